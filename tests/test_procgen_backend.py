"""
The Procgen backend: procgen / procgen-mirror (Python <= 3.12, numpy 1, gym3) or procgen-gym (Python 3.13, numpy 2, no
gym). Both run the same C++ games; the fingerprints below were recorded with procgen-mirror and must come out the same
with either package.
"""

import gc
import hashlib
import json
import sys
import threading

import numpy as np
import pytest

from sb3_ppg.procgen import ProcgenVecEnv, make_procgen_env
from sb3_ppg.procgen.backend import BACKEND, ProcgenGymAdapter, make_native_env

# (game, mode) -> fingerprint of 300 steps of 4 games (rand_seed 123, levels 7..56, fixed random actions), recorded
# with procgen-mirror 0.10.7. "frames": every observation, reward, done and info; "dynamics": the same without the
# frames, and the games' final states. procgen-gym draws a few pixels of some sprites differently (CoinRun, CaveFlyer,
# Jumper, Ninja: at most 0.04% of the pixel values), so only the dynamics are compared there.
FINGERPRINTS = {
    ("starpilot", "easy"): "frames",
    ("bossfight", "easy"): "frames",
    ("coinrun", "hard"): "dynamics",
}
EXPECTED = {
    ("starpilot", "easy", "frames"): "ce2693d13d8574cc15064bb349152e62dab8dabb9d7e6f925fc5a2f4c59f4061",
    ("bossfight", "easy", "frames"): "ab32663265758dfd7e12cf055fc0a6ec9b4de1150fa92f12bda4eec5202c90c2",
    ("coinrun", "hard", "dynamics"): "529e05f6f5862352f7456778567faeac8947a5645db7ae9c3dcd9f164fa668ab",
}


def fingerprint(game: str, mode: str, with_frames: bool) -> str:
    env = ProcgenVecEnv(4, game, distribution_mode=mode, num_levels=50, start_level=7, rand_seed=123, num_threads=0)
    digest = hashlib.sha256()
    observations = env.reset()
    actions = np.random.default_rng(0).integers(0, 15, size=(300, 4))
    for step_actions in actions:
        if with_frames:
            digest.update(observations.tobytes())
        observations, rewards, dones, infos = env.step(step_actions)
        digest.update(rewards.astype(np.float32).tobytes() + dones.astype(np.uint8).tobytes())
        for info in infos:
            if with_frames and "terminal_observation" in info:
                digest.update(info["terminal_observation"].tobytes())
            digest.update(json.dumps({k: int(v) for k, v in sorted(info.items()) if k != "terminal_observation"}).encode())
    digest.update(b"".join(env.get_env_states()))
    env.close()
    return digest.hexdigest()


def test_backend_for_this_python():
    assert BACKEND == ("procgen-gym" if sys.version_info >= (3, 13) else "procgen")
    native = make_native_env(2, "bossfight", distribution_mode="easy", rand_seed=0, num_threads=0)
    assert isinstance(native, ProcgenGymAdapter) == (BACKEND == "procgen-gym")
    rewards, observations, firsts = native.observe()
    assert observations["rgb"].shape == (2, 64, 64, 3) and observations["rgb"].dtype == np.uint8
    assert rewards.shape == (2,) and firsts.dtype == bool and firsts.all()
    assert set(native.get_info()[0]) == {"level_seed", "prev_level_seed", "prev_level_complete"}
    native.close()


@pytest.mark.parametrize("game, mode", list(FINGERPRINTS))
def test_same_games_on_every_backend(game, mode):
    """Same seed, same actions: the same levels, rewards, episode ends, infos and states (and frames) on either package."""
    kind = FINGERPRINTS[(game, mode)]
    assert fingerprint(game, mode, with_frames=kind == "frames") == EXPECTED[(game, mode, kind)]


def test_states_and_seeding_round_trip():
    """get_env_states / set_env_states and VecEnv.seed behave the same through the backend."""
    env = make_procgen_env("bossfight", n_envs=2, seed=5, num_threads=0)
    first = env.reset()
    env.seed(5)
    np.testing.assert_array_equal(env.reset(), first)  # the same seed gives the same levels
    venv = env.venv.venv  # VecNormalize(VecMonitor(ProcgenVecEnv))
    actions = np.array([1, 2])
    env.step(actions)
    states = venv.get_env_states()
    after = [env.step(actions)[0] for _ in range(5)]
    venv.set_env_states(states)
    np.testing.assert_array_equal([env.step(actions)[0] for _ in range(5)], after)
    env.close()


@pytest.mark.skipif(BACKEND != "procgen", reason="gym3/cffi envs only (procgen, procgen-mirror)")
def test_lost_env_freed_by_the_garbage_collector_cannot_deadlock():
    """
    Regression: a lost env (in a reference cycle) freed by the garbage collector while cffi's lock was held (a new
    env resolving its functions) closed itself through that same lock, and the test suite hung forever.
    """
    lost = make_native_env(1, "starpilot")
    ffi = lost._ffi
    cycle = [lost]
    cycle.append(cycle)
    del lost, cycle
    done = threading.Event()

    def collect_under_cffi_lock() -> None:
        with ffi._lock:
            gc.collect()
        done.set()

    threading.Thread(target=collect_under_cffi_lock, daemon=True).start()
    assert done.wait(60), "closing a lost env needed cffi's lock: deadlock"


LIBGL_MISSING = (
    "cannot load library '/venv/site-packages/procgen/data/prebuilt/libenv.so': libGL.so.1: cannot open shared object "
    "file: No such file or directory"
)


class LibraryMissing:
    """Stands in for procgen's env class (or procgen-gym's package) on a server without libGL: loading fails."""

    def __init__(self, *args, **kwargs):
        raise OSError(LIBGL_MISSING)


@pytest.mark.parametrize("where", ["procgen", "procgen-gym", "import"])
def test_missing_system_library_names_the_packages(monkeypatch, where):
    """
    On a headless server or a CUDA image without libGL, procgen's libenv.so fails to load: the error names the
    Debian / Ubuntu packages to install (on main it was procgen's bare OSError).
    """
    import importlib

    from sb3_ppg.procgen import backend as backend_module

    if where == "import":
        real_import = importlib.import_module

        def import_module(name, *args):
            if name == "procgen":
                raise OSError(LIBGL_MISSING)
            return real_import(name, *args)

        monkeypatch.setattr(backend_module.importlib, "import_module", import_module)
        backend_module.backend.cache_clear()
        try:
            with pytest.raises(OSError) as error:
                backend_module.backend()
        finally:
            monkeypatch.undo()
            backend_module.backend.cache_clear()
    else:
        installed = backend_module.backend()
        if where == "procgen":
            fake = installed._replace(gym3_env_class=LibraryMissing)
        else:
            fake = installed._replace(
                gym3_env_class=None, procgen_gym=type("procgen_gym", (), {"ProcgenVecEnv": LibraryMissing})
            )
        monkeypatch.setattr(backend_module, "backend", lambda: fake)
        with pytest.raises(OSError) as error:
            make_procgen_env("coinrun", 1)
    message = str(error.value)
    assert "libGL.so.1: cannot open shared object file" in message
    assert "apt-get install -y libgl1 libglib2.0-0 libx11-6" in message and "headless" in message
