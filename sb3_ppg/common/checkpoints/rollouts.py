"""
The auxiliary buffer's rollouts in a checkpoint: one file per stored policy iteration, named by its content, in the
rollouts folder that successive checkpoints share (``<save_path>/<name_prefix>_rollouts/rollout_<digest>.npz``).
"""

import pathlib
import re
import weakref
from typing import Any

import numpy as np

from sb3_ppg.common.array_files import (
    array_digest,
    array_file_checksum,
    metadata_checksum,
    read_array_file,
    write_array_file,
)
from sb3_ppg.common.aux_buffer import AuxiliaryBuffer
from sb3_ppg.common.checkpoints.manifest import CheckpointDamagedError

ROLLOUT_FORMAT = "sb3_ppg.aux_rollout"
#: The names of the stored rollouts
ROLLOUT_NAME = re.compile(r"rollout_[0-9a-f]{32}\.npz")
#: The stored file of each policy iteration of a buffer already on disk, valid until the buffer's next reset():
#: buffer -> (its ``n_resets``, {iteration: file name})
_STORED_FILES: "weakref.WeakKeyDictionary[AuxiliaryBuffer, tuple[int, dict[int, str]]]" = weakref.WeakKeyDictionary()


def stored_files(buffer: AuxiliaryBuffer) -> dict[int, str]:
    """The stored file of each policy iteration of ``buffer`` already on disk (a dict to update), since its last reset."""
    n_resets, files = _STORED_FILES.get(buffer, (None, {}))
    if n_resets != buffer.n_resets:
        files = {}
        _STORED_FILES[buffer] = (buffer.n_resets, files)
    return files


def rollout_layout(buffer: AuxiliaryBuffer) -> dict[str, Any]:
    """
    The metadata of a stored rollout of ``buffer``: its format, and the buffer's layout it must fit. Version 2 files
    hold the action masks of a ``MaskablePPG`` buffer (an ``action_masks`` array, ``mask_dims`` in the layout);
    the files of a buffer without masks stay version 1, so those written by earlier versions are read as they were.
    """
    return {"format": ROLLOUT_FORMAT, "version": buffer.file_version, **buffer.layout_metadata()}


def stored_checksum(path: pathlib.Path) -> str | None:
    """The checksum of a stored rollout file, or None when there is no such readable file."""
    if not path.is_file():
        return None
    try:
        return array_file_checksum(path)
    except ValueError:
        return None


def write_rollouts(buffer: AuxiliaryBuffer | None, folder: pathlib.Path) -> tuple[list[str], dict[str, str]]:
    """
    Store each policy iteration of the auxiliary buffer in its own file, named by its content and written once.

    :return: the files' names, in order, and their checksums by name
    """
    rollout_files: list[str] = []
    rollout_digests: dict[str, str] = {}
    if buffer is None:
        return rollout_files, rollout_digests
    layout = rollout_layout(buffer)
    stored = stored_files(buffer)
    for iteration in range(buffer.n_iterations):
        name = stored.get(iteration)
        digest = stored_checksum(folder / name) if name is not None else None
        if digest is None:
            arrays = buffer.iteration_arrays(iteration)
            content = array_digest(np.frombuffer("".join(array_digest(a) for a in arrays.values()).encode(), np.uint8))
            name = f"rollout_{content[:32]}.npz"
            digest = stored_checksum(folder / name)
            if digest is None:
                digest = write_array_file(folder / name, arrays, layout)["checksum"]
            stored[iteration] = name
        rollout_files.append(name)
        rollout_digests[name] = digest
    return rollout_files, rollout_digests


def check_rollout(path: pathlib.Path, where: str, expected_checksum: str | None, full: bool) -> None:
    """
    Check a stored rollout listed in a manifest: present, readable, with the recorded checksum (None: none recorded).

    :param full: read the whole file and check every array
    """
    if not path.is_file():
        raise CheckpointDamagedError(f"the stored rollout {where} is missing")
    try:
        checksum = metadata_checksum(read_array_file(path, ROLLOUT_FORMAT)[0]) if full else array_file_checksum(path)
    except ValueError as error:
        raise CheckpointDamagedError(f"the stored rollout {where} is damaged: {error}") from error
    if expected_checksum is not None and checksum != expected_checksum:
        raise CheckpointDamagedError(f"the stored rollout {where} does not match its checksum (another or changed file)")


def read_rollouts(buffer: AuxiliaryBuffer | None, folder: pathlib.Path, names: list[str], folder_name: str) -> None:
    """Fill the auxiliary buffer with the stored rollouts ``names``, in order (its earlier content is dropped)."""
    if buffer is None:
        if names:
            raise ValueError("the checkpoint holds auxiliary-buffer rollouts but this model has no auxiliary buffer")
        return
    layout = rollout_layout(buffer)
    buffer.reset()
    stored = stored_files(buffer)
    for iteration, name in enumerate(names):
        path = folder / name
        try:
            metadata, arrays = read_array_file(path, ROLLOUT_FORMAT)
        except (ValueError, OSError) as error:
            raise CheckpointDamagedError(f"the stored rollout {folder_name}/{name} is damaged: {error}") from error
        mismatches = [key for key, value in layout.items() if metadata.get(key) != value]
        if mismatches:
            raise ValueError(f"the stored rollout {str(path)!r} does not fit this model ({', '.join(mismatches)} differ)")
        buffer.add_iteration_arrays(arrays, path)
        stored[iteration] = name
