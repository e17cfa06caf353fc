"""
Loading a checkpoint written by ``PPGCheckpointCallback`` (``PPG.load_checkpoint``): the checksums, the world size,
then the model zip and the run state. Under torchrun every rank restores its own part (its envs, random generators,
last observations and auxiliary buffer); the ranks agree on every error, so none waits for a rank that failed.
"""

import os
import pathlib
import random
import warnings
from collections import deque
from typing import TYPE_CHECKING, Any

import numpy as np
import torch as th

from sb3_ppg.common import distributed
from sb3_ppg.common.array_files import array_file_checksum, file_digest, metadata_checksum, read_array_file
from sb3_ppg.common.checkpoints.checkpoint import (
    MANIFEST,
    ROLLOUT_FORMAT,
    RUN_STATE_FORMAT,
    CheckpointDamagedError,
    list_checkpoints,
    lock_holder,
    rank_folder,
    read_manifest,
)
from sb3_ppg.common.checkpoints.env_state import EnvMismatchError, set_vec_env_state, unsaved_parts
from sb3_ppg.common.hyperparameters import HyperparameterError

if TYPE_CHECKING:
    from sb3_ppg.ppg.base import PPGBase

#: Errors of the arguments (hyperparameters, the env), not of the checkpoint: an older checkpoint would not fit either
ARGUMENT_ERRORS = (HyperparameterError, EnvMismatchError)


def _obs_from_arrays(name: str, arrays: dict[str, np.ndarray]) -> Any:
    if name in arrays:
        return arrays[name]
    keys = [key[len(name) + 1 :] for key in arrays if key.startswith(name + ".")]
    return {key: arrays[f"{name}.{key}"] for key in keys} if keys else None


def check_world_size(directory: pathlib.Path, manifest: dict[str, Any]) -> None:
    """
    Check that a checkpoint was written with this run's world size (1 for a single process): every rank's envs,
    random generators and auxiliary buffer are in it, so a run resumes exactly only with as many ranks.

    :raises ValueError: naming both world sizes and how to resume, or to start anew from the weights
    """
    saved, current = manifest.get("world_size", 1), distributed.get_world_size()
    if saved != current:
        if saved == 1:
            how = "in a single process (python ..., without torchrun)"
        else:
            how = (
                f"under torchrun with {saved} processes (torchrun --nproc_per_node={saved} ...; on several machines, "
                f"nnodes x nproc_per_node = {saved})"
            )
        raise ValueError(
            f"Checkpoint {str(directory)!r} was written with world size {saved} and this run has world size {current}: "
            "it holds each rank's envs, random generators and auxiliary buffer, so it resumes only with the same world "
            f"size. Resume it {how}, or start anew from its weights with "
            f"PPG.load({str(directory / 'model.zip')!r}, env=...)."
        )


def verify_files(directory: pathlib.Path, manifest: dict[str, Any], rank: int | None = None, full: bool = False) -> None:
    """
    Check the files a manifest lists: each checkpoint file against its SHA-256, each stored rollout for its presence
    and its checksum (read from the file's metadata; ``full``: the whole file read and checked, as loading it does).

    :param directory: the checkpoint's folder
    :param manifest: its manifest
    :param rank: for a checkpoint written under torchrun, check only the model zip and this rank's part; None: all
    :param full: read every stored rollout completely (a rollout damaged inside its arrays is found only so)
    :raises CheckpointDamagedError: naming the first file that does not match
    """
    files, rollout_files = manifest["files"], manifest["aux_rollout_files"]
    if rank is not None and "world_size" in manifest:
        prefix = rank_folder(rank) + "/"
        files = {name: digest for name, digest in files.items() if "/" not in name or name.startswith(prefix)}
        rollout_files = manifest["rank_aux_rollout_files"][rank]
    for name, digest in files.items():
        if not (directory / name).is_file():
            raise CheckpointDamagedError(f"{name} is missing")
        if file_digest(directory / name) != digest:
            raise CheckpointDamagedError(f"{name} does not match its checksum (damaged or changed file)")
    digests = manifest.get("aux_rollout_digests", {})  # not in the manifests of sb3_ppg 0.x
    for name in rollout_files:
        where = f"{manifest['rollouts_folder']}/{name}"
        path = directory.parent / manifest["rollouts_folder"] / name
        if not path.is_file():
            raise CheckpointDamagedError(f"the stored rollout {where} is missing")
        try:
            checksum = metadata_checksum(read_array_file(path, ROLLOUT_FORMAT)[0]) if full else array_file_checksum(path)
        except ValueError as error:
            raise CheckpointDamagedError(f"the stored rollout {where} is damaged: {error}") from error
        if name in digests and checksum != digests[name]:
            raise CheckpointDamagedError(f"the stored rollout {where} does not match its checksum (another or changed file)")


def newest_verified(
    folder: pathlib.Path, before: pathlib.Path | None = None
) -> tuple[tuple[pathlib.Path, dict[str, Any]] | None, list[str]]:
    """
    The newest checkpoint of ``folder`` whose files all verify (``verify_files(..., full=True)``: every stored rollout
    read), older than ``before``.

    :param folder: a checkpoint folder (``save_path``)
    :param before: a checkpoint of ``folder``: only those written before it (all others when its manifest is
        unreadable); None: all
    :return: (the checkpoint and its manifest, or None when none verifies; what was skipped, newest first, each with
        the reason)
    """
    entries = list_checkpoints(folder, quiet=before)
    directories = [directory for directory, _ in entries]
    if before is not None:
        entries = entries[: directories.index(before)] if before in directories else [e for e in entries if e[0] != before]
    skipped = []
    for directory, manifest in reversed(entries):
        try:
            verify_files(directory, manifest, full=True)
        except CheckpointDamagedError as error:
            skipped.append(f"{str(directory)!r} ({error})")
            continue
        return (directory, manifest), skipped
    return None, skipped


def restore_run(model: "PPGBase", directory: pathlib.Path, manifest: dict[str, Any], part: str = "") -> None:
    """
    Put the run state and the auxiliary buffer of a checkpoint (files already verified) into a loaded model.

    :param part: the folder of this rank's part in a checkpoint written under torchrun (``rank_<r>``), else ""
    """
    try:
        metadata, arrays = read_array_file(directory / part / "run_state.npz", RUN_STATE_FORMAT)
    except (ValueError, OSError) as error:
        raise CheckpointDamagedError(f"{os.path.join(part, 'run_state.npz')} cannot be read: {error}") from error
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
            try:
                rollout_metadata, rollout_arrays = read_array_file(path, ROLLOUT_FORMAT)
            except (ValueError, OSError) as error:
                where = f"{manifest['rollouts_folder']}/{name}"
                raise CheckpointDamagedError(f"the stored rollout {where} is damaged: {error}") from error
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
        pickled_name = f"{part}/env_states.pkl" if part else "env_states.pkl"
        pickled_envs = (directory / pickled_name).read_bytes() if pickled_name in manifest["files"] else None
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
    device = distributed.auto_init(device)  # a process started by torchrun joins the job before anything is read
    if distributed.is_active():
        return _load_distributed(cls, path, env, device, **kwargs)
    explicit, candidates = _candidates(path)
    skipped: list[str] = []
    for directory, manifest in candidates:
        check_world_size(directory, manifest)
        try:
            model = _load_one(cls, directory, manifest, env, device, kwargs)
        except CheckpointDamagedError as error:
            if explicit:
                raise damaged_error(directory, str(error)) from error
            skipped.append(f"{str(directory)!r} ({error})")
            continue
        except ARGUMENT_ERRORS:
            raise
        except (ValueError, KeyError, TypeError, OSError) as error:
            raise ValueError(f"Checkpoint {str(directory)!r} cannot be loaded: {error}") from error
        _warn_skipped(directory, skipped)
        return model
    raise _none_loads(path, skipped)


def _candidates(path: str | os.PathLike) -> tuple[bool, list[tuple[pathlib.Path, dict[str, Any]]]]:
    """
    What ``load_checkpoint(path)`` tries, in order: the checkpoint ``path`` (explicit: True), or the complete
    checkpoints of the folder ``path``, newest first.

    :raises FileNotFoundError: when ``path`` holds no complete checkpoint
    :raises ValueError: when the manifest of the checkpoint ``path`` is damaged (naming one that verifies)
    """
    path = pathlib.Path(path)
    if (path / MANIFEST).is_file():
        try:
            manifest = read_manifest(path)
        except ValueError as error:
            raise damaged_error(path, str(error)) from error
        return True, [(path, manifest)]  # type: ignore[list-item]
    candidates = list_checkpoints(path)
    if not candidates:
        raise FileNotFoundError(f"No complete PPG checkpoint (a folder with a {MANIFEST}) in {str(path)!r}.")
    return False, candidates[::-1]


def _load_one(
    cls: type["PPGBase"],
    directory: pathlib.Path,
    manifest: dict[str, Any],
    env: Any,
    device: th.device | str,
    kwargs: dict[str, Any],
    rank: int | None = None,
) -> "PPGBase":
    """Verify a checkpoint (this rank's part under torchrun), load its model and restore its run state."""
    verify_files(directory, manifest, rank)
    model = cls.load(directory / "model.zip", env=env, device=device, force_reset=False, **kwargs)
    restore_run(model, directory, manifest, rank_folder(rank) if rank is not None else "")
    return model


def damaged_error(directory: pathlib.Path, reason: str) -> CheckpointDamagedError:
    """
    The error for a damaged checkpoint, naming the newest older one that verifies (see ``newest_verified``).

    :param directory: the damaged checkpoint
    :param reason: what is damaged
    :return: the error
    """
    found, _ = newest_verified(directory.parent, before=directory)
    if found is not None:
        fallback = f"the newest older checkpoint that verifies is {str(found[0])!r}: pass it to load_checkpoint()"
    else:
        fallback = f"no older checkpoint in {str(directory.parent)!r} verifies"
    holder = lock_holder(directory.parent)
    writing = f" Another run is writing here ({holder}): it may be changing these files." if holder else ""
    return CheckpointDamagedError(
        f"Checkpoint {str(directory)!r} is damaged ({reason}); {fallback} (given the folder "
        f"{str(directory.parent)!r}, load_checkpoint() loads the newest checkpoint that verifies).{writing}"
    )


def _warn_skipped(directory: pathlib.Path, skipped: list[str]) -> None:
    if skipped:
        warnings.warn(
            f"Loaded checkpoint {str(directory)!r}: the newer ones are damaged and were skipped: {'; '.join(skipped)}. "
            "The run continues from an older point; the skipped checkpoints are deleted by the pruning (keep_last) once "
            "the run has written a newer one.",
            stacklevel=3,
        )


def _none_loads(path: str | os.PathLike, skipped: list[str]) -> ValueError:
    holder = lock_holder(path)
    writing = f" Another run is writing here ({holder}): it may be changing these files." if holder else ""
    return ValueError(f"No checkpoint in {str(path)!r} can be loaded, every one is damaged: {'; '.join(skipped)}.{writing}")


def _load_distributed(
    cls: type["PPGBase"], path: str | os.PathLike, env: Any, device: th.device | str, **kwargs: Any
) -> "PPGBase":
    """
    ``load_checkpoint`` under torchrun (collective: every rank calls it): rank 0 finds the checkpoints to try and reads
    their manifests, then each rank verifies and restores its own part; an error on any rank is raised on every rank,
    and a checkpoint damaged on any rank is skipped by every rank (given a folder).
    """
    rank = distributed.get_rank()
    found: tuple[Any, ...] | None = None
    if rank == 0:
        try:
            found = ("found", *_candidates(path))
        except FileNotFoundError as error:
            found = ("missing", str(error))
        except Exception as error:
            found = ("invalid", f"{error}" if isinstance(error, ValueError) else f"{type(error).__name__}: {error}")
    found = distributed.broadcast_object(found)
    if found[0] == "missing":
        raise FileNotFoundError(found[1])
    if found[0] == "invalid":
        raise ValueError(found[1])
    _, explicit, candidates = found
    skipped: list[str] = []
    for directory, manifest in candidates:
        check_world_size(directory, manifest)  # the same manifest and world size on every rank: no rank goes on alone
        model, error = None, None
        try:
            model = _load_one(cls, directory, manifest, env, device, kwargs, rank)
        except Exception as caught:
            error = caught
        outcome = None if error is None else (isinstance(error, CheckpointDamagedError), f"{type(error).__name__}: {error}")
        failures = {failed: item for failed, item in enumerate(distributed.all_gather_object(outcome)) if item is not None}
        if not failures:
            _warn_skipped(directory, skipped)
            return model  # type: ignore[return-value]
        if isinstance(error, ARGUMENT_ERRORS):
            raise error
        reasons = "; ".join(f"rank {failed}: {message}" for failed, (_, message) in failures.items())
        if not all(damaged for damaged, _ in failures.values()):
            raise ValueError(f"Checkpoint {str(directory)!r} cannot be loaded ({reasons})") from error
        if explicit:
            message = distributed.broadcast_object(str(damaged_error(directory, reasons)) if rank == 0 else None)
            raise CheckpointDamagedError(message) from error
        skipped.append(f"{str(directory)!r} ({reasons})")
    raise _none_loads(path, skipped)


def read_monitor_log_sizes(directory: pathlib.Path) -> dict[str, int]:
    """
    The sizes of the run's episode logs (``*.monitor.csv``, by real path) when a checkpoint was written: a resumed
    run cuts them there, so that the episodes logged after the checkpoint (and played again) are not counted twice.

    :param directory: A complete checkpoint folder (of a single-process run, or this rank's part under torchrun)
    :return: ``{path: size}`` (empty for checkpoints of envs without episode logs)
    """
    path = directory / "run_state.npz"
    if not path.is_file():
        path = directory / rank_folder(distributed.get_rank()) / "run_state.npz"
    metadata, _ = read_array_file(path, RUN_STATE_FORMAT)
    return {str(name): int(size) for name, size in metadata.get("monitor_log_sizes", {}).items()}
