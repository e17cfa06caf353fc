"""
The package that provides Procgen's C++ games, behind one interface: ``procgen`` (procgen-mirror; gym3's API) or
``procgen_gym`` (procgen-gym, Python 3.13; Gymnasium's). :func:`make_native_env` builds the C++ vectorized env of
whichever is installed with the part of gym3's interface :mod:`sb3_ppg.procgen` uses (see docs/procgen.md).
"""

import functools
import gc
import importlib
import os
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np


class Backend(NamedTuple):
    """The installed Procgen package, imported on first use (see :func:`backend`)."""

    #: ``"procgen"`` (procgen or procgen-mirror), ``"procgen-gym"``, or ``None`` when neither is installed
    name: str | None
    #: The package's module that defines the games, modes and assets (``ENV_NAMES``, ``DISTRIBUTION_MODE_DICT``, ...)
    env_module: ModuleType | None
    #: Folder of the game assets (procgen's default ``resource_root``)
    assets_dir: str | None
    #: ``procgen.ProcgenGym3Env`` (what legacy ``gym.make("procgen:...")`` envs wrap); ``None`` with procgen-gym
    gym3_env_class: type | None
    #: The ``procgen_gym`` package (Python 3.13), or ``None``
    procgen_gym: ModuleType | None


#: The Debian / Ubuntu packages of the system libraries that procgen's ``libenv.so`` links besides those it bundles
#: (``ldd libenv.so``: libGL.so.1, libglib-2.0.so.0 / libgthread-2.0.so.0, libX11.so.6): CUDA container images and
#: headless servers often lack them
SYSTEM_PACKAGES = ("libgl1", "libglib2.0-0", "libx11-6")


def missing_library_error(error: OSError) -> OSError:
    """The error for procgen's C++ library failing to load, naming the system packages to install."""
    message = str(error)
    if "cannot open shared object file" not in message and "cannot load library" not in message:
        return error
    return OSError(
        f"Procgen's C++ library could not be loaded ({message}). Its renderer links the system's OpenGL, X11 and GLib "
        f"libraries, which headless servers and CUDA container images often lack; on Debian / Ubuntu install them "
        f"with: apt-get install -y {' '.join(SYSTEM_PACKAGES)} (the package is libglib2.0-0t64 on Ubuntu 24.04)."
    )


@functools.cache
def backend() -> Backend:
    """
    Import the installed Procgen package (``procgen`` first, else ``procgen_gym``), once: ``import sb3_ppg`` does not
    load it (nor gym3 and gym), the first Procgen env or option check does.

    :return: what sb3_ppg uses of it
    """
    try:
        procgen = importlib.import_module("procgen")
        env_module = importlib.import_module("procgen.env")
        name, gym3_env_class, procgen_gym = "procgen", procgen.ProcgenGym3Env, None
    except OSError as error:  # a C++ library loaded on import lacks a system library
        raise missing_library_error(error) from error
    except ImportError:  # Python 3.13: procgen-gym
        try:
            procgen_gym = importlib.import_module("procgen_gym")
            env_module = importlib.import_module("procgen_gym.env")
            name, gym3_env_class = "procgen-gym", None
        except ImportError:
            return Backend(None, None, None, None, None)
        except OSError as error:  # its C++ library, loaded on import, lacks a system library
            raise missing_library_error(error) from error
    assets_dir = os.path.join(env_module.SCRIPT_DIR, "data", "assets") + os.sep
    return Backend(name, env_module, assets_dir, gym3_env_class, procgen_gym)


#: What to install for the Procgen games (named by the error of :func:`require_backend`)
PROCGEN_EXTRA = "procgen"


def require_backend() -> Backend:
    """
    The installed Procgen package (see :func:`backend`).

    :raises ImportError: where none is installed, naming sb3-ppg's extra that installs it
    """
    installed = backend()
    if installed.name is None:
        raise ImportError(
            f"The Procgen games need a Procgen package, which sb3-ppg installs with its {PROCGEN_EXTRA!r} extra (also "
            f'part of "zoo" and "tests"): pip install -e ".[{PROCGEN_EXTRA}]" in the sb3-ppg folder. It brings '
            "procgen-mirror (numpy 1) on Python 3.11 and 3.12, procgen on 3.10, procgen-gym (numpy 2) on 3.13."
        )
    return installed


#: The module attributes of earlier versions (``BACKEND``, ``ENV_MODULE``, ``ASSETS_DIR``, ``ProcgenGym3Env``), read
#: from :func:`backend` when asked for
_BACKEND_ATTRIBUTES = {
    "BACKEND": "name",
    "ENV_MODULE": "env_module",
    "ASSETS_DIR": "assets_dir",
    "ProcgenGym3Env": "gym3_env_class",
}


def __getattr__(name: str) -> Any:
    if name in _BACKEND_ATTRIBUTES:
        return getattr(backend(), _BACKEND_ATTRIBUTES[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def check_resource_root(resource_root: str) -> str:
    """
    Check a custom ``resource_root`` before procgen sees it (a missing asset makes procgen exit the process).

    :return: The folder, ending with a path separator (as procgen expects)
    """
    assets_dir = backend().assets_dir
    if not os.path.isdir(resource_root):
        raise ValueError(
            f"resource_root {resource_root!r} is not a folder: pass a folder with procgen's asset layout "
            f"(a copy of {assets_dir!r}), or leave resource_root out to use procgen's own assets."
        )
    resource_root = os.path.join(resource_root, "")
    if assets_dir is not None and os.path.abspath(resource_root) != os.path.abspath(assets_dir):
        for folder, _, files in os.walk(assets_dir):
            relative = os.path.relpath(folder, assets_dir)
            missing = [name for name in files if not os.path.isfile(os.path.join(resource_root, relative, name))]
            if missing:
                raise ValueError(
                    f"resource_root {resource_root!r} lacks procgen's asset "
                    f"{os.path.normpath(os.path.join(relative, missing[0]))!r} (procgen would exit the process on "
                    f"it): copy the whole asset folder {assets_dir!r} and replace the files you want to change."
                )
    return resource_root


class ProcgenGymAdapter:
    """
    ``procgen_gym.ProcgenVecEnv`` with the gym3 interface of ``procgen.ProcgenGym3Env`` that sb3_ppg uses (``act``,
    ``observe``, ``get_info``, ``get_state``, ``set_state``, ``close``).
    """

    def __init__(self, num: int, env_name: str, render_mode: str | None = None, **options: Any):
        self.num = num
        self.options = dict(options, env_name=env_name)
        procgen_gym = backend().procgen_gym
        assert procgen_gym is not None, "procgen-gym is not installed"
        self._venv = procgen_gym.ProcgenVecEnv(num_envs=num, env_name=env_name, render_mode=render_mode, **options)
        self._observe()

    def _observe(self) -> None:
        # procgen_gym's reset() observes the current state without resetting anything (procgen resets by itself);
        # the reward and first flags of that observation are in the C library's buffers
        self._frames, self._infos = self._venv.reset()
        self._rewards = self._venv._clib.get_reward_buf().copy()
        self._firsts = self._venv._clib.get_first_buf().astype(bool)

    def act(self, actions: np.ndarray) -> None:
        """:param actions: int32 actions, one per game"""
        self._frames, self._rewards, self._firsts, _, self._infos = self._venv.step(actions)

    def observe(self) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray]:
        """:return: rewards, ``{"rgb": frames}`` (``(num, 64, 64, 3)`` uint8) and first flags, as gym3's ``observe``"""
        return self._rewards, {"rgb": self._frames}, self._firsts

    def get_info(self) -> list[dict[str, Any]]:
        """:return: one dict per game (``level_seed``, ``prev_level_seed``, ``prev_level_complete``[, ``rgb``])"""
        return [{key: values[i] for key, values in self._infos.items()} for i in range(self.num)]

    def get_state(self) -> list[bytes]:
        """:return: the serialized state of every game"""
        return self._venv.get_state()

    def set_state(self, states: list[bytes]) -> None:
        """:param states: one serialized state per game (from ``get_state``)"""
        self._venv.set_state(states)
        self._observe()

    def close(self) -> None:
        """Release the C++ env."""
        self._venv.close()


def make_native_env(num: int, env_name: str, render_mode: str | None = None, **options: Any) -> Any:
    """Build Procgen's C++ vectorized env with the installed package (a ``ProcgenGym3Env`` or a :class:`ProcgenGymAdapter`)."""
    installed = require_backend()
    if installed.gym3_env_class is not None:
        # gym3 reaches the C library through cffi, which resolves each function on first use under a lock that is not
        # reentrant. A lost env freed by the garbage collector at that moment closes itself through the same lock
        # and the process hangs forever (seen in the test suite). So the collector is paused while the env is built,
        # and every function of the new env is resolved then, so that no later call takes the lock.
        collecting = gc.isenabled()
        gc.disable()
        try:
            try:
                env = installed.gym3_env_class(num=num, env_name=env_name, render_mode=render_mode, **options)
            except OSError as error:  # gym3 loads procgen's C++ library here: a system library may be missing
                raise missing_library_error(error) from error
            library = getattr(env, "_c_lib", None)
            for name in dir(library) if library is not None else ():
                getattr(library, name, None)
        finally:
            if collecting:
                gc.enable()
        return env
    if installed.procgen_gym is not None:
        try:
            return ProcgenGymAdapter(num, env_name, render_mode=render_mode, **options)
        except OSError as error:
            raise missing_library_error(error) from error
    raise AssertionError(f"unknown Procgen package {installed.name!r}")
