"""
Pruning a folder of checkpoints (``PPGCheckpointCallback``'s ``keep_last``): what a run no longer needs is deleted,
only the files this package writes, by their names, never through a symbolic link out of the folder.
"""

import os
import pathlib
from collections.abc import Callable
from typing import Any

from sb3_ppg.common.array_files import TEMPORARY_NAME, fsync_directory
from sb3_ppg.common.checkpoints.checkpoint import CHECKPOINT_FILES
from sb3_ppg.common.checkpoints.manifest import MANIFEST, RANK_FOLDER, checkpoint_steps, list_checkpoints
from sb3_ppg.common.checkpoints.rollouts import ROLLOUT_NAME

#: How pruning reports what it leaves alone: ``warn(path, problem)``
Warn = Callable[[pathlib.Path, str], None]


def prune(
    folder: pathlib.Path,
    name_prefix: str,
    rollouts_path: pathlib.Path,
    keep_last: int | None,
    newest: pathlib.Path | None,
    resume_point: pathlib.Path | None,
    warn: Warn,
) -> None:
    """
    Delete what the run no longer needs: complete checkpoints beyond ``keep_last`` and those of an abandoned branch,
    incomplete checkpoints, stored rollouts no checkpoint uses, temporary files of interrupted writes. A folder is
    removed once empty. Other files and folders stay (with a warning inside a checkpoint or the rollouts folder), as
    do checkpoints whose manifest cannot be read (with a warning).

    :param folder: the checkpoints' folder (``save_path``)
    :param name_prefix: the prefix of the run's checkpoint folders
    :param rollouts_path: the folder of the stored rollouts
    :param keep_last: the number of complete checkpoints kept; None: all
    :param newest: The checkpoint this run has just written (complete; kept whatever happens); None: the start of
        a resumed run
    :param resume_point: At the start of a resumed run, the checkpoint of ``folder`` it continues from: it and
        every checkpoint written after it are kept (the run has not written a checkpoint of its own yet)
    :param warn: called once for each path left alone, with the reason
    """
    checkpoints = list_checkpoints(folder)
    own = []
    for directory, manifest in checkpoints:
        if checkpoint_steps(directory, name_prefix) is None:
            continue
        if directory.is_symlink() or is_outside(directory, folder):
            warn(directory, "is a symbolic link: pruning leaves it (and what it links to) alone")
        else:
            own.append((directory, manifest))
    removed = checkpoints_to_remove(own, keep_last, newest, resume_point)
    for directory in removed:
        remove_checkpoint(directory, warn)
    for directory in sorted(folder.iterdir()):
        # Incomplete checkpoints (no manifest): a kill during a write
        incomplete = not os.path.lexists(directory / MANIFEST)
        if checkpoint_steps(directory, name_prefix) is not None and incomplete and directory != newest:
            if directory.is_dir() and not directory.is_symlink() and not is_outside(directory, folder):
                remove_checkpoint(directory, warn)
    for directory, _ in own:
        if directory.is_dir():
            for part in (directory, *rank_folders(directory)):
                remove_files(part, keep=CHECKPOINT_FILES)
    used = set()
    for directory, manifest in checkpoints:
        if directory not in removed and manifest["rollouts_folder"] == rollouts_path.name:
            used.update(manifest["aux_rollout_files"])
    prune_rollouts(folder, rollouts_path, used, warn)
    fsync_directory(folder)


def checkpoints_to_remove(
    checkpoints: list[tuple[pathlib.Path, dict[str, Any]]],
    keep_last: int | None,
    newest: pathlib.Path | None,
    resume_point: pathlib.Path | None,
) -> list[pathlib.Path]:
    """
    The complete checkpoints (the run's, oldest first) that pruning deletes: with ``keep_last``, those superseded by a
    newer one with fewer steps (an abandoned branch, or the first ``learn()`` before one that counts from 0 again),
    then all but the ``keep_last`` newest; never ``newest``, nor the resume point and what was written after it.
    """
    if keep_last is None:
        return []
    directories = [directory for directory, _ in checkpoints]
    steps = [manifest["num_timesteps"] for _, manifest in checkpoints]
    protected = {newest}
    if newest is None and resume_point in directories:
        protected.update(directories[directories.index(resume_point) :])
    superseded = {directory for i, directory in enumerate(directories) if any(s <= steps[i] for s in steps[i + 1 :])}
    remove = [directory for directory in directories if directory in superseded and directory not in protected]
    kept = [directory for directory in directories if directory not in remove]
    return remove + [directory for directory in kept[:-keep_last] if directory not in protected]


def remove_checkpoint(directory: pathlib.Path, warn: Warn) -> None:
    """Delete a checkpoint's files (the manifest first: a checkpoint half deleted by a kill is incomplete)."""
    manifest = directory / MANIFEST
    if manifest.is_file() and not manifest.is_symlink():
        manifest.unlink()
        fsync_directory(directory)
    for part in (*rank_folders(directory), directory):
        remove_files(part)
        try:
            part.rmdir()
        except OSError:
            if part == directory:
                others = sorted(path.name for path in directory.rglob("*"))
                warn(directory, f"holds files sb3_ppg does not write ({', '.join(others)}): left in place")


def rank_folders(directory: pathlib.Path) -> list[pathlib.Path]:
    """The ``rank_<r>/`` folders of a checkpoint written under torchrun (real folders, not links)."""
    return [
        path
        for path in sorted(directory.iterdir())
        if RANK_FOLDER.fullmatch(path.name) and path.is_dir() and not path.is_symlink()
    ]


def remove_files(folder: pathlib.Path, keep: tuple[str, ...] = ()) -> None:
    """
    Delete the checkpoint files in ``folder`` (those of ``CHECKPOINT_FILES`` not in ``keep``) and the temporary
    files of interrupted writes of other processes (this one's may be in progress); plain files only.
    """
    for path in folder.iterdir():
        if path.is_symlink() or not path.is_file():
            continue
        temporary = TEMPORARY_NAME.fullmatch(path.name)
        if temporary is not None:
            # The file it was to become; a temporary of a temporary (..model.zip.tmp-<pid>.tmp-<pid>, which a kill
            # while a checkpoint's model.zip was written could leave with earlier versions) also counts
            name = temporary["name"]
            while (inner := TEMPORARY_NAME.fullmatch(name)) is not None:
                name = inner["name"]
            if name in CHECKPOINT_FILES and int(temporary["pid"]) != os.getpid():
                path.unlink(missing_ok=True)
        elif path.name in CHECKPOINT_FILES and path.name not in keep:
            path.unlink(missing_ok=True)


def prune_rollouts(folder: pathlib.Path, rollouts: pathlib.Path, used: set[str], warn: Warn) -> None:
    """Delete the stored rollouts no complete checkpoint uses, and temporary files of interrupted writes."""
    if not rollouts.is_dir():
        return
    if is_outside(rollouts, folder):
        warn(
            rollouts,
            "leads out of save_path (a symbolic link): pruning deletes nothing there, so stored rollouts no "
            "checkpoint uses stay (delete them yourself, or make it a folder of save_path)",
        )
        return
    for path in sorted(rollouts.iterdir()):
        temporary = TEMPORARY_NAME.fullmatch(path.name)
        if path.is_symlink() or not path.is_file():
            warn(path, "is not a stored rollout of sb3_ppg (a folder or a link): left alone")
        elif ROLLOUT_NAME.fullmatch(path.name):
            if path.name not in used:
                path.unlink(missing_ok=True)
        elif temporary is not None and ROLLOUT_NAME.fullmatch(temporary["name"]):
            if int(temporary["pid"]) != os.getpid():
                path.unlink(missing_ok=True)
        else:
            warn(path, "is not a stored rollout of sb3_ppg: left alone")
    fsync_directory(rollouts)


def is_outside(path: pathlib.Path, folder: pathlib.Path) -> bool:
    """Whether ``path`` leads out of ``folder`` (through a symbolic link)."""
    return not pathlib.Path(os.path.realpath(path)).is_relative_to(os.path.realpath(folder))
