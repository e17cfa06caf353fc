"""Files of plain arrays (``.npz`` read with ``allow_pickle=False`` plus checksummed JSON metadata) and atomic writes."""

import hashlib
import io
import json
import math
import os
import pathlib
import re
import zipfile
from collections.abc import Callable
from typing import IO, Any

import numpy as np
from gymnasium import spaces

ZIP_MAGIC = b"PK\x03\x04"
METADATA_MEMBER = "metadata.json"
#: The temporary file of an atomic write, ``.<name>.tmp-<pid>`` next to the file it replaces (see ``temporary_path``)
TEMPORARY_NAME = re.compile(r"\.(?P<name>.+)\.tmp-(?P<pid>\d+)")


def fsync_directory(directory: str | pathlib.Path) -> None:
    """Flush a directory entry (a rename or a new file) to disk; a no-op where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def temporary_path(path: str | pathlib.Path) -> pathlib.Path:
    """Where this process writes ``path`` before renaming it into place (a name ``TEMPORARY_NAME`` matches)."""
    path = pathlib.Path(path)
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def atomic_write(path: str | pathlib.Path, write: Callable[[IO[bytes]], None]) -> None:
    """
    Write a file so that it is complete or absent, also after a kill: a temporary file, fsynced and renamed over ``path``.
    """
    path = pathlib.Path(path)
    temporary = temporary_path(path)
    try:
        with open(temporary, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)


def file_digest(path: str | pathlib.Path) -> str:
    """The SHA-256 of a file's bytes, as hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def array_digest(array: np.ndarray) -> str:
    """The SHA-256 of an array's bytes (C order), as hex."""
    return hashlib.sha256(np.asarray(array, order="C").data).hexdigest()


def _json_digest(metadata: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(metadata, sort_keys=True).encode()).hexdigest()


def metadata_checksum(metadata: dict[str, Any]) -> str:
    """The checksum of a file written by ``write_array_file``, from the metadata ``read_array_file`` returned."""
    return _json_digest({key: value for key, value in metadata.items() if key != "checksum"})


def array_file_checksum(path: str | pathlib.Path) -> str:
    """The checksum a file of ``write_array_file`` claims, read from its metadata alone (a ``ValueError`` for another file)."""
    try:
        with zipfile.ZipFile(path) as archive:
            metadata = json.loads(archive.read(METADATA_MEMBER))
    except (zipfile.BadZipFile, OSError, EOFError, KeyError, ValueError) as error:
        raise ValueError(f"{str(path)!r} is not a readable array file (truncated or damaged): {error!r}") from error
    checksum = metadata.get("checksum") if isinstance(metadata, dict) else None
    if not isinstance(checksum, str):
        raise ValueError(f"{str(path)!r} has no checksum in its metadata (damaged, or not written by sb3_ppg)")
    return checksum


def _json_number(value: float) -> float | str:
    """A float for JSON; infinities and NaN as the strings "inf", "-inf", "nan" (strict JSON has no such numbers)."""
    return float(value) if math.isfinite(value) else str(float(value))


def _json_bounds(array: np.ndarray) -> Any:
    """Box bounds for JSON: one number when all are equal, else the nested list."""
    flat = array.reshape(-1)
    if flat.size > 0 and np.all(flat == flat[0]):
        return _json_number(flat[0])
    return np.vectorize(_json_number, otypes=[object])(array).tolist()


def space_to_json(space: spaces.Space) -> dict[str, Any]:
    """Describe a gymnasium space in JSON (Box, Discrete, MultiDiscrete, MultiBinary and Dict of those)."""
    if isinstance(space, spaces.Box):
        return {
            "type": "Box",
            "shape": list(space.shape),
            "dtype": space.dtype.str,  # type: ignore[union-attr]
            "low": _json_bounds(space.low),
            "high": _json_bounds(space.high),
        }
    if isinstance(space, spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, spaces.MultiDiscrete):
        return {"type": "MultiDiscrete", "nvec": space.nvec.tolist(), "start": space.start.tolist()}
    if isinstance(space, spaces.MultiBinary):
        return {"type": "MultiBinary", "n": np.asarray(space.n).tolist()}
    if isinstance(space, spaces.Dict):
        return {"type": "Dict", "spaces": [[key, space_to_json(sub)] for key, sub in space.spaces.items()]}
    raise ValueError(
        f"Cannot describe a {type(space).__name__} space in JSON (supported: Box, Discrete, MultiDiscrete, MultiBinary, Dict)."
    )


def space_from_json(description: dict[str, Any]) -> spaces.Space:
    """The gymnasium space described by ``space_to_json``."""
    kind = description["type"]
    if kind == "Box":
        shape = tuple(description["shape"])
        dtype = np.dtype(description["dtype"])
        low = np.broadcast_to(np.asarray(description["low"], dtype=np.float64), shape)
        high = np.broadcast_to(np.asarray(description["high"], dtype=np.float64), shape)
        return spaces.Box(low=low.astype(dtype), high=high.astype(dtype), shape=shape, dtype=dtype)  # type: ignore[arg-type]
    if kind == "Discrete":
        return spaces.Discrete(int(description["n"]), start=int(description["start"]))
    if kind == "MultiDiscrete":
        return spaces.MultiDiscrete(description["nvec"], start=description["start"])
    if kind == "MultiBinary":
        return spaces.MultiBinary(description["n"])
    if kind == "Dict":
        return spaces.Dict({key: space_from_json(sub) for key, sub in description["spaces"]})
    raise ValueError(f"Unknown space type {kind!r}")


def write_array_file(
    path: str | pathlib.Path | IO[bytes], arrays: dict[str, np.ndarray], metadata: dict[str, Any], atomic: bool = True
) -> dict[str, Any]:
    """
    Write arrays (numeric or bool: nothing is pickled) and JSON metadata as an ``.npz`` file; the metadata gets the
    dtype, shape and SHA-256 of every array, and a checksum of itself.

    :param atomic: write under a temporary name and rename into place (for a path)
    :return: the metadata as written
    """
    metadata = dict(metadata)
    metadata["arrays"] = {
        name: {"dtype": array.dtype.str, "shape": list(array.shape), "sha256": array_digest(array)}
        for name, array in arrays.items()
    }
    metadata["checksum"] = _json_digest(metadata)

    def write(file: IO[bytes]) -> None:
        with zipfile.ZipFile(file, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
            archive.writestr(METADATA_MEMBER, json.dumps(metadata, sort_keys=True))
            for name, array in arrays.items():
                with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                    np.lib.format.write_array(member, np.asarray(array, order="C"), allow_pickle=False)

    if isinstance(path, (str, pathlib.Path)):
        if atomic:
            atomic_write(path, write)
        else:
            with open(path, "wb") as file:
                write(file)
    else:
        write(path)
    return metadata


def read_array_file(
    path: str | pathlib.Path | IO[bytes], expected_format: str
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """
    Read a file written by ``write_array_file``, checked completely (a ``ValueError`` for another kind of file, a
    truncated one or a changed byte): (metadata, arrays by name).
    """
    if isinstance(path, (str, pathlib.Path)):
        with open(path, "rb") as file:
            return read_array_file_object(file, expected_format, path)
    return read_array_file_object(path, expected_format, path)


def read_array_file_object(
    file: IO[bytes], expected_format: str, source: object
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """``read_array_file`` on an open binary file; ``source`` names it in messages."""
    start = file.tell() if file.seekable() else 0
    magic = file.read(len(ZIP_MAGIC))
    if magic != ZIP_MAGIC:
        hint = " (it looks like a pickle: pickles are not loaded, for safety)" if magic[:1] == b"\x80" else ""
        raise ValueError(f"{source!r} is not a {expected_format} file written by sb3_ppg (an .npz archive){hint}.")
    if file.seekable():
        file.seek(start)
    else:
        file = io.BytesIO(magic + file.read())
    try:
        with np.load(file, allow_pickle=False) as archive:
            raw_metadata = archive[METADATA_MEMBER] if METADATA_MEMBER in archive.files else None
            if not isinstance(raw_metadata, bytes):
                raise ValueError("no metadata.json")
            metadata = json.loads(raw_metadata)
            if not isinstance(metadata, dict) or metadata.get("format") != expected_format:
                raise ValueError(f"it holds {metadata.get('format') if isinstance(metadata, dict) else None!r}")
            claimed = metadata.pop("checksum", None)
            if claimed != _json_digest(metadata):
                raise ValueError("the metadata's checksum does not match (changed or damaged metadata)")
            arrays = {}
            for name, info in metadata["arrays"].items():
                array = archive[name]
                if array.dtype.str != info["dtype"] or list(array.shape) != info["shape"]:
                    raise ValueError(
                        f"array {name!r} is {array.dtype.str} {list(array.shape)}, the metadata says "
                        f"{info['dtype']} {info['shape']}"
                    )
                if array_digest(array) != info["sha256"]:
                    raise ValueError(f"array {name!r} does not match its checksum (damaged file)")
                arrays[name] = array
    except ValueError as error:
        raise ValueError(f"{source!r} is not a valid {expected_format} file: {error}.") from error
    except (zipfile.BadZipFile, OSError, EOFError, KeyError, TypeError, json.JSONDecodeError) as error:
        raise ValueError(f"{source!r} is not a valid {expected_format} file (truncated or damaged): {error!r}.") from error
    return metadata, arrays
