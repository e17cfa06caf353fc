"""
Procgen for Stable-Baselines3.

Three ways to use the 16 Procgen games (Cobbe et al. 2020) with SB3:

- :class:`ProcgenVecEnv`: a native SB3 ``VecEnv`` over procgen's vectorized C++ environment
  (``procgen.ProcgenGym3Env``). This is the fast path used for training (one C++ env, ``num_threads`` worker threads).
- :func:`make_procgen_env`: the full wrapper chain of the PPG paper, ready for ``PPG``/``PPO`` and ``EvalCallback``.
- :func:`register_procgen_envs`: gymnasium ids ``procgen/<game>-v0`` backed by :class:`ProcgenGymnasiumEnv`
  (one game per env), for ``gymnasium.make``, ``make_vec_env`` and the RL Zoo.

:func:`convert_legacy_procgen_env` turns a legacy ``gym.make("procgen:procgen-<game>-v0")`` env into the gymnasium one.

Procgen specifics that shape this module:

- Procgen resets automatically: the observation that follows the last action of an episode is already the first frame
  of the next episode, and procgen never renders a separate "terminal" frame. The last frame of a finished episode is
  therefore the frame the agent saw before its last action; it is what ``terminal_observation``
  (:class:`ProcgenVecEnv`) and the observation returned with ``terminated=True`` (:class:`ProcgenGymnasiumEnv`) hold.
- Procgen can only be seeded when the C++ env is built (``rand_seed``), so seeding rebuilds it. Building takes
  milliseconds (about two seconds once per process, to load the assets). Seeds are mapped into procgen's int32 range
  with ``seed % (2**31 - 1)``.
- Episodes also end on procgen's internal time limit (1000 steps in most games). Procgen does not say whether an
  episode ended on the time limit, so every episode end is reported as terminal (``TimeLimit.truncated=False``,
  ``truncated=False``), as in the paper.
- ``render_mode="rgb_array"`` gives 512x512 frames rendered on demand: only ``render()``/``get_images()`` pay for
  them (a copy of the game state is drawn by a second, one-game procgen env). Procgen's own ``render_mode`` draws them
  at every step for every game (SB3's ``make_vec_env`` asks for ``"rgb_array"`` by default), which is many times
  slower than the game itself.
- At the end of an episode the info dict holds ``is_success`` (procgen's ``prev_level_complete``: the level was
  completed), so ``EvalCallback`` reports a success rate.
"""

import os
import pickle
from collections.abc import Sequence
from typing import Any, ClassVar, SupportsFloat

import gymnasium
import numpy as np
from gymnasium import spaces
from stable_baselines3.common.running_mean_std import RunningMeanStd
from stable_baselines3.common.vec_env import VecNormalize
from stable_baselines3.common.vec_env.base_vec_env import VecEnv, VecEnvIndices, VecEnvObs, VecEnvStepReturn

# RewardOnlyVecNormalize is imported here too: statistics pickled before it moved to sb3_ppg.vec_env refer to it here
from sb3_ppg.vec_env import FastVecMonitor, RewardOnlyVecNormalize, finished_indices

__all__ = [
    "DISTRIBUTION_MODES",
    "PROCGEN_GAMES",
    "PROCGEN_OPTIONS",
    "ProcgenGymnasiumEnv",
    "ProcgenVecEnv",
    "check_procgen_options",
    "convert_legacy_procgen_env",
    "make_procgen_env",
    "procgen_seed",
    "register_procgen_envs",
]

# The 16 games of the Procgen benchmark, in procgen's order
PROCGEN_GAMES = (
    "bigfish",
    "bossfight",
    "caveflyer",
    "chaser",
    "climber",
    "coinrun",
    "dodgeball",
    "fruitbot",
    "heist",
    "jumper",
    "leaper",
    "maze",
    "miner",
    "ninja",
    "plunder",
    "starpilot",
)

# Which games support each distribution mode (procgen's ``Game::parse_options`` aborts the process with a C++
# assertion for any other pair, and ``ProcgenGym3Env`` checks "exploration" against ``EXPLORATION_LEVEL_SEEDS``)
DISTRIBUTION_MODES: dict[str, tuple[str, ...]] = {
    "easy": PROCGEN_GAMES,
    "hard": PROCGEN_GAMES,
    "extreme": ("chaser", "dodgeball", "leaper", "starpilot"),
    "memory": ("caveflyer", "dodgeball", "heist", "jumper", "maze", "miner"),
    "exploration": ("caveflyer", "climber", "coinrun", "heist", "jumper", "leaper", "maze", "ninja"),
}

# Options of ``procgen.ProcgenGym3Env`` other than the game, the distribution mode and the level range,
# with procgen's defaults (``resource_root``: a string, ``None`` means procgen's own assets)
PROCGEN_OPTIONS: dict[str, Any] = {
    "center_agent": True,
    "use_backgrounds": True,
    "use_monochrome_assets": False,
    "restrict_themes": False,
    "use_generated_assets": False,
    "paint_vel_info": False,
    "use_sequential_levels": False,
    "debug_mode": 0,
    "resource_root": None,
}

PROCGEN_OBSERVATION_SHAPE = (64, 64, 3)
PROCGEN_N_ACTIONS = 15
# Procgen passes integer options as int32 and asserts ``-2**31 < value < 2**31``
_MAX_INT32 = 2**31 - 1


def procgen_seed(seed: int) -> int:
    """
    Map any integer seed into the range procgen accepts for ``rand_seed`` (``0 <= seed < 2**31 - 1``).

    SB3 draws seeds up to ``2**32 - 1`` (``VecEnv.seed(None)``) and adds the env index, procgen asserts that its seed
    fits in an int32.

    :param seed: Any integer (numpy integers included)
    :return: ``seed % (2**31 - 1)`` as a python int
    """
    return int(seed) % _MAX_INT32


def _check_int(name: str, value: Any, minimum: int, maximum: int = _MAX_INT32) -> int:
    """
    Check that ``value`` is an integer (not a bool) in ``[minimum, maximum]``.

    :param name: Name of the argument, for the error message
    :param value: The value to check
    :param minimum: Smallest valid value
    :param maximum: Largest valid value
    :return: The value as a python int
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"`{name}` must be an integer, got {value!r} of type {type(value).__name__}")
    if not minimum <= value <= maximum:
        raise ValueError(f"`{name}` must be between {minimum} and {maximum}, got {value}")
    return int(value)


def check_procgen_options(
    env_name: str,
    distribution_mode: str,
    num_levels: int,
    start_level: int,
    procgen_kwargs: dict[str, Any],
) -> dict[str, Any]:
    """
    Validate the game and the procgen options, and return them in the form stored in ``procgen_kwargs`` attributes.

    Procgen itself reports bad options with bare assertions, or aborts the whole python process (an unsupported
    distribution mode for a game, a negative level range), so everything is checked here first.

    :param env_name: Name of the game, one of ``PROCGEN_GAMES``
    :param distribution_mode: One of ``DISTRIBUTION_MODES`` that the game supports
    :param num_levels: Number of unique levels (0: unlimited)
    :param start_level: Seed of the first level
    :param procgen_kwargs: Other procgen options (keys of ``PROCGEN_OPTIONS``)
    :return: ``{"distribution_mode": ..., "num_levels": ..., "start_level": ..., **procgen_kwargs}`` with python types
    """
    if env_name not in PROCGEN_GAMES:
        raise ValueError(f"Unknown procgen game {env_name!r}. Valid games: {', '.join(PROCGEN_GAMES)}")
    if distribution_mode not in DISTRIBUTION_MODES:
        raise ValueError(
            f"Unknown distribution_mode {distribution_mode!r}. Valid modes: {', '.join(DISTRIBUTION_MODES)} "
            "(not every game supports every mode)"
        )
    if env_name not in DISTRIBUTION_MODES[distribution_mode]:
        game_modes = [mode for mode, games in DISTRIBUTION_MODES.items() if env_name in games]
        raise ValueError(
            f"{env_name} does not support distribution_mode={distribution_mode!r}: it supports {', '.join(game_modes)}. "
            f"Games with the {distribution_mode!r} mode: {', '.join(DISTRIBUTION_MODES[distribution_mode])}"
        )
    num_levels = _check_int("num_levels", num_levels, 0)
    start_level = _check_int("start_level", start_level, 0)
    if start_level + num_levels > _MAX_INT32:
        raise ValueError(
            f"start_level + num_levels must be at most 2**31 - 1 (levels are int32 seeds), got {start_level} + {num_levels}"
        )
    if distribution_mode == "exploration" and (num_levels != 0 or start_level != 0):
        raise ValueError(
            "distribution_mode='exploration' plays one fixed level per game, "
            f"num_levels and start_level must be left at 0, got num_levels={num_levels}, start_level={start_level}"
        )
    options: dict[str, Any] = {"distribution_mode": distribution_mode, "num_levels": num_levels, "start_level": start_level}
    for key, value in procgen_kwargs.items():
        if key not in PROCGEN_OPTIONS:
            raise ValueError(
                f"Unknown procgen option {key!r}. Valid options: distribution_mode, num_levels, start_level, "
                f"{', '.join(PROCGEN_OPTIONS)}"
            )
        default = PROCGEN_OPTIONS[key]
        if isinstance(default, bool):
            if not isinstance(value, (bool, np.bool_)):
                raise ValueError(f"Procgen option {key!r} must be a bool, got {value!r}")
            options[key] = bool(value)
        elif isinstance(default, int):
            options[key] = _check_int(key, value, 0)
        else:
            if not isinstance(value, str):
                raise ValueError(f"Procgen option {key!r} must be a string, got {value!r}")
            options[key] = value
    return options


def _check_render_mode(render_mode: str | None) -> None:
    """
    Check that procgen supports the render mode.

    :param render_mode: ``None`` or ``"rgb_array"``
    """
    if render_mode not in (None, "rgb_array"):
        raise ValueError(f"Procgen envs support render_mode=None or 'rgb_array', got {render_mode!r}")


def _make_gym3_env(
    num: int,
    env_name: str,
    options: dict[str, Any],
    rand_seed: int | None,
    num_threads: int,
    render_mode: str | None,
) -> Any:
    """
    Build the C++ environment.

    :param num: Number of parallel games
    :param env_name: Name of the game
    :param options: Output of :func:`check_procgen_options`
    :param rand_seed: Seed of the level sampler (already in procgen's range), ``None`` for a random one
    :param num_threads: Number of procgen worker threads (0: step in the calling thread)
    :param render_mode: ``"rgb_array"``: procgen draws 512x512 frames (key ``"rgb"`` of ``get_info()``) at every step
    :return: a ``procgen.ProcgenGym3Env``
    """
    # Imported here: importing procgen prints gym's deprecation banner, and the gymnasium ids can be registered
    # without it
    from procgen import ProcgenGym3Env

    kwargs = dict(options)
    if kwargs["distribution_mode"] == "exploration":
        # Procgen sets the level itself in this mode and asserts that neither option is given
        del kwargs["num_levels"], kwargs["start_level"]
    return ProcgenGym3Env(
        num=num,
        env_name=env_name,
        rand_seed=rand_seed,
        num_threads=num_threads,
        render_mode=render_mode,
        **kwargs,
    )


def _observation_space(channels_first: bool = False) -> spaces.Box:
    """
    :param channels_first: ``(3, 64, 64)`` instead of procgen's ``(64, 64, 3)``
    :return: The observation space of every procgen game
    """
    height, width, channels = PROCGEN_OBSERVATION_SHAPE
    shape = (channels, height, width) if channels_first else PROCGEN_OBSERVATION_SHAPE
    return spaces.Box(low=0, high=255, shape=shape, dtype=np.uint8)


def _close_procgen_env(env: "ProcgenVecEnv | ProcgenGymnasiumEnv") -> None:
    """
    Free the C++ env and the renderer of a :class:`ProcgenVecEnv` or :class:`ProcgenGymnasiumEnv` (closing twice is
    harmless).

    :param env: The env to close
    """
    if env._env is not None:
        env._env.close()
        env._env = None
    env._renderer.close()


class _HiresRenderer:
    """
    Draws the 512x512 frames of procgen games on demand.

    Procgen draws them only when built with ``render_mode="rgb_array"``, and then for every game at every step.
    Instead, the state of each game to draw is copied (``get_state``/``set_state``) into a one-game env built with
    rendering on, whose next ``observe`` draws it: the frames are identical to procgen's, and nothing is paid between
    ``render()`` calls.

    :param env_name: Name of the game
    :param options: Output of :func:`check_procgen_options`
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
            self._env = _make_gym3_env(1, self.env_name, self.options, 0, 0, "rgb_array")
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


class ProcgenVecEnv(VecEnv):
    """
    Native SB3 ``VecEnv`` over procgen's vectorized C++ environment: ``num_envs`` games of the same kind stepped by
    ``num_threads`` C++ threads, without one python object per game.

    Observations are ``uint8`` frames of shape ``(64, 64, 3)`` (channel last, procgen's layout), or ``(3, 64, 64)``
    with ``channels_first=True`` (the layout SB3's CNN policies expect, as :func:`make_procgen_env` uses it: a
    transposed view of the same memory, with no copy and no ``VecTransposeImage`` layer); actions ``Discrete(15)``.

    - ``seed(seed)`` + ``reset()`` rebuild the C++ env with ``rand_seed=procgen_seed(seed)``: the same seed gives the
      same levels. Procgen seeds a whole vectorized env with one seed, the seed of the first env is used.
    - Any other ``reset()`` after a step also rebuilds the env (all episodes restart), with a seed drawn from a generator
      seeded by the last seed used, so ``reset()`` always starts new episodes, and runs stay reproducible.
      A ``reset()`` right after construction or after a rebuild keeps the env as it is.
    - The info dict of a finished episode holds ``terminal_observation`` (the last frame of the episode),
      ``TimeLimit.truncated=False``, ``is_success`` (the level was completed) and procgen's info: ``prev_level_seed``
      and ``prev_level_complete`` (the finished level), ``level_seed`` (the next one). Other step infos are empty
      (building procgen's info for every game at every step would cost a few percent of the throughput);
      ``reset_infos`` hold procgen's info of every game.
    - ``get_attr``/``set_attr``/``env_method`` act on this object (there is one env object for all indices) and
      return one entry per requested index. ``env_is_wrapped`` is always ``False``.
    - Reset options (``set_options``) are ignored: procgen has none.

    :param num_envs: Number of parallel games
    :param env_name: Name of the game, one of ``PROCGEN_GAMES``
    :param distribution_mode: Level difficulty: "easy", "hard" (procgen's default, the paper's setting), "extreme",
        "memory" or "exploration" (see ``DISTRIBUTION_MODES`` for which games support which)
    :param num_levels: Number of unique levels to sample from (0: unlimited)
    :param start_level: Seed of the first level of the range
    :param rand_seed: Seed of the level sampler (any integer, mapped with :func:`procgen_seed`); ``None`` for a
        random one
    :param num_threads: Number of procgen worker threads (2 fits a 2-core machine; more threads than cores do not help)
    :param render_mode: ``None`` or ``"rgb_array"`` (``render()``/``get_images()`` then return 512x512 frames, drawn
        on demand: about 5 ms per game and call, nothing between calls)
    :param channels_first: Observations (and terminal observations) of shape ``(3, 64, 64)`` instead of ``(64, 64, 3)``.
        Rendered images keep the ``(height, width, 3)`` layout of images.
    :param procgen_kwargs: Other procgen options: ``center_agent``, ``use_backgrounds``, ``use_monochrome_assets``,
        ``restrict_themes``, ``use_generated_assets``, ``paint_vel_info``, ``use_sequential_levels``, ``debug_mode``,
        ``resource_root``
    """

    def __init__(
        self,
        num_envs: int,
        env_name: str,
        distribution_mode: str = "hard",
        num_levels: int = 0,
        start_level: int = 0,
        rand_seed: int | None = None,
        num_threads: int = 2,
        render_mode: str | None = None,
        channels_first: bool = False,
        **procgen_kwargs: Any,
    ):
        num_envs = _check_int("num_envs", num_envs, 1)
        self.num_threads = _check_int("num_threads", num_threads, 0, 1024)
        _check_render_mode(render_mode)
        self.env_name = env_name
        self.procgen_kwargs = check_procgen_options(env_name, distribution_mode, num_levels, start_level, procgen_kwargs)
        # ``VecEnv.__init__`` reads it with ``get_attr``
        self.render_mode = render_mode
        self._renderer = _HiresRenderer(env_name, self.procgen_kwargs)
        self._env: Any = None
        self._build(None if rand_seed is None else procgen_seed(rand_seed), num_envs)
        self.channels_first = bool(channels_first)
        super().__init__(num_envs, _observation_space(self.channels_first), spaces.Discrete(PROCGEN_N_ACTIONS))
        # Read by ``VecVideoRecorder`` (procgen runs at 15 frames per second)
        self.metadata = {**self.metadata, "render_fps": 15}
        self._actions = np.zeros(num_envs, dtype=np.int32)
        _, observations, _ = self._env.observe()
        self._last_obs: np.ndarray = observations["rgb"]
        self.reset_infos = self._env.get_info()

    def _build(self, rand_seed: int | None, num_envs: int | None = None) -> None:
        """
        (Re)build the C++ env.

        :param rand_seed: Seed in procgen's range, ``None`` for a random one
        :param num_envs: Number of games (defaults to ``self.num_envs``)
        """
        if self._env is not None:
            self._env.close()
        if rand_seed is None:
            rand_seed = int(np.random.SeedSequence().generate_state(1)[0]) % _MAX_INT32
        self._env = _make_gym3_env(
            self.num_envs if num_envs is None else num_envs,
            self.env_name,
            self.procgen_kwargs,
            rand_seed,
            self.num_threads,
            None,
        )
        # Seeds of the rebuilds done by ``reset()`` when no seed was set
        self._seed_generator = np.random.default_rng(rand_seed)
        # Whether the env was stepped since it was built
        self._stepped = False

    def reset(self) -> VecEnvObs:
        """
        Start new episodes in all games (see the class docstring for seeding).

        :return: The first frames, shape ``(num_envs, 64, 64, 3)``
        """
        seed = self._seeds[0]
        if seed is not None:
            self._build(procgen_seed(seed))
        elif self._stepped:
            self._build(int(self._seed_generator.integers(_MAX_INT32)))
        self._reset_seeds()
        self._reset_options()
        _, observations, _ = self._env.observe()
        self._last_obs = observations["rgb"]
        self.reset_infos = self._env.get_info()
        return self._last_obs.transpose(0, 3, 1, 2) if self.channels_first else self._last_obs

    def step_async(self, actions: np.ndarray) -> None:
        """
        Check and store the actions.

        :param actions: Integer actions in ``[0, 15)``, shape ``(num_envs,)`` or ``(num_envs, 1)``
        """
        actions = np.asarray(actions)
        if actions.shape != self._actions.shape:
            if actions.shape != (self.num_envs, 1):
                raise ValueError(
                    f"Expected actions of shape ({self.num_envs},) (or ({self.num_envs}, 1)), one per env, "
                    f"got shape {actions.shape}"
                )
            actions = actions[:, 0]
        # Checked on a python list: this runs between two procgen steps, while procgen's threads wait, and there a
        # python loop over 64 numbers costs less than numpy's calls (see docs/procgen.md, "Throughput")
        kind = actions.dtype.kind
        if kind in "iu":
            values = actions.tolist()
            in_range = min(values) >= 0 and max(values) < PROCGEN_N_ACTIONS
        elif kind == "f" and np.all(np.mod(actions, 1) == 0):
            in_range = actions.min() >= 0 and actions.max() < PROCGEN_N_ACTIONS
        else:
            raise ValueError(f"Expected integer actions, got {actions.dtype} values {actions.ravel()}")
        if not in_range:
            raise ValueError(f"Actions must be in [0, {PROCGEN_N_ACTIONS}), got {actions.ravel()}")
        self._actions[:] = actions

    def step_wait(self) -> VecEnvStepReturn:
        """
        Step all games with the stored actions.

        :return: observations, rewards, dones, infos
        """
        # ``act`` only starts the games: procgen's threads step them until ``observe`` returns. Python work that does not
        # need the results is done in between, while this thread would otherwise wait
        self._env.act(self._actions)
        infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        self._stepped = True
        rewards, observations, dones = self._env.observe()
        observations = observations["rgb"]
        done_indices = finished_indices(dones)
        if done_indices:
            # procgen's infos are only read at episode ends: building them for every game at every step would cost
            # a few percent of the env's throughput
            for idx, info in zip(done_indices, self._episode_end_infos(done_indices), strict=True):
                infos[idx] = info
                # Copied (C-contiguous): the previous observation array was handed out and may be modified downstream
                frame = self._last_obs[idx]
                info["terminal_observation"] = (frame.transpose(2, 0, 1) if self.channels_first else frame).copy()
                info["TimeLimit.truncated"] = False
                info["is_success"] = bool(info["prev_level_complete"])
        # ``_last_obs`` keeps procgen's layout (``get_images`` returns images)
        self._last_obs = observations
        if self.channels_first:
            observations = observations.transpose(0, 3, 1, 2)
        return observations, rewards, dones, infos

    def _episode_end_infos(self, done_indices: list[int]) -> list[dict[str, Any]]:
        """
        Procgen's infos (``level_seed``, ``prev_level_seed``, ``prev_level_complete``) of some games, read right after
        ``observe()``.

        gym3's ``get_info()`` observes again and builds a dict for every game; the info buffers that ``observe()``
        just filled are read instead when gym3 exposes them (``_info``, gym3 0.3), for the finished games only.

        :param done_indices: indices of the games whose episode just ended
        :return: one info dict per index
        """
        info_buffers = getattr(self._env, "_info", None)
        if not isinstance(info_buffers, dict):
            all_infos = self._env.get_info()
            return [all_infos[idx] for idx in done_indices]
        infos = []
        for idx in done_indices:
            # Scalars as Python numbers; arrays (none by default) copied out of the reused buffers
            infos.append(
                {key: values.item(idx) if values.ndim == 1 else values[idx].copy() for key, values in info_buffers.items()}
            )
        return infos

    def close(self) -> None:
        """
        Free the C++ env.
        """
        _close_procgen_env(self)

    def get_images(self) -> Sequence[np.ndarray | None]:
        """
        :return: One frame per env: the 512x512 render of the current state if ``render_mode="rgb_array"``, else the
            64x64 observation
        """
        if self.render_mode == "rgb_array":
            return self._renderer.render(self._env)
        return list(self._last_obs)

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        """
        Return an attribute of this env, once per requested index.

        :param attr_name: The name of the attribute
        :param indices: Indices of envs
        :return: ``[getattr(self, attr_name)] * n_indices``
        """
        value = getattr(self, attr_name)
        return [value for _ in self._get_indices(indices)]

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        """
        Set an attribute of this env (shared by all indices).

        :param attr_name: The name of the attribute
        :param value: Its new value
        :param indices: Indices of envs (all of them share the attribute)
        """
        setattr(self, attr_name, value)

    def env_method(
        self, method_name: str, *method_args: Any, indices: VecEnvIndices = None, **method_kwargs: Any
    ) -> list[Any]:
        """
        Call a method of this env once, and return its result once per requested index.

        :param method_name: The name of the method
        :param method_args: Positional arguments of the call
        :param indices: Indices of envs
        :param method_kwargs: Keyword arguments of the call
        :return: ``[result] * n_indices``
        """
        result = getattr(self, method_name)(*method_args, **method_kwargs)
        return [result for _ in self._get_indices(indices)]

    def env_is_wrapped(self, wrapper_class: type[gymnasium.Wrapper], indices: VecEnvIndices = None) -> list[bool]:
        """
        :param wrapper_class: A gymnasium wrapper class
        :param indices: Indices of envs
        :return: ``False`` for each index: the games are not gymnasium envs, so they are never wrapped
        """
        return [False for _ in self._get_indices(indices)]


class ProcgenGymnasiumEnv(gymnasium.Env[np.ndarray, int]):
    """
    One procgen game as a ``gymnasium.Env`` (built on ``ProcgenGym3Env(num=1, num_threads=0)``), registered as
    ``procgen/<game>-v0`` by :func:`register_procgen_envs`.

    Use it where SB3 wants single envs (``gymnasium.make``, ``make_vec_env``, the RL Zoo); to train on many games at
    once :class:`ProcgenVecEnv` is about 2.5 times faster than a ``DummyVecEnv`` of these.

    - ``reset(seed=...)`` rebuilds the C++ env with that seed (procgen seeds only at construction): the same seed gives
      the same levels. ``reset()`` without a seed in the middle of an episode rebuilds it with a seed from
      ``self.np_random``; right after an episode end (or after construction) it returns the first frame of the
      episode procgen already started.
    - The observation returned with ``terminated=True`` is the last frame of the finished episode (procgen resets
      automatically and never renders a terminal frame); the next ``reset()`` returns the first frame of the new one.
      ``truncated`` is always ``False`` (procgen does not tell its time limit from other episode ends).
    - Rewards are python floats; infos hold procgen's ``level_seed``, ``prev_level_seed`` and ``prev_level_complete``,
      plus ``is_success`` at episode ends.
    - ``render()`` draws the current state of the game in 512x512 (on demand, about 5 ms a call). Right after an
      episode end that is the first frame of the next episode, which procgen has already started.

    :param env_name: Name of the game, one of ``PROCGEN_GAMES``
    :param render_mode: ``None`` or ``"rgb_array"`` (``render()`` returns 512x512 frames)
    :param distribution_mode: Level difficulty: "easy", "hard" (procgen's default), "extreme", "memory" or
        "exploration" (see ``DISTRIBUTION_MODES``)
    :param num_levels: Number of unique levels to sample from (0: unlimited)
    :param start_level: Seed of the first level of the range
    :param procgen_kwargs: Other procgen options (see :class:`ProcgenVecEnv`)
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["rgb_array"], "render_fps": 15}

    def __init__(
        self,
        env_name: str,
        render_mode: str | None = None,
        distribution_mode: str = "hard",
        num_levels: int = 0,
        start_level: int = 0,
        **procgen_kwargs: Any,
    ):
        _check_render_mode(render_mode)
        self.env_name = env_name
        # Everything needed to build a ``ProcgenVecEnv`` with the same settings:
        # ``ProcgenVecEnv(n_envs, env.env_name, **env.procgen_kwargs)``
        self.procgen_kwargs = check_procgen_options(env_name, distribution_mode, num_levels, start_level, procgen_kwargs)
        self.render_mode = render_mode
        self.observation_space = _observation_space()
        self.action_space = spaces.Discrete(PROCGEN_N_ACTIONS)
        self._renderer = _HiresRenderer(env_name, self.procgen_kwargs)
        self._env: Any = None
        self._action = np.zeros(1, dtype=np.int32)
        self._build(None)

    def _build(self, rand_seed: int | None) -> None:
        """
        (Re)build the C++ env and observe its first frame.

        :param rand_seed: Seed in procgen's range, ``None`` for a random one
        """
        if self._env is not None:
            self._env.close()
        self._env = _make_gym3_env(1, self.env_name, self.procgen_kwargs, rand_seed, 0, None)
        _, observations, _ = self._env.observe()
        # Current frame of the running episode (the last frame once it has ended)
        self._obs: np.ndarray = observations["rgb"][0]
        # First frame of the next episode, set when an episode ends
        self._next_obs: np.ndarray | None = None
        self._info = self._get_info()
        # Whether at least one step of the current episode has been taken
        self._in_episode = False

    def _get_info(self) -> dict[str, Any]:
        """
        :return: procgen's info dict of the game, with python ints
        """
        return {key: int(value) for key, value in self._env.get_info()[0].items()}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """
        Start a new episode.

        :param seed: Seed of the level sampler (any integer); rebuilds the C++ env
        :param options: Ignored (procgen has no reset options)
        :return: The first frame of the episode and the info dict
        """
        super().reset(seed=seed)
        if seed is not None:
            self._build(procgen_seed(seed))
        elif self._next_obs is not None:
            # The previous episode has ended, procgen already started the next one
            self._obs, self._next_obs = self._next_obs, None
        elif self._in_episode:
            self._build(int(self.np_random.integers(_MAX_INT32)))
        self._in_episode = False
        return self._obs, dict(self._info)

    def step(self, action: int | np.ndarray) -> tuple[np.ndarray, SupportsFloat, bool, bool, dict[str, Any]]:
        """
        Take one step.

        :param action: An integer in ``[0, 15)`` (python or numpy, scalar or of shape ``(1,)``)
        :return: observation, reward, terminated, truncated (always ``False``), info
        """
        action_array = np.asarray(action)
        if action_array.size != 1 or action_array.dtype.kind not in "iu" or not 0 <= action_array.item() < PROCGEN_N_ACTIONS:
            raise ValueError(f"Expected one integer action in [0, {PROCGEN_N_ACTIONS}), got {action!r}")
        if self._next_obs is not None:
            # Stepping on without reset(): continue in the episode procgen already started
            self._obs, self._next_obs = self._next_obs, None
        self._action[0] = action_array.item()
        self._env.act(self._action)
        rewards, observations, firsts = self._env.observe()
        info = self._info = self._get_info()
        terminated = bool(firsts[0])
        if terminated:
            # ``observations`` is the first frame of the next episode: keep it for reset() and return the last frame
            self._next_obs = observations["rgb"][0]
            self._in_episode = False
            info = {**info, "is_success": bool(info["prev_level_complete"])}
        else:
            self._obs = observations["rgb"][0]
            self._in_episode = True
        return self._obs, float(rewards[0]), terminated, False, info

    def render(self) -> np.ndarray | None:  # type: ignore[override]
        """
        :return: The 512x512 frame of the current state if ``render_mode="rgb_array"``, else ``None``
        """
        if self.render_mode == "rgb_array":
            return self._renderer.render(self._env)[0]
        return None

    def close(self) -> None:
        """
        Free the C++ env.
        """
        _close_procgen_env(self)


def register_procgen_envs() -> None:
    """
    Register the gymnasium ids ``procgen/<game>-v0`` of the 16 games (entry point :class:`ProcgenGymnasiumEnv`).

    Calling it again does nothing. Procgen options are passed to ``gymnasium.make``:
    ``gymnasium.make("procgen/coinrun-v0", distribution_mode="easy", num_levels=200)``.
    """
    for game in PROCGEN_GAMES:
        env_id = f"procgen/{game}-v0"
        if env_id not in gymnasium.registry:
            gymnasium.register(id=env_id, entry_point="sb3_ppg.procgen:ProcgenGymnasiumEnv", kwargs={"env_name": game})


def make_procgen_env(
    env_name: str,
    n_envs: int = 64,
    distribution_mode: str = "easy",
    num_levels: int = 0,
    start_level: int = 0,
    seed: int | None = None,
    normalize_reward: bool = True,
    reward_gamma: float = 0.999,
    clip_reward: float = 10.0,
    training: bool = True,
    num_threads: int = 2,
    render_mode: str | None = None,
    monitor_filename: str | None = None,
    monitor_info_keywords: tuple[str, ...] = (),
    vec_normalize_path: str | None = None,
    **procgen_kwargs: Any,
) -> VecEnv:
    """
    Procgen env with the PPG paper's wrappers: ``VecNormalize(VecMonitor(ProcgenVecEnv), norm_obs=False)``, each SB3
    wrapper in the faster subclass of :mod:`sb3_ppg.vec_env` (same outputs, found by SB3's helpers), over a
    channel-first ``ProcgenVecEnv``. The chain keeps 92% of raw procgen's throughput on a 2-core machine, where SB3's
    own wrappers keep 81-86% (``docs/procgen.md``).

    - ``ProcgenVecEnv(..., channels_first=True)``: ``(3, 64, 64)`` uint8 observations, as SB3's CNNs expect (a view
      of procgen's frames: no copy, and no ``VecTransposeImage`` layer; the algorithm does not add one either).
    - ``VecMonitor`` (:class:`~sb3_ppg.vec_env.FastVecMonitor`) records episode returns on the raw rewards
      (``ep_rew_mean``, ``EvalCallback``'s episode rewards).
    - ``VecNormalize(norm_obs=False, norm_reward=normalize_reward, gamma=reward_gamma, clip_reward=clip_reward,
      epsilon=1e-8)`` (:class:`~sb3_ppg.vec_env.RewardOnlyVecNormalize`): the paper's return-based reward scaling
      (rewards divided by the running standard deviation of the discounted return, no mean subtraction, then clipped).

    ``training=False`` gives an evaluation env: frozen statistics (``VecNormalize.training=False``) and raw rewards
    (``norm_reward=False``). ``VecNormalize`` is kept even with ``normalize_reward=False`` (it then passes rewards
    through), so training and evaluation chains always match. Its statistics are not saved with a model: save them
    with ``unwrap_vec_normalize(env).save(path)`` and pass ``vec_normalize_path=path`` to load them.

    Reward-normalization gamma: the default ``reward_gamma=0.999`` is the discount of the PPG/PPO losses, so the
    rewards are scaled by the spread of the same returns the value function learns; CleanRL's ``ppg_procgen.py``
    does this. The original PPG code normalized with its ``RewardNormalizer`` default of 0.99 while discounting with
    0.999 (CleanRL calls it technically incorrect); pass ``reward_gamma=0.99`` to reproduce the paper exactly.
    One difference remains: ``VecNormalize`` updates its statistics at every step, the original once per rollout.

    :param env_name: Name of the game, one of ``PROCGEN_GAMES``
    :param n_envs: Number of parallel games (the paper uses 64)
    :param distribution_mode: Level difficulty ("easy": CleanRL and quick runs; "hard": the paper's results)
    :param num_levels: Number of unique levels (0: unlimited, the paper's setting; e.g. 200 for the generalization
        benchmark, with ``num_levels=0`` for the evaluation env)
    :param start_level: Seed of the first level
    :param seed: Seed of the level sampler (mapped into procgen's range); ``None`` for a random one.
        ``model.set_random_seed``/``PPG(seed=...)`` reseed it through ``VecEnv.seed``.
    :param normalize_reward: Whether to normalize the rewards (training envs only)
    :param reward_gamma: Discount of the running return used to scale the rewards
    :param clip_reward: Normalized rewards are clipped to ``[-clip_reward, clip_reward]``
    :param training: ``False`` for an evaluation env (frozen statistics, raw rewards)
    :param num_threads: Number of procgen worker threads
    :param render_mode: ``"rgb_array"`` for videos (``VecVideoRecorder``)
    :param monitor_filename: Path of the ``VecMonitor`` CSV log (``.monitor.csv`` is appended unless present;
        ``None``: no file)
    :param monitor_info_keywords: Info keys logged by ``VecMonitor`` at episode ends (e.g. ``("is_success",)``)
    :param vec_normalize_path: Load the reward statistics of a ``VecNormalize`` saved at this path (the arguments,
        ``training`` and ``normalize_reward`` among them, still decide how they are used; a file that is not a
        ``VecNormalize``, or one that normalizes observations, is a ``ValueError``)
    :param procgen_kwargs: Other procgen options (``use_backgrounds``, ``restrict_themes``, ...; see
        :class:`ProcgenVecEnv`)
    :return: The wrapped env
    """
    if not 0.0 <= reward_gamma < 1.0:
        raise ValueError(f"reward_gamma must be in [0, 1), got {reward_gamma}")
    if not clip_reward > 0.0:
        raise ValueError(f"clip_reward must be positive, got {clip_reward}")
    # Read first: a bad file must not leave a procgen env behind
    reward_statistics = None if vec_normalize_path is None else _load_reward_statistics(vec_normalize_path)
    venv: VecEnv = ProcgenVecEnv(
        n_envs,
        env_name,
        distribution_mode=distribution_mode,
        num_levels=num_levels,
        start_level=start_level,
        rand_seed=seed,
        num_threads=num_threads,
        render_mode=render_mode,
        channels_first=True,
        **procgen_kwargs,
    )
    if monitor_filename is not None:
        directory = os.path.dirname(monitor_filename)
        if directory:
            os.makedirs(directory, exist_ok=True)
    venv = FastVecMonitor(venv, filename=monitor_filename, info_keywords=monitor_info_keywords)
    norm_reward = normalize_reward and training
    vec_normalize = RewardOnlyVecNormalize(
        venv,
        training=training,
        norm_obs=False,
        norm_reward=norm_reward,
        clip_reward=clip_reward,
        gamma=reward_gamma,
        epsilon=1e-8,
    )
    if reward_statistics is not None:
        vec_normalize.ret_rms, vec_normalize.epsilon = reward_statistics
    return vec_normalize


def _load_reward_statistics(path: str) -> tuple[RunningMeanStd, float]:
    """
    Read the reward statistics of a ``VecNormalize`` saved with ``save(path)`` (by a procgen chain or by SB3's own
    ``VecNormalize``). Only the statistics are read, so statistics saved by older chains, whose observations were
    channel-last at the ``VecNormalize`` layer, load too.

    :param path: Path of the pickled ``VecNormalize``
    :return: The running statistics of the discounted returns, and ``epsilon``
    """
    try:
        with open(path, "rb") as file_handler:
            saved = pickle.load(file_handler)
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError) as error:
        raise ValueError(f"Could not read VecNormalize statistics from {path}: {error!r}") from error
    if not isinstance(saved, VecNormalize):
        raise ValueError(f"{path} holds a {type(saved).__name__}, not VecNormalize statistics (saved with VecNormalize.save)")
    if saved.norm_obs:
        raise ValueError(f"{path} normalizes observations, procgen chains only normalize rewards")
    return saved.ret_rms, saved.epsilon


def _find_procgen_gym3_env(env: Any) -> Any:
    """
    Find the ``procgen.ProcgenGym3Env`` inside a legacy gym procgen env.

    :param env: What ``gym.make("procgen:procgen-<game>-v0")`` returns (or shimmy's wrapper of it)
    :return: The ``ProcgenGym3Env``, or ``None``
    """
    from procgen import ProcgenGym3Env

    # shimmy's GymV21CompatibilityV0 / GymV26CompatibilityV0 keep the legacy env in ``gym_env``
    inner = getattr(env, "gym_env", env)
    # gym wrappers -> gym3.interop.ToGymEnv
    inner = getattr(inner, "unwrapped", inner)
    # gym3 wrappers (ExtractDictObWrapper, ViewerWrapper) keep the wrapped env in ``env``
    for _ in range(10):
        if isinstance(inner, ProcgenGym3Env):
            return inner
        inner = getattr(inner, "env", None)
        if inner is None:
            break
    return None


def convert_legacy_procgen_env(env: Any) -> ProcgenGymnasiumEnv:
    """
    Build the gymnasium-native :class:`ProcgenGymnasiumEnv` with the settings of a legacy gym procgen env.

    ``gym.make("procgen:procgen-<game>-v0", ...)`` gives a gym 0.21-API env that SB3 can only use through shimmy,
    and that breaks as soon as a seed is passed (``ToGymEnv.seed() takes 1 positional argument but 2 were given``:
    procgen seeds only at construction), besides returning numpy rewards. This reads the game and options from the
    legacy env and returns the native env, which SB3 uses directly (seeds honoured). The legacy env is left as it
    is (close it if you do not need it). Better: create ``ProcgenGymnasiumEnv`` or ``gymnasium.make("procgen/<game>-v0")``
    directly.

    :param env: A legacy gym procgen env (optionally inside shimmy's compatibility wrapper)
    :return: A new :class:`ProcgenGymnasiumEnv` with the same game and options (``render_mode="human"`` becomes
        ``"rgb_array"``)
    """
    gym3_env = _find_procgen_gym3_env(env)
    if gym3_env is None:
        raise ValueError(
            f"{env} is not a legacy procgen env (no procgen.ProcgenGym3Env inside). For procgen, use "
            "sb3_ppg.procgen.ProcgenGymnasiumEnv / gymnasium.make('procgen/<game>-v0') for single envs, "
            "or ProcgenVecEnv / make_procgen_env for vectorized training"
        )
    options = gym3_env.options
    mode_names = {0: "easy", 1: "hard", 2: "extreme", 10: "memory"}
    from procgen.env import SCRIPT_DIR

    defaults = {**PROCGEN_OPTIONS, "resource_root": os.path.join(SCRIPT_DIR, "data", "assets") + os.sep}
    # Only the options that differ from procgen's defaults
    procgen_kwargs = {key: options[key] for key in PROCGEN_OPTIONS if key in options and options[key] != defaults[key]}
    # "exploration" is stored as "hard" on one fixed level, which is what ``num_levels``/``start_level`` give back
    return ProcgenGymnasiumEnv(
        options["env_name"],
        render_mode="rgb_array" if options["render_human"] else None,
        distribution_mode=mode_names[options["distribution_mode"]],
        num_levels=options["num_levels"],
        start_level=options["start_level"],
        **procgen_kwargs,
    )
