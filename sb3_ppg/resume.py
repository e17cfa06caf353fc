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

from sb3_ppg import distributed
from sb3_ppg.array_files import file_digest, read_array_file
from sb3_ppg.checkpoints import ROLLOUT_FORMAT, RUN_STATE_FORMAT, find_checkpoint, rank_folder, read_manifest
from sb3_ppg.env_state import EnvMismatchError, set_vec_env_state, unsaved_parts
from sb3_ppg.validation import HyperparameterError

if TYPE_CHECKING:
    from sb3_ppg.base import PPGBase

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


def verify_files(directory: pathlib.Path, manifest: dict[str, Any], rank: int | None = None) -> None:
    """
    Check every file listed in a manifest against its checksum (``ValueError`` naming the first damaged one).

    :param directory: the checkpoint's folder
    :param manifest: its manifest
    :param rank: for a checkpoint written under torchrun, check only the model zip and this rank's part; None: all
    """
    files, rollout_files = manifest["files"], manifest["aux_rollout_files"]
    if rank is not None and "world_size" in manifest:
        prefix = rank_folder(rank) + "/"
        files = {name: digest for name, digest in files.items() if "/" not in name or name.startswith(prefix)}
        rollout_files = manifest["rank_aux_rollout_files"][rank]
    for name, digest in files.items():
        if not (directory / name).is_file():
            raise ValueError(f"{name} is missing")
        if file_digest(directory / name) != digest:
            raise ValueError(f"{name} does not match its checksum (damaged or changed file)")
    for name in rollout_files:
        if not (directory.parent / manifest["rollouts_folder"] / name).is_file():
            raise ValueError(f"the stored rollout {manifest['rollouts_folder']}/{name} is missing")


def restore_run(model: "PPGBase", directory: pathlib.Path, manifest: dict[str, Any], part: str = "") -> None:
    """
    Put the run state and the auxiliary buffer of a checkpoint (files already verified) into a loaded model.

    :param part: the folder of this rank's part in a checkpoint written under torchrun (``rank_<r>``), else ""
    """
    metadata, arrays = read_array_file(directory / part / "run_state.npz", RUN_STATE_FORMAT)
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
    directory, previous, manifest = _find(path)
    check_world_size(directory, manifest)
    try:
        verify_files(directory, manifest)
        model = cls.load(directory / "model.zip", env=env, device=device, force_reset=False, **kwargs)
        restore_run(model, directory, manifest)
    except ARGUMENT_ERRORS:
        raise
    except (ValueError, KeyError, TypeError, OSError) as error:
        raise _damaged(directory, previous, str(error)) from error
    return model


def _find(path: str | os.PathLike) -> tuple[pathlib.Path, pathlib.Path | None, dict[str, Any]]:
    """The checkpoint to load from ``path``, the complete one before it (or None) and its manifest."""
    directory, previous = find_checkpoint(path)
    try:
        manifest = read_manifest(directory)
        assert manifest is not None
    except (ValueError, OSError) as error:
        raise _damaged(directory, previous, str(error)) from error
    return directory, previous, manifest


def _damaged(directory: pathlib.Path, previous: pathlib.Path | None, reason: str) -> ValueError:
    fallback = f"the previous complete checkpoint is {str(previous)!r}" if previous else "there is no previous one"
    return ValueError(
        f"Checkpoint {str(directory)!r} is damaged or does not fit ({reason}); {fallback}: pass it to load_checkpoint()."
    )


def _load_distributed(
    cls: type["PPGBase"], path: str | os.PathLike, env: Any, device: th.device | str, **kwargs: Any
) -> "PPGBase":
    """
    ``load_checkpoint`` under torchrun (collective: every rank calls it): rank 0 finds the checkpoint and reads its
    manifest, then each rank verifies and restores its own part; an error on any rank is raised on every rank.
    """
    rank = distributed.get_rank()
    found: tuple[Any, ...] | None = None
    if rank == 0:
        try:
            found = ("found", *_find(path))
        except FileNotFoundError as error:
            found = ("missing", str(error))
        except Exception as error:
            found = ("invalid", f"{error}" if isinstance(error, ValueError) else f"{type(error).__name__}: {error}")
    found = distributed.broadcast_object(found)
    if found[0] == "missing":
        raise FileNotFoundError(found[1])
    if found[0] == "invalid":
        raise ValueError(found[1])
    _, directory, previous, manifest = found
    check_world_size(directory, manifest)  # the same manifest and world size on every rank: no rank goes on alone
    model, error = None, None
    try:
        verify_files(directory, manifest, rank)
        model = cls.load(directory / "model.zip", env=env, device=device, force_reset=False, **kwargs)
        restore_run(model, directory, manifest, rank_folder(rank))
    except Exception as caught:
        error = caught
    failures = distributed.gather_errors(error)
    if isinstance(error, ARGUMENT_ERRORS):
        raise error
    if failures:
        reasons = "; ".join(f"rank {failed}: {reason}" for failed, reason in failures.items())
        raise _damaged(directory, previous, reasons) from error
    return model  # type: ignore[return-value]


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
