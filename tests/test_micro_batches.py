"""micro_batch_size: minibatches split into micro-batches compute the same updates with smaller forward passes."""

from typing import Any

import numpy as np
import pytest
import torch as th
from double_precision import run_in_float64
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.envs import FakeImageEnv, SimpleMultiObsEnv
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
from stable_baselines3.common.type_aliases import RolloutBufferSamples

from sb3_ppg import PPG
from sb3_ppg.common.aux_buffer import AuxiliaryBufferSamples
from sb3_ppg.common.optim import split_minibatch, split_observations
from sb3_ppg.common.precision import AUTO_CPU_MICRO_BATCH_SIZE, resolve_micro_batch_size

# Plain SGD keeps float-rounding differences of the gradients at that size in the parameters (Adam can turn a
# rounding difference of a near-zero gradient into a step of a whole learning rate); the models run in float64 (see
# double_precision.run_in_float64), where whole and split minibatches agree to ~1e-15 on any CPU
SGD = dict(net_arch=[16], optimizer_class=th.optim.SGD, optimizer_kwargs=dict(momentum=0.9))
# Whole and split minibatches sum the same terms in another order: in float64 they agree far below this
FLOAT64_TOLERANCE = dict(rtol=0.0, atol=1e-10)
# Two envs x 16 steps, minibatches of 32 samples (policy) and 2 rollouts = 32 samples (aux), one aux phase
CONFIG = dict(batch_size=32, n_epochs=2, n_aux_epochs=2, aux_batch_rollouts=2, precision="fp32")


def train(make_model: Any, micro_batch_size: int | None, env_id: Any = "CartPole-v1", **overrides: Any) -> PPG:
    """Two policy iterations and one auxiliary phase of the small model, in float64."""
    policy = "MultiInputPolicy" if env_id is SimpleMultiObsEnv else "MlpPolicy"
    env = make_vec_env(env_id, n_envs=2, seed=0)
    model = run_in_float64(make_model(env, policy, SGD, micro_batch_size=micro_batch_size, **{**CONFIG, **overrides}))
    model.learn(64)
    assert model.n_aux_phases == (1 if model.n_aux_epochs else 0)
    return model


@pytest.mark.parametrize(
    "overrides",
    [
        {},  # the joint loss, one optimizer
        {"n_value_epochs": 1},  # value-only epochs with their own optimizer, then policy-only epochs
        {"normalize_advantage": "minibatch"},  # normalized over the whole minibatch, not each micro-batch
        {"n_aux_grad_accum": 2, "aux_batch_rollouts": 1},  # accumulated aux minibatches, each split again
        {"env_id": SimpleMultiObsEnv},  # Dict observations
    ],
    ids=["joint", "value-epochs", "minibatch-advantages", "aux-accumulation", "dict-obs"],
)
def test_micro_batches_train_to_the_same_parameters(make_model, overrides):
    whole, split = (train(make_model, size, **overrides) for size in (None, 5))  # 32 = 5 + 5 + ... + 2: unequal parts
    for a, b in zip(whole.policy.parameters(), split.policy.parameters(), strict=True):
        th.testing.assert_close(a, b, **FLOAT64_TOLERANCE)
    assert (whole._n_updates, whole._n_aux_updates) == (split._n_updates, split._n_aux_updates)
    # The logged statistics are those of whole minibatches
    for key in ("train/approx_kl", "train/value_loss", "train/clip_fraction", "train/loss", "aux/kl_loss"):
        assert split.logger.name_to_value[key] == pytest.approx(whole.logger.name_to_value[key], rel=1e-9, abs=1e-12)


def test_micro_batches_bound_every_forward_pass(make_model):
    """No forward pass of training (rollouts, both phases, the old-policy pass) holds more than micro_batch_size."""
    model = make_model(make_vec_env("CartPole-v1", n_envs=2, seed=0), micro_batch_size=6, **CONFIG)
    batch_sizes = []
    for module in model.policy.modules():
        if isinstance(module, BaseFeaturesExtractor):
            module.register_forward_hook(lambda module, inputs, output: batch_sizes.append(len(inputs[0])))
    model.learn(64)
    assert model.n_aux_phases == 1
    assert max(batch_sizes) == 6 and 2 in batch_sizes  # 32 = 5 x 6 + 2 (and the rollouts' 2 envs)


def test_early_stopping_leaves_no_gradient_behind(make_model):
    """A minibatch that target_kl stops was already backpropagated in micro-batches: its gradient is dropped."""
    stop = dict(target_kl=1e-12, batch_size=16, n_aux_epochs=0, n_policy_iters=1)
    model = train(make_model, 5, **stop)
    # Each of the 2 policy phases stopped in its first epoch (of 2), before its second minibatch's step
    assert model._n_updates == 2
    assert all(parameter.grad is None for parameter in model.policy.parameters())
    # The same stop without micro-batches: the same parameters
    whole = train(make_model, None, **stop)
    for a, b in zip(whole.policy.parameters(), model.policy.parameters(), strict=True):
        th.testing.assert_close(a, b, **FLOAT64_TOLERANCE)


def test_split_minibatch_views_and_shares():
    observations = {"image": th.arange(10 * 3).reshape(10, 3), "vector": th.arange(10.0)}
    batch = AuxiliaryBufferSamples(observations, th.arange(10.0), th.ones(10, 2), np.array([4, 7]))
    parts = split_minibatch(batch, 4)
    assert [share for _, share in parts] == [0.4, 0.4, 0.2]
    assert [len(part.returns) for part, _ in parts] == [4, 4, 2]
    last = parts[-1][0]
    th.testing.assert_close(last.observations["image"], observations["image"][8:])
    assert last.observations["image"].data_ptr() == observations["image"][8:].data_ptr()  # a view, not a copy
    assert last.rollout_indices is batch.rollout_indices  # one per rollout: not cut
    assert split_minibatch(batch, None) == [(batch, 1.0)] and split_minibatch(batch, 10) == [(batch, 1.0)]
    samples = RolloutBufferSamples(*(th.arange(6.0) for _ in RolloutBufferSamples._fields))
    assert [part.advantages.tolist() for part, _ in split_minibatch(samples, 4)] == [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0]]
    assert [len(part) for part in split_observations(th.zeros(7, 2), 3)] == [3, 3, 1]


@pytest.mark.parametrize("value", [0, -4, 2.5, "64"])
def test_invalid_micro_batch_size(value):
    with pytest.raises(ValueError, match="micro_batch_size must be"):
        PPG("MlpPolicy", "CartPole-v1", micro_batch_size=value)


@pytest.mark.parametrize("value", [2.5, "64", "none"])
def test_micro_batch_size_type_error_names_the_valid_values(value):
    with pytest.raises(ValueError, match="micro_batch_size must be an integer >= 1, 'auto' or None"):
        PPG("MlpPolicy", "CartPole-v1", micro_batch_size=value)


def test_auto_micro_batch_size():
    """ "auto" (the default) splits the minibatches of a convolutional policy on a CPU only."""
    assert PPG("MlpPolicy", "CartPole-v1")._micro_batch_size is None
    image_env = FakeImageEnv(screen_height=16, screen_width=16, n_channels=3, discrete=True)
    policy_kwargs = dict(features_extractor_kwargs=dict(channels=(4, 8)))
    cnn = PPG("ProcgenCnn", image_env, policy_kwargs=policy_kwargs, device="cpu")
    assert cnn.micro_batch_size == "auto" and cnn._micro_batch_size == AUTO_CPU_MICRO_BATCH_SIZE == 256
    assert PPG("ProcgenCnn", image_env, policy_kwargs=policy_kwargs, micro_batch_size=None)._micro_batch_size is None
    assert resolve_micro_batch_size("auto", "cuda", convolutional=True) is None
    assert resolve_micro_batch_size(64, "cuda", convolutional=True) == 64
