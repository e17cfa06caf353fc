"""
How many threads torch and procgen use: as many as this process has CPUs to itself, and no more than are idle.

Threads beyond the idle CPUs fight over them with other jobs (or the other ranks of a torchrun job): on a 2-core
machine kept busy by other jobs, torch's default threads made training 5 to 24 times slower than one thread
(docs/command_line.md#threads). The rule (:func:`default_num_threads`): the CPUs this process may run on
(``os.sched_getaffinity``) divided among the ranks of this machine under torchrun (``LOCAL_WORLD_SIZE``), capped by the
CPUs the other jobs leave idle (the machine's CPUs minus its 1-minute load average, rounded to the nearest whole CPU)
less one, which the Python thread and the env's threads keep for themselves between torch's operations, and at
least 1. On the project's 2 idle cores one thread trained 1.8 to 1.9 times faster than two. A user's choice wins:
``OMP_NUM_THREADS`` (which torch reads at start-up), ``--num-threads`` on the command line, ``num_threads=`` of
``make_procgen_env``; library code never changes torch's threads.
"""

import math
import os

import torch

#: Environment variables through which a user sets torch's number of threads before it starts
USER_THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def usable_cpus() -> int:
    """
    :return: The number of CPUs this process may run on (its affinity mask; ``os.cpu_count()`` where there is none)
    """
    if hasattr(os, "sched_getaffinity"):
        return max(len(os.sched_getaffinity(0)), 1)
    return max(os.cpu_count() or 1, 1)


def local_world_size() -> int:
    """
    :return: The number of processes of a torchrun job on this machine (``LOCAL_WORLD_SIZE``; 1 outside torchrun)
    """
    try:
        return max(int(os.environ.get("LOCAL_WORLD_SIZE", "1")), 1)
    except ValueError:
        return 1


def idle_cpus() -> float:
    """
    :return: The machine's CPUs minus its 1-minute load average (infinite where the load average is unknown)
    """
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return math.inf
    return (os.cpu_count() or 1) - load


def default_num_threads() -> int:
    """
    The number of threads for torch and procgen: this process's share of its CPUs (:func:`usable_cpus` divided by
    :func:`local_world_size`), no more than the idle CPUs (:func:`idle_cpus`, rounded) less one, at least 1.

    :return: The number of threads
    """
    share = max(usable_cpus() // local_world_size(), 1)
    idle = idle_cpus()
    if math.isfinite(idle):
        share = min(share, math.floor(idle + 0.5) - 1)
    return max(share, 1)


def user_set_torch_threads() -> bool:
    """
    :return: Whether the user chose torch's threads through the environment (``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``)
    """
    return any(os.environ.get(name, "").strip() for name in USER_THREAD_VARIABLES)


def choose_torch_threads(num_threads: int | None = None) -> tuple[int, str]:
    """
    Set torch's number of threads, for a program's start (the command line, the quick start, the examples).

    :param num_threads: The user's choice (``None`` or a value <= 0: ``OMP_NUM_THREADS`` where set, else
        :func:`default_num_threads`)
    :return: The number of threads torch now uses, and why (for a line of output)
    """
    if num_threads is not None and num_threads > 0:
        reason = "as asked"
    elif user_set_torch_threads():
        return torch.get_num_threads(), "OMP_NUM_THREADS"
    else:
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
    chosen = (num_threads is not None and num_threads > 0) or user_set_torch_threads()
    return None if chosen or recorded is None or recorded < 1 else recorded


def describe_default() -> str:
    """
    :return: What :func:`default_num_threads` was chosen from, in words
    """
    idle = idle_cpus()
    words = f"{usable_cpus()} CPUs"
    if local_world_size() > 1:
        words += f" shared by {local_world_size()} ranks"
    if math.isfinite(idle):
        words += f", load average {os.getloadavg()[0]:.1f}"
    return words
