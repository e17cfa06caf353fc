"""sb3_ppg.common.distributions: stored parameters and KL(pi_old || pi) for each action space, against torch.distributions."""

from contextlib import contextmanager

import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from sb3_contrib.common.envs import InvalidActionEnvDiscrete
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.envs import IdentityEnvMultiDiscrete
from stable_baselines3.common.utils import ConstantSchedule
from torch.distributions import Bernoulli, Categorical, Distribution, Independent, Normal, kl_divergence

from sb3_ppg import PPG, MaskablePPG
from sb3_ppg.common.distributions import (
    distribution_param_dim,
    get_distribution_params,
    kl_divergence_from_params,
    sampling_checks_parameters,
    unchecked_distributions,
)
from sb3_ppg.ppg import policies as policies_module
from sb3_ppg.ppg.policies import PPGPolicy
from sb3_ppg.ppg_mask.policies import MaskablePPGPolicy

OBS_SPACE = spaces.Box(-1, 1, (4,), np.float32)


def two_policies(action_space: spaces.Space, use_sde: bool = False) -> tuple[PPGPolicy, PPGPolicy]:
    """Two policies with different weights over the same spaces (pi_old and pi)."""
    policies = []
    for seed in (0, 1):
        th.manual_seed(seed)
        policy = PPGPolicy(OBS_SPACE, action_space, ConstantSchedule(1e-3), net_arch=[8], use_sde=use_sde, log_std_init=-0.5)
        if use_sde:
            policy.reset_noise()
        policies.append(policy)
    return policies[0], policies[1]


def reference_kl(old_dist, new_dist, action_space: spaces.Space) -> th.Tensor:
    """KL(old || new) per state from torch.distributions objects, summed over action dimensions."""
    if isinstance(action_space, spaces.Discrete):
        return kl_divergence(Categorical(logits=old_dist.logits), Categorical(logits=new_dist.logits))
    if isinstance(action_space, spaces.MultiDiscrete):
        return sum(
            kl_divergence(Categorical(logits=old.logits), Categorical(logits=new.logits))
            for old, new in zip(old_dist, new_dist, strict=True)
        )
    if isinstance(action_space, spaces.MultiBinary):
        return kl_divergence(
            Independent(Bernoulli(logits=old_dist.logits), 1), Independent(Bernoulli(logits=new_dist.logits), 1)
        )
    return kl_divergence(
        Independent(Normal(old_dist.loc, old_dist.scale), 1), Independent(Normal(new_dist.loc, new_dist.scale), 1)
    )


ACTION_SPACES = {
    "discrete": (spaces.Discrete(5), False),
    "multidiscrete": (spaces.MultiDiscrete([3, 2, 4]), False),
    "multibinary": (spaces.MultiBinary(3), False),
    "box": (spaces.Box(-1, 1, (2,), np.float32), False),
    "box_gsde": (spaces.Box(-1, 1, (2,), np.float32), True),
}


@pytest.mark.parametrize("name", sorted(ACTION_SPACES))
def test_kl_from_params_matches_torch(name: str) -> None:
    action_space, use_sde = ACTION_SPACES[name]
    old_policy, new_policy = two_policies(action_space, use_sde)
    obs = th.as_tensor(np.random.default_rng(0).uniform(-1, 1, (10, 4)).astype(np.float32))
    with th.no_grad():
        old_sb3 = old_policy.get_distribution(obs)
        old_params = get_distribution_params(old_sb3).clone()
        old_torch = old_sb3.distribution
        old_torch = [Categorical(logits=d.logits.clone()) for d in old_torch] if isinstance(old_torch, list) else old_torch
    assert old_params.shape == (10, distribution_param_dim(action_space))
    new_sb3 = new_policy.get_distribution(obs)
    kl = kl_divergence_from_params(old_params, new_sb3)
    expected = reference_kl(old_torch, new_sb3.distribution, action_space)
    assert kl.shape == (10,)
    th.testing.assert_close(kl, expected, rtol=1e-5, atol=1e-6)
    assert (kl > 0).all()
    # Gradients flow into the current policy only
    kl.mean().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in new_policy.parameters())
    assert all(p.grad is None for p in old_policy.parameters())


@pytest.mark.parametrize("name", sorted(ACTION_SPACES))
def test_kl_of_a_distribution_with_itself_is_zero(name: str) -> None:
    action_space, use_sde = ACTION_SPACES[name]
    policy, _ = two_policies(action_space, use_sde)
    obs = th.zeros((3, 4))
    with th.no_grad():
        distribution = policy.get_distribution(obs)
        kl = kl_divergence_from_params(get_distribution_params(distribution).clone(), distribution)
    th.testing.assert_close(kl, th.zeros(3), rtol=0, atol=1e-6)


def test_unsupported_action_space() -> None:
    with pytest.raises(ValueError, match="does not support the action space"):
        distribution_param_dim(spaces.Tuple([spaces.Discrete(2)]))


#: Policies whose action distributions are checked: (policy class, action space, use_sde)
CHECKED_POLICIES = {
    "Discrete": (PPGPolicy, spaces.Discrete(3), False),
    "MultiDiscrete": (PPGPolicy, spaces.MultiDiscrete([2, 3]), False),
    "MultiBinary": (PPGPolicy, spaces.MultiBinary(2), False),
    "Box": (PPGPolicy, spaces.Box(-1, 1, (2,)), False),
    "Box gSDE": (PPGPolicy, spaces.Box(-1, 1, (2,)), True),
    "masked Discrete": (MaskablePPGPolicy, spaces.Discrete(3), False),
    "masked MultiDiscrete": (MaskablePPGPolicy, spaces.MultiDiscrete([2, 3]), False),
}


@pytest.mark.parametrize("case", list(CHECKED_POLICIES))
def test_unchecked_distributions_only_that_distribution(case):
    """
    The distributions that the policy's action distribution builds inside the context skip their argument check (on
    CUDA it reads the device); when not enabled, after the context (also after an exception) and for another policy
    they check as before; torch's process-wide default is never touched.
    """
    policy_class, action_space, use_sde = CHECKED_POLICIES[case]
    policy, other = (
        policy_class(OBS_SPACE, action_space, ConstantSchedule(1e-3), net_arch=[8], use_sde=use_sde) for _ in range(2)
    )
    nan_latent = th.full((2, 8), float("nan"))
    default = Distribution._validate_args

    def build(model: PPGPolicy) -> None:
        if use_sde:
            model.reset_noise()
        model._get_action_dist_from_latent(nan_latent)

    with pytest.raises(ValueError, match="Expected parameter"):
        build(policy)
    with unchecked_distributions(policy.action_dist, enabled=False), pytest.raises(ValueError, match="Expected"):
        build(policy)
    with pytest.raises(RuntimeError, match="stop"), unchecked_distributions(policy.action_dist):
        build(policy)  # not checked
        assert Distribution._validate_args == default
        with pytest.raises(ValueError, match="Expected parameter"):
            build(other)  # another policy's distributions check as before
        raise RuntimeError("stop")
    with pytest.raises(ValueError, match="Expected parameter"):
        build(policy)  # checked again after the context, also after an exception
    assert Distribution._validate_args == default


#: Rollouts to check: (algorithm, env, whether the sampling skips the argument checks on CUDA)
ROLLOUT_CASES = {
    "Discrete": (PPG, lambda: "CartPole-v1", True),
    "Box": (PPG, lambda: "Pendulum-v1", False),
    "MultiDiscrete": (PPG, lambda: IdentityEnvMultiDiscrete(dim=2), True),
    "masked Discrete": (MaskablePPG, lambda: InvalidActionEnvDiscrete(dim=4, n_invalid_actions=1), True),
}


@pytest.mark.parametrize("case", list(ROLLOUT_CASES))
def test_rollout_samples_in_unchecked_distributions(monkeypatch, case):
    """
    The rollout builds and samples its action distributions inside ``unchecked_distributions(action_dist, enabled)``,
    enabled for the categorical action spaces (whose sampling refuses non-finite probabilities itself), not for a
    Gaussian; the callbacks run outside it.
    """
    algorithm, make_env, enabled = ROLLOUT_CASES[case]
    active: list[bool] = []

    @contextmanager
    def recording(distribution, enabled: bool = True):
        assert distribution is model.policy.action_dist
        active.append(enabled)
        try:
            yield
        finally:
            active.pop()

    monkeypatch.setattr(policies_module, "unchecked_distributions", recording)
    model = algorithm(
        "MlpPolicy", make_env(), n_steps=8, batch_size=8, n_policy_iters=2, aux_batch_rollouts=1, seed=0, device="cpu"
    )
    at_sampling = []
    get_distribution = model.policy._get_action_dist_from_latent

    def recorded_get_distribution(*args, **kwargs):
        at_sampling.append(list(active))
        return get_distribution(*args, **kwargs)

    class RecordingCallback(BaseCallback):
        def _on_step(self) -> bool:
            at_sampling.append(("callback", list(active)))
            return True

    monkeypatch.setattr(model.policy, "_get_action_dist_from_latent", recorded_get_distribution)
    model.learn(16, callback=RecordingCallback())
    rollout = [contexts for contexts in at_sampling if not isinstance(contexts, tuple) and contexts]
    assert rollout == [[enabled]] * 16  # each rollout step, inside one context
    assert [entry for entry in at_sampling if isinstance(entry, tuple)] == [("callback", [])] * 16
    assert active == []


def test_sampling_checks_parameters():
    """Categorical sampling (torch.multinomial) refuses non-finite probabilities; a Gaussian's and a Bernoulli's pass."""
    assert sampling_checks_parameters(spaces.Discrete(3)) and sampling_checks_parameters(spaces.MultiDiscrete([2, 3]))
    assert not sampling_checks_parameters(spaces.Box(-1, 1, (2,))) and not sampling_checks_parameters(spaces.MultiBinary(2))
    with pytest.raises(RuntimeError, match="probability tensor contains either"):
        Categorical(logits=th.tensor([[float("nan"), 0.0]]), validate_args=False).sample()
    assert th.isnan(Normal(th.tensor([float("nan")]), th.ones(1), validate_args=False).sample()).all()
