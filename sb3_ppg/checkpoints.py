"""Checkpoints that resume a PPG run exactly: ``PPGCheckpointCallback`` writes them, ``PPG.load_checkpoint`` reads them."""

import json
import os
import pathlib
import random
import re
import warnings
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import torch as th
from stable_baselines3.common.callbacks import BaseCallback, CallbackList, EventCallback

from sb3_ppg.array_files import array_digest, atomic_write, file_digest, fsync_directory, read_array_file, write_array_file
from sb3_ppg.env_state import get_vec_env_state, monitor_log_sizes, set_vec_env_state, unsaved_parts

if TYPE_CHECKING:
    from sb3_ppg.base import PPGBase

MANIFEST = "manifest.json"
CHECKPOINT_FORMAT = "sb3_ppg.checkpoint"
RUN_STATE_FORMAT = "sb3_ppg.run_state"
ROLLOUT_FORMAT = "sb3_ppg.aux_rollout"
# Counters of the model that the run state carries (SB3's and PPG's)
COUNTERS = ("num_timesteps", "_n_updates", "_n_aux_phases", "_n_aux_updates", "_episode_num", "_num_timesteps_at_start",
            "_total_timesteps")  # fmt: skip


def iter_callbacks(callback: BaseCallback | None) -> Iterator[BaseCallback]:
    """The callback and every callback nested in it (``CallbackList``, ``EventCallback``)."""
    if callback is None:
        return
    yield callback
    if isinstance(callback, CallbackList):
        for child in callback.callbacks:
            yield from iter_callbacks(child)
    if isinstance(callback, EventCallback):
        yield from iter_callbacks(callback.callback)


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


def checkpoint_steps(directory: pathlib.Path, prefix: str) -> int | None:
    """The timestep count in a checkpoint folder's name ``<prefix>_<steps>_steps``, or None for another name."""
    match = re.fullmatch(re.escape(prefix) + r"_(\d+)_steps", directory.name)
    return int(match.group(1)) if match else None


def write_checkpoint(model: "PPGBase", directory: pathlib.Path, rollouts: pathlib.Path) -> None:
    """
    Write a complete checkpoint of ``model`` into ``directory`` (see ``PPGCheckpointCallback``). The stored
    rollouts of the auxiliary buffer go to ``rollouts`` (one file each, written once); the manifest, written last
    and atomically, lists every file with its checksum: a folder without manifest is an incomplete checkpoint.
    """
    directory.mkdir(parents=True, exist_ok=True)
    rollouts.mkdir(parents=True, exist_ok=True)
    # A checkpoint of the same step written before (by a run resumed from an older one) stops being complete first
    if (directory / MANIFEST).exists():
        (directory / MANIFEST).unlink()
        fsync_directory(directory)
    files = {}

    # The model zip (all optimizers): SB3's save() closes the file it writes, so write a temporary path and rename
    temporary = directory / f".model.zip.tmp-{os.getpid()}"
    model.save(temporary)
    with open(temporary, "rb+") as file:
        os.fsync(file.fileno())
    os.replace(temporary, directory / "model.zip")
    files["model.zip"] = file_digest(directory / "model.zip")

    # The auxiliary buffer: each stored policy iteration in its own file, shared by successive checkpoints
    rollout_files = []
    buffer = model.aux_buffer
    if buffer is not None:
        layout = {"format": ROLLOUT_FORMAT, "version": 1, **buffer.layout_metadata()}
        for iteration in range(buffer.n_iterations):
            name = buffer.saved_rollout_files.get(iteration)
            if name is None or not (rollouts / name).is_file():
                arrays = buffer.iteration_arrays(iteration)
                digest = array_digest(np.frombuffer("".join(array_digest(a) for a in arrays.values()).encode(), np.uint8))
                name = f"rollout_{digest[:32]}.npz"
                if not (rollouts / name).is_file():
                    write_array_file(rollouts / name, arrays, layout)
                buffer.saved_rollout_files[iteration] = name
            rollout_files.append(name)

    # The run state: counters, last observations, random generators, episode statistics, the envs' states
    metadata: dict[str, Any] = {"format": RUN_STATE_FORMAT, "version": 1}
    metadata["counters"] = {name: getattr(model, name) for name in COUNTERS}
    metadata["current_progress_remaining"] = model._current_progress_remaining
    metadata["aux_rollout_files"] = rollout_files
    metadata["ep_info_buffer"] = list(model.ep_info_buffer or [])
    metadata["ep_success_buffer"] = list(model.ep_success_buffer or [])
    np_state = np.random.get_state()
    metadata["numpy_rng"] = {"name": np_state[0], "pos": int(np_state[2]), "has_gauss": int(np_state[3]),
                             "cached_gaussian": float(np_state[4])}  # fmt: skip
    python_state = random.getstate()
    metadata["python_rng"] = [python_state[0], list(python_state[1]), python_state[2]]
    arrays = {"numpy_rng_keys": np.asarray(np_state[1]), "torch_rng": th.get_rng_state().numpy()}
    if th.cuda.is_available():
        for index, state in enumerate(th.cuda.get_rng_state_all()):
            arrays[f"cuda_rng.{index}"] = state.numpy()
    arrays.update(_obs_arrays("last_obs", model._last_obs))
    arrays.update(_obs_arrays("last_original_obs", model._last_original_obs))
    if model._last_episode_starts is not None:
        arrays["last_episode_starts"] = np.asarray(model._last_episode_starts)
    pickled_envs = None
    if model.env is not None:
        metadata["env"], env_arrays, pickled_envs = get_vec_env_state(model.env)
        arrays.update(env_arrays)
        metadata["monitor_log_sizes"] = monitor_log_sizes(model.env)
    metadata["n_envs"] = model.n_envs
    write_array_file(directory / "run_state.npz", arrays, json.loads(json.dumps(metadata, default=_json_value)))
    files["run_state.npz"] = file_digest(directory / "run_state.npz")
    if pickled_envs is not None:
        atomic_write(directory / "env_states.pkl", lambda file: file.write(pickled_envs))
        files["env_states.pkl"] = file_digest(directory / "env_states.pkl")

    manifest = {
        "format": CHECKPOINT_FORMAT,
        "version": 1,
        "num_timesteps": model.num_timesteps,
        "files": files,
        "rollouts_folder": os.path.relpath(rollouts, directory.parent),
        "aux_rollout_files": rollout_files,
    }
    atomic_write(directory / MANIFEST, lambda file: file.write(json.dumps(manifest, indent=1).encode()))


def read_manifest(directory: pathlib.Path) -> dict[str, Any] | None:
    """The manifest of a checkpoint folder, or None when the checkpoint is incomplete (no manifest)."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise ValueError(f"The manifest of checkpoint {str(directory)!r} is damaged: {error}") from error
    if not isinstance(manifest, dict) or manifest.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{str(directory / MANIFEST)!r} is not a PPG checkpoint manifest.")
    return manifest


def complete_checkpoints(folder: pathlib.Path) -> list[pathlib.Path]:
    """The complete checkpoints (folders with a manifest) in ``folder``, oldest first (by timesteps, then name)."""
    found = []
    for directory in folder.iterdir() if folder.is_dir() else []:
        if directory.is_dir() and (directory / MANIFEST).is_file():
            match = re.search(r"_(\d+)_steps$", directory.name)
            found.append((int(match.group(1)) if match else -1, directory.name, directory))
    return [directory for _, _, directory in sorted(found)]


def find_checkpoint(path: str | os.PathLike) -> tuple[pathlib.Path, pathlib.Path | None]:
    """
    The checkpoint to load from ``path`` (a checkpoint folder, or a folder of them: its newest complete one) and the
    complete one before it (None if none), for error messages.
    """
    path = pathlib.Path(path)
    if (path / MANIFEST).is_file():
        siblings = complete_checkpoints(path.parent)
        before = [d for d in siblings if d != path and siblings.index(d) < siblings.index(path)] if path in siblings else []
        return path, before[-1] if before else None
    checkpoints = complete_checkpoints(path)
    if not checkpoints:
        raise FileNotFoundError(f"No complete PPG checkpoint (a folder with a {MANIFEST}) in {str(path)!r}.")
    return checkpoints[-1], checkpoints[-2] if len(checkpoints) > 1 else None


def read_monitor_log_sizes(directory: pathlib.Path) -> dict[str, int]:
    """
    The sizes of the run's episode logs (``*.monitor.csv``, by real path) when a checkpoint was written: a resumed
    run cuts them there, so that the episodes logged after the checkpoint (and played again) are not counted twice.

    :param directory: A complete checkpoint folder
    :return: ``{path: size}`` (empty for checkpoints of envs without episode logs)
    """
    metadata, _ = read_array_file(directory / "run_state.npz", RUN_STATE_FORMAT)
    return {str(path): int(size) for path, size in metadata.get("monitor_log_sizes", {}).items()}


def verify_files(directory: pathlib.Path, manifest: dict[str, Any]) -> None:
    """Check every file listed in a manifest against its checksum (``ValueError`` naming the first damaged one)."""
    for name, digest in manifest["files"].items():
        if not (directory / name).is_file():
            raise ValueError(f"{name} is missing")
        if file_digest(directory / name) != digest:
            raise ValueError(f"{name} does not match its checksum (damaged or changed file)")
    for name in manifest["aux_rollout_files"]:
        if not (directory.parent / manifest["rollouts_folder"] / name).is_file():
            raise ValueError(f"the stored rollout {manifest['rollouts_folder']}/{name} is missing")


def restore_run(model: "PPGBase", directory: pathlib.Path, manifest: dict[str, Any]) -> None:
    """Put the run state and the auxiliary buffer of a checkpoint (files already verified) into a loaded model."""
    metadata, arrays = read_array_file(directory / "run_state.npz", RUN_STATE_FORMAT)
    if metadata["n_envs"] != model.n_envs:
        raise ValueError(
            f"The checkpoint's run had {metadata['n_envs']} envs, the env passed has {model.n_envs}: pass an env with "
            f"{metadata['n_envs']} envs to continue the run (or PPG.load() its model.zip and set_env() to start anew)."
        )
    # The auxiliary buffer
    buffer = model.aux_buffer
    rollout_files = metadata["aux_rollout_files"]
    if buffer is not None:
        layout = {"format": ROLLOUT_FORMAT, "version": 1, **buffer.layout_metadata()}
        rollouts = directory.parent / manifest["rollouts_folder"]
        for iteration, name in enumerate(rollout_files):
            path = rollouts / name
            rollout_metadata, rollout_arrays = read_array_file(path, ROLLOUT_FORMAT)
            mismatches = [key for key, value in layout.items() if rollout_metadata.get(key) != value]
            if mismatches:
                raise ValueError(f"the stored rollout {str(path)!r} does not fit this model ({', '.join(mismatches)} differ)")
            buffer.set_iteration_arrays(iteration, rollout_arrays, path)
            buffer.saved_rollout_files[iteration] = name
        buffer.pos = len(rollout_files) * buffer.n_envs
    elif rollout_files:
        raise ValueError("the checkpoint holds auxiliary-buffer rollouts but this model has no auxiliary buffer")

    for name, value in metadata["counters"].items():
        setattr(model, name, value)
    model._current_progress_remaining = metadata["current_progress_remaining"]
    model.ep_info_buffer = deque(metadata["ep_info_buffer"], maxlen=model._stats_window_size)
    model.ep_success_buffer = deque(metadata["ep_success_buffer"], maxlen=model._stats_window_size)
    model._last_obs = _obs_from_arrays("last_obs", arrays)
    model._last_original_obs = _obs_from_arrays("last_original_obs", arrays)
    model._last_episode_starts = arrays.get("last_episode_starts")

    if model.env is not None and "env" in metadata:
        pickled_envs = (directory / "env_states.pkl").read_bytes() if "env_states.pkl" in manifest["files"] else None
        restored = set_vec_env_state(model.env, metadata["env"], arrays, pickled_envs)
        if not restored:
            warnings.warn(
                "The envs' states could not be saved in this checkpoint ("
                + "; ".join(unsaved_parts(metadata["env"]))
                + "): the episodes restart from a reset, so the run does not continue exactly as it would have."
            )
            model._last_obs = None  # learn() resets the env
    elif model.env is None:
        model._last_obs = None

    # The random generators last: nothing above may draw from them afterwards
    np_state = metadata["numpy_rng"]
    np.random.set_state((np_state["name"], arrays["numpy_rng_keys"], np_state["pos"], np_state["has_gauss"],
                         np_state["cached_gaussian"]))  # fmt: skip
    version, python_state, gauss_next = metadata["python_rng"]
    random.setstate((version, tuple(python_state), gauss_next))
    th.set_rng_state(th.from_numpy(arrays["torch_rng"].copy()))
    cuda_states = [arrays[f"cuda_rng.{i}"] for i in range(len(arrays)) if f"cuda_rng.{i}" in arrays]
    if cuda_states and th.cuda.is_available() and len(cuda_states) == th.cuda.device_count():
        th.cuda.set_rng_state_all([th.from_numpy(state.copy()) for state in cuda_states])


def load_checkpoint(
    cls: type["PPGBase"], path: str | os.PathLike, env: Any = None, device: th.device | str = "auto", **kwargs: Any
) -> "PPGBase":
    """See ``PPGBase.load_checkpoint``."""
    directory, previous = find_checkpoint(path)
    try:
        manifest = read_manifest(directory)
        assert manifest is not None
        verify_files(directory, manifest)
        model = cls.load(directory / "model.zip", env=env, device=device, force_reset=False, **kwargs)
        restore_run(model, directory, manifest)
    except (ValueError, KeyError, TypeError, OSError) as error:
        fallback = f"the previous complete checkpoint is {str(previous)!r}" if previous else "there is no previous one"
        raise ValueError(
            f"Checkpoint {str(directory)!r} is damaged or does not fit ({error}); {fallback}: pass it to load_checkpoint()."
        ) from error
    return model
