"""
Procgen's C++ environment (``procgen.ProcgenGym3Env``, or procgen-gym's through :mod:`sb3_ppg.procgen.backend`) as
:class:`~sb3_ppg.procgen.ProcgenVecEnv` and :class:`~sb3_ppg.procgen.ProcgenGymnasiumEnv` build it, and the renderer that
draws 512x512 frames of its games on demand.
"""

from typing import Any

import numpy as np
from gymnasium import spaces

from sb3_ppg.procgen.backend import make_native_env
from sb3_ppg.procgen.games import PROCGEN_OBSERVATION_SHAPE


def make_gym3_env(
    num: int,
    env_name: str,
    options: dict[str, Any],
    rand_seed: int | None,
    num_threads: int,
    render_mode: str | None,
) -> Any:
    """
    Build the C++ environment (see :func:`~sb3_ppg.procgen.backend.make_native_env`).

    :param options: Output of :func:`~sb3_ppg.procgen.check_procgen_options`
    :param rand_seed: Seed of the level sampler (already in procgen's range), ``None`` for a random one
    :param num_threads: Number of procgen worker threads (0: step in the calling thread)
    """
    kwargs = dict(options)
    if kwargs["distribution_mode"] == "exploration":
        # Procgen sets the level itself in this mode and asserts that neither option is given
        del kwargs["num_levels"], kwargs["start_level"]
    return make_native_env(
        num=num,
        env_name=env_name,
        rand_seed=rand_seed,
        num_threads=num_threads,
        render_mode=render_mode,
        **kwargs,
    )


def observation_space(channels_first: bool = False) -> spaces.Box:
    """
    :param channels_first: ``(3, 64, 64)`` instead of procgen's ``(64, 64, 3)``
    :return: The observation space of every procgen game
    """
    height, width, channels = PROCGEN_OBSERVATION_SHAPE
    shape = (channels, height, width) if channels_first else PROCGEN_OBSERVATION_SHAPE
    return spaces.Box(low=0, high=255, shape=shape, dtype=np.uint8)


class HiresRenderer:
    """
    Draws the 512x512 frames of procgen games on demand: each game's state is copied into a one-game env built with
    rendering on (the same frames as procgen's, nothing paid between ``render()`` calls).
    """

    def __init__(self, env_name: str, options: dict[str, Any]):
        self.env_name = env_name
        self.options = options
        self._env: Any = None

    def render(self, gym3_env: Any) -> list[np.ndarray]:
        """
        :param gym3_env: The ``ProcgenGym3Env`` whose games to draw
        :return: One 512x512x3 uint8 frame per game
        """
        if self._env is None:
            self._env = make_gym3_env(1, self.env_name, self.options, 0, 0, "rgb_array")
        frames = []
        for state in gym3_env.get_state():
            self._env.set_state([state])
            frames.append(self._env.get_info()[0]["rgb"])
        return frames

    def close(self) -> None:
        """
        Free the rendering env.
        """
        if self._env is not None:
            self._env.close()
            self._env = None


def close_native_env(env: Any) -> None:
    """
    Free the C++ env (``env._env``) and the renderer (``env._renderer``) of a ``ProcgenVecEnv`` or
    ``ProcgenGymnasiumEnv`` (closing twice is harmless), and mark the env closed (see :func:`check_open`).

    :param env: The env to close
    """
    if env._env is not None:
        env._env.close()
        env._env = None
    env._renderer.close()
    env._closed = True


def check_open(env: Any) -> None:
    """
    Raise a clear error when a closed ``ProcgenVecEnv`` or ``ProcgenGymnasiumEnv`` is used (its C++ env is freed).

    :param env: The env about to be reset, stepped or read
    :raises RuntimeError: when ``env.close()`` was called
    """
    if getattr(env, "_closed", False):
        raise RuntimeError(
            f"This {type(env).__name__} ({env.env_name}) was closed and its games freed: build a new env "
            "(e.g. with make_procgen_env) instead of using a closed one."
        )
