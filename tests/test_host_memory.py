"""
Freed memory and the process (issue 50, item 1): ``PPG.learn()`` leaves glibc's malloc as it found it (a fresh process
after ``learn()``, or after an exception inside it, allocates as one that never trained, and a user's own ``mallopt``
survives); the command line keeps freed memory in its own process (sb3_ppg/cli/host_memory.py: no ``mmap`` per large
block, no trimming, glibc's defaults and a trim when its command ends) and says so.
"""

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import environment_with_glibc_defaults

from sb3_ppg.cli import host_memory

#: A block well above glibc's largest mmap threshold (32 MiB)
BLOCK_BYTES = 64 * 2**20


class FakeLibc:
    """``mallopt`` and ``malloc_trim`` that record their calls."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def mallopt(self, parameter: int, value: int) -> int:
        self.calls.append(("mallopt", parameter, value))
        return 1

    def malloc_trim(self, pad: int) -> int:
        self.calls.append(("malloc_trim", pad))
        return 1


@pytest.fixture
def fake_libc(monkeypatch):
    libc = FakeLibc()
    monkeypatch.setattr(host_memory, "glibc", lambda: libc)
    for name in host_memory.MALLOC_ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    return libc


KEEP = [
    ("mallopt", host_memory.M_MMAP_MAX, 0),
    ("mallopt", host_memory.M_TRIM_THRESHOLD, host_memory.KEPT_TRIM_THRESHOLD),
]
RESTORE = [
    ("mallopt", host_memory.M_MMAP_MAX, host_memory.DEFAULT_MMAP_MAX),
    ("mallopt", host_memory.M_TRIM_THRESHOLD, host_memory.DEFAULT_TRIM_THRESHOLD),
    ("malloc_trim", 0),
]


def test_the_outermost_context_keeps_and_restores(fake_libc):
    with host_memory.freed_memory_kept() as kept:
        assert kept and fake_libc.calls == KEEP
        with host_memory.freed_memory_kept() as inner:  # nested: the outer one's setting
            assert inner
        assert fake_libc.calls == KEEP
    assert fake_libc.calls == KEEP + RESTORE
    # An exception inside still restores glibc's defaults
    fake_libc.calls.clear()
    with pytest.raises(KeyboardInterrupt), host_memory.freed_memory_kept():
        raise KeyboardInterrupt
    assert fake_libc.calls == KEEP + RESTORE
    assert host_memory._depth == 0


@pytest.mark.parametrize(
    "setting",
    ["disabled", "no glibc", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_MAX_", "GLIBC_TUNABLES"],
)
def test_nothing_changes_where_it_should_not(fake_libc, monkeypatch, setting):
    enabled = setting != "disabled"
    if setting == "no glibc":
        monkeypatch.setattr(host_memory, "glibc", lambda: None)
    elif setting == "GLIBC_TUNABLES":
        monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1000000")
    elif setting != "disabled":
        monkeypatch.setenv(setting, "1000000")  # the user's own malloc settings
    with host_memory.freed_memory_kept(enabled) as kept:
        assert not kept
    assert fake_libc.calls == []


#: Run in a fresh process (as a training script starts): page faults of four 64 MiB tensors allocated, touched and
#: freed in turn after a first one, with glibc's defaults then with freed memory kept, and the resident memory inside
#: the context (the last block freed) and after it. Tensors, not NumPy arrays: NumPy asks for huge pages for large
#: arrays, torch's CPU allocator does not.
FAULTS_SCRIPT = """
import json, resource
import torch as th
from sb3_ppg.cli import host_memory

def faults():
    block = th.ones(BLOCK, dtype=th.uint8)
    del block
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(4):
        block = th.ones(BLOCK, dtype=th.uint8)
        del block
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

def resident():
    with open("/proc/self/statm") as file:
        return int(file.read().split()[1]) * resource.getpagesize()

default = faults()
with host_memory.freed_memory_kept() as kept:
    kept_faults = faults()
    resident_inside = resident()
print(json.dumps(dict(default=default, kept=kept, kept_faults=kept_faults, inside=resident_inside, after=resident())))
"""


@pytest.mark.skipif(host_memory.glibc() is None, reason="glibc's malloc only (Linux)")
def test_glibc_maps_a_kept_block_once():
    """With glibc's defaults each 64 MiB block is mapped anew (a fault per page); kept, its pages are reused."""
    env = environment_with_glibc_defaults()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(Path(__file__).parent.parent), env.get("PYTHONPATH"))))
    script = FAULTS_SCRIPT.replace("BLOCK", str(BLOCK_BYTES))
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    pages = BLOCK_BYTES // resource.getpagesize()
    if result["default"] < pages:  # e.g. transparent huge pages for every mapping: few faults either way
        pytest.skip(f"glibc's defaults took {result['default']} page faults for 4 blocks of {pages} pages here")
    assert result["kept"]
    # Kept, the blocks take freed pages again: at most half of them mapped anew (seen here: none, or one block of 4)
    assert result["kept_faults"] < result["default"] // 2, result
    # and the freed block stays mapped until the context ends, when it is returned to the OS
    assert result["after"] < result["inside"] - BLOCK_BYTES // 2, result


#: Run in a fresh process: the model of a tiny CartPole run built, then (but for ``control``) trained, and glibc's malloc
#: observed afterwards as a user's program would see it: two 2 MiB ``malloc`` / ``free`` pairs (whether glibc served
#: each with a fresh ``mmap``: the chunk header's IS_MMAPPED bit), then a NumPy loop of 300 operations on 2 MiB arrays
#: (its minor page faults). ``exception``: ``learn()`` raises from a callback; ``user_mallopt``: the program set
#: ``mallopt(M_MMAP_MAX, 0)`` before.
MALLOC_SCRIPT = """
import ctypes, json, resource, sys
import numpy as np
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from sb3_ppg import PPG

scenario = sys.argv[1]
libc = ctypes.CDLL("libc.so.6")
libc.malloc.argtypes, libc.malloc.restype = [ctypes.c_size_t], ctypes.c_void_p
libc.free.argtypes, libc.free.restype = [ctypes.c_void_p], None
libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
if scenario == "user_mallopt":
    assert libc.mallopt(-4, 0) == 1  # M_MMAP_MAX: never mmap

class Stop(BaseCallback):
    def _on_step(self):
        if self.num_timesteps >= 48:
            raise RuntimeError("stop")
        return True

model = PPG("MlpPolicy", make_vec_env("CartPole-v1", n_envs=2, seed=0), n_steps=16, batch_size=16, n_policy_iters=2,
            aux_batch_rollouts=1, seed=0, device="cpu")
if scenario in ("learn", "user_mallopt"):
    model.learn(64)
elif scenario == "exception":
    try:
        model.learn(64, callback=Stop())
    except RuntimeError:
        pass

def mmapped_pairs():
    flags = []
    for _ in range(2):
        pointer = libc.malloc(2 * 2**20)
        flags.append(int(ctypes.c_size_t.from_address(pointer - 8).value & 2 != 0))
        libc.free(pointer)
    return flags

pairs = mmapped_pairs()
array = np.ones(2**18)  # 2 MiB
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(300):
    result = array * 2.0
    del result
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(json.dumps(dict(pairs=pairs, faults=faults)))
"""


def malloc_after(scenario: str) -> dict:
    """What :data:`MALLOC_SCRIPT` observes in a fresh process with glibc's defaults (no ``MALLOC_*_`` variables)."""
    env = environment_with_glibc_defaults()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(Path(__file__).parent.parent), env.get("PYTHONPATH"))))
    run = subprocess.run([sys.executable, "-c", MALLOC_SCRIPT, scenario], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(host_memory.glibc() is None, reason="glibc's malloc only (Linux)")
def test_learn_leaves_malloc_as_a_process_that_never_trained():
    """
    Issue 50 item 1, as a user tried it: on 47f6757, after learn() (or an exception inside it) both pairs were mmapped
    ([1, 1]: glibc's dynamic mmap threshold off for good) and the NumPy loop took ~150,000 page faults against ~1,000;
    a user's mallopt(M_MMAP_MAX, 0) was reset by learn().
    """
    control = malloc_after("control")
    # glibc's dynamic threshold: the first 2 MiB block is mmapped, its free raises the threshold, the second is not
    assert control["pairs"] == [1, 0], control
    for scenario in ("learn", "exception"):
        trained = malloc_after(scenario)
        assert trained["pairs"] == control["pairs"], (scenario, trained, control)
        # The same range of page faults: a 2 MiB array mapped anew at every operation would take 512 each (153,600)
        assert trained["faults"] <= 3 * control["faults"] + 2000, (scenario, trained, control)
    # The program's own setting survives learn(): glibc still never mmaps
    assert malloc_after("user_mallopt")["pairs"] == [0, 0]


def test_command_line_keeps_freed_memory_on_a_cpu_and_says_so(fake_libc, capsys):
    """The command line's context: kept (and said in one line) on a CPU device, nothing on another or for --help."""
    with host_memory.command_line_memory(["--env", "CartPole-v1", "--device", "cpu"]) as kept:
        assert kept and fake_libc.calls == KEEP
    assert fake_libc.calls == KEEP + RESTORE
    assert capsys.readouterr().out.startswith("freed memory: kept in this process while it trains on the CPU")
    fake_libc.calls.clear()
    # Another device type (SB3 falls back to the CPU for "cuda" where there is none), and --help
    for argv in (["--device", "mps"], ["--device", "cpu", "--help"]):
        with host_memory.command_line_memory(argv) as kept:
            assert not kept
    assert fake_libc.calls == [] and capsys.readouterr().out == ""
