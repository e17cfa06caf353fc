"""
Checkpoints that resume a PPG run exactly: ``PPGCheckpointCallback`` writes them (:func:`write_checkpoint`),
``PPG.load_checkpoint`` finds and reads them (:func:`find_checkpoint` here, the rest in :mod:`sb3_ppg.resume`).

Under torchrun (data-parallel training, :func:`sb3_ppg.distributed.is_active`) a checkpoint holds every rank's part:
rank 0 writes ``model.zip`` (parameters and optimizers are the same on every rank), each rank ``r`` writes its run
state (random generators, last observations, envs) into ``rank_<r>/`` and its auxiliary-buffer rollouts into the
shared rollouts folder, then rank 0 gathers every rank's checksums and writes the manifest last. The folder must be
shared by all ranks (one machine, or a shared filesystem).
"""

import json
import os
import pathlib
import random
import re
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import torch as th
from stable_baselines3.common.callbacks import BaseCallback, CallbackList, EventCallback

from sb3_ppg import distributed
from sb3_ppg.array_files import array_digest, atomic_write, file_digest, fsync_directory, write_array_file
from sb3_ppg.env_state import get_vec_env_state, monitor_log_sizes

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


def _json_value(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else str(value)


def checkpoint_steps(directory: pathlib.Path, prefix: str) -> int | None:
    """The timestep count in a checkpoint folder's name ``<prefix>_<steps>_steps``, or None for another name."""
    match = re.fullmatch(re.escape(prefix) + r"_(\d+)_steps", directory.name)
    return int(match.group(1)) if match else None


def rank_folder(rank: int) -> str:
    """The folder, inside a checkpoint written under torchrun, of rank ``rank``'s part."""
    return f"rank_{rank}"


def write_checkpoint(
    model: "PPGBase", directory: pathlib.Path, rollouts: pathlib.Path, finish: Callable[[], None] | None = None
) -> None:
    """
    Write a complete checkpoint of ``model`` into ``directory`` (see ``PPGCheckpointCallback``). The stored
    rollouts of the auxiliary buffer go to ``rollouts`` (one file each, written once); the manifest, written last
    and atomically, lists every file with its checksum: a folder without manifest is an incomplete checkpoint.
    Under torchrun this is collective: every rank calls it at the same rollout boundary and writes its own part
    (see the module's docstring).

    :param model: the model, at a rollout boundary
    :param directory: the checkpoint's folder
    :param rollouts: the folder of the stored rollouts, shared by successive checkpoints
    :param finish: run once the checkpoint is complete by the process that wrote the manifest (rank 0 under
        torchrun), e.g. to prune older checkpoints; under torchrun its errors reach every rank
    :raises RuntimeError: under torchrun, on every rank, when any rank failed (the message says which and why)
    """
    if distributed.is_active():
        _write_distributed(model, directory, rollouts, finish)
        return
    _start_checkpoint(directory, rollouts, "")
    files = {"model.zip": _write_model(model, directory)}
    rollout_files = _write_rollouts(model, rollouts)
    files.update(_write_run_state(model, directory, rollout_files))
    _write_manifest(directory, _manifest(model, directory, rollouts, files, rollout_files))
    if finish is not None:
        finish()


def _start_checkpoint(directory: pathlib.Path, rollouts: pathlib.Path, part: str) -> None:
    """Create the folders; a checkpoint of the same step written before (by a run resumed from an older one) stops
    being complete first."""
    (directory / part).mkdir(parents=True, exist_ok=True)
    rollouts.mkdir(parents=True, exist_ok=True)
    if (directory / MANIFEST).exists():
        (directory / MANIFEST).unlink(missing_ok=True)
        fsync_directory(directory)


def _write_model(model: "PPGBase", directory: pathlib.Path) -> str:
    """Write ``model.zip`` (all optimizers) and return its checksum."""
    # SB3's save() closes the file it writes, so write a temporary path and rename
    temporary = directory / f".model.zip.tmp-{os.getpid()}"
    model.save(temporary)
    with open(temporary, "rb+") as file:
        os.fsync(file.fileno())
    os.replace(temporary, directory / "model.zip")
    return file_digest(directory / "model.zip")


def _write_rollouts(model: "PPGBase", rollouts: pathlib.Path) -> list[str]:
    """
    Store each policy iteration of the auxiliary buffer in its own file, named by its content and written once (shared
    by successive checkpoints, and by the ranks if two ever held the same rollout); return their names, in order.
    """
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
    return rollout_files


def _write_run_state(model: "PPGBase", folder: pathlib.Path, rollout_files: list[str]) -> dict[str, str]:
    """
    Write the run state into ``folder``: counters, last observations, random generators, episode statistics, the
    envs' states (``run_state.npz``, and ``env_states.pkl`` for the pickled envs of a ``DummyVecEnv``).

    :return: the checksum of each file written, by name
    """
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
    write_array_file(folder / "run_state.npz", arrays, json.loads(json.dumps(metadata, default=_json_value)))
    files = {"run_state.npz": file_digest(folder / "run_state.npz")}
    if pickled_envs is not None:
        atomic_write(folder / "env_states.pkl", lambda file: file.write(pickled_envs))
        files["env_states.pkl"] = file_digest(folder / "env_states.pkl")
    return files


def _manifest(
    model: "PPGBase", directory: pathlib.Path, rollouts: pathlib.Path, files: dict[str, str], rollout_files: list[str]
) -> dict[str, Any]:
    return {
        "format": CHECKPOINT_FORMAT,
        "version": 1,
        "num_timesteps": model.num_timesteps,
        "files": files,
        "rollouts_folder": os.path.relpath(rollouts, directory.parent),
        "aux_rollout_files": rollout_files,
    }


def _write_manifest(directory: pathlib.Path, manifest: dict[str, Any]) -> None:
    atomic_write(directory / MANIFEST, lambda file: file.write(json.dumps(manifest, indent=1).encode()))


def _write_distributed(
    model: "PPGBase", directory: pathlib.Path, rollouts: pathlib.Path, finish: Callable[[], None] | None
) -> None:
    """``write_checkpoint`` under torchrun: each rank writes its part, rank 0 the model zip and, last, the manifest."""
    rank = distributed.get_rank()
    part = rank_folder(rank)
    files: dict[str, str] = {}
    rollout_files: list[str] = []
    error: BaseException | None = None
    try:
        _start_checkpoint(directory, rollouts, part)
        if rank == 0:  # the parameters and optimizers are the same on every rank
            files["model.zip"] = _write_model(model, directory)
        rollout_files = _write_rollouts(model, rollouts)
        run_state = _write_run_state(model, directory / part, rollout_files)
        files.update({f"{part}/{name}": digest for name, digest in run_state.items()})
    except Exception as caught:
        error = caught
    # Every rank learns whether all ranks wrote their part, then rank 0 completes the checkpoint and tells the others
    failures = distributed.gather_errors(error)
    message = None
    if failures:
        reasons = "; ".join(f"rank {failed}: {reason}" for failed, reason in failures.items())
        message = f"Checkpoint {str(directory)!r} could not be written ({reasons}): it stays incomplete (no manifest)."
    else:
        parts = distributed.all_gather_object(
            dict(files=files, rollout_files=rollout_files, folders=(str(directory), str(rollouts)))
        )
        if rank == 0:
            outcome = _complete_distributed(model, directory, rollouts, parts, finish)
            message, error = outcome if outcome is not None else (None, None)
        message = distributed.broadcast_object(message)
    if message is not None:
        raise RuntimeError(message) from error


def _complete_distributed(
    model: "PPGBase",
    directory: pathlib.Path,
    rollouts: pathlib.Path,
    parts: list[dict[str, Any]],
    finish: Callable[[], None] | None,
) -> tuple[str, BaseException] | None:
    """
    On rank 0, once every rank has written its part: check that rank 0 sees every rank's files (a shared folder), write
    the manifest, then run ``finish``.

    :return: None, or the error message for every rank and rank 0's exception
    """
    try:
        files: dict[str, str] = {}
        for rank, part in enumerate(parts):
            if part["folders"] != parts[0]["folders"]:
                raise ValueError(
                    f"rank {rank} wrote to {part['folders']}, rank 0 to {parts[0]['folders']}: every rank must give "
                    "PPGCheckpointCallback the same save_path and name_prefix"
                )
            missing = [name for name in part["files"] if not (directory / name).is_file()]
            missing += [name for name in part["rollout_files"] if not (rollouts / name).is_file()]
            if missing:
                raise FileNotFoundError(
                    f"rank {rank}'s files {missing} are not visible from rank 0: under torchrun, checkpoints need a "
                    "save_path that all ranks share (one machine, or a shared filesystem)"
                )
            files.update(part["files"])
        rollout_files = list(dict.fromkeys(name for part in parts for name in part["rollout_files"]))
        manifest = _manifest(model, directory, rollouts, files, rollout_files)
        manifest["world_size"] = len(parts)
        manifest["rank_aux_rollout_files"] = [part["rollout_files"] for part in parts]
        _write_manifest(directory, manifest)
    except Exception as error:
        reason = f"rank 0: {type(error).__name__}: {error}"
        return f"Checkpoint {str(directory)!r} could not be written ({reason}): it stays incomplete (no manifest).", error
    try:
        if finish is not None:
            finish()
    except Exception as error:
        return f"Checkpoint {str(directory)!r} is complete, but then rank 0 failed: {type(error).__name__}: {error}", error
    return None


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
