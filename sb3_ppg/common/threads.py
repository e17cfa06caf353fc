"""
How many threads this process can use to itself: as many as it has CPUs, and no more than are idle. It computes,
it sets nothing: procgen's worker threads take it as their default (``ProcgenVecEnv(num_threads=None)``), and the
command line sets torch's threads from it (:mod:`sb3_ppg.cli.threads`); library code never changes torch's threads.

Threads beyond the idle CPUs fight over them with other jobs (or the other ranks of a torchrun job): on a 2-core
machine kept busy by other jobs, torch's default threads made training 5 to 24 times slower than one thread
(docs/command_line.md#threads). The rule (:func:`default_num_threads`): the CPUs this process may run on
(``os.sched_getaffinity``) divided among the ranks of this machine under torchrun (``LOCAL_WORLD_SIZE``), capped by the
CPUs the other jobs leave idle (the machine's CPUs minus its 1-minute load average, rounded to the nearest whole CPU)
less one, which the Python thread and the env's threads keep for themselves between torch's operations, and at
least 1. On the project's 2 idle cores one thread trained 1.8 to 1.9 times faster than two.
"""

import math
import os


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
