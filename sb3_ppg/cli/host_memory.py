"""
Freed memory kept in the command line's own process while it trains on the CPU (see docs/throughput.md). Only the
command line does this, for its own process: the library never changes malloc's settings, which ``mallopt`` changes for
the rest of a process (glibc's dynamic mmap threshold is off after any ``mallopt`` of these settings). A Python program
gets the same from glibc's variables set before it starts (``MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=2147483647``).

glibc's ``malloc`` serves every block above its mmap threshold (at most 32 MiB) with a fresh ``mmap`` and gives it
back to the OS when it is freed; the next block's pages are then mapped again by the kernel, one page fault per
4 KiB, while the thread that touches them waits. A CPU training step allocates and frees activations of that size at
every micro-batch (the IMPALA CNN's first stack: 32 MiB in bf16, 64 MiB in fp32 at 256 samples). Within
:func:`freed_memory_kept`, glibc takes every block from its heap and keeps the heap's free memory mapped, so that
the next step reuses the same pages; on leaving it, glibc's defaults come back and the free memory is returned to
the OS. What is computed does not change, only where the memory comes from.
"""

import argparse
import contextlib
import ctypes
import functools
import os
import platform
import threading
from collections.abc import Iterator

from stable_baselines3.common.utils import get_device

#: ``mallopt`` parameters (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
#: glibc's defaults, set again on leaving (malloc.h: DEFAULT_TRIM_THRESHOLD, DEFAULT_MMAP_MAX)
DEFAULT_TRIM_THRESHOLD = 128 * 1024
DEFAULT_MMAP_MAX = 65536
#: The trim threshold while memory is kept: the largest that ``mallopt`` takes (an ``int``), about 2 GiB
KEPT_TRIM_THRESHOLD = 2**31 - 1
#: Environment variables that configure glibc's malloc: where one is set, the user's settings are left as they are
MALLOC_ENVIRONMENT = ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_")

_lock = threading.Lock()
#: How many :func:`freed_memory_kept` contexts are open (the outermost one sets and restores)
_depth = 0


@functools.cache
def glibc() -> ctypes.CDLL | None:
    """The process's glibc (for ``mallopt`` and ``malloc_trim``); ``None`` on other systems and C libraries."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt, malloc_trim = libc.mallopt, libc.malloc_trim
    except (OSError, AttributeError):
        return None
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    malloc_trim.argtypes, malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    return libc


def malloc_configured_by_user() -> bool:
    """Whether the environment configures glibc's malloc (``MALLOC_*_`` variables, ``glibc.malloc`` tunables)."""
    return any(name in os.environ for name in MALLOC_ENVIRONMENT) or "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", "")


@contextlib.contextmanager
def freed_memory_kept(enabled: bool = True) -> Iterator[bool]:
    """
    Within the context, glibc keeps the memory that the process frees (see the module's docstring); nested contexts
    share the outermost one's setting. Nothing changes where ``enabled`` is False, on a system without glibc, or where
    the environment configures glibc's malloc.

    :param enabled: whether to keep freed memory
    :return: (as the context's value) whether freed memory is kept
    """
    global _depth
    libc = glibc() if enabled and not malloc_configured_by_user() else None
    if libc is None:
        yield False
        return
    with _lock:
        if _depth == 0:
            libc.mallopt(M_MMAP_MAX, 0)
            libc.mallopt(M_TRIM_THRESHOLD, KEPT_TRIM_THRESHOLD)
        _depth += 1
    try:
        yield True
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                libc.mallopt(M_MMAP_MAX, DEFAULT_MMAP_MAX)
                libc.mallopt(M_TRIM_THRESHOLD, DEFAULT_TRIM_THRESHOLD)
                libc.malloc_trim(0)  # the heap's free memory back to the OS


@contextlib.contextmanager
def command_line_memory(argv: list[str]) -> Iterator[bool]:
    """
    Within the context, a command that trains on the CPU (the zoo's ``--device``, default ``auto``) keeps the memory it
    frees (:func:`freed_memory_kept`), said in one line (by rank 0 only under torchrun). ``-h`` / ``--help`` change
    nothing.

    :param argv: The command's arguments
    :return: (as the context's value) whether freed memory is kept
    """
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--device", default="auto")
    known, _ = parser.parse_known_args(argv)
    try:
        on_cpu = get_device(known.device).type == "cpu"
    except RuntimeError:  # an unknown device: the zoo says so
        on_cpu = False
    helping = "-h" in argv or "--help" in argv
    with freed_memory_kept(on_cpu and not helping) as kept:
        if kept and os.environ.get("RANK", "0") == "0":
            print(
                "freed memory: kept in this process while it trains on the CPU (glibc's mmap and trim thresholds off; "
                "see docs/throughput.md)"
            )
        yield kept
