"""
The rule that chooses procgen's and the command line's threads (sb3_ppg.common.threads) and where it applies; the
command line's torch threads (sb3_ppg.cli.threads).
"""

import os

import pytest
import torch

from sb3_ppg.cli import threads as cli_threads
from sb3_ppg.common import threads


@pytest.fixture
def machine(monkeypatch):
    """A machine of given CPUs, affinity, load and torchrun ranks, without OMP_NUM_THREADS / MKL_NUM_THREADS."""

    def set_machine(cpus: int, affinity: int, load: float | None, local_world_size: int | None = None) -> None:
        monkeypatch.setattr(os, "cpu_count", lambda: cpus)
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(affinity)), raising=False)
        if load is None:

            def no_load_average():
                raise OSError("no load average")

            monkeypatch.setattr(os, "getloadavg", no_load_average)
        else:
            monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
        if local_world_size is None:
            monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
        else:
            monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local_world_size))
        for name in cli_threads.USER_THREAD_VARIABLES:
            monkeypatch.delenv(name, raising=False)

    return set_machine


@pytest.mark.parametrize(
    "cpus, affinity, load, ranks, expected",
    [
        (2, 2, 0.0, None, 1),  # idle 2-core machine: one CPU for torch, one for Python and the env
        (2, 2, 5.0, None, 1),  # busy: at least one thread
        (4, 4, 0.4, None, 3),  # 3.6 idle CPUs round to 4, less one
        (16, 16, 0.0, None, 15),  # idle: the usable CPUs, less one
        (16, 4, 0.0, None, 4),  # affinity (taskset, a cgroup's cpuset) caps it
        (16, 16, 0.0, 4, 4),  # torchrun: 4 ranks share the 16 CPUs
        (16, 16, 0.0, 32, 1),  # more ranks than CPUs: one each
        (16, 16, 10.4, None, 5),  # 5.6 idle CPUs round to 6, less one
        (16, 16, None, None, 16),  # no load average: the usable CPUs
    ],
)
def test_default_num_threads(machine, cpus, affinity, load, ranks, expected):
    machine(cpus, affinity, load, ranks)
    assert threads.default_num_threads() == expected


def test_user_choices_win(machine, monkeypatch):
    machine(16, 16, 0.0)
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        # OMP_NUM_THREADS set: torch's threads are left as the user set them
        monkeypatch.setenv("OMP_NUM_THREADS", "3")
        assert cli_threads.choose_torch_threads() == (3, "OMP_NUM_THREADS")
        assert torch.get_num_threads() == 3
        # An explicit number wins over everything
        assert cli_threads.choose_torch_threads(2) == (2, "as asked")
        assert torch.get_num_threads() == 2
        # Neither: the rule
        monkeypatch.delenv("OMP_NUM_THREADS")
        machine(16, 16, 14.8)
        assert cli_threads.choose_torch_threads()[0] == 1 == torch.get_num_threads()
        assert "16 CPUs, load average 14.8" in cli_threads.choose_torch_threads()[1]
        # A valid MKL_NUM_THREADS is a choice too, named as such
        monkeypatch.setenv("MKL_NUM_THREADS", "2")
        assert cli_threads.choose_torch_threads() == (1, "MKL_NUM_THREADS")
    finally:
        torch.set_num_threads(previous)


@pytest.mark.parametrize("value", ["abc", "0", "-2", " ", "1.5", "0,2"])
def test_invalid_omp_num_threads_is_no_choice(machine, monkeypatch, value):
    """
    Issue 51 item 4: an OMP_NUM_THREADS that libgomp ignores ("abc", "0") is not reported as the user's choice: the
    command line warns that it is invalid and applies its own rule (a blank value is unset: no warning).
    """
    machine(2, 2, 6.0)
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        if value.strip():
            with pytest.warns(UserWarning, match=rf"OMP_NUM_THREADS={value!r} is not a number of threads .* ignored"):
                chosen = cli_threads.choose_torch_threads()
        else:
            chosen = cli_threads.choose_torch_threads()
        assert chosen == (1, "2 CPUs, load average 6.0") and torch.get_num_threads() == 1
        # --resume takes the run's own threads: an invalid variable is no choice there either
        assert cli_threads.threads_for_resume(3) == 3
    finally:
        torch.set_num_threads(previous)


@pytest.mark.parametrize("value, valid", [("4", True), (" 3 ", True), ("4,2", True), ("abc", False), ("0", False)])
def test_is_valid_thread_count(value, valid):
    assert cli_threads.is_valid_thread_count(value) is valid


def test_command_line_threads(machine, capsys):
    """train / enjoy: --num-threads, else the rule; said in one line; put back on leaving (callers of main())."""
    pytest.importorskip("rl_zoo3")
    from sb3_ppg.cli.zoo import command_line_threads

    machine(2, 2, 6.0)
    previous = torch.get_num_threads()
    with command_line_threads(["--env", "CartPole-v1"]) as num_threads:
        assert num_threads == 1 == torch.get_num_threads()
    assert "torch and procgen threads: 1 (2 CPUs, load average 6.0; --num-threads N to choose)" in capsys.readouterr().out
    assert torch.get_num_threads() == previous
    with command_line_threads(["--env", "CartPole-v1", "--num-threads", "2"]) as num_threads:
        assert num_threads == 2 == torch.get_num_threads()
    assert torch.get_num_threads() == previous


def test_threads_for_resume(machine, monkeypatch):
    """--resume: the run's own threads (exact), unless the user chose (--num-threads, OMP_NUM_THREADS) or unknown."""
    machine(16, 16, 0.0)
    assert cli_threads.threads_for_resume(3) == 3
    assert cli_threads.threads_for_resume(3, -1) == 3  # the zoo's --num-threads default
    assert cli_threads.threads_for_resume(3, 2) is None
    assert cli_threads.threads_for_resume(None) is None  # a checkpoint of an earlier version
    monkeypatch.setenv("MKL_NUM_THREADS", "4")
    assert cli_threads.threads_for_resume(3) is None


def test_procgen_threads(machine):
    """ProcgenVecEnv / make_procgen_env: num_threads=None is the rule; the command line's envs take torch's threads."""
    from sb3_ppg.procgen import ProcgenVecEnv, make_procgen_env

    machine(16, 3, 0.0)
    env = ProcgenVecEnv(2, "coinrun", distribution_mode="easy", rand_seed=0)  # 3 usable CPUs
    assert env.num_threads == 3
    env.close()
    env = make_procgen_env("coinrun", n_envs=2, seed=0, num_threads=1)
    assert env.unwrapped.num_threads == 1
    env.close()
    env = make_procgen_env("coinrun", n_envs=2, seed=0)
    assert env.unwrapped.num_threads == 3
    env.close()


def test_command_line_procgen_threads():
    from stable_baselines3.common.env_util import make_vec_env

    from sb3_ppg.cli.vec_env import ProcgenVecEnvFactory
    from sb3_ppg.procgen import register_procgen_envs

    register_procgen_envs()
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        env = make_vec_env("procgen/coinrun-v0", n_envs=2, vec_env_cls=ProcgenVecEnvFactory())
        assert env.unwrapped.num_threads == 1
        env.close()
    finally:
        torch.set_num_threads(previous)
