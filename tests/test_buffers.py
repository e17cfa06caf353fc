"""AuxiliaryBuffer: layout (whole per-env rollouts), dtype and memory, shuffling, old-policy storage."""

import copy
import json

import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from helpers import assert_same_samples
from stable_baselines3.common.buffers import DictRolloutBuffer, RolloutBuffer
from stable_baselines3.common.utils import ConstantSchedule

from sb3_ppg.common.aux_buffer import AuxiliaryBuffer
from sb3_ppg.common.cuda.device_data import device_minibatches, gathers_on_device
from sb3_ppg.common.distributions import get_distribution_params
from sb3_ppg.common.rollout_buffers import env_minibatches
from sb3_ppg.ppg.policies import PPGPolicy

N_STEPS, N_ENVS = 8, 3
# Observation pixel (0, 0, 0) encodes the step, pixel (1, 0, 0) the env, pixel (2, 0, 0) the iteration
IMAGE_SPACE = spaces.Box(0, 255, (3, 4, 4), np.uint8)
ACTION_SPACE = spaces.Discrete(3)


def filled_rollout_buffer(iteration: int, observation_space: spaces.Space = IMAGE_SPACE) -> RolloutBuffer:
    buffer_class = DictRolloutBuffer if isinstance(observation_space, spaces.Dict) else RolloutBuffer
    buffer = buffer_class(N_STEPS, observation_space, ACTION_SPACE, device="cpu", n_envs=N_ENVS)
    for step in range(N_STEPS):
        image = np.zeros((N_ENVS, *IMAGE_SPACE.shape), dtype=np.uint8)
        image[:, 0, 0, 0] = step
        image[:, 1, 0, 0] = np.arange(N_ENVS)
        image[:, 2, 0, 0] = iteration
        obs = {"image": image, "vector": image[:, :, 0, 0].astype(np.float32)} if buffer_class is DictRolloutBuffer else image
        buffer.add(
            obs,
            np.zeros((N_ENVS, 1)),
            np.zeros(N_ENVS, dtype=np.float32),
            np.zeros(N_ENVS, dtype=np.float32),
            th.zeros(N_ENVS),
            th.zeros(N_ENVS),
        )
    buffer.compute_returns_and_advantage(th.zeros(N_ENVS), np.zeros(N_ENVS))
    # Encode (iteration, env, step) in the returns too
    buffer.returns[:] = iteration * 1000 + np.arange(N_ENVS)[None, :] * 100 + np.arange(N_STEPS)[:, None]
    return buffer


def make_aux_buffer(n_policy_iters: int = 2, observation_space: spaces.Space = IMAGE_SPACE) -> AuxiliaryBuffer:
    return AuxiliaryBuffer(n_policy_iters, N_STEPS, N_ENVS, observation_space, ACTION_SPACE, device="cpu")


@pytest.mark.parametrize("flattened", [False, True])
def test_rows_are_whole_per_env_rollouts(flattened):
    aux_buffer = make_aux_buffer()
    for iteration in range(2):
        rollout_buffer = filled_rollout_buffer(iteration)
        if flattened:
            # SB3's get() flattens the arrays in place, env-major
            next(rollout_buffer.get(4))
            assert rollout_buffer.generator_ready
        aux_buffer.add(rollout_buffer)
    assert aux_buffer.full() and aux_buffer.n_iterations == 2 and aux_buffer.n_rollouts == 2 * N_ENVS
    for row in range(2 * N_ENVS):
        iteration, env = divmod(row, N_ENVS)
        obs = aux_buffer.observations[row].numpy()
        np.testing.assert_array_equal(obs[:, 0, 0, 0], np.arange(N_STEPS))
        assert np.all(obs[:, 1, 0, 0] == env) and np.all(obs[:, 2, 0, 0] == iteration)
        np.testing.assert_array_equal(aux_buffer.returns[row].numpy(), iteration * 1000 + env * 100 + np.arange(N_STEPS))


def test_observations_keep_uint8_and_memory_is_raw_bytes():
    aux_buffer = make_aux_buffer(n_policy_iters=4)
    assert aux_buffer.observations.dtype == th.uint8
    n_frames = 4 * N_ENVS * N_STEPS
    obs_bytes = n_frames * int(np.prod(IMAGE_SPACE.shape))
    per_step_bytes = n_frames * 4 * (1 + ACTION_SPACE.n)  # float32 return + old logits
    assert aux_buffer.nbytes == obs_bytes + per_step_bytes


def test_minibatches_are_shuffled_whole_rollouts():
    aux_buffer = make_aux_buffer(n_policy_iters=4)
    for iteration in range(4):
        aux_buffer.add(filled_rollout_buffer(iteration))
    seen = []
    generator = np.random.default_rng(0)
    batches = list(aux_buffer.get(batch_rollouts=5, generator=generator))
    assert [len(b.rollout_indices) for b in batches] == [5, 5, 2]
    for batch in batches:
        obs = batch.observations.reshape(len(batch.rollout_indices), N_STEPS, *IMAGE_SPACE.shape)
        for k, row in enumerate(batch.rollout_indices):
            iteration, env = divmod(int(row), N_ENVS)
            # Each rollout: one env, one iteration, N_STEPS consecutive steps
            assert th.equal(obs[k, :, 0, 0, 0], th.arange(N_STEPS, dtype=th.uint8))
            assert th.all(obs[k, :, 1, 0, 0] == env) and th.all(obs[k, :, 2, 0, 0] == iteration)
        expected_returns = np.concatenate([aux_buffer.returns[row].numpy() for row in batch.rollout_indices])
        np.testing.assert_array_equal(batch.returns.numpy(), expected_returns)
        assert batch.old_distribution_params.shape == (len(batch.rollout_indices) * N_STEPS, ACTION_SPACE.n)
        seen.extend(batch.rollout_indices.tolist())
    # Every rollout exactly once per epoch, in shuffled order mixing iterations
    assert sorted(seen) == list(range(4 * N_ENVS))
    assert seen != sorted(seen)
    assert len({row // N_ENVS for row in seen[:5]}) > 1


def test_add_when_full_and_mismatched_buffers_raise():
    aux_buffer = make_aux_buffer(n_policy_iters=1)
    aux_buffer.add(filled_rollout_buffer(0))
    with pytest.raises(RuntimeError, match="full"):
        aux_buffer.add(filled_rollout_buffer(1))
    aux_buffer.reset()
    assert aux_buffer.n_rollouts == 0 and not aux_buffer.full()
    other = AuxiliaryBuffer(1, N_STEPS + 1, N_ENVS, IMAGE_SPACE, ACTION_SPACE, device="cpu")
    with pytest.raises(ValueError, match="does not fit"):
        other.add(filled_rollout_buffer(0))


def test_rollout_chunks_and_old_distribution_params():
    """The old-policy pass reads the stored rollouts in order, in chunks, and stores parameters back row by row."""
    aux_buffer = make_aux_buffer()
    aux_buffer.add(filled_rollout_buffer(0))
    policy = PPGPolicy(IMAGE_SPACE, ACTION_SPACE, ConstantSchedule(1e-3), net_arch=[8])
    chunks = list(aux_buffer.iter_rollout_chunks(batch_rollouts=2))
    assert [rows for rows, _ in chunks] == [slice(0, 2), slice(2, 3)]  # only the filled rows
    for rows, obs in chunks:
        np.testing.assert_array_equal(obs.numpy(), aux_buffer.observations[rows].reshape(-1, *IMAGE_SPACE.shape).numpy())
        with th.no_grad():
            aux_buffer.store_old_distribution_params(rows, get_distribution_params(policy.get_distribution(obs)))
    obs = aux_buffer.observations[:N_ENVS].reshape(-1, *IMAGE_SPACE.shape)
    with th.no_grad():
        expected = get_distribution_params(policy.get_distribution(obs)).numpy().reshape(N_ENVS, N_STEPS, -1)
    np.testing.assert_allclose(aux_buffer.old_distribution_params[:N_ENVS].numpy(), expected, rtol=1e-5, atol=1e-6)
    # Rows not filled yet are left alone
    assert th.all(aux_buffer.old_distribution_params[N_ENVS:] == 0)


def test_dict_observations():
    dict_space = spaces.Dict({"image": IMAGE_SPACE, "vector": spaces.Box(-10, 300, (3,), np.float32)})
    aux_buffer = make_aux_buffer(observation_space=dict_space)
    aux_buffer.add(filled_rollout_buffer(0, dict_space))
    aux_buffer.add(filled_rollout_buffer(1, dict_space))
    assert aux_buffer.observations["image"].dtype == th.uint8
    assert aux_buffer.observations["vector"].dtype == th.float32
    batch = next(aux_buffer.get(batch_rollouts=2))
    assert set(batch.observations) == {"image", "vector"}
    assert batch.observations["image"].shape == (2 * N_STEPS, *IMAGE_SPACE.shape)
    rows = batch.rollout_indices
    expected_vector = aux_buffer.observations["vector"][rows].reshape(-1, 3).numpy()
    np.testing.assert_array_equal(batch.observations["vector"].numpy(), expected_vector)


@pytest.mark.parametrize(
    "observation_space, action_space",
    [
        (IMAGE_SPACE, ACTION_SPACE),
        (spaces.Dict({"image": IMAGE_SPACE, "vector": spaces.Box(-np.inf, np.inf, (3,), np.float32)}), ACTION_SPACE),
        (IMAGE_SPACE, spaces.Box(np.array([-1.0, -2.0], np.float32), np.array([1.0, np.inf], np.float32), dtype=np.float32)),
        (IMAGE_SPACE, spaces.MultiDiscrete([3, 4])),
        (IMAGE_SPACE, spaces.MultiBinary(3)),
    ],
)
def test_save_load_plain_arrays(tmp_path, observation_space, action_space):
    """The buffer on disk: plain arrays and JSON (spaces included), read back exactly, with a checksum per array."""
    aux_buffer = AuxiliaryBuffer(3, N_STEPS, N_ENVS, observation_space, action_space, device="cpu")
    for iteration in range(2):
        aux_buffer.add(filled_rollout_buffer(iteration, observation_space))
    normal = np.random.default_rng(0).normal(size=aux_buffer.old_distribution_params.shape)
    aux_buffer.old_distribution_params[:] = th.as_tensor(normal)
    aux_buffer.save(tmp_path / "buffer.npz")
    with np.load(tmp_path / "buffer.npz", allow_pickle=False) as archive:
        metadata = json.loads(archive["metadata.json"])
        assert metadata["pos"] == 2 * N_ENVS and metadata["n_policy_iters"] == 3 and metadata["n_envs"] == N_ENVS
        assert all(len(info["sha256"]) == 64 for info in metadata["arrays"].values())
    loaded = AuxiliaryBuffer.load(tmp_path / "buffer.npz")
    assert loaded.observation_space == observation_space and loaded.action_space == action_space
    assert loaded.pos == aux_buffer.pos and loaded.n_policy_iters == 3
    obs_keys = observation_space.spaces if isinstance(observation_space, spaces.Dict) else [None]
    for key in obs_keys:
        original = aux_buffer.observations[key] if key else aux_buffer.observations
        restored = loaded.observations[key] if key else loaded.observations
        assert restored.dtype == original.dtype
        assert th.equal(restored, original)
    assert th.equal(loaded.returns, aux_buffer.returns)
    assert th.equal(loaded.old_distribution_params[:6], aux_buffer.old_distribution_params[:6])
    loaded.check_compatible(aux_buffer, "test")
    # No temporary file left behind
    assert [path.name for path in tmp_path.iterdir()] == ["buffer.npz"]


@pytest.mark.parametrize("observation_space", [IMAGE_SPACE, spaces.Dict(image=IMAGE_SPACE, vector=spaces.Box(0, 9, (3,)))])
def test_env_minibatches_are_whole_env_rollouts_in_one_seeded_order(observation_space):
    """
    policy_minibatches="envs": one permutation of the envs per epoch from NumPy's global generator (SB3 seeds it), cut
    into groups of batch_size // n_steps envs; each minibatch holds all the steps of its envs, env by env, in order.
    """
    buffer = filled_rollout_buffer(0, observation_space)
    np.random.seed(7)
    expected_order = np.random.permutation(N_ENVS)
    np.random.seed(7)
    minibatches = list(env_minibatches(buffer, batch_size=2 * N_STEPS))
    assert buffer.generator_ready  # flattened as SB3's get() flattens it
    # 3 envs, 2 per minibatch: the last minibatch holds the remaining env (as torch.chunk makes it)
    assert [len(minibatch.returns) for minibatch in minibatches] == [2 * N_STEPS, N_STEPS]
    returns = th.cat([minibatch.returns for minibatch in minibatches]).numpy()
    expected = (expected_order[:, None] * 100 + np.arange(N_STEPS)[None, :]).reshape(-1)
    np.testing.assert_array_equal(returns, expected)
    for minibatch in minibatches:
        images = minibatch.observations["image"] if isinstance(minibatch.observations, dict) else minibatch.observations
        # The observations go with the returns: pixel (1, 0, 0) is the env, pixel (0, 0, 0) the step
        np.testing.assert_array_equal(images[:, 1, 0, 0].numpy() * 100 + images[:, 0, 0, 0].numpy(), minibatch.returns)
    # The next epoch draws the next permutation of the envs from the same generator
    next_order = np.random.permutation(N_ENVS)
    np.random.seed(7)
    np.random.permutation(N_ENVS)
    second_epoch = th.cat([minibatch.returns for minibatch in env_minibatches(buffer, batch_size=N_STEPS)]).numpy()
    np.testing.assert_array_equal(second_epoch // 100, next_order.repeat(N_STEPS))


@pytest.mark.parametrize("n_envs, n_minibatches", [(4, 2), (7, 3), (5, 2), (8, 8)])
def test_env_minibatches_split_the_envs_as_torch_chunk(n_envs, n_minibatches):
    """The paper's code cuts a permutation of the envs with torch.chunk(order, n_minibatches): chunks of
    ceil(n_envs / n_minibatches) envs, which is what batch_size = ceil(n_envs / n_minibatches) * n_steps gives."""
    n_steps = 2
    buffer = RolloutBuffer(n_steps, spaces.Box(0, 1, (1,)), ACTION_SPACE, device="cpu", n_envs=n_envs)
    buffer.returns = np.tile(np.arange(n_envs, dtype=np.float32), (n_steps, 1))  # the env of each sample
    buffer.full = True
    order = np.random.default_rng(0).permutation(n_envs)
    batch_size = -(-n_envs // n_minibatches) * n_steps
    minibatches = env_minibatches(buffer, batch_size, generator=FixedOrder(order))
    envs = [minibatch.returns[::n_steps].long().tolist() for minibatch in minibatches]
    assert envs == [chunk.tolist() for chunk in th.chunk(th.as_tensor(order), n_minibatches)]


class FixedOrder:
    """A generator whose permutation is given."""

    def __init__(self, order: np.ndarray) -> None:
        self.order = order

    def permutation(self, n: int) -> np.ndarray:
        assert n == len(self.order)
        return self.order


def test_old_distribution_params_and_returns_keep_float64():
    """A float64 model's old policy and value targets are stored in float64 (no float32 rounding); float32 as before."""
    aux_buffer = make_aux_buffer(n_policy_iters=1)
    rollout_buffer = filled_rollout_buffer(0)
    rollout_buffer.returns = rollout_buffer.returns.astype(np.float64) + 1 / 3
    aux_buffer.add(rollout_buffer)
    params = th.rand(N_ENVS * N_STEPS, aux_buffer.n_distribution_params, dtype=th.float64) / 3
    aux_buffer.store_old_distribution_params(slice(0, N_ENVS), params)
    batch = next(aux_buffer.get(N_ENVS, generator=FixedOrder(np.arange(N_ENVS))))
    assert batch.returns.dtype == batch.old_distribution_params.dtype == th.float64
    th.testing.assert_close(batch.old_distribution_params, params, rtol=0, atol=0)
    np.testing.assert_array_equal(batch.returns.numpy(), rollout_buffer.returns.swapaxes(0, 1).reshape(-1))
    # A float32 rollout after reset(): float32 arrays again
    aux_buffer.reset()
    aux_buffer.add(filled_rollout_buffer(0))
    aux_buffer.store_old_distribution_params(slice(0, N_ENVS), params.float())
    assert aux_buffer.returns.dtype == aux_buffer.old_distribution_params.dtype == th.float32


@pytest.mark.parametrize("dict_obs", [False, True])
def test_device_minibatches_are_sb3s(dict_obs):
    """The policy phase's minibatches gathered on the device are SB3's get() ones: same permutation, same samples."""
    image = spaces.Box(0, 255, (3, 4, 4), np.uint8)
    obs_space = spaces.Dict({"image": image, "vector": spaces.Box(-1, 1, (2,))}) if dict_obs else image
    action_space = spaces.MultiDiscrete([3, 2])
    buffer_class = DictRolloutBuffer if dict_obs else RolloutBuffer
    buffer = buffer_class(8, obs_space, action_space, n_envs=3)
    rng = np.random.default_rng(0)
    for _ in range(8):
        obs = {key: space.sample() for key, space in obs_space.spaces.items()} if dict_obs else image.sample()
        batch_obs = {k: np.stack([v] * 3) for k, v in obs.items()} if dict_obs else np.stack([obs] * 3)
        buffer.add(
            batch_obs,
            rng.integers(0, 2, (3, 2)),
            rng.normal(size=3),
            np.zeros(3, bool),
            th.as_tensor(rng.normal(size=3)),
            th.as_tensor(rng.normal(size=3)),
        )
    buffer.compute_returns_and_advantage(th.as_tensor(rng.normal(size=3)), np.zeros(3, bool))
    reference = copy.deepcopy(buffer)
    np.random.seed(7)
    expected = list(reference.get(5))
    np.random.seed(7)
    gathered = list(device_minibatches(buffer, 5, th.device("cpu")))
    assert len(expected) == 5
    assert_same_samples(gathered, expected)
    assert not gathers_on_device(buffer, th.device("cpu")) and gathers_on_device(buffer, th.device("cuda"))
