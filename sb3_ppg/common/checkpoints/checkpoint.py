"""
Checkpoints that resume a PPG run exactly: ``PPGCheckpointCallback`` writes them (:func:`write_checkpoint`),
``PPG.load_checkpoint`` finds and reads them (:func:`list_checkpoints` here, the rest in
:mod:`sb3_ppg.common.checkpoints.resume`).

Under torchrun (data-parallel training, :func:`sb3_ppg.common.distributed.is_active`) a checkpoint holds every rank's part:
rank 0 writes ``model.zip`` (parameters and optimizers are the same on every rank), each rank ``r`` writes its run
state (random generators, last observations, envs) into ``rank_<r>/`` and its auxiliary-buffer rollouts into the
shared rollouts folder, then rank 0 gathers every rank's checksums and writes the manifest last. The folder must be
shared by all ranks (one machine, or a shared filesystem).

A run holds a lock on its checkpoint folder while it trains (:func:`lock_folder`; rank 0 under torchrun), so that two
runs never write into one folder.
"""

import json
import os
import pathlib
import random
import re
import socket
import warnings
from collections.abc import Callable, Iterator
from typing import IO, TYPE_CHECKING, Any

try:
    import fcntl
except ImportError:  # Windows: no folder lock
    fcntl = None  # type: ignore[assignment]

import numpy as np
import torch as th
from stable_baselines3.common.callbacks import BaseCallback, CallbackList, EventCallback

from sb3_ppg.common import distributed
from sb3_ppg.common.array_files import (
    array_digest,
    array_file_checksum,
    atomic_write,
    file_digest,
    fsync_directory,
    write_array_file,
)
from sb3_ppg.common.checkpoints.env_state import get_vec_env_state, monitor_log_sizes

if TYPE_CHECKING:
    from sb3_ppg.ppg.base import PPGBase

MANIFEST = "manifest.json"
#: The lock file a training run holds in its checkpoint folder
LOCK_FILE = ".sb3_ppg.lock"
#: The files of a checkpoint folder (and of its ``rank_<r>/`` folders) that ``write_checkpoint`` writes
CHECKPOINT_FILES = (MANIFEST, "model.zip", "run_state.npz", "env_states.pkl")
#: Names of the stored rollouts, and of the temporary files of atomic writes (``.<name>.tmp-<pid>``)
ROLLOUT_NAME = re.compile(r"rollout_[0-9a-f]{32}\.npz")
TEMPORARY_NAME = re.compile(r"\.(?P<name>.+)\.tmp-(?P<pid>\d+)")
CHECKPOINT_FORMAT = "sb3_ppg.checkpoint"
RUN_STATE_FORMAT = "sb3_ppg.run_state"
ROLLOUT_FORMAT = "sb3_ppg.aux_rollout"
# Counters of the model that the run state carries (SB3's and PPG's)
COUNTERS = ("num_timesteps", "_n_updates", "_n_aux_phases", "_n_aux_updates", "_episode_num", "_num_timesteps_at_start",
            "_total_timesteps")  # fmt: skip


class CheckpointDamagedError(ValueError):
    """A checkpoint whose files do not match its manifest (a file missing, changed, truncated or unreadable)."""


# The folder locks this process holds, by real path (see lock_folder)
_held_locks: dict[str, IO[str]] = {}


def lock_holder(folder: str | os.PathLike) -> str | None:
    """
    Who holds the lock on a checkpoint folder, when another process does.

    :param folder: the checkpoint folder
    :return: ``"pid <pid> on <host>"`` (as the holder wrote it), or None when no other process holds the lock
    """
    path = pathlib.Path(folder) / LOCK_FILE
    if fcntl is None or os.path.realpath(folder) in _held_locks or not path.is_file():
        return None
    with open(path) as file:
        try:
            fcntl.flock(file.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return file.read().strip() or "pid unknown"
    return None


def lock_folder(folder: str | os.PathLike) -> None:
    """
    Take this process's lock on a checkpoint folder (``.sb3_ppg.lock``, an exclusive ``flock``), held until
    :func:`release_folder` or the end of the process: a lock left by a process that died is free again. Taking it
    again in the process that holds it does nothing. Without ``fcntl`` (Windows) there is no lock.

    :param folder: the checkpoint folder (created if needed)
    :raises RuntimeError: when another process holds it, naming that process
    """
    key = os.path.realpath(folder)
    if fcntl is None or key in _held_locks:
        return
    os.makedirs(folder, exist_ok=True)
    file = open(pathlib.Path(folder) / LOCK_FILE, "a+")
    try:
        fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        file.seek(0)
        holder = file.read().strip() or "pid unknown"
        file.close()
        raise RuntimeError(
            f"Another run is writing here ({holder}): {str(folder)!r} is locked by it. Two runs writing into one "
            "checkpoint folder would overwrite and prune each other's files: wait until that run ends (or stop it), "
            "or give this run another folder."
        ) from None
    file.seek(0)
    file.truncate()
    file.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
    file.flush()
    _held_locks[key] = file


def release_folder(folder: str | os.PathLike) -> None:
    """Release this process's lock on a checkpoint folder (nothing when it does not hold it); the lock file stays."""
    file = _held_locks.pop(os.path.realpath(folder), None)
    if file is not None:
        file.close()


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

    The manifest's ``sequence`` numbers the checkpoints of a folder in the order they were written (one more than
    the largest there): the newest checkpoint is the one written last, whatever its step count (a run resumed from
    an older checkpoint, or a second ``learn()`` that counts its steps from 0 again, writes smaller step counts).

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
    rollout_files, rollout_digests = _write_rollouts(model, rollouts)
    files.update(_write_run_state(model, directory, rollout_files))
    _write_manifest(directory, _manifest(model, directory, rollouts, files, rollout_files, rollout_digests))
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


def _write_rollouts(model: "PPGBase", rollouts: pathlib.Path) -> tuple[list[str], dict[str, str]]:
    """
    Store each policy iteration of the auxiliary buffer in its own file, named by its content and written once (shared
    by successive checkpoints, and by the ranks if two ever held the same rollout); a stored file that cannot be read
    any more is written again.

    :return: the files' names, in order, and their checksums by name (``array_file_checksum``)
    """
    rollout_files: list[str] = []
    rollout_digests: dict[str, str] = {}
    buffer = model.aux_buffer
    if buffer is not None:
        layout = {"format": ROLLOUT_FORMAT, "version": 1, **buffer.layout_metadata()}
        for iteration in range(buffer.n_iterations):
            name = buffer.saved_rollout_files.get(iteration)
            digest = _stored_checksum(rollouts / name) if name is not None else None
            if digest is None:
                arrays = buffer.iteration_arrays(iteration)
                content = array_digest(np.frombuffer("".join(array_digest(a) for a in arrays.values()).encode(), np.uint8))
                name = f"rollout_{content[:32]}.npz"
                digest = _stored_checksum(rollouts / name)
                if digest is None:
                    digest = write_array_file(rollouts / name, arrays, layout)["checksum"]
                buffer.saved_rollout_files[iteration] = name
            rollout_files.append(name)  # type: ignore[arg-type]
            rollout_digests[name] = digest  # type: ignore[index]
    return rollout_files, rollout_digests


def _stored_checksum(path: pathlib.Path) -> str | None:
    """The checksum of a stored rollout file, or None when there is no such readable file."""
    if not path.is_file():
        return None
    try:
        return array_file_checksum(path)
    except ValueError:
        return None


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
    model: "PPGBase",
    directory: pathlib.Path,
    rollouts: pathlib.Path,
    files: dict[str, str],
    rollout_files: list[str],
    rollout_digests: dict[str, str],
) -> dict[str, Any]:
    return {
        "format": CHECKPOINT_FORMAT,
        "version": 1,
        "sequence": _next_sequence(directory.parent),
        "num_timesteps": model.num_timesteps,
        "files": files,
        "rollouts_folder": os.path.relpath(rollouts, directory.parent),
        "aux_rollout_files": rollout_files,
        "aux_rollout_digests": rollout_digests,
    }


def _next_sequence(folder: pathlib.Path) -> int:
    """One more than the largest ``sequence`` of the complete checkpoints in ``folder`` (1 for the first)."""
    largest = 0
    for directory in folder.iterdir():
        try:
            manifest = read_manifest(directory) if directory.is_dir() else None
        except ValueError:
            continue
        if manifest is not None:
            largest = max(largest, manifest.get("sequence", 0))
    return largest + 1


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
    rollout_digests: dict[str, str] = {}
    error: BaseException | None = None
    try:
        _start_checkpoint(directory, rollouts, part)
        if rank == 0:  # the parameters and optimizers are the same on every rank
            files["model.zip"] = _write_model(model, directory)
        rollout_files, rollout_digests = _write_rollouts(model, rollouts)
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
            dict(
                files=files,
                rollout_files=rollout_files,
                rollout_digests=rollout_digests,
                folders=(str(directory), str(rollouts)),
            )
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
        rollout_digests = {name: digest for part in parts for name, digest in part["rollout_digests"].items()}
        manifest = _manifest(model, directory, rollouts, files, rollout_files, rollout_digests)
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
    """
    The manifest of a checkpoint folder, checked: every key it needs, with the right types.

    :param directory: the checkpoint folder
    :return: the manifest, or None when there is none (an incomplete checkpoint)
    :raises ValueError: naming the file (and the key) when it cannot be read, is not a PPG checkpoint manifest, or a
        key is missing or of the wrong type
    """
    path = directory / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise ValueError(f"The manifest {str(path)!r} is damaged (not readable JSON): {error}") from error
    if not isinstance(manifest, dict) or manifest.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{str(path)!r} is not a PPG checkpoint manifest (its format is not {CHECKPOINT_FORMAT!r}).")
    check_manifest(manifest, path)
    return manifest


def _is_int(value: Any, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _is_names(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(name, str) for name in value)


def _is_relative_name(name: Any) -> bool:
    """A path inside the checkpoint folder (``model.zip``, ``rank_1/run_state.npz``): relative, without ``..``."""
    return isinstance(name, str) and name != "" and not os.path.isabs(name) and ".." not in re.split(r"[/\\]", name)


def check_manifest(manifest: dict[str, Any], path: pathlib.Path) -> None:
    """
    Check the keys of a checkpoint manifest and their types.

    :param manifest: the manifest's content
    :param path: the manifest's file, for messages
    :raises ValueError: naming the file, the key, what it holds and what it should hold
    """
    expected = {
        "version": ("an integer >= 1", lambda value: _is_int(value, 1)),
        "num_timesteps": ("an integer >= 0", lambda value: _is_int(value, 0)),
        "files": (
            'an object {"<file in the checkpoint folder>": "<sha256>"}',
            lambda value: (
                isinstance(value, dict)
                and all(_is_relative_name(name) and isinstance(digest, str) for name, digest in value.items())
            ),
        ),
        "rollouts_folder": ("the name of a folder next to the checkpoint", lambda value: _is_relative_name(value)),
        "aux_rollout_files": ("a list of file names", _is_names),
    }
    optional = {
        "sequence": ("an integer >= 0", lambda value: _is_int(value, 0)),
        "world_size": ("an integer >= 1", lambda value: _is_int(value, 1)),
        "aux_rollout_digests": (
            'an object {"<rollout file>": "<checksum>"}',
            lambda value: isinstance(value, dict) and all(isinstance(item, str) for item in value.values()),
        ),
    }
    for key, (description, valid) in {**expected, **optional}.items():
        if key not in manifest:
            if key in expected:
                raise ValueError(
                    f"The manifest {str(path)!r} has no key {key!r} (it should be {description}): damaged or edited."
                )
        elif not valid(manifest[key]):
            raise ValueError(
                f"The manifest {str(path)!r} holds {manifest[key]!r} under {key!r}, which should be {description}: "
                "damaged or edited."
            )
    if "world_size" in manifest:
        per_rank = manifest.get("rank_aux_rollout_files")
        if not (isinstance(per_rank, list) and len(per_rank) == manifest["world_size"] and all(map(_is_names, per_rank))):
            raise ValueError(
                f"The manifest {str(path)!r} holds {per_rank!r} under 'rank_aux_rollout_files', which should be a list "
                f"of {manifest['world_size']} lists of file names (one per rank): damaged or edited."
            )


def checkpoint_order(directory: pathlib.Path, manifest: dict[str, Any]) -> tuple[int, int, int, str]:
    """
    The sort key of a complete checkpoint, oldest first: the manifest's ``sequence`` (the order of writing); manifests
    written before it existed (sb3_ppg 0.x) come first, by step count then name.
    """
    if "sequence" in manifest:
        return (1, manifest["sequence"], manifest["num_timesteps"], directory.name)
    return (0, 0, manifest["num_timesteps"], directory.name)


def list_checkpoints(
    folder: pathlib.Path, prefix: str | None = None, quiet: pathlib.Path | None = None
) -> list[tuple[pathlib.Path, dict[str, Any]]]:
    """
    The complete checkpoints in ``folder`` with their manifests, oldest first (see ``checkpoint_order``). A folder
    whose ``manifest.json`` is not a readable PPG checkpoint manifest is skipped, with a warning naming it.

    :param folder: a checkpoint folder (``save_path``)
    :param prefix: only the folders ``<prefix>_<steps>_steps``; None: every sub-folder with a manifest
    :param quiet: a folder skipped without warning (one an error already names)
    :return: ``[(checkpoint folder, manifest)]``
    """
    found = []
    for directory in sorted(folder.iterdir()) if folder.is_dir() else []:
        if (prefix is not None and checkpoint_steps(directory, prefix) is None) or not (directory / MANIFEST).is_file():
            continue
        try:
            manifest = read_manifest(directory)
        except ValueError as error:
            if directory != quiet:
                warnings.warn(f"Skipped {str(directory)!r}, not a usable checkpoint: {error}", stacklevel=2)
            continue
        if manifest is not None:
            found.append((checkpoint_order(directory, manifest), directory, manifest))
    return [(directory, manifest) for _, directory, manifest in sorted(found, key=lambda item: item[0])]


def complete_checkpoints(folder: pathlib.Path) -> list[pathlib.Path]:
    """The complete checkpoints in ``folder``, oldest first (see ``list_checkpoints``)."""
    return [directory for directory, _ in list_checkpoints(folder)]
