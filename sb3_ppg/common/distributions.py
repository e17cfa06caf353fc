"""Action distributions as stored parameters, and KL(pi_old || pi) from them, for every action space PPG supports."""

import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch as th
from gymnasium import spaces
from stable_baselines3.common.distributions import Distribution
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


#: The contexts of :func:`unchecked_distributions` open now, in all threads, and torch's default before the first
_unchecked = {"depth": 0, "default": True}
_unchecked_lock = threading.Lock()


@contextmanager
def unchecked_distributions(device: th.device, enabled: bool = True) -> Iterator[None]:
    """
    On a CUDA device, torch distributions built inside the context skip the check of their arguments, which reads
    the device (a host sync); elsewhere, or when not ``enabled``, nothing changes. torch's default is process-wide:
    it is set back when the last context open in any thread exits.

    :param device: the device the distributions are on
    :param enabled: whether to skip the checks (e.g. only for action spaces whose sampling refuses non-finite
        parameters itself, see :func:`sampling_checks_parameters`)
    """
    if device.type != "cuda" or not enabled:
        yield
        return
    with _unchecked_lock:
        if _unchecked["depth"] == 0:
            _unchecked["default"] = th.distributions.Distribution._validate_args
            th.distributions.Distribution.set_default_validate_args(False)
        _unchecked["depth"] += 1
    try:
        yield
    finally:
        with _unchecked_lock:
            _unchecked["depth"] -= 1
            if _unchecked["depth"] == 0:
                th.distributions.Distribution.set_default_validate_args(_unchecked["default"])


def sampling_checks_parameters(action_space: spaces.Space) -> bool:
    """
    Whether sampling the action distribution of ``action_space`` refuses non-finite parameters by itself: categorical
    ones (Discrete, MultiDiscrete) sample with ``torch.multinomial``, which refuses NaN or infinite probabilities. A
    Gaussian or Bernoulli sample would carry them into the env: their argument checks stay on in the rollout.
    """
    return isinstance(action_space, (spaces.Discrete, spaces.MultiDiscrete))
