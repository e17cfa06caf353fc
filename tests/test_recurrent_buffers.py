"""
RecurrentPPG's auxiliary buffer: its episode starts and LSTM start states are torch tensors stored with its other
arrays (CPU memory, page-locked memory or the model's device), counted in ``nbytes``, the same whatever the storage,
and the files written when they were NumPy arrays (tests/data/old_files/recurrent/, by the code of commit e166e31,
see tests/data/scripts/write_recurrent_old_files.py) load as they were written.
"""

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch as th
from stable_baselines3.common.env_util import make_vec_env

from sb3_ppg import RecurrentPPG
from sb3_ppg.common.array_files import read_array_file
from sb3_ppg.common.aux_buffer import AUX_BUFFER_FORMAT
from sb3_ppg.common.recurrent.buffers import RecurrentAuxiliaryBuffer

OLD_FILES = Path(__file__).parent / "data" / "old_files" / "recurrent"
DEVICE = "cuda" if th.cuda.is_available() else "cpu"
#: The settings of the old files' run
OLD_RUN = dict(n_steps=8, batch_size=8, n_policy_iters=3, n_aux_epochs=1, aux_batch_rollouts=2)
OLD_POLICY = dict(lstm_hidden_size=4, net_arch=[4])


def make_model(aux_buffer_device: str = "auto", device: str = "cpu", **kwargs) -> RecurrentPPG:
    env = make_vec_env("CartPole-v1", n_envs=4, seed=0)
    run = dict(n_steps=16, batch_size=32, n_policy_iters=2, n_aux_epochs=2, aux_batch_rollouts=3)
    policy_kwargs = dict(lstm_hidden_size=8, net_arch=[8], n_lstm_layers=2)
    return RecurrentPPG(
        "MlpLstmPolicy",
        env,
        seed=0,
        policy_kwargs=policy_kwargs,
        aux_buffer_device=aux_buffer_device,
        device=device,
        **{**run, **kwargs},
    )


def old_model(aux_buffer_device: str) -> RecurrentPPG:
    env = make_vec_env("CartPole-v1", n_envs=2, seed=0)
    return RecurrentPPG("MlpLstmPolicy", env, seed=0, policy_kwargs=OLD_POLICY, aux_buffer_device=aux_buffer_device, **OLD_RUN)


@pytest.mark.parametrize("aux_buffer_device", ["cpu", "pinned", "device", "auto"])
def test_recurrent_fields_are_tensors_of_the_storage_counted_in_nbytes(aux_buffer_device: str) -> None:
    model = make_model(aux_buffer_device, device=DEVICE)
    _, callback = model._setup_learn(1000)
    buffer = model.aux_buffer
    assert isinstance(buffer, RecurrentAuxiliaryBuffer)
    for _ in range(2):
        model.collect_rollouts(model.env, callback, model.rollout_buffer, model.n_steps)
        buffer.add(model.rollout_buffer)
    assert buffer.full() and bool(buffer.episode_starts.any()) and float(buffer.lstm_start_states[4:].abs().max()) > 0
    fields = {"episode_starts": (th.bool, (8, 16)), "lstm_start_states": (th.float32, (8, 4, 2, 8))}
    for name, (dtype, shape) in fields.items():
        tensor = getattr(buffer, name)
        assert isinstance(tensor, th.Tensor), name
        assert tensor.dtype == dtype and tuple(tensor.shape) == shape, name
        assert tensor.device == buffer.returns.device == buffer.storage_device, name
        assert tensor.is_pinned() == buffer.pinned, name
    # nbytes: PPG's arrays, one byte per episode start and four bytes per state float; what the memory check estimated
    ppg_nbytes = buffer.observations.nbytes + buffer.returns.nbytes + buffer.old_distribution_params.nbytes
    assert buffer.nbytes == ppg_nbytes + 8 * 16 + 8 * 4 * 2 * 8 * 4
    layout = (model.n_policy_iters, model.n_steps, model.n_envs, model.observation_space, model.action_space)
    assert buffer.nbytes == RecurrentAuxiliaryBuffer.estimate_nbytes(*layout, lstm_state_shape=(2, 8))
    # Minibatches take their rows' episode starts and states, on the model's device
    model._compute_old_distributions()
    episode_starts, start_states = buffer.episode_starts.cpu(), buffer.lstm_start_states.cpu()
    for batch in buffer.get(3, np.random.default_rng(0)):
        rows = th.as_tensor(batch.rollout_indices)
        assert batch.episode_starts.device.type == batch.lstm_states.pi[0].device.type == model.device.type
        assert th.equal(batch.episode_starts.cpu(), episode_starts[rows])
        states = (*batch.lstm_states.pi, *batch.lstm_states.vf)
        for index, state in enumerate(states):
            assert th.equal(state.cpu(), start_states[rows, index].permute(1, 0, 2))


def test_the_updates_are_the_same_whatever_the_storage() -> None:
    """On the CPU, every storage trains to the same weights (the recomputed start states stored where they live)."""
    runs = {}
    for choice in ("cpu", "pinned", "device"):
        model = make_model(choice, aux_start_states="recomputed")
        model.learn(4 * 16 * 4)
        assert model.n_aux_phases == 2
        runs[choice] = model.policy.state_dict()
    for choice in ("pinned", "device"):
        for name, tensor in runs["cpu"].items():
            assert th.equal(runs[choice][name], tensor), f"{name} differs with aux_buffer_device={choice!r}"


def test_an_aux_buffer_file_of_numpy_fields_loads_and_saves_the_same(tmp_path) -> None:
    metadata, arrays = read_array_file(OLD_FILES / "aux_buffer.npz", AUX_BUFFER_FORMAT)
    assert arrays["episode_starts"].dtype == bool and arrays["lstm_start_states"].shape == (4, 4, 1, 4)
    for aux_buffer_device in ("cpu", "device"):
        model = old_model(aux_buffer_device)
        model.load_aux_buffer(OLD_FILES / "aux_buffer.npz")
        buffer = model.aux_buffer
        assert buffer.storage == aux_buffer_device.replace("cpu", "host") and buffer.n_iterations == 2
        assert th.equal(buffer.episode_starts[:4].cpu(), th.as_tensor(arrays["episode_starts"]))
        assert th.equal(buffer.lstm_start_states[:4].cpu(), th.as_tensor(arrays["lstm_start_states"]))
        # Saved again, the same file content: the format did not change
        model.save_aux_buffer(tmp_path / f"{aux_buffer_device}.npz")
        new_metadata, new_arrays = read_array_file(tmp_path / f"{aux_buffer_device}.npz", AUX_BUFFER_FORMAT)
        assert new_metadata == metadata and new_arrays.keys() == arrays.keys()
        for name, array in arrays.items():
            assert new_arrays[name].dtype == array.dtype and np.array_equal(new_arrays[name], array), name


@pytest.mark.filterwarnings("ignore:The checkpoint was written with 2 torch threads")
def test_a_checkpoint_of_numpy_fields_resumes(tmp_path) -> None:
    shutil.copytree(OLD_FILES / "checkpoints", tmp_path / "checkpoints")
    model = RecurrentPPG.load_checkpoint(
        tmp_path / "checkpoints", env=make_vec_env("CartPole-v1", n_envs=2, seed=0), device="cpu"
    )
    assert model.num_timesteps == 80 and model.n_aux_phases == 1
    buffer = model.aux_buffer
    assert isinstance(buffer.lstm_start_states, th.Tensor) and buffer.n_iterations == 2
    # The checkpoint's rollouts are those the same run saved with save_aux_buffer
    _, arrays = read_array_file(OLD_FILES / "aux_buffer.npz", AUX_BUFFER_FORMAT)
    assert th.equal(buffer.episode_starts[:4].cpu(), th.as_tensor(arrays["episode_starts"]))
    assert th.equal(buffer.lstm_start_states[:4].cpu(), th.as_tensor(arrays["lstm_start_states"]))
    assert np.abs(model.get_run_state().last_lstm_states).max() > 0
    # The run goes on: the third iteration fills the buffer, whose auxiliary phase runs from the loaded states
    before = {name: tensor.clone() for name, tensor in model.policy.state_dict().items()}
    model.learn(16, reset_num_timesteps=False)
    assert model.num_timesteps == 96 and model.n_aux_phases == 2 and model.aux_buffer.n_rollouts == 0
    assert not all(th.equal(tensor, before[name]) for name, tensor in model.policy.state_dict().items())
