"""
``aux_buffer_device``: where the auxiliary buffer lives (CPU memory, pinned CPU memory, the model's device). The choice
(a pure function of the device and its free memory), the fallbacks (no CUDA, not enough memory, pinning refused), and
that every storage gives the same minibatches, files and updates. The arrays are torch tensors wherever they live.
"""

import io

import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from sb3_contrib.common.envs import InvalidActionEnvDiscrete
from stable_baselines3.common.env_util import make_vec_env
from test_buffers import ACTION_SPACE, IMAGE_SPACE, N_ENVS, N_STEPS, filled_rollout_buffer

from sb3_ppg import MaskablePPG
from sb3_ppg.common.array_files import read_array_file
from sb3_ppg.common.aux_buffer import (
    AUX_BUFFER_DEVICE_MEMORY_SHARE,
    AUX_BUFFER_FORMAT,
    AuxiliaryBuffer,
    resolve_aux_buffer_storage,
)
from sb3_ppg.common.hyperparameters import HyperparameterError

GIB = 1024**3
CUDA = th.device("cuda:0")
DICT_SPACE = spaces.Dict({"image": IMAGE_SPACE, "vector": spaces.Box(-1, 1, (3,), np.float32)})


def free_memory(free: int):
    """A stand-in for ``torch.cuda.mem_get_info``: ``free`` bytes free of 80 GiB."""
    return lambda device: (free, 80 * GIB)


def test_auto_keeps_the_buffer_on_cuda_when_it_fits_in_the_share_of_free_memory():
    free = 40 * GIB
    fits = int(AUX_BUFFER_DEVICE_MEMORY_SHARE * free)
    storage, reason = resolve_aux_buffer_storage("auto", CUDA, fits, free_memory(free))
    assert storage == "device"
    assert "fit in 50% of the 40 GiB free on cuda:0" in reason
    storage, reason = resolve_aux_buffer_storage("auto", CUDA, fits + 1, free_memory(free))
    assert storage == "pinned"
    assert "do not fit" in reason


def test_explicit_choices_on_cuda():
    assert resolve_aux_buffer_storage("cpu", CUDA, GIB, free_memory(40 * GIB))[0] == "host"
    assert resolve_aux_buffer_storage("pinned", CUDA, GIB, free_memory(40 * GIB))[0] == "pinned"
    # "device" is kept while the buffer fits in the free memory at all, refused clearly beyond it
    assert resolve_aux_buffer_storage("device", CUDA, 30 * GIB, free_memory(40 * GIB))[0] == "device"
    with pytest.raises(ValueError, match="more than the 40 GiB free on cuda:0: use aux_buffer_device='auto' or 'pinned'"):
        resolve_aux_buffer_storage("device", CUDA, 41 * GIB, free_memory(40 * GIB))


def test_without_cuda_the_buffer_stays_in_cpu_memory():
    def no_query(device):
        raise AssertionError("the free memory of a non-CUDA device is never asked for")

    cpu = th.device("cpu")
    for choice in ("cpu", "pinned", "auto"):
        storage, reason = resolve_aux_buffer_storage(choice, cpu, GIB, no_query)
        assert storage == "host"
        assert choice == "cpu" or "not a CUDA device" in reason
    # On a CPU model, "device" means tensors in CPU memory (the device's own arrays)
    assert resolve_aux_buffer_storage("device", cpu, GIB, no_query)[0] == "device"


def test_unknown_choice_is_refused():
    with pytest.raises(ValueError, match=r"aux_buffer_device must be one of \('cpu', 'pinned', 'device', 'auto'\)"):
        resolve_aux_buffer_storage("gpu", th.device("cpu"), GIB)
    with pytest.raises(ValueError, match="storage must be 'host', 'pinned' or 'device'"):
        AuxiliaryBuffer(1, N_STEPS, N_ENVS, IMAGE_SPACE, ACTION_SPACE, device="cpu", storage="gpu")


def test_pinned_memory_falls_back_to_pageable_when_pinning_fails(monkeypatch):
    real_zeros = th.zeros

    def zeros_refusing_pins(*args, pin_memory=False, **kwargs):
        if pin_memory:
            raise RuntimeError("cannot pin")
        return real_zeros(*args, **kwargs)

    monkeypatch.setattr(th, "zeros", zeros_refusing_pins)
    buffer = AuxiliaryBuffer(1, N_STEPS, N_ENVS, IMAGE_SPACE, ACTION_SPACE, device="cpu", storage="pinned")
    assert not buffer.pinned
    assert buffer.observations.device.type == "cpu" and buffer.observations.dtype == th.uint8
    assert buffer.returns.shape == (N_ENVS, N_STEPS) and buffer.returns.device.type == "cpu"


@pytest.mark.skipif(not th.cuda.is_available(), reason="page-locked memory needs CUDA")
def test_pinned_buffer_uses_pinned_arrays_where_pinning_works():
    buffer = AuxiliaryBuffer(1, N_STEPS, N_ENVS, IMAGE_SPACE, ACTION_SPACE, device="cpu", storage="pinned")
    assert buffer.pinned
    assert buffer.observations.is_pinned() and buffer.returns.is_pinned() and buffer.old_distribution_params.is_pinned()


def test_host_storage_holds_tensors_in_cpu_memory():
    buffer = AuxiliaryBuffer(1, N_STEPS, N_ENVS, DICT_SPACE, ACTION_SPACE, device="cpu", storage="host")
    tensors = [*buffer.observations.values(), buffer.returns, buffer.old_distribution_params]
    assert all(isinstance(tensor, th.Tensor) and tensor.device.type == "cpu" for tensor in tensors)
    assert buffer.observations["image"].dtype == th.uint8 and buffer.observations["vector"].dtype == th.float32


def filled_buffer(storage: str, observation_space: spaces.Space) -> AuxiliaryBuffer:
    """A buffer of 3 policy iterations in ``storage``, with masks and old-policy parameters (the same for any storage)."""
    buffer = AuxiliaryBuffer(
        3, N_STEPS, N_ENVS, observation_space, ACTION_SPACE, device="cpu", storage=storage, mask_dims=int(ACTION_SPACE.n)
    )
    for iteration in range(3):
        rollout_buffer = filled_rollout_buffer(iteration, observation_space)
        rollout_buffer.action_masks = np.random.default_rng(iteration).random((N_STEPS, N_ENVS, 3)) > 0.3
        buffer.add(rollout_buffer)
    params = th.as_tensor(np.random.default_rng(7).normal(size=(N_STEPS * N_ENVS * 3, 3)), dtype=th.float32)
    buffer.store_old_distribution_params(slice(0, 3 * N_ENVS), params)
    return buffer


def as_numpy(values):
    if isinstance(values, dict):
        return {key: value.numpy() for key, value in values.items()}
    return None if values is None else values.numpy()


@pytest.mark.parametrize("observation_space", [IMAGE_SPACE, DICT_SPACE], ids=["image", "dict"])
@pytest.mark.parametrize("storage", ["pinned", "device"])
def test_every_storage_gives_the_same_minibatches_and_files(tmp_path, observation_space, storage):
    reference = filled_buffer("host", observation_space)
    buffer = filled_buffer(storage, observation_space)
    # Minibatches of two rollouts (of 9: the last one is shorter), two epochs, the same shuffles
    for epoch in range(2):
        batches = buffer.get(2, np.random.default_rng(epoch))
        for expected, batch in zip(reference.get(2, np.random.default_rng(epoch)), batches, strict=True):
            np.testing.assert_array_equal(batch.rollout_indices, expected.rollout_indices)
            for field in ("returns", "old_distribution_params", "action_masks"):
                np.testing.assert_array_equal(as_numpy(getattr(batch, field)), as_numpy(getattr(expected, field)))
                assert getattr(batch, field).dtype == getattr(expected, field).dtype
            observations, expected_observations = as_numpy(batch.observations), as_numpy(expected.observations)
            if isinstance(observations, dict):
                for key in observations:
                    np.testing.assert_array_equal(observations[key], expected_observations[key])
            else:
                np.testing.assert_array_equal(observations, expected_observations)
    # The old-policy pass's chunks (in order)
    chunks = zip(buffer.iter_rollout_chunks(4), reference.iter_rollout_chunks(4), strict=True)
    for (rows, observations), (expected_rows, expected) in chunks:
        assert rows == expected_rows
        observations, expected = as_numpy(observations), as_numpy(expected)
        for key in observations if isinstance(observations, dict) else [None]:
            got, want = (observations[key], expected[key]) if key else (observations, expected)
            np.testing.assert_array_equal(got, want)
    # The same arrays for the checkpoints, the same file for save_aux_buffer
    for iteration in range(3):
        arrays, expected_arrays = buffer.iteration_arrays(iteration, True), reference.iteration_arrays(iteration, True)
        assert arrays.keys() == expected_arrays.keys()
        for name, array in arrays.items():
            assert array.dtype == expected_arrays[name].dtype
            np.testing.assert_array_equal(array, expected_arrays[name])
    buffer.save(tmp_path / "buffer.npz")
    reference.save(tmp_path / "reference.npz")
    metadata, arrays = read_array_file(tmp_path / "buffer.npz", AUX_BUFFER_FORMAT)
    expected_metadata, expected_arrays = read_array_file(tmp_path / "reference.npz", AUX_BUFFER_FORMAT)
    assert metadata == expected_metadata
    for name, array in arrays.items():
        np.testing.assert_array_equal(array, expected_arrays[name])
    # A saved buffer loads back into this storage (load_aux_buffer's path)
    target = AuxiliaryBuffer(
        3, N_STEPS, N_ENVS, observation_space, ACTION_SPACE, device="cpu", storage=storage, mask_dims=int(ACTION_SPACE.n)
    )
    target.copy_from(AuxiliaryBuffer.load(tmp_path / "reference.npz"), "reference.npz")
    assert target.pos == reference.pos
    for name, array in target.iteration_arrays(2, True).items():
        np.testing.assert_array_equal(array, reference.iteration_arrays(2, True)[name])


def train_masked(aux_buffer_device: str, verbose: int = 0, device: str = "auto") -> MaskablePPG:
    env = make_vec_env(lambda: InvalidActionEnvDiscrete(dim=20, n_invalid_actions=10), n_envs=2, seed=0)
    model = MaskablePPG(
        "MlpPolicy",
        env,
        n_steps=16,
        batch_size=16,
        n_policy_iters=2,
        n_aux_epochs=2,
        aux_batch_rollouts=1,
        policy_kwargs=dict(net_arch=[16]),
        aux_buffer_device=aux_buffer_device,
        device=device,
        seed=0,
        verbose=verbose,
    )
    model.learn(128)
    return model


def test_the_updates_are_the_same_whatever_the_storage():
    reference = train_masked("cpu")
    assert reference.n_aux_phases == 2
    for choice in ("device", "auto", "pinned"):
        model = train_masked(choice)
        for (name, param), expected in zip(model.policy.named_parameters(), reference.policy.parameters(), strict=True):
            assert th.equal(param, expected), f"{name} differs with aux_buffer_device={choice!r}"


def test_the_log_says_where_the_buffer_lives_and_why(capsys):
    train_masked("auto", verbose=1, device="cpu")
    assert "It lives in CPU memory (aux_buffer_device='auto' and the model is on cpu, not a CUDA device)." in (
        capsys.readouterr().out
    )


def test_invalid_choice_is_a_clear_error(make_model):
    with pytest.raises(HyperparameterError, match="aux_buffer_device must be one of"):
        make_model(aux_buffer_device="gpu")


@pytest.mark.filterwarnings("ignore:learn.total_timesteps=16. stops")
def test_save_and_load_keep_the_choice_and_the_buffer(make_model):
    model = make_model(aux_buffer_device="device")
    model.learn(16)
    file = io.BytesIO()
    model.save(file)
    file.seek(0)
    loaded = type(model).load(file, env=model.get_env())
    assert loaded.aux_buffer_device == "device" and loaded.aux_buffer.storage == "device"
    buffer_file = io.BytesIO()
    model.save_aux_buffer(buffer_file)
    buffer_file.seek(0)
    loaded.load_aux_buffer(buffer_file)
    assert loaded.aux_buffer.storage == "device"
    np.testing.assert_array_equal(
        loaded.aux_buffer.iteration_arrays(0)["returns"], model.aux_buffer.iteration_arrays(0)["returns"]
    )
