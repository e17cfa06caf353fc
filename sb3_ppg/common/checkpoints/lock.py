"""
The lock of a checkpoint folder (``.sb3_ppg.lock``): a run holds it while it trains (rank 0 under torchrun), so that two
runs never write into one folder. The file names the process that holds the lock.
"""

import os
import pathlib
import socket
from typing import IO

try:
    import fcntl
except ImportError:  # Windows: no folder lock
    fcntl = None  # type: ignore[assignment]

#: The lock file a training run holds in its checkpoint folder
LOCK_FILE = ".sb3_ppg.lock"

# The folder locks this process holds, by real path (see lock_folder)
_held_locks: dict[str, IO[str]] = {}


def lock_holder(folder: str | os.PathLike) -> str | None:
    """Who holds the lock on a checkpoint folder (``"pid <pid> on <host>"``), or None when no other process does."""
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
    Take this process's lock on a checkpoint folder (an exclusive ``flock``), held until :func:`release_folder` or the
    end of the process; none without ``fcntl`` (Windows).

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
