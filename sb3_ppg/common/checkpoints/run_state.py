"""
Where a run is, beyond its weights and optimizers (:class:`RunState`), what a model offers to the code that saves and
resumes runs (:class:`ResumableModel`), and the run state in a checkpoint (``run_state.npz``: plain arrays and JSON;
``env_states.pkl``: the pickled envs of a ``DummyVecEnv``), with the random generators and the envs' states. Under
torchrun each rank writes its own, into ``rank_<r>/``.
"""

import json
import pathlib
import random
import warnings
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch as th
from stable_baselines3.common.vec_env import VecEnv

from sb3_ppg.common import distributed
from sb3_ppg.common.array_files import atomic_write, file_digest, read_array_file, write_array_file
from sb3_ppg.common.aux_buffer import AuxiliaryBuffer
from sb3_ppg.common.checkpoints.env_state import get_vec_env_state, monitor_log_sizes, set_vec_env_state, unsaved_parts
from sb3_ppg.common.checkpoints.manifest import CheckpointDamagedError, rank_folder
from sb3_ppg.common.checkpoints.model_objects import describe_model_objects

#: The last observations of a run: an array, a dict of arrays (Dict spaces), or None (the env is reset first)
Observations = np.ndarray | dict[str, np.ndarray] | None


@dataclass
class RunState:
    """
    The counters, statistics and last observations of a run: with the weights, optimizers, auxiliary buffer, envs and
    random generators, what continues it exactly. The fields are the model's attributes of the same names (SB3's).
    """

    num_timesteps: int
    total_timesteps: int
    num_timesteps_at_start: int
    n_updates: int
    n_aux_phases: int
    n_aux_updates: int
    episode_num: int
    current_progress_remaining: float
    ep_info_buffer: list[dict[str, Any]]
    ep_success_buffer: list[Any]
    last_obs: Observations
    last_original_obs: Observations
    last_episode_starts: np.ndarray | None
    #: The running discounted returns of ``PPG(normalize_reward=True)``'s reward normalizer (per env of this rank)
    reward_running_return: np.ndarray | None = None
    #: A recurrent model's LSTM states after the last rollout step (``RecurrentPPG``'s: its next step's input); None
    #: for the other models
    last_lstm_states: np.ndarray | None = None

    @classmethod
    def of(cls, model: Any) -> "RunState":
        """An SB3 model's run state (its arrays, not copies); PPG's counters of auxiliary phases and updates too."""
        return cls(
            num_timesteps=model.num_timesteps,
            total_timesteps=model._total_timesteps,
            num_timesteps_at_start=model._num_timesteps_at_start,
            n_updates=model._n_updates,
            n_aux_phases=model._n_aux_phases,
            n_aux_updates=model._n_aux_updates,
            episode_num=model._episode_num,
            current_progress_remaining=model._current_progress_remaining,
            ep_info_buffer=list(model.ep_info_buffer or []),
            ep_success_buffer=list(model.ep_success_buffer or []),
            last_obs=model._last_obs,
            last_original_obs=model._last_original_obs,
            last_episode_starts=model._last_episode_starts,
            reward_running_return=None
            if getattr(model, "reward_normalizer", None) is None
            else model.reward_normalizer.running_return,
        )

    def restore(self, model: Any) -> None:
        """Put this run state back into a model (the attributes that :meth:`of` reads)."""
        model.num_timesteps = self.num_timesteps
        model._total_timesteps = self.total_timesteps
        model._num_timesteps_at_start = self.num_timesteps_at_start
        model._n_updates = self.n_updates
        model._n_aux_phases = self.n_aux_phases
        model._n_aux_updates = self.n_aux_updates
        model._episode_num = self.episode_num
        model._current_progress_remaining = self.current_progress_remaining
        model.ep_info_buffer = deque(self.ep_info_buffer, maxlen=model._stats_window_size)
        model.ep_success_buffer = deque(self.ep_success_buffer, maxlen=model._stats_window_size)
        model._last_obs = self.last_obs
        model._last_original_obs = self.last_original_obs
        model._last_episode_starts = self.last_episode_starts
        if getattr(model, "reward_normalizer", None) is not None and self.reward_running_return is not None:
            model.reward_normalizer.set_running_return(self.reward_running_return)


@runtime_checkable
class ResumableModel(Protocol):
    """
    What checkpoints (:mod:`sb3_ppg.common.checkpoints`) need from a model: :class:`~sb3_ppg.PPG` is one. A model
    is resumable exactly at a rollout boundary: once ``train()`` has consumed the last rollout collected, before the
    next rollout draws anything.
    """

    env: VecEnv | None
    n_envs: int
    num_timesteps: int
    aux_buffer: AuxiliaryBuffer | None

    @property
    def at_rollout_boundary(self) -> bool:
        """Whether the model is at a rollout boundary (False from the start of a rollout until its ``train()`` returns)."""

    def get_run_state(self) -> RunState:
        """The run's state (see :class:`RunState`)."""

    def set_run_state(self, state: RunState) -> None:
        """Put back a run state from :meth:`get_run_state`."""

    def save(self, path: Any) -> None:
        """Save the model zip (weights, optimizers, hyperparameters)."""


RUN_STATE_FORMAT = "sb3_ppg.run_state"
#: The counters of a :class:`RunState`, by the names the file stores them under
COUNTERS = {
    "num_timesteps": "num_timesteps",
    "_n_updates": "n_updates",
    "_n_aux_phases": "n_aux_phases",
    "_n_aux_updates": "n_aux_updates",
    "_episode_num": "episode_num",
    "_num_timesteps_at_start": "num_timesteps_at_start",
    "_total_timesteps": "total_timesteps",
}


def _obs_arrays(name: str, obs: Any) -> dict[str, np.ndarray]:
    if obs is None:
        return {}
    if isinstance(obs, dict):
        return {f"{name}.{key}": np.asarray(value) for key, value in obs.items()}
    return {name: np.asarray(obs)}


def _obs_from_arrays(name: str, arrays: dict[str, np.ndarray]) -> Any:
    if name in arrays:
        return arrays[name]
    keys = [key[len(name) + 1 :] for key in arrays if key.startswith(name + ".")]
    return {key: arrays[f"{name}.{key}"] for key in keys} if keys else None


def _json_value(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else str(value)


def write_run_state(model: ResumableModel, folder: pathlib.Path, rollout_files: list[str]) -> dict[str, str]:
    """
    Write the run state into ``folder`` (``run_state.npz``, and ``env_states.pkl`` for a ``DummyVecEnv``'s envs).

    :param rollout_files: the stored rollouts of the model's auxiliary buffer, in order
    :return: the checksum of each file written, by name
    """
    state = model.get_run_state()
    metadata: dict[str, Any] = {"format": RUN_STATE_FORMAT, "version": 1}
    metadata["counters"] = {name: getattr(state, field) for name, field in COUNTERS.items()}
    metadata["current_progress_remaining"] = state.current_progress_remaining
    metadata["aux_rollout_files"] = rollout_files
    metadata["ep_info_buffer"] = state.ep_info_buffer
    metadata["ep_success_buffer"] = state.ep_success_buffer
    np_state = np.random.get_state()
    metadata["numpy_rng"] = {"name": np_state[0], "pos": int(np_state[2]), "has_gauss": int(np_state[3]),
                             "cached_gaussian": float(np_state[4])}  # fmt: skip
    python_state = random.getstate()
    metadata["python_rng"] = [python_state[0], list(python_state[1]), python_state[2]]
    arrays = {"numpy_rng_keys": np.asarray(np_state[1]), "torch_rng": th.get_rng_state().numpy()}
    if th.cuda.is_available():
        for index, cuda_state in enumerate(th.cuda.get_rng_state_all()):
            arrays[f"cuda_rng.{index}"] = cuda_state.numpy()
    arrays.update(_obs_arrays("last_obs", state.last_obs))
    arrays.update(_obs_arrays("last_original_obs", state.last_original_obs))
    if state.last_episode_starts is not None:
        arrays["last_episode_starts"] = np.asarray(state.last_episode_starts)
    if state.reward_running_return is not None:
        arrays["reward_running_return"] = np.asarray(state.reward_running_return, dtype=np.float64)
    if state.last_lstm_states is not None:
        arrays["last_lstm_states"] = np.asarray(state.last_lstm_states)
    pickled_envs = None
    if model.env is not None:
        metadata["env"], env_arrays, pickled_envs = get_vec_env_state(model.env)
        arrays.update(env_arrays)
        metadata["monitor_log_sizes"] = monitor_log_sizes(model.env)
    metadata["n_envs"] = model.n_envs
    metadata["torch_num_threads"] = th.get_num_threads()  # CPU kernels round differently with another count
    # What load_checkpoint(..., allow_pickle=False) gives load() in place of the zip's pickled objects
    metadata["model_objects"] = describe_model_objects(model)
    write_array_file(folder / "run_state.npz", arrays, json.loads(json.dumps(metadata, default=_json_value)))
    files = {"run_state.npz": file_digest(folder / "run_state.npz")}
    if pickled_envs is not None:
        atomic_write(folder / "env_states.pkl", lambda file: file.write(pickled_envs))
        files["env_states.pkl"] = file_digest(folder / "env_states.pkl")
    return files


def read_run_state(path: pathlib.Path, where: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Read a ``run_state.npz``, its checksums verified: its metadata and arrays."""
    try:
        return read_array_file(path, RUN_STATE_FORMAT)
    except (ValueError, OSError) as error:
        raise CheckpointDamagedError(f"{where} cannot be read: {error}") from error


def restore_run_state(
    model: ResumableModel, metadata: dict[str, Any], arrays: dict[str, np.ndarray], pickled_envs: pathlib.Path | None
) -> None:
    """Put a run state back: the model's :class:`RunState`, its envs' states, then the random generators."""
    state = RunState(
        **{field: metadata["counters"][name] for name, field in COUNTERS.items()},
        current_progress_remaining=metadata["current_progress_remaining"],
        ep_info_buffer=metadata["ep_info_buffer"],
        ep_success_buffer=metadata["ep_success_buffer"],
        last_obs=_obs_from_arrays("last_obs", arrays),
        last_original_obs=_obs_from_arrays("last_original_obs", arrays),
        last_episode_starts=arrays.get("last_episode_starts"),
        reward_running_return=arrays.get("reward_running_return"),
        last_lstm_states=arrays.get("last_lstm_states"),
    )
    if model.env is not None and "env" in metadata:
        pickled = pickled_envs.read_bytes() if pickled_envs is not None else None
        if not set_vec_env_state(model.env, metadata["env"], arrays, pickled):
            warnings.warn(
                "The envs' states could not be saved in this checkpoint ("
                + "; ".join(unsaved_parts(metadata["env"]))
                + "): the episodes restart from a reset, so the run does not continue exactly as it would have."
            )
            state.last_obs = None  # learn() resets the env
    elif model.env is None:
        state.last_obs = None
    model.set_run_state(state)
    warn_other_threads(model, metadata.get("torch_num_threads"))

    np_state = metadata["numpy_rng"]
    np.random.set_state((np_state["name"], arrays["numpy_rng_keys"], np_state["pos"], np_state["has_gauss"],
                         np_state["cached_gaussian"]))  # fmt: skip
    version, python_state, gauss_next = metadata["python_rng"]
    random.setstate((version, tuple(python_state), gauss_next))
    th.set_rng_state(th.from_numpy(arrays["torch_rng"].copy()))
    cuda_states = [arrays[f"cuda_rng.{i}"] for i in range(len(arrays)) if f"cuda_rng.{i}" in arrays]
    if cuda_states and th.cuda.is_available() and len(cuda_states) == th.cuda.device_count():
        th.cuda.set_rng_state_all([th.from_numpy(cuda_state.copy()) for cuda_state in cuda_states])


def warn_other_threads(model: ResumableModel, recorded: int | None) -> None:
    """Warn when a CPU model resumes with other torch threads than its checkpoint was written with (None: unknown)."""
    current = th.get_num_threads()
    if recorded is None or recorded == current or th.device(getattr(model, "device", "cpu")).type != "cpu":
        return
    warnings.warn(
        f"The checkpoint was written with {recorded} torch threads and torch now uses {current}: torch's CPU kernels "
        "round differently with another number of threads, so the resumed run matches the uninterrupted one to float "
        f"rounding, not bit for bit. For an exact resume, call torch.set_num_threads({recorded}) before loading "
        f"(command line: --num-threads {recorded}).",
        stacklevel=2,
    )


def _rank_run_state(directory: pathlib.Path) -> dict[str, Any]:
    path = directory / "run_state.npz"
    if not path.is_file():
        path = directory / rank_folder(distributed.get_rank()) / "run_state.npz"
    metadata, _ = read_array_file(path, RUN_STATE_FORMAT)
    return metadata


def read_torch_threads(directory: pathlib.Path) -> int | None:
    """The torch threads this process's part of a checkpoint was written with (None: not recorded)."""
    return _rank_run_state(directory).get("torch_num_threads")


def read_monitor_log_sizes(directory: pathlib.Path) -> dict[str, int]:
    """The sizes of the run's episode logs when a checkpoint was written (a resumed run cuts them there)."""
    metadata = _rank_run_state(directory)
    return {str(name): int(size) for name, size in metadata.get("monitor_log_sizes", {}).items()}
