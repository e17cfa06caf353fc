"""
The command line's torch threads: it owns its process, so it sets them (``train``, ``enjoy``, the quick start), from
the user's choice (``--num-threads``, a valid ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS``) or the rule of
:func:`sb3_ppg.common.threads.default_num_threads`, and says what it chose (docs/command_line.md#threads).
"""

import os
import warnings

import torch

from sb3_ppg.common.threads import default_num_threads, describe_default

#: Environment variables through which a user sets torch's number of threads before it starts
USER_THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def is_valid_thread_count(value: str) -> bool:
    """
    Whether an ``OMP_NUM_THREADS`` value sets a number of threads: a positive integer (or a comma-separated list of
    them, OpenMP's nested form, whose first counts); libgomp ignores any other value, ``0`` and ``abc`` included.
    """
    first = value.split(",")[0].strip()
    return first.isascii() and first.isdigit() and int(first) > 0


def user_thread_variable() -> str | None:
    """
    :return: The variable through which the user chose torch's threads (``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS``
        set to a valid count, see :func:`is_valid_thread_count`), or None
    """
    for name in USER_THREAD_VARIABLES:
        if is_valid_thread_count(os.environ.get(name, "")):
            return name
    return None


def invalid_thread_variables() -> dict[str, str]:
    """:return: The thread variables set (not empty) to a value that is not a valid count, by name"""
    values = {name: os.environ.get(name, "") for name in USER_THREAD_VARIABLES}
    return {name: value for name, value in values.items() if value.strip() and not is_valid_thread_count(value)}


def choose_torch_threads(num_threads: int | None = None) -> tuple[int, str]:
    """
    Set torch's number of threads, for a program's start (the command line, the quick start, the examples).

    :param num_threads: The user's choice (``None`` or a value <= 0: ``OMP_NUM_THREADS`` where set to a valid count,
        else :func:`default_num_threads`, with a warning for an invalid ``OMP_NUM_THREADS``)
    :return: The number of threads torch now uses, and why (for a line of output)
    """
    if num_threads is not None and num_threads > 0:
        reason = "as asked"
    elif (variable := user_thread_variable()) is not None:
        return torch.get_num_threads(), variable
    else:
        for name, value in invalid_thread_variables().items():
            warnings.warn(
                f"{name}={value!r} is not a number of threads (a positive integer): it is ignored, as libgomp ignores "
                f"it, and the command line chooses torch's threads itself. Set {name} to a positive integer, or unset it."
            )
        num_threads = default_num_threads()
        reason = describe_default()
    torch.set_num_threads(num_threads)
    return torch.get_num_threads(), reason


def threads_for_resume(recorded: int | None, num_threads: int | None = None) -> int | None:
    """
    The torch threads for the command line's ``--resume``: the run's own, for an exact resume, unless the user chose.

    :param recorded: The threads the checkpoint was written with (None: unknown)
    :param num_threads: The user's ``--num-threads`` (None or <= 0: none)
    :return: The number of threads to set, or None to keep torch's
    """
    chosen = (num_threads is not None and num_threads > 0) or user_thread_variable() is not None
    return None if chosen or recorded is None or recorded < 1 else recorded
