"""
The manifest of a checkpoint (``manifest.json``, written last: a folder without one is an incomplete checkpoint): every
file of the checkpoint with its SHA-256, the stored rollouts it uses with their checksums, the order of writing
(``sequence``). The names of checkpoint folders (``<name_prefix>_<steps>_steps``) and of their ``rank_<r>/`` parts.
"""

import json
import os
import pathlib
import re
import warnings
from typing import Any

from sb3_ppg.common.array_files import atomic_write, file_digest

MANIFEST = "manifest.json"
CHECKPOINT_FORMAT = "sb3_ppg.checkpoint"
#: The folder of rank ``r``'s part in a checkpoint written under torchrun (see ``rank_folder``)
RANK_FOLDER = re.compile(r"rank_(\d+)")


class CheckpointDamagedError(ValueError):
    """A checkpoint whose files do not match its manifest (a file missing, changed, truncated or unreadable)."""


def checkpoint_name(prefix: str, steps: int) -> str:
    """The folder name of the checkpoint of ``prefix`` at ``steps`` timesteps: ``<prefix>_<steps>_steps``."""
    return f"{prefix}_{steps}_steps"


def checkpoint_steps(directory: pathlib.Path, prefix: str) -> int | None:
    """The timestep count in a checkpoint folder's name (``checkpoint_name``), or None for another name."""
    match = re.fullmatch(re.escape(prefix) + r"_(\d+)_steps", directory.name)
    return int(match.group(1)) if match else None


def rank_folder(rank: int) -> str:
    """The folder, inside a checkpoint written under torchrun, of rank ``rank``'s part (``RANK_FOLDER``)."""
    return f"rank_{rank}"


def build_manifest(
    num_timesteps: int,
    directory: pathlib.Path,
    rollouts: pathlib.Path,
    files: dict[str, str],
    rollout_files: list[str],
    rollout_digests: dict[str, str],
) -> dict[str, Any]:
    """
    The manifest of a checkpoint: its files' and stored rollouts' checksums and its ``sequence`` (the order of writing).

    :param files: the checksum of each file of the checkpoint, by its path inside the folder
    :param rollout_files: the stored rollouts it uses, in the auxiliary buffer's order
    :param rollout_digests: their checksums, by name
    """
    return {
        "format": CHECKPOINT_FORMAT,
        "version": 1,
        "sequence": _next_sequence(directory.parent),
        "num_timesteps": num_timesteps,
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


def write_manifest(directory: pathlib.Path, manifest: dict[str, Any]) -> None:
    atomic_write(directory / MANIFEST, lambda file: file.write(json.dumps(manifest, indent=1).encode()))


def check_files(directory: pathlib.Path, manifest: dict[str, Any], rank: int | None = None) -> None:
    """
    Check the files a manifest lists (not the stored rollouts) against their SHA-256.

    :param rank: under torchrun, check only the model zip and this rank's part; None: all
    """
    files = manifest["files"]
    if rank is not None and "world_size" in manifest:
        prefix = rank_folder(rank) + "/"
        files = {name: digest for name, digest in files.items() if "/" not in name or name.startswith(prefix)}
    for name, digest in files.items():
        if not (directory / name).is_file():
            raise CheckpointDamagedError(f"{name} is missing")
        if file_digest(directory / name) != digest:
            raise CheckpointDamagedError(f"{name} does not match its checksum (damaged or changed file)")


def listed_rollouts(manifest: dict[str, Any], rank: int | None = None) -> list[str]:
    """The stored rollouts a manifest lists (for a checkpoint written under torchrun and a ``rank``: that rank's)."""
    if rank is not None and "world_size" in manifest:
        return manifest["rank_aux_rollout_files"][rank]
    return manifest["aux_rollout_files"]


def read_manifest(directory: pathlib.Path) -> dict[str, Any] | None:
    """The manifest of a checkpoint folder, checked (None when there is none: an incomplete checkpoint)."""
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
    """Check the keys of a checkpoint manifest and their types (a ``ValueError`` names the file and the key)."""
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
    The complete checkpoints in ``folder`` with their manifests, oldest first; unreadable manifests are skipped with a
    warning (none with ``quiet``).

    :param prefix: only the folders ``<prefix>_<steps>_steps``; None: every sub-folder with a manifest
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
