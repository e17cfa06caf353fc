"""
Checkpoints that resume a PPG run exactly: :func:`write_checkpoint` writes the model zip, the run state, the stored
rollouts and, last, the manifest; :func:`load_checkpoint` verifies them, loads the model and restores the run. Under
torchrun each rank writes and restores its own part (see docs/checkpoints.md).
"""

import io
import os
import pathlib
import pickle
import warnings
import zipfile
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import torch as th

from sb3_ppg.common import distributed
from sb3_ppg.common.array_files import atomic_write, file_digest, fsync_directory
from sb3_ppg.common.checkpoints.env_state import EnvMismatchError
from sb3_ppg.common.checkpoints.lock import lock_holder
from sb3_ppg.common.checkpoints.manifest import (
    MANIFEST,
    CheckpointDamagedError,
    build_manifest,
    check_files,
    list_checkpoints,
    listed_rollouts,
    rank_folder,
    read_manifest,
    write_manifest,
)
from sb3_ppg.common.checkpoints.model_objects import rebuild
from sb3_ppg.common.checkpoints.rollouts import check_rollout, read_rollouts, write_rollouts
from sb3_ppg.common.checkpoints.run_state import ResumableModel, read_run_state, restore_run_state, write_run_state
from sb3_ppg.common.hyperparameters import HyperparameterError
from sb3_ppg.common.save_util import read_model_zip

Model = TypeVar("Model", bound=ResumableModel)

#: The files of a checkpoint folder (and of its ``rank_<r>/`` folders) that ``write_checkpoint`` writes
CHECKPOINT_FILES = (MANIFEST, "model.zip", "run_state.npz", "env_states.pkl")


class PickleRefusedError(ValueError):
    """``load_checkpoint(..., allow_pickle=False)`` of a checkpoint that cannot be loaded without unpickling."""


#: Errors of the arguments (hyperparameters, the env, ``allow_pickle``), not of the checkpoint: an older checkpoint
#: would not fit either
ARGUMENT_ERRORS = (HyperparameterError, EnvMismatchError, PickleRefusedError)


def write_checkpoint(
    model: ResumableModel, directory: pathlib.Path, rollouts: pathlib.Path, finish: Callable[[], None] | None = None
) -> None:
    """
    Write a complete checkpoint of ``model`` into ``directory``, the manifest last (a folder without one is incomplete);
    collective under torchrun (see docs/checkpoints.md).

    :param model: the model, at a rollout boundary
    :param directory: the checkpoint's folder
    :param rollouts: the folder of the stored rollouts, shared by successive checkpoints
    :param finish: run once the checkpoint is complete by the process that wrote the manifest (e.g. pruning)
    :raises RuntimeError: under torchrun, on every rank, when any rank failed (the message says which and why)
    """
    if distributed.is_active():
        _write_distributed(model, directory, rollouts, finish)
        return
    _start_checkpoint(directory, rollouts, "")
    files = {"model.zip": _write_model(model, directory)}
    rollout_names, rollout_digests = write_rollouts(model.aux_buffer, rollouts)
    files.update(write_run_state(model, directory, rollout_names))
    write_manifest(directory, build_manifest(model.num_timesteps, directory, rollouts, files, rollout_names, rollout_digests))
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


def _write_model(model: ResumableModel, directory: pathlib.Path) -> str:
    """Write ``model.zip`` (all optimizers) atomically and return its checksum."""
    # One temporary file (.model.zip.tmp-<pid>), which pruning recognizes; the model writes into the file object
    # (saving to a temporary path would add a second temporary name that a kill could leave behind)
    atomic_write(directory / "model.zip", model.save)
    return file_digest(directory / "model.zip")


def _write_distributed(
    model: ResumableModel, directory: pathlib.Path, rollouts: pathlib.Path, finish: Callable[[], None] | None
) -> None:
    """``write_checkpoint`` under torchrun: each rank writes its part, rank 0 the model zip and, last, the manifest."""
    rank = distributed.get_rank()
    part = rank_folder(rank)
    files: dict[str, str] = {}
    rollout_names: list[str] = []
    rollout_digests: dict[str, str] = {}
    error: BaseException | None = None
    try:
        _start_checkpoint(directory, rollouts, part)
        if rank == 0:  # the parameters and optimizers are the same on every rank
            files["model.zip"] = _write_model(model, directory)
        rollout_names, rollout_digests = write_rollouts(model.aux_buffer, rollouts)
        run_state = write_run_state(model, directory / part, rollout_names)
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
                rollout_files=rollout_names,
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
    model: ResumableModel,
    directory: pathlib.Path,
    rollouts: pathlib.Path,
    parts: list[dict[str, Any]],
    finish: Callable[[], None] | None,
) -> tuple[str, BaseException] | None:
    """On rank 0, once every rank has written its part: check that it sees them, write the manifest, run ``finish``."""
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
        rollout_names = list(dict.fromkeys(name for part in parts for name in part["rollout_files"]))
        rollout_digests = {name: digest for part in parts for name, digest in part["rollout_digests"].items()}
        manifest = build_manifest(model.num_timesteps, directory, rollouts, files, rollout_names, rollout_digests)
        manifest["world_size"] = len(parts)
        manifest["rank_aux_rollout_files"] = [part["rollout_files"] for part in parts]
        write_manifest(directory, manifest)
    except Exception as error:
        reason = f"rank 0: {type(error).__name__}: {error}"
        return f"Checkpoint {str(directory)!r} could not be written ({reason}): it stays incomplete (no manifest).", error
    try:
        if finish is not None:
            finish()
    except Exception as error:
        return f"Checkpoint {str(directory)!r} is complete, but then rank 0 failed: {type(error).__name__}: {error}", error
    return None


def verify_files(directory: pathlib.Path, manifest: dict[str, Any], rank: int | None = None, full: bool = False) -> None:
    """
    Check the files a manifest lists against their checksums, and the stored rollouts' presence and checksums.

    :param rank: under torchrun, check only the model zip and this rank's part; None: all
    :param full: read every stored rollout completely (a rollout damaged inside its arrays is found only so)
    :raises CheckpointDamagedError: naming the first file that does not match
    """
    check_files(directory, manifest, rank)
    digests = manifest.get("aux_rollout_digests", {})  # not in the manifests of sb3_ppg 0.x
    for name in listed_rollouts(manifest, rank):
        path = directory.parent / manifest["rollouts_folder"] / name
        check_rollout(path, f"{manifest['rollouts_folder']}/{name}", digests.get(name), full)


def newest_verified(
    folder: pathlib.Path, before: pathlib.Path | None = None
) -> tuple[tuple[pathlib.Path, dict[str, Any]] | None, list[str]]:
    """
    The newest checkpoint of ``folder`` whose files all verify completely, written before ``before`` (None: all).

    :return: (the checkpoint and its manifest, or None; what was skipped, newest first, each with the reason)
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


def find_checkpoint(
    path: str | os.PathLike, verify_named: bool = True
) -> tuple[tuple[pathlib.Path, dict[str, Any]] | None, list[str]]:
    """
    The checkpoint ``path`` names, verified completely: ``path`` itself when it is a checkpoint, else the newest of the
    folder ``path`` that verifies. ``load_checkpoint`` and the command line's ``--resume`` both choose with it.

    :param verify_named: verify the checkpoint ``path`` when it is one
    :return: (the checkpoint and its manifest, or None; the damaged newer ones skipped, each with the reason)
    :raises CheckpointDamagedError: when the checkpoint ``path`` is damaged (naming the newest older one that verifies)
    """
    path = pathlib.Path(path)
    if not (path / MANIFEST).is_file():
        return newest_verified(path)
    try:
        manifest = read_manifest(path)
        if verify_named:
            verify_files(path, manifest, full=True)  # type: ignore[arg-type]
    except ValueError as error:
        raise damaged_error(path, str(error)) from error
    return (path, manifest), []  # type: ignore[return-value]


def check_world_size(directory: pathlib.Path, manifest: dict[str, Any]) -> None:
    """Check that a checkpoint was written with this run's world size (a ``ValueError`` says how to resume)."""
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


def restore_run(model: ResumableModel, directory: pathlib.Path, manifest: dict[str, Any], part: str = "") -> None:
    """
    Put the run state and the auxiliary buffer of a verified checkpoint into a loaded model.

    :param part: this rank's folder under torchrun (``rank_<r>``), else ""
    """
    metadata, arrays = read_run_state(directory / part / "run_state.npz", os.path.join(part, "run_state.npz"))
    if metadata["n_envs"] != model.n_envs:
        raise ValueError(
            f"The checkpoint's run had {metadata['n_envs']} envs, the env passed has {model.n_envs}: pass an env with "
            f"{metadata['n_envs']} envs to continue the run (or PPG.load() its model.zip and set_env() to start anew)."
        )
    rollouts_folder = manifest["rollouts_folder"]
    read_rollouts(model.aux_buffer, directory.parent / rollouts_folder, metadata["aux_rollout_files"], rollouts_folder)
    pickled_name = f"{part}/env_states.pkl" if part else "env_states.pkl"
    restore_run_state(model, metadata, arrays, directory / pickled_name if pickled_name in manifest["files"] else None)


def load_checkpoint(
    cls: type[Model],
    path: str | os.PathLike,
    env: Any = None,
    device: th.device | str = "auto",
    allow_pickle: bool = True,
    **kwargs: Any,
) -> Model:
    """
    Load a checkpoint: verify it, load its model with ``cls.load`` and restore the run (see ``PPG.load_checkpoint``).

    :param path: a checkpoint folder, or a folder of checkpoints (the newest that verifies is loaded)
    :param allow_pickle: False: unpickle nothing (see :func:`pickle_free_objects`); a bool, anything else is refused
    :param kwargs: passed to ``cls.load``
    """
    if not isinstance(allow_pickle, (bool, np.bool_)):
        # A string such as "False" is true: a security switch takes exactly what it documents
        raise TypeError(
            f"allow_pickle must be True or False, got {allow_pickle!r} ({type(allow_pickle).__name__}): pass "
            "allow_pickle=False to unpickle nothing, True only for checkpoints you trust (pickles run code when loaded)."
        )
    device = distributed.auto_init(device)  # a process started by torchrun joins the job before anything is read
    path = os.path.expanduser(path)  # as PPGCheckpointCallback's save_path
    if not allow_pickle:
        kwargs["allow_pickle"] = False  # read by _load_one
    if distributed.is_active():
        return _load_distributed(cls, path, env, device, **kwargs)
    directory, manifest, skipped = _chosen(path)
    check_world_size(directory, manifest)
    try:
        model = _load_one(cls, directory, manifest, env, device, kwargs)
    except CheckpointDamagedError as error:  # changed since it was verified
        raise damaged_error(directory, str(error)) from error
    except ARGUMENT_ERRORS:
        raise
    except (ValueError, KeyError, TypeError, OSError) as error:
        raise ValueError(f"Checkpoint {str(directory)!r} cannot be loaded: {error}") from error
    _warn_skipped(directory, skipped)
    return model


def _chosen(path: str | os.PathLike, verify_named: bool = True) -> tuple[pathlib.Path, dict[str, Any], list[str]]:
    """The checkpoint ``load_checkpoint(path)`` loads (:func:`find_checkpoint`), with the damaged ones skipped."""
    found, skipped = find_checkpoint(path, verify_named)
    if found is None and not skipped:
        raise FileNotFoundError(f"No complete PPG checkpoint (a folder with a {MANIFEST}) in {str(path)!r}.")
    if found is None:
        raise _none_loads(path, skipped)
    return found[0], found[1], skipped


def _load_one(
    cls: type[Model],
    directory: pathlib.Path,
    manifest: dict[str, Any],
    env: Any,
    device: th.device | str,
    kwargs: dict[str, Any],
    rank: int | None = None,
) -> Model:
    """Verify a checkpoint (this rank's part under torchrun), load its model and restore its run state."""
    verify_files(directory, manifest, rank)
    kwargs = dict(kwargs)
    pickle_free = not kwargs.pop("allow_pickle", True)
    if pickle_free:
        part = rank_folder(rank) if rank is not None else ""
        kwargs["custom_objects"] = pickle_free_objects(directory, manifest, part, kwargs.get("custom_objects"))
    try:
        model = cls.load(directory / "model.zip", env=env, device=device, force_reset=False, **kwargs)
    except (pickle.UnpicklingError, RuntimeError, ValueError) as error:
        reason = _tampered_file(directory / "model.zip", error, pickle_free)
        if reason is None or isinstance(error, ARGUMENT_ERRORS):
            raise
        raise ValueError(reason) from error
    restore_run(model, directory, manifest, rank_folder(rank) if rank is not None else "")
    return model


def _tampered_file(model_zip: pathlib.Path, error: BaseException, pickle_free: bool) -> str | None:
    """
    Which file of a verified checkpoint makes ``load`` fail, and why (its checksums match: it was changed and the
    manifest updated, or written by other code); None for another error.
    """
    note = "changed after the checkpoint was written (its checksum in the manifest too), or written by other code"
    if isinstance(error, pickle.UnpicklingError):
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        detail = next((line for line in lines if "GLOBAL" in line), lines[0] if lines else type(error).__name__)
        return (
            f"model.zip, {_unloadable_member(model_zip) or 'a .pth member'}: not a file of tensors ({detail}): {note}; "
            "nothing in it was run"
        )
    source = "run_state.npz (its descriptions of the spaces and policy_kwargs)" if pickle_free else "model.zip's data"
    if isinstance(error, RuntimeError) and "state_dict" in str(error):
        detail = str(error).splitlines()[0].strip()
        return (
            f"model.zip, policy.pth: its parameters do not fit the policy built from {source} ({detail}): one of these "
            f"files was {note}"
        )
    if isinstance(error, ValueError) and "loaded state dict" in str(error):  # torch's Optimizer.load_state_dict
        return f"model.zip, its optimizers' .pth members: they do not fit the policy's parameters ({error}): {note}"
    if pickle_free and isinstance(error, ValueError) and "spaces do not match" in str(error):
        return f"run_state.npz: its description of the spaces does not fit the env ({error}): it was {note}"
    return None


def _unloadable_member(model_zip: pathlib.Path) -> str | None:
    """The first ``.pth`` member of a model zip that ``torch.load(weights_only=True)`` refuses (nothing is run)."""
    with zipfile.ZipFile(model_zip) as archive:
        for name in archive.namelist():
            if name.endswith(".pth"):
                try:
                    th.load(io.BytesIO(archive.read(name)), map_location="cpu", weights_only=True)
                except Exception:
                    return name
    return None


def pickle_free_objects(
    directory: pathlib.Path, manifest: dict[str, Any], part: str, custom_objects: dict[str, Any] | None
) -> dict[str, Any]:
    """
    The ``custom_objects`` that load a checkpoint's ``model.zip`` without unpickling: its pickled objects rebuilt from
    their plain descriptions (:mod:`.model_objects`), the caller's taking precedence.

    :raises PickleRefusedError: when the checkpoint holds pickled envs, or a pickled object has no plain description
    """
    where = f"Checkpoint {str(directory)!r}"
    fix = "Load it with allow_pickle=True only if you trust where it comes from (pickles run code when loaded)"
    pickled_envs = f"{part}/env_states.pkl" if part else "env_states.pkl"
    if pickled_envs in manifest["files"]:
        raise PickleRefusedError(
            f"{where} holds the pickled envs of a DummyVecEnv ({pickled_envs}), which allow_pickle=False refuses. {fix}; "
            "checkpoints of envs whose states are arrays (Procgen's ProcgenVecEnv) need no pickle."
        )
    metadata, _ = read_run_state(directory / part / "run_state.npz", os.path.join(part, "run_state.npz"))
    given = dict(custom_objects or {})
    described = metadata.get("model_objects", {"objects": {}, "not_described": {}})
    objects = {name: rebuild(value) for name, value in described["objects"].items()}
    saved = read_model_zip(directory / "model.zip")
    pickled = [name for name, item in (saved[0] if saved else {}).items() if isinstance(item, dict) and ":serialized:" in item]
    missing = [name for name in pickled if name not in given and name not in objects]
    if saved is None or missing:
        why = {name: described["not_described"].get(name, "not described in its run state") for name in missing}
        reasons = "; ".join(f"{name}: {reason}" for name, reason in why.items()) or "model.zip cannot be read"
        raise PickleRefusedError(
            f"{where} cannot be loaded without unpickling objects of its model.zip ({reasons}). {fix}, or pass those "
            "objects in custom_objects (checkpoints of earlier sb3_ppg versions describe none of them)."
        )
    return {**{name: objects[name] for name in pickled if name not in given}, **given}


def damaged_error(directory: pathlib.Path, reason: str) -> CheckpointDamagedError:
    """The error for a damaged checkpoint, naming the newest older one that verifies."""
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


def _load_distributed(cls: type[Model], path: str | os.PathLike, env: Any, device: th.device | str, **kwargs: Any) -> Model:
    """
    ``load_checkpoint`` under torchrun (collective: every rank calls it): rank 0 chooses the checkpoint
    (:func:`find_checkpoint`), then each rank verifies and restores its own part; an error on any rank is raised on
    every rank.
    """
    rank = distributed.get_rank()
    found: tuple[Any, ...] | None = None
    if rank == 0:
        try:
            found = ("found", *_chosen(path, verify_named=False))
        except FileNotFoundError as error:
            found = ("missing", str(error))
        except Exception as error:
            found = ("invalid", f"{error}" if isinstance(error, ValueError) else f"{type(error).__name__}: {error}")
    found = distributed.broadcast_object(found)
    if found[0] == "missing":
        raise FileNotFoundError(found[1])
    if found[0] == "invalid":
        raise ValueError(found[1])
    _, directory, manifest, skipped = found
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
    message = distributed.broadcast_object(str(damaged_error(directory, reasons)) if rank == 0 else None)
    raise CheckpointDamagedError(message) from error
