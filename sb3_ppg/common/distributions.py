"""Action distributions as stored parameters, and KL(pi_old || pi) from them, for every action space PPG supports."""

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch as th
from gymnasium import spaces
from stable_baselines3.common.distributions import (
    BernoulliDistribution,
    CategoricalDistribution,
    DiagGaussianDistribution,
    Distribution,
    MultiCategoricalDistribution,
    StateDependentNoiseDistribution,
    make_proba_distribution,
)
from stable_baselines3.common.preprocessing import get_action_dim
from torch.distributions import Bernoulli, Categorical, Normal, kl_divergence


def distribution_param_dim(action_space: spaces.Space) -> int:
    """Number of floats that describe one state's action distribution (see ``get_distribution_params``)."""
    if isinstance(action_space, spaces.Discrete):
        return int(action_space.n)
    if isinstance(action_space, spaces.MultiDiscrete):
        return int(action_space.nvec.sum())
    if isinstance(action_space, spaces.MultiBinary):
        return math.prod(action_space.shape)
    if isinstance(action_space, spaces.Box):
        return 2 * math.prod(action_space.shape)
    raise ValueError(f"PPG does not support the action space {action_space}: use Discrete, MultiDiscrete, MultiBinary or Box.")


def get_distribution_params(distribution: Distribution) -> th.Tensor:
    """
    The parameters of an SB3 action distribution, one row per state (logits, or mean and log std), detached from SB3's
    reused ``Distribution`` object.
    """
    torch_dist = distribution.distribution
    if isinstance(torch_dist, list):
        return th.cat([dist.logits for dist in torch_dist], dim=1)
    if isinstance(torch_dist, (Categorical, Bernoulli)):
        return torch_dist.logits
    if isinstance(torch_dist, Normal):
        return th.cat([torch_dist.loc, torch_dist.scale.log()], dim=1)
    raise NotImplementedError(f"PPG cannot store the parameters of {type(distribution).__name__}")


def kl_divergence_from_params(old_params: th.Tensor, distribution: Distribution) -> th.Tensor:
    """
    ``KL(pi_old || pi)`` per state, summed over action dimensions, ``pi_old`` rebuilt from ``get_distribution_params``'s
    parameters and ``pi`` the current distribution (gradients flow through it).
    """
    torch_dist = distribution.distribution
    if isinstance(torch_dist, list):
        old_logits = th.split(old_params, list(distribution.action_dims), dim=1)  # type: ignore[attr-defined]
        per_dim = [
            kl_divergence(Categorical(logits=logits, validate_args=False), dist)
            for logits, dist in zip(old_logits, torch_dist, strict=True)
        ]
        return th.stack(per_dim, dim=1).sum(dim=1)
    if isinstance(torch_dist, Categorical):
        return kl_divergence(Categorical(logits=old_params, validate_args=False), torch_dist)
    if isinstance(torch_dist, Bernoulli):
        return kl_divergence(Bernoulli(logits=old_params, validate_args=False), torch_dist).sum(dim=1)
    if isinstance(torch_dist, Normal):
        mean, log_std = old_params.chunk(2, dim=1)
        return kl_divergence(Normal(mean, log_std.exp(), validate_args=False), torch_dist).sum(dim=1)
    raise NotImplementedError(f"PPG cannot compute the KL divergence of {type(distribution).__name__}")


class PPGCategoricalDistribution(CategoricalDistribution):
    """SB3's ``CategoricalDistribution`` (Discrete actions), its torch distribution built with ``validate_args``."""

    #: Whether the torch distributions built check their arguments (None: torch's default); see
    #: :func:`unchecked_distributions`
    validate_args: bool | None = None

    def proba_distribution(self, action_logits: th.Tensor) -> "PPGCategoricalDistribution":
        self.distribution = Categorical(logits=action_logits, validate_args=self.validate_args)
        return self


class PPGMultiCategoricalDistribution(MultiCategoricalDistribution):
    """SB3's ``MultiCategoricalDistribution`` (MultiDiscrete actions), built with ``validate_args``."""

    validate_args: bool | None = None

    def proba_distribution(self, action_logits: th.Tensor) -> "PPGMultiCategoricalDistribution":
        parts = th.split(action_logits, list(self.action_dims), dim=1)
        self.distribution = [Categorical(logits=part, validate_args=self.validate_args) for part in parts]
        return self


class PPGBernoulliDistribution(BernoulliDistribution):
    """SB3's ``BernoulliDistribution`` (MultiBinary actions), built with ``validate_args``."""

    validate_args: bool | None = None

    def proba_distribution(self, action_logits: th.Tensor) -> "PPGBernoulliDistribution":
        self.distribution = Bernoulli(logits=action_logits, validate_args=self.validate_args)
        return self


class PPGDiagGaussianDistribution(DiagGaussianDistribution):
    """SB3's ``DiagGaussianDistribution`` (Box actions), built with ``validate_args``."""

    validate_args: bool | None = None

    def proba_distribution(self, mean_actions: th.Tensor, log_std: th.Tensor) -> "PPGDiagGaussianDistribution":
        action_std = th.ones_like(mean_actions) * log_std.exp()
        self.distribution = Normal(mean_actions, action_std, validate_args=self.validate_args)
        return self


class PPGStateDependentNoiseDistribution(StateDependentNoiseDistribution):
    """SB3's ``StateDependentNoiseDistribution`` (Box actions with gSDE), built with ``validate_args``."""

    validate_args: bool | None = None

    def proba_distribution(
        self, mean_actions: th.Tensor, log_std: th.Tensor, latent_sde: th.Tensor
    ) -> "PPGStateDependentNoiseDistribution":
        self._latent_sde = latent_sde if self.learn_features else latent_sde.detach()
        variance = th.mm(self._latent_sde**2, self.get_std(log_std) ** 2)
        self.distribution = Normal(mean_actions, th.sqrt(variance + self.epsilon), validate_args=self.validate_args)
        return self


def make_distribution(
    action_space: spaces.Space, use_sde: bool = False, dist_kwargs: dict[str, Any] | None = None
) -> Distribution:
    """SB3's ``make_proba_distribution`` with the distributions above (the same classes but for ``validate_args``)."""
    dist_kwargs = dist_kwargs or {}
    if isinstance(action_space, spaces.Box):
        gaussian = PPGStateDependentNoiseDistribution if use_sde else PPGDiagGaussianDistribution
        return gaussian(get_action_dim(action_space), **dist_kwargs)
    if isinstance(action_space, spaces.Discrete):
        return PPGCategoricalDistribution(int(action_space.n), **dist_kwargs)
    if isinstance(action_space, spaces.MultiDiscrete):
        return PPGMultiCategoricalDistribution(list(action_space.nvec), **dist_kwargs)
    if isinstance(action_space, spaces.MultiBinary) and isinstance(action_space.n, int):
        return PPGBernoulliDistribution(action_space.n, **dist_kwargs)
    return make_proba_distribution(action_space, use_sde, dist_kwargs)  # SB3's error


@contextmanager
def unchecked_distributions(distribution: Distribution, enabled: bool = True) -> Iterator[None]:
    """
    The torch distributions that ``distribution`` builds inside the context skip the check of their arguments (on
    CUDA it reads the device, a host sync; on a CPU it costs ~3% of RecurrentPPG's training at the zoo's CartPoleNoVel
    settings); when not ``enabled``, nothing changes. The losses' finite checks stop a non-finite value instead. Only
    this object changes (its ``validate_args``), not torch's process-wide default.

    :param distribution: the policy's action distribution (one of the classes above, or a maskable one)
    :param enabled: whether to skip the checks (e.g. only for action spaces whose sampling refuses non-finite
        parameters itself, see :func:`sampling_checks_parameters`)
    """
    if not enabled:
        yield
        return
    previous = distribution.validate_args  # type: ignore[attr-defined]
    distribution.validate_args = False  # type: ignore[attr-defined]
    try:
        yield
    finally:
        distribution.validate_args = previous  # type: ignore[attr-defined]


def sampling_checks_parameters(action_space: spaces.Space) -> bool:
    """
    Whether sampling the action distribution of ``action_space`` refuses non-finite parameters by itself: categorical
    ones (Discrete, MultiDiscrete) sample with ``torch.multinomial``, which refuses NaN or infinite probabilities. A
    Gaussian or Bernoulli sample would carry them into the env: their argument checks stay on in the rollout.
    """
    return isinstance(action_space, (spaces.Discrete, spaces.MultiDiscrete))
