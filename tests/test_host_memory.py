"""
``PPG(keep_freed_memory=True)`` (sb3_ppg/common/host_memory.py): on a CPU device with glibc, ``learn()`` keeps the
memory it frees in the process (no ``mmap`` per large block, no trimming) and gives it back when it returns; what is
computed does not change.
"""

import contextlib
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch as th
from helpers import assert_identical, environment_with_glibc_defaults, parameters, small_ppg

from sb3_ppg import PPG
from sb3_ppg.common import host_memory
from sb3_ppg.ppg import ppg as ppg_module

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
from sb3_ppg.common import host_memory

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


def test_learn_keeps_freed_memory_on_a_cpu_with_the_same_results(monkeypatch):
    spy: list[bool] = []  # the ``enabled`` that each learn() gave freed_memory_kept
    original = ppg_module.freed_memory_kept

    @contextlib.contextmanager
    def recorded(enabled: bool = True):
        spy.append(enabled)
        with original(enabled) as kept:
            yield kept

    monkeypatch.setattr(ppg_module, "freed_memory_kept", recorded)
    kept = small_ppg()
    assert kept.keep_freed_memory is True  # the default
    kept.learn(2 * kept.n_steps * kept.n_envs)  # one auxiliary cycle
    not_kept = small_ppg(keep_freed_memory=False)
    not_kept.learn(2 * not_kept.n_steps * not_kept.n_envs)
    assert spy == [True, False]
    assert kept.n_aux_phases == not_kept.n_aux_phases == 1
    assert_identical(parameters(kept), parameters(not_kept))
    assert host_memory._depth == 0
    # Not on other devices (not measured there)
    kept.device = th.device("cuda")
    assert not kept._keeps_freed_memory()


def test_keep_freed_memory_is_checked_saved_and_loaded(tmp_path):
    with pytest.raises(ValueError, match="keep_freed_memory must be a bool, got 'yes'"):
        small_ppg(keep_freed_memory="yes")
    model = small_ppg(keep_freed_memory=False)
    model.save(tmp_path / "model.zip")
    assert PPG.load(tmp_path / "model.zip").keep_freed_memory is False
    assert PPG.load(tmp_path / "model.zip", keep_freed_memory=True).keep_freed_memory is True
