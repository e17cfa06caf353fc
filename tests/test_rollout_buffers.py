"""
PPG's rollout buffers (PPGRolloutBuffer, PPGDictRolloutBuffer): SB3's samples without flattening the rollout, and the
observation arrays kept from one rollout to the next.
"""

import copy

import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from helpers import assert_identical, assert_same_samples, parameters, small_ppg
from sb3_contrib.common.envs import InvalidActionEnvMultiDiscrete
from sb3_contrib.common.maskable.buffers import MaskableDictRolloutBuffer, MaskableRolloutBuffer
from stable_baselines3.common.buffers import DictRolloutBuffer, RolloutBuffer
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.logger import KVWriter, Logger
from stable_baselines3.common.utils import explained_variance
from test_cuda_graphs import requires_cuda

from sb3_ppg import MaskablePPG
from sb3_ppg.common import cuda
from sb3_ppg.common.aux_buffer import AuxiliaryBuffer
from sb3_ppg.common.cuda import device_data
from sb3_ppg.common.cuda.device_data import (
    device_env_minibatches,
    device_minibatches,
    gathers_on_device,
    rollout_to_device,
)
from sb3_ppg.common.envs import make_dict_cartpole
from sb3_ppg.common.rollout_buffers import (
    DeviceRollout,
    PPGDictRolloutBuffer,
    PPGRolloutBuffer,
    env_minibatches,
    flatten_rollout_buffer,
    rollout_explained_variance,
)
from sb3_ppg.ppg_mask.buffers import MaskablePPGDictRolloutBuffer, MaskablePPGRolloutBuffer

N_STEPS, N_ENVS = 6, 4
IMAGE = spaces.Box(0, 255, (3, 4, 4), np.uint8)
DICT_SPACE = spaces.Dict({"image": IMAGE, "vector": spaces.Box(-1, 1, (2,))})
ACTIONS = spaces.MultiDiscrete([3, 2])


def fill(buffer: RolloutBuffer, seed: int = 0) -> RolloutBuffer:
    """Fill a rollout buffer with random steps (the same for the same seed), returns and advantages computed."""
    rng = np.random.default_rng(seed)
    buffer.reset()
    for _ in range(N_STEPS):
        if isinstance(buffer.observation_space, spaces.Dict):
            obs = {key: np.stack([space.sample() for _ in range(N_ENVS)]) for key, space in DICT_SPACE.spaces.items()}
        else:
            obs = rng.integers(0, 256, (N_ENVS, *IMAGE.shape), dtype=np.uint8)
        # A mask per action of each sub-space (sb3-contrib's maskable buffers)
        masks = dict(action_masks=rng.random((N_ENVS, 5)) < 0.7) if hasattr(buffer, "action_masks") else {}
        buffer.add(
            obs,
            rng.integers(0, 2, (N_ENVS, 2)),
            rng.normal(size=N_ENVS).astype(np.float32),
            rng.random(N_ENVS) < 0.2,
            th.as_tensor(rng.normal(size=N_ENVS), dtype=th.float32),
            th.as_tensor(rng.normal(size=N_ENVS), dtype=th.float32),
            **masks,
        )
    buffer.compute_returns_and_advantage(th.as_tensor(rng.normal(size=N_ENVS), dtype=th.float32), rng.random(N_ENVS) < 0.2)
    return buffer


#: (SB3's or sb3-contrib's buffer, PPG's with the same samples) for plain and Dict observations, without and with masks
BUFFER_CLASSES = {
    (False, False): (RolloutBuffer, PPGRolloutBuffer),
    (True, False): (DictRolloutBuffer, PPGDictRolloutBuffer),
    (False, True): (MaskableRolloutBuffer, MaskablePPGRolloutBuffer),
    (True, True): (MaskableDictRolloutBuffer, MaskablePPGDictRolloutBuffer),
}


def buffer_pair(dict_obs: bool, masks: bool = False) -> tuple[RolloutBuffer, RolloutBuffer]:
    """SB3's (or sb3-contrib's) buffer and PPG's, filled with the same steps."""
    space = DICT_SPACE if dict_obs else IMAGE
    pair = []
    for buffer_class in BUFFER_CLASSES[dict_obs, masks]:
        DICT_SPACE.seed(1)
        pair.append(fill(buffer_class(N_STEPS, space, ACTIONS, device="cpu", n_envs=N_ENVS)))
    return pair[0], pair[1]


@pytest.mark.parametrize("dict_obs, masks", list(BUFFER_CLASSES))
def test_get_is_sb3s_without_flattening(dict_obs, masks):
    sb3, ppg = buffer_pair(dict_obs, masks)
    for batch_size in (5, None):  # two epochs, SB3's arrays flattened by the first
        np.random.seed(3)
        expected = list(sb3.get(batch_size))
        np.random.seed(3)
        assert_same_samples(list(ppg.get(batch_size)), expected)
    assert sb3.generator_ready and not ppg.generator_ready
    assert (ppg.observations["image"] if dict_obs else ppg.observations).shape[:2] == (N_STEPS, N_ENVS)
    # Flat indices (env * n_steps + step) give the same samples flattened or not
    indices = np.array([0, 7, 23, 5, 12])
    unflattened = ppg._get_samples(indices)
    flatten_rollout_buffer(ppg)
    assert_same_samples([unflattened], [sb3._get_samples(indices)])
    assert_same_samples([ppg._get_samples(indices)], [sb3._get_samples(indices)])


@pytest.mark.parametrize("dict_obs, masks", list(BUFFER_CLASSES))
@pytest.mark.parametrize("batch_size", [N_STEPS, 2 * N_STEPS, 3 * N_STEPS - 1])
def test_env_minibatches_are_the_same_from_ppgs_buffer_and_on_the_device(dict_obs, masks, batch_size):
    sb3, ppg = buffer_pair(dict_obs, masks)
    expected = list(env_minibatches(sb3, batch_size, generator=np.random.default_rng(5)))
    assert_same_samples(list(env_minibatches(ppg, batch_size, generator=np.random.default_rng(5))), expected)
    assert not ppg.generator_ready  # gathered without flattening
    if masks:
        return  # MaskablePPG gathers on the host (device_minibatches makes SB3's samples, without masks)
    on_device = device_env_minibatches(ppg, batch_size, th.device("cpu"), generator=np.random.default_rng(5))
    assert_same_samples(list(on_device), expected)


@pytest.mark.parametrize("dict_obs", [False, True])
def test_device_minibatches_from_ppgs_buffer_are_sb3s(dict_obs):
    sb3, ppg = buffer_pair(dict_obs)
    np.random.seed(11)
    expected = list(sb3.get(7))
    np.random.seed(11)
    assert_same_samples(list(device_minibatches(ppg, 7, th.device("cpu"))), expected)
    # A flattened buffer (SB3's, after its get()) gives them too
    np.random.seed(11)
    assert_same_samples(list(device_minibatches(sb3, 7, th.device("cpu"))), expected)
    assert gathers_on_device(ppg, th.device("cuda")) and not gathers_on_device(ppg, th.device("cpu"))


@pytest.mark.parametrize("dict_obs, masks", list(BUFFER_CLASSES))
def test_reset_keeps_the_observation_arrays_zeroed(dict_obs, masks):
    _, ppg = buffer_pair(dict_obs, masks)
    arrays = dict(ppg.observations) if dict_obs else {"": ppg.observations}
    assert any(array.any() for array in arrays.values())
    flatten_rollout_buffer(ppg)  # as SB3's get() or a test's replay may: the kept arrays still come back
    ppg.reset()
    again = dict(ppg.observations) if dict_obs else {"": ppg.observations}
    for key, array in arrays.items():
        assert again[key] is array and not array.any() and array.shape[:2] == (N_STEPS, N_ENVS)
    assert not ppg.generator_ready and ppg.pos == 0 and not ppg.full
    # The other arrays are SB3's new zeros (and sb3-contrib's masks ones)
    assert not ppg.values.any() and not ppg.advantages.any() and not ppg.actions.any()
    assert not masks or ppg.action_masks.all()
    # Filled again, it holds what was added, as SB3's new arrays do
    DICT_SPACE.seed(2)
    fill(ppg, seed=9)
    DICT_SPACE.seed(2)
    sb3 = fill(
        BUFFER_CLASSES[dict_obs, masks][0](N_STEPS, ppg.observation_space, ACTIONS, device="cpu", n_envs=N_ENVS), seed=9
    )
    for key, array in arrays.items():
        assert (again[key] is array) and np.array_equal(array, sb3.observations[key] if dict_obs else sb3.observations)


@pytest.mark.parametrize("dict_obs", [False, True])
def test_scalar_observations_are_sampled_as_sb3s(dict_obs):
    """A Box of shape () is sampled as (B, 1), as SB3's flattening makes it, on the host and on the device."""
    scalar = spaces.Box(-1, 1, (), np.float32)
    space = spaces.Dict({"x": scalar, "image": IMAGE}) if dict_obs else scalar
    buffers = []
    for buffer_class in (DictRolloutBuffer, PPGDictRolloutBuffer) if dict_obs else (RolloutBuffer, PPGRolloutBuffer):
        space.seed(4)
        buffer = buffer_class(N_STEPS, space, ACTIONS, device="cpu", n_envs=N_ENVS)
        for _ in range(N_STEPS):
            samples = [space.sample() for _ in range(N_ENVS)]
            obs = (
                {key: np.stack([sample[key] for sample in samples]) for key in space.spaces} if dict_obs else np.stack(samples)
            )
            buffer.add(obs, np.ones((N_ENVS, 2)), np.ones(N_ENVS), np.zeros(N_ENVS), th.ones(N_ENVS), th.ones(N_ENVS))
        buffer.compute_returns_and_advantage(th.zeros(N_ENVS), np.zeros(N_ENVS))
        buffers.append(buffer)
    sb3, ppg = buffers
    np.random.seed(0)
    expected = list(sb3.get(7))
    assert (expected[0].observations["x"] if dict_obs else expected[0].observations).shape == (7, 1)
    for gathered in (lambda: ppg.get(7), lambda: device_minibatches(ppg, 7, th.device("cpu"))):
        np.random.seed(0)
        assert_same_samples(list(gathered()), expected)
    expected = list(env_minibatches(sb3, N_STEPS, generator=np.random.default_rng(1)))
    assert_same_samples(list(env_minibatches(ppg, N_STEPS, generator=np.random.default_rng(1))), expected)
    on_device = device_env_minibatches(ppg, N_STEPS, th.device("cpu"), generator=np.random.default_rng(1))
    assert_same_samples(list(on_device), expected)


#: Observation and action spaces whose steps SB3's add() reshapes or casts: (observation space, action space, n_envs)
ADD_CASES = {
    "image, MultiDiscrete": (IMAGE, ACTIONS, N_ENVS),
    "Discrete obs, Box actions": (spaces.Discrete(5), spaces.Box(-1, 1, (3,), np.float32), N_ENVS),
    "scalar Box obs, Discrete actions": (spaces.Box(-1, 1, (), np.float32), spaces.Discrete(4), N_ENVS),
    "float64 obs, one env": (spaces.Box(-1, 1, (2, 3), np.float64), spaces.Discrete(4), 1),
    "Dict with Discrete": (spaces.Dict({"d": spaces.Discrete(3), "image": IMAGE}), ACTIONS, N_ENVS),
    "image, MultiBinary": (IMAGE, spaces.MultiBinary(2), N_ENVS),
}


#: The cases with masks too where sb3-contrib's masks apply (Discrete and MultiDiscrete actions)
ADD_CASES_MASKS = [
    (case, masks)
    for case, (_, action_space, _) in ADD_CASES.items()
    for masks in (False, True)
    if not masks or isinstance(action_space, (spaces.Discrete, spaces.MultiDiscrete))
]


@pytest.mark.parametrize("case, masks", ADD_CASES_MASKS)
def test_add_writes_what_sb3s_add_writes(case, masks):
    """
    PPG's add() (each value copied once), and its two parts (add_before_step(), add_after_step(): PPG's rollout), leave
    every array as SB3's (sb3-contrib's) add() does: values, dtypes and shapes, for reshaped Discrete observations, a
    0-d log-probability, float64 values, values of shape (n_envs,) or (n_envs, 1), a step without masks; what was
    added is not aliased.
    """
    space, action_space, n_envs = ADD_CASES[case]
    dict_obs = isinstance(space, spaces.Dict)
    buffer_classes = [*BUFFER_CLASSES[dict_obs, masks], BUFFER_CLASSES[dict_obs, masks][1]]
    buffers = [buffer_class(N_STEPS, space, action_space, device="cpu", n_envs=n_envs) for buffer_class in buffer_classes]
    mask_dims = buffers[0].mask_dims if masks else 0
    rng = np.random.default_rng(7)
    steps = []
    for step_index in range(N_STEPS):
        space.seed(int(rng.integers(1000)))
        samples = [space.sample() for _ in range(n_envs)]
        obs = {key: np.stack([sample[key] for sample in samples]) for key in space.spaces} if dict_obs else np.stack(samples)
        actions = np.stack([action_space.sample() for _ in range(n_envs)])
        # n_envs 1: a 0-d log-probability (SB3 reshapes it) and values in float64; values of shape (n_envs, 1), and
        # (n_envs,) every other step
        log_prob = th.tensor(rng.normal()) if n_envs == 1 else th.as_tensor(rng.normal(size=n_envs), dtype=th.float32)
        value_shape = (n_envs, 1) if step_index % 2 == 0 else (n_envs,)
        value = th.as_tensor(rng.normal(size=value_shape), dtype=th.float64 if n_envs == 1 else th.float32)
        # One step without masks (its rows stay all valid)
        extra = dict(action_masks=rng.random((n_envs, mask_dims)) < 0.6) if masks and step_index != 2 else {}
        rewards, episode_starts = rng.normal(size=n_envs).astype(np.float32), rng.random(n_envs) < 0.3
        steps.append((obs, actions, rewards, episode_starts, value, log_prob, extra))
    sb3, ppg, two_parts = buffers
    for (obs, actions, rewards, episode_starts, value, log_prob), extra in ((step[:6], step[6]) for step in steps):
        for buffer in (sb3, ppg):
            buffer.add(obs, actions, rewards, episode_starts, value, log_prob, **extra)
        two_parts.add_before_step(obs, actions, episode_starts, value, log_prob, **extra)
        two_parts.add_after_step(rewards)
    names = ["actions", "rewards", "episode_starts", "values", "log_probs", *(["action_masks"] if masks else [])]
    arrays = [(getattr(sb3, name), getattr(mine, name)) for mine in (ppg, two_parts) for name in names]
    for mine in (ppg, two_parts):
        arrays += [(sb3.observations[key], mine.observations[key]) for key in sb3.observations] if dict_obs else []
        arrays += [] if dict_obs else [(sb3.observations, mine.observations)]
    for expected, mine in arrays:
        assert mine.dtype == expected.dtype and mine.shape == expected.shape
        np.testing.assert_array_equal(mine, expected)
    assert ppg.full and two_parts.full and ppg.pos == two_parts.pos == sb3.pos == N_STEPS
    # The arrays hold copies: what was added can change afterwards
    for *step, extra in steps:
        for added in [*(step[0].values() if dict_obs else [step[0]]), *step[1:], *extra.values()]:
            if added.dtype in (np.bool_, th.bool):
                added ^= True
            else:
                added += 1
    for expected, mine in arrays:
        np.testing.assert_array_equal(mine, expected)


def test_explained_variance_in_sb3s_order():
    """The logged explained variance sums in SB3's flattened order (64 x 8 float32 values: another order, other bits)."""
    rng = np.random.default_rng(2)  # values whose sums differ in the last bits in the two orders
    sb3 = RolloutBuffer(64, IMAGE, ACTIONS, device="cpu", n_envs=8)
    sb3.values = rng.normal(size=(64, 8)).astype(np.float32)
    sb3.returns = (sb3.values + rng.normal(size=(64, 8))).astype(np.float32)
    step_major = explained_variance(sb3.values.flatten(), sb3.returns.flatten())
    unflattened = rollout_explained_variance(sb3)
    flatten_rollout_buffer(sb3)
    assert unflattened == rollout_explained_variance(sb3) == explained_variance(sb3.values.flatten(), sb3.returns.flatten())
    assert step_major != unflattened  # the order matters for these values


def test_deepcopy_keeps_one_array():
    _, ppg = buffer_pair(False)
    clone = copy.deepcopy(ppg)
    assert clone._kept_observations is clone.observations and clone.observations is not ppg.observations
    clone.reset()
    assert ppg.observations.any() and not clone.observations.any()


@pytest.mark.parametrize("storage", ["host", "pinned", "device"])
@pytest.mark.parametrize("dict_obs", [False, True])
def test_aux_buffer_adds_the_same_rows_flattened_or_not(storage, dict_obs):
    sb3, ppg = buffer_pair(dict_obs)
    flatten_rollout_buffer(sb3)
    space = DICT_SPACE if dict_obs else IMAGE
    buffers = [AuxiliaryBuffer(1, N_STEPS, N_ENVS, space, ACTIONS, device="cpu", storage=storage) for _ in range(2)]
    buffers[0].add(sb3)
    buffers[1].add(ppg)
    for name, array in buffers[0].iteration_arrays(0).items():
        np.testing.assert_array_equal(buffers[1].iteration_arrays(0)[name], array, err_msg=name)


def snapshot(device_rollout: DeviceRollout) -> DeviceRollout:
    """A rollout copied as a device copies it: apart from the host arrays (on the CPU ``rollout_to_device`` views them)."""
    observations = device_rollout.observations
    if isinstance(observations, dict):
        observations = {key: value.clone() for key, value in observations.items()}
    else:
        observations = observations.clone()
    return DeviceRollout(observations, [field.clone() for field in device_rollout.fields], device_rollout.step_major)


@pytest.mark.parametrize("storage", ["host", "pinned", "device"])
@pytest.mark.parametrize("dict_obs", [False, True])
def test_aux_buffer_adds_the_same_rows_from_the_device_rollout(storage, dict_obs):
    """
    Given the rollout already copied to its device (train()'s on CUDA), a buffer stored on that device takes the
    observations and value targets from that copy (the same rows), flattened or not; others copy from the host.
    """
    sb3, ppg = buffer_pair(dict_obs)
    flatten_rollout_buffer(sb3)
    space = DICT_SPACE if dict_obs else IMAGE
    expected = AuxiliaryBuffer(1, N_STEPS, N_ENVS, space, ACTIONS, device="cpu", storage="host")
    expected.add(ppg)
    for rollout in (ppg, sb3):
        device_rollout = snapshot(rollout_to_device(rollout, th.device("cpu")))
        assert device_rollout.step_major is (rollout is ppg)
        aux = AuxiliaryBuffer(1, N_STEPS, N_ENVS, space, ACTIONS, device="cpu", storage=storage)
        aux.add(rollout, device_rollout)
        for name, array in expected.iteration_arrays(0).items():
            np.testing.assert_array_equal(aux.iteration_arrays(0)[name], array, err_msg=name)
        # Which copy was read: the device one for a buffer on the device, the host one otherwise
        device_rollout.returns.add_(1.0)
        for tensor in device_rollout.observations.values() if dict_obs else [device_rollout.observations]:
            tensor.add_(1)
        aux.reset()
        aux.add(rollout, device_rollout)
        shift = 1 if storage == "device" else 0
        for name, array in expected.iteration_arrays(0).items():
            if name == "old_distribution_params":  # not from the rollout
                continue
            np.testing.assert_array_equal(aux.iteration_arrays(0)[name], array + np.array(shift, array.dtype), err_msg=name)


def test_another_rollouts_device_copy_is_refused():
    _, ppg = buffer_pair(False)
    other = PPGRolloutBuffer(N_STEPS - 1, IMAGE, ACTIONS, device="cpu", n_envs=N_ENVS)
    other.full = True
    aux = AuxiliaryBuffer(1, N_STEPS, N_ENVS, IMAGE, ACTIONS, device="cpu", storage="device")
    other_copy = rollout_to_device(other, th.device("cpu"))
    with pytest.raises(ValueError, match="device copy of the rollout holds 20 steps, not the rollout buffer's 6 x 4"):
        aux.add(ppg, other_copy)
    assert aux.pos == 0
    with pytest.raises(ValueError, match="device copy of the rollout holds 20 steps"):
        next(device_minibatches(ppg, 7, th.device("cpu"), device_rollout=other_copy))


@pytest.mark.parametrize("dict_obs", [False, True])
def test_device_minibatches_from_one_device_rollout(dict_obs):
    """Every epoch gathers from the same copy of the rollout: the samples of a copy per epoch, the same permutations."""
    sb3, ppg = buffer_pair(dict_obs)
    device_rollout = rollout_to_device(ppg, th.device("cpu"))
    for order in (None, np.random.default_rng(0).permutation(N_STEPS * N_ENVS)):
        np.random.seed(5)
        expected = [list(device_minibatches(ppg, 7, th.device("cpu"), order)) for _ in range(2)]
        np.random.seed(5)
        gathered = [list(device_minibatches(ppg, 7, th.device("cpu"), order, device_rollout)) for _ in range(2)]
        for epoch, expected_epoch in zip(gathered, expected, strict=True):
            assert_same_samples(epoch, expected_epoch)
    np.random.seed(5)
    expected = list(sb3.get(7))
    np.random.seed(5)
    assert_same_samples(list(device_minibatches(ppg, 7, th.device("cpu"), device_rollout=device_rollout)), expected)
    expected = list(env_minibatches(ppg, N_STEPS, generator=np.random.default_rng(2)))
    from_copy = device_env_minibatches(ppg, N_STEPS, th.device("cpu"), np.random.default_rng(2), device_rollout)
    assert_same_samples(list(from_copy), expected)


def test_maskable_aux_buffer_adds_masks_unflattened():
    action_space = spaces.Discrete(3)
    rollout = MaskableRolloutBuffer(N_STEPS, IMAGE, action_space, device="cpu", n_envs=N_ENVS)
    rng = np.random.default_rng(0)
    masks = rng.random((N_STEPS, N_ENVS, 3)) < 0.5
    for step in range(N_STEPS):
        obs = rng.integers(0, 256, (N_ENVS, *IMAGE.shape), dtype=np.uint8)
        rollout.add(obs, np.zeros((N_ENVS, 1)), np.zeros(N_ENVS), np.zeros(N_ENVS), th.zeros(N_ENVS), th.zeros(N_ENVS),
                    action_masks=masks[step])  # fmt: skip
    rollout.compute_returns_and_advantage(th.zeros(N_ENVS), np.zeros(N_ENVS))
    for storage in ("host", "device"):
        aux = AuxiliaryBuffer(1, N_STEPS, N_ENVS, IMAGE, action_space, device="cpu", storage=storage, mask_dims=3)
        aux.add(rollout)
        np.testing.assert_array_equal(aux.iteration_arrays(0)["action_masks"], masks.swapaxes(0, 1))


class LoggedValues(KVWriter):
    """The values of every log dump, without the timings."""

    def __init__(self) -> None:
        self.dumps: list[dict] = []

    def write(self, key_values: dict, key_excluded: dict, step: int = 0) -> None:
        self.dumps.append({key: value for key, value in key_values.items() if not key.startswith("time/")})


def test_ppg_uses_its_buffers():
    assert type(small_ppg().rollout_buffer) is PPGRolloutBuffer
    dict_env = make_vec_env(make_dict_cartpole, n_envs=2, seed=0)
    assert type(small_ppg(dict_env, policy="MultiInputPolicy").rollout_buffer) is PPGDictRolloutBuffer
    assert type(small_ppg(rollout_buffer_class=RolloutBuffer).rollout_buffer) is RolloutBuffer
    assert type(MaskablePPG("MlpPolicy", small_ppg().env, n_steps=16).rollout_buffer) is MaskablePPGRolloutBuffer


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=requires_cuda)])
def test_ppg_trains_as_with_sb3s_buffer(device, monkeypatch):
    """
    PPG's default buffers make the updates (and the logs) of SB3's, bit for bit, with both kinds of minibatches: SB3's
    buffer gathering on the host as SB3 does (its get() flattens, its _get_samples copies), PPG's as PPG does (on CUDA
    on the device, from the unflattened arrays).
    """
    for minibatches in ("transitions", "envs"):
        runs = []
        for buffer_class in (None, RolloutBuffer):
            model = small_ppg(
                n_envs=4, batch_size=32, policy_minibatches=minibatches, rollout_buffer_class=buffer_class, device=device
            )
            on_device = buffer_class is None and device == "cuda"
            monkeypatch.setattr(cuda, "gathers_on_device", lambda rollout_buffer, device, on=on_device: on)
            logged = LoggedValues()
            model.set_logger(Logger(None, [logged]))
            model.learn(4 * 16 * 3, log_interval=1)
            runs.append((parameters(model), logged.dumps))
        assert_identical(runs[0][0], runs[1][0])
        assert len(runs[0][1]) == 3 and runs[0][1] == runs[1][1]
        # SB3 dumps the logs before train(): the dumps after the first hold the previous iteration's train/ values
        assert sum("train/explained_variance" in dump for dump in runs[0][1]) == 2


@pytest.mark.parametrize("minibatches", ["transitions", "envs"])
def test_train_copies_the_rollout_to_the_device_once(monkeypatch, minibatches):
    """
    Gathering on the device (CUDA's path, run here on the CPU), train() copies the rollout there once for all the
    policy phase's epochs and the auxiliary buffer's add, and drops the copy after: the updates of the host path.
    """
    runs = []
    copy_rollout = device_data.rollout_to_device
    for on_device in (False, True):
        copies, added, at_aux_phase = [], [], []

        def recorded_copy(*args, copies=copies):
            """The copy as a device makes it: a snapshot of the host arrays (on the CPU the copy is a view)."""
            copies.append(snapshot(copy_rollout(*args)))
            return copies[-1]

        monkeypatch.setattr(cuda, "gathers_on_device", lambda rollout_buffer, device, on=on_device: on)
        monkeypatch.setattr(cuda, "rollout_to_device", recorded_copy)  # train()'s copy
        monkeypatch.setattr(device_data, "rollout_to_device", recorded_copy)  # an epoch's own copy
        model = small_ppg(n_envs=4, batch_size=32, n_epochs=2, policy_minibatches=minibatches, aux_buffer_device="device")
        add, aux_phase = model.aux_buffer.add, model._aux_phase

        def recorded_add(rollout_buffer, device_rollout=None, add=add, added=added):
            added.append(device_rollout)
            add(rollout_buffer, device_rollout)

        def recorded_aux_phase(aux_phase=aux_phase, at_aux_phase=at_aux_phase, model=model):
            at_aux_phase.append(model._device_rollout)
            aux_phase()

        monkeypatch.setattr(model.aux_buffer, "add", recorded_add)
        monkeypatch.setattr(model, "_aux_phase", recorded_aux_phase)
        model.learn(4 * 16 * 3)
        assert model.n_aux_phases == 1 and model._device_rollout is None
        assert len(added) == 3 and at_aux_phase == [None]  # the copy dropped before the auxiliary phase
        if on_device:  # one copy per train(), the one the auxiliary buffer stored from
            assert len(copies) == 3 and all(given is copy for given, copy in zip(added, copies, strict=True))
        else:
            assert copies == [] and added == [None] * 3
        runs.append(parameters(model))
    assert_identical(*runs)


def test_saved_model_keeps_its_buffer_class(tmp_path):
    model = small_ppg(rollout_buffer_class=RolloutBuffer)
    model.save(tmp_path / "sb3_buffer")
    assert type(type(model).load(tmp_path / "sb3_buffer").rollout_buffer) is RolloutBuffer
    model = small_ppg()
    model.save(tmp_path / "ppg_buffer")
    assert type(type(model).load(tmp_path / "ppg_buffer").rollout_buffer) is PPGRolloutBuffer


def test_maskable_ppg_trains_as_with_sb3_contribs_buffer():
    """MaskablePPG's default buffers make the updates of sb3-contrib's, bit for bit, with both kinds of minibatches."""
    for minibatches in ("transitions", "envs"):
        runs = []
        for buffer_class in (None, MaskableRolloutBuffer):
            env = make_vec_env(lambda: InvalidActionEnvMultiDiscrete(dims=[2, 3], n_invalid_actions=1), n_envs=4, seed=0)
            model = MaskablePPG("MlpPolicy", env, policy_kwargs=dict(net_arch=[16]), seed=0, n_steps=16, batch_size=32,
                                n_policy_iters=2, n_aux_epochs=1, aux_batch_rollouts=2, policy_minibatches=minibatches,
                                rollout_buffer_class=buffer_class)  # fmt: skip
            model.learn(4 * 16 * 3)
            assert model.n_aux_phases == 1
            runs.append(parameters(model))
        assert type(model.rollout_buffer) is MaskableRolloutBuffer
        assert_identical(*runs)
