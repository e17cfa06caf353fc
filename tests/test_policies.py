"""PPGPolicy: architectures, parameter counts, initialization, gradient routing and the KL helpers."""

import math

import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from stable_baselines3.common.distributions import (
    BernoulliDistribution,
    CategoricalDistribution,
    DiagGaussianDistribution,
    MultiCategoricalDistribution,
)
from stable_baselines3.common.preprocessing import preprocess_obs
from stable_baselines3.common.utils import ConstantSchedule, obs_as_tensor
from torch import nn

from sb3_ppg.common.distributions import distribution_param_dim, get_distribution_params, kl_divergence_from_params
from sb3_ppg.common.preprocessing import preprocess_obs_as
from sb3_ppg.common.torch_layers import ImpalaCNN, normed_init_
from sb3_ppg.ppg.policies import PPGPolicy, ProcgenCnnPolicy

PROCGEN_OBS = spaces.Box(0, 255, (3, 64, 64), np.uint8)
SMALL_IMAGE_OBS = spaces.Box(0, 255, (3, 16, 16), np.uint8)
PROCGEN_ACTIONS = spaces.Discrete(15)
LR = ConstantSchedule(5e-4)


def make_procgen_policy(arch: str, obs_space: spaces.Box = PROCGEN_OBS, **kwargs) -> ProcgenCnnPolicy:
    return ProcgenCnnPolicy(obs_space, PROCGEN_ACTIONS, LR, arch=arch, **kwargs)


def n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def image_batch(obs_space: spaces.Box, n: int = 8) -> th.Tensor:
    return th.randint(0, 256, (n, *obs_space.shape), dtype=th.uint8)


@pytest.mark.parametrize("arch, expected", [("dual", 1_248_657), ("detach", 626_513), ("shared", 626_513)])
def test_procgen_parameter_counts(arch, expected):
    # Counts of the reference implementation (IMPALA 16-32-32 encoder = 622,144 parameters, 15 actions)
    policy = make_procgen_policy(arch)
    assert n_params(policy) == expected
    assert n_params(policy.pi_features_extractor) == 622_144
    assert policy.share_features_extractor == (arch != "dual")


def test_impala_normed_init():
    policy = make_procgen_policy("dual")
    residual_scale = 6**-0.25
    for extractor in (policy.pi_features_extractor, policy.vf_features_extractor):
        assert isinstance(extractor, ImpalaCNN)
        for stack in extractor.stacks:
            assert th.allclose(stack.conv.weight.flatten(1).norm(dim=1), th.tensor(1.0))
            for block in stack.blocks:
                for conv in (block.conv_a, block.conv_b):
                    assert th.allclose(conv.weight.flatten(1).norm(dim=1), th.tensor(residual_scale))
        assert th.allclose(extractor.dense.weight.norm(dim=1), th.tensor(1.4))
    for head in (policy.action_net, policy.value_net, policy.aux_value_net):
        assert th.allclose(head.weight.norm(dim=1), th.tensor(0.1))
    for module in policy.modules():
        if isinstance(module, (nn.Linear, nn.Conv2d)):
            assert th.all(module.bias == 0)
    assert math.isclose(residual_scale, 0.6389, abs_tol=1e-4)


def test_normed_init_rejects_other_layers():
    with pytest.raises(TypeError, match=r"nn\.Linear or nn\.Conv2d"):
        normed_init_(nn.ReLU())


def grads_of(module: nn.Module) -> list[th.Tensor | None]:
    return [p.grad for p in module.parameters()]


def all_zero_or_none(module: nn.Module) -> bool:
    return all(g is None or th.all(g == 0) for g in grads_of(module))


def any_nonzero(module: nn.Module) -> bool:
    return any(g is not None and th.any(g != 0) for g in grads_of(module))


def test_dual_gradient_isolation():
    policy = make_procgen_policy("dual", SMALL_IMAGE_OBS)
    obs = image_batch(SMALL_IMAGE_OBS)
    actions = th.randint(0, 15, (8,))
    values, log_prob, entropy = policy.evaluate_actions(obs, actions)
    (-(log_prob.mean() + 0.01 * entropy.mean())).backward()
    assert any_nonzero(policy.pi_features_extractor)
    assert all_zero_or_none(policy.vf_features_extractor)
    assert all_zero_or_none(policy.value_net)

    policy.zero_grad(set_to_none=True)
    values, _, _ = policy.evaluate_actions(obs, actions)
    values.pow(2).mean().backward()
    assert any_nonzero(policy.vf_features_extractor)
    assert any_nonzero(policy.value_net)
    assert all_zero_or_none(policy.pi_features_extractor)
    assert all_zero_or_none(policy.action_net)


@pytest.mark.parametrize("detach_value_in_aux", [True, False])
def test_detach_gradient_routing(detach_value_in_aux):
    policy = make_procgen_policy("detach", SMALL_IMAGE_OBS, detach_value_in_aux=detach_value_in_aux)
    obs = image_batch(SMALL_IMAGE_OBS)
    # Policy phase and rollouts: the value loss trains the value head only
    values, _, _ = policy.evaluate_actions(obs, th.randint(0, 15, (8,)))
    values.pow(2).mean().backward()
    assert any_nonzero(policy.value_net)
    assert all_zero_or_none(policy.features_extractor)
    policy.zero_grad(set_to_none=True)
    policy.predict_values(obs).pow(2).mean().backward()
    assert all_zero_or_none(policy.features_extractor)
    policy.zero_grad(set_to_none=True)

    # Aux phase: the aux value loss reaches the trunk through the aux head
    _, values, aux_values = policy.forward_aux(obs)
    aux_values.pow(2).mean().backward()
    assert any_nonzero(policy.features_extractor)
    assert any_nonzero(policy.aux_value_net)
    assert all_zero_or_none(policy.value_net)
    policy.zero_grad(set_to_none=True)

    # Aux phase: the true value loss reaches the trunk only with detach_value_in_aux=False (the paper's text)
    _, values, _ = policy.forward_aux(obs)
    values.pow(2).mean().backward()
    assert any_nonzero(policy.value_net)
    assert any_nonzero(policy.features_extractor) == (not detach_value_in_aux)


def test_shared_value_loss_reaches_trunk():
    policy = make_procgen_policy("shared", SMALL_IMAGE_OBS)
    values, _, _ = policy.evaluate_actions(image_batch(SMALL_IMAGE_OBS), th.randint(0, 15, (8,)))
    values.pow(2).mean().backward()
    assert any_nonzero(policy.features_extractor)


def test_aux_head_untouched_by_policy_phase_losses():
    policy = make_procgen_policy("dual", SMALL_IMAGE_OBS)
    values, log_prob, entropy = policy.evaluate_actions(image_batch(SMALL_IMAGE_OBS), th.randint(0, 15, (8,)))
    (values.mean() + log_prob.mean() + entropy.mean()).backward()
    assert all_zero_or_none(policy.aux_value_net)


@pytest.mark.parametrize("arch", ["dual", "detach", "shared"])
def test_forward_paths_agree(arch):
    """forward, evaluate_actions, predict_values and forward_aux compute the same values and distribution."""
    policy = make_procgen_policy(arch, SMALL_IMAGE_OBS)
    obs = image_batch(SMALL_IMAGE_OBS)
    with th.no_grad():
        actions, values, log_prob = policy(obs)
        eval_values, eval_log_prob, _ = policy.evaluate_actions(obs, actions)
        distribution, aux_phase_values, aux_values = policy.forward_aux(obs)
        aux_log_prob = distribution.log_prob(actions)
        assert th.allclose(values, eval_values)
        assert th.allclose(values, policy.predict_values(obs))
        assert th.allclose(values, aux_phase_values)
        assert th.allclose(log_prob, eval_log_prob)
        assert th.allclose(log_prob, aux_log_prob)
        assert aux_values.shape == (8, 1)


def test_mlp_one_network_archs_put_value_head_on_policy_latent():
    obs_space = spaces.Box(-1, 1, (4,), np.float32)
    policy = PPGPolicy(obs_space, spaces.Discrete(2), LR, arch="detach", net_arch=[32, 32])
    assert policy.net_arch == dict(pi=[32, 32], vf=[])
    assert policy.value_net.in_features == 32
    assert policy.aux_value_net.in_features == 32
    dual = PPGPolicy(obs_space, spaces.Discrete(2), LR, arch="dual", net_arch=dict(pi=[32], vf=[8]))
    assert dual.value_net.in_features == 8
    assert dual.aux_value_net.in_features == 32


def test_default_adam_eps_is_the_papers():
    policy = PPGPolicy(spaces.Box(-1, 1, (4,), np.float32), spaces.Discrete(2), LR)
    assert policy.optimizer.defaults["eps"] == 1e-8
    # The aux head is optimized too
    optimized = {id(p) for group in policy.optimizer.param_groups for p in group["params"]}
    assert all(id(p) in optimized for p in policy.aux_value_net.parameters())


def test_invalid_policy_arguments():
    obs_space = spaces.Box(-1, 1, (4,), np.float32)
    with pytest.raises(ValueError, match="Unknown PPG arch 'triple'"):
        PPGPolicy(obs_space, spaces.Discrete(2), LR, arch="triple")
    with pytest.raises(ValueError, match="contradicts arch='dual'"):
        PPGPolicy(obs_space, spaces.Discrete(2), LR, arch="dual", share_features_extractor=True)
    with pytest.raises(ValueError, match="would be unused"):
        PPGPolicy(obs_space, spaces.Discrete(2), LR, arch="shared", net_arch=dict(pi=[8], vf=[8]))
    with pytest.raises(ValueError, match="mutually exclusive"):
        PPGPolicy(obs_space, spaces.Discrete(2), LR, ortho_init=True, normed_init=True)
    with pytest.raises(ValueError, match="image observation space"):
        ProcgenCnnPolicy(obs_space, spaces.Discrete(2), LR)


ACTION_SPACES = [
    spaces.Discrete(5),
    spaces.MultiDiscrete([3, 4, 2]),
    spaces.MultiBinary(4),
    spaces.Box(-1, 1, (3,), np.float32),
]


@pytest.mark.parametrize("action_space", ACTION_SPACES, ids=lambda s: type(s).__name__)
def test_kl_from_stored_params_matches_analytic_kl(action_space):
    obs_space = spaces.Box(-1, 1, (6,), np.float32)
    policy = PPGPolicy(obs_space, action_space, LR, net_arch=[16])
    obs = th.randn(10, 6)
    with th.no_grad():
        old_params = get_distribution_params(policy.get_distribution(obs)).clone()
    assert old_params.shape == (10, distribution_param_dim(action_space))
    # Against itself: zero
    assert th.allclose(kl_divergence_from_params(old_params, policy.get_distribution(obs)), th.zeros(10), atol=1e-6)

    # Move the policy, then compare with SB3's KL between two separate distribution objects
    with th.no_grad():
        for param in policy.parameters():
            param.add_(0.3 * th.randn_like(param))
    new_distribution = policy.get_distribution(obs)
    kl = kl_divergence_from_params(old_params, new_distribution)
    assert kl.shape == (10,)
    assert th.all(kl > 0)

    kl_fn = th.distributions.kl_divergence
    if isinstance(action_space, spaces.Discrete):
        old = CategoricalDistribution(5).proba_distribution(old_params)
        expected = kl_fn(old.distribution, new_distribution.distribution)
    elif isinstance(action_space, spaces.MultiDiscrete):
        old = MultiCategoricalDistribution([3, 4, 2]).proba_distribution(old_params)
        per_dim = [kl_fn(o, n) for o, n in zip(old.distribution, new_distribution.distribution, strict=True)]
        expected = th.stack(per_dim, dim=1).sum(dim=1)
    elif isinstance(action_space, spaces.MultiBinary):
        old = BernoulliDistribution(4).proba_distribution(old_params)
        expected = kl_fn(old.distribution, new_distribution.distribution).sum(dim=1)
    else:
        mean, log_std = old_params.chunk(2, dim=1)
        old = DiagGaussianDistribution(3).proba_distribution(mean, log_std)
        expected = kl_fn(old.distribution, new_distribution.distribution).sum(dim=1)
    assert th.allclose(kl, expected, atol=1e-6)
    # Gradients flow into the current policy
    kl.mean().backward()
    assert any_nonzero(policy.action_net)


def test_stored_params_survive_sb3_distribution_reuse():
    """SB3 reuses one Distribution object per policy: stored parameters must not follow later calls."""
    policy = PPGPolicy(spaces.Box(-1, 1, (6,), np.float32), spaces.Discrete(5), LR, net_arch=[16])
    obs = th.randn(4, 6)
    with th.no_grad():
        params = get_distribution_params(policy.get_distribution(obs)).clone()
        policy.get_distribution(th.randn(4, 6))
        assert th.allclose(params, get_distribution_params(policy.get_distribution(obs)))
        assert policy.get_distribution(obs) is policy.get_distribution(obs)


def test_procgen_cnn_policy_is_exported_under_both_names():
    from sb3_ppg import PPG, ProcgenCnn, ProcgenCnnPolicy

    assert ProcgenCnn is ProcgenCnnPolicy
    assert PPG.policy_aliases["ProcgenCnn"] is ProcgenCnnPolicy
    assert PPG.policy_aliases["ProcgenCnnPolicy"] is ProcgenCnnPolicy
    policy = make_procgen_policy("dual", SMALL_IMAGE_OBS)
    assert isinstance(policy.pi_features_extractor, ImpalaCNN)


def test_image_observations_are_preprocessed_in_the_policy_dtype():
    """SB3's preprocessing gives float32: a float64 policy divides its images by 255 in float64 (no float32 rounding),
    a float32 policy gets SB3's own preprocessing."""
    space = spaces.Box(0, 255, (3, 8, 8), np.uint8)
    obs = th.as_tensor(np.random.default_rng(0).integers(0, 256, (5, 3, 8, 8), dtype=np.uint8))
    assert th.equal(preprocess_obs_as(obs, space, True, th.float32), preprocess_obs(obs, space))
    float64 = preprocess_obs_as(obs, space, True, th.float64)
    assert float64.dtype == th.float64 and th.equal(float64, obs.double() / 255.0)
    assert not th.equal(float64, preprocess_obs(obs, space).double())  # what float32 rounding gives
    assert th.equal(preprocess_obs_as(obs, space, False, th.float64), obs.double())


@pytest.mark.parametrize(
    "observation_space",
    [
        spaces.Box(-1, 1, (3,), np.float64),
        spaces.Discrete(4),
        spaces.MultiDiscrete([2, 3]),
        spaces.MultiBinary(3),
        spaces.Dict(vector=spaces.Box(-1, 1, (3,), np.float64), index=spaces.Discrete(4)),
    ],
)
def test_other_observations_are_preprocessed_in_the_policy_dtype(observation_space):
    """Float64 Box observations reach a float64 policy unrounded; one-hot and binary encodings are exact in any dtype."""
    observation_space.seed(0)
    samples = [observation_space.sample() for _ in range(5)]
    if isinstance(observation_space, spaces.Dict):
        obs = obs_as_tensor({key: np.stack([sample[key] for sample in samples]) for key in observation_space.spaces}, "cpu")
    else:
        obs = obs_as_tensor(np.stack(samples), "cpu")
    float64 = preprocess_obs_as(obs, observation_space, True, th.float64)
    reference = preprocess_obs(obs, observation_space)
    subspaces = observation_space.spaces if isinstance(observation_space, spaces.Dict) else {None: observation_space}
    for key, subspace in subspaces.items():
        result, raw, sb3 = (value[key] if key is not None else value for value in (float64, obs, reference))
        assert result.dtype == th.float64
        expected = raw if isinstance(subspace, spaces.Box) else sb3.double()
        assert th.equal(result, expected)
