"""
:class:`ProcgenGymnasiumEnv`: one procgen game as a ``gymnasium.Env`` (the ids ``procgen/<game>-v0``), and
:func:`convert_legacy_procgen_env`, which turns a legacy ``gym.make("procgen:procgen-<game>-v0")`` env into one.
"""

from typing import Any, ClassVar, SupportsFloat

import gymnasium
import numpy as np
from gymnasium import spaces

from sb3_ppg.procgen.backend import backend
from sb3_ppg.procgen.games import (
    MAX_INT32,
    PROCGEN_N_ACTIONS,
    PROCGEN_OPTIONS,
    check_argument_names,
    check_procgen_options,
    check_render_mode,
    procgen_seed,
)
from sb3_ppg.procgen.native import HiresRenderer, check_open, close_native_env, make_gym3_env, observation_space


class ProcgenGymnasiumEnv(gymnasium.Env[np.ndarray, int]):
    """
    One procgen game as a ``gymnasium.Env`` (built on ``ProcgenGym3Env(num=1, num_threads=0)``), registered as
    ``procgen/<game>-v0`` by :func:`~sb3_ppg.procgen.register_procgen_envs`, for where SB3 wants single envs. Seeding,
    resets and episode ends are described in docs/procgen.md.

    :param env_name: Name of the game, one of ``PROCGEN_GAMES``
    :param render_mode: ``None`` or ``"rgb_array"`` (``render()`` returns 512x512 frames)
    :param distribution_mode: Level difficulty: "easy", "hard" (procgen's default), "extreme", "memory" or
        "exploration" (see ``DISTRIBUTION_MODES``)
    :param num_levels: Number of unique levels to sample from (0: unlimited)
    :param start_level: Seed of the first level of the range
    :param procgen_kwargs: Other procgen options (see :class:`~sb3_ppg.procgen.ProcgenVecEnv`)
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
        seed_fix = "seed the level sampler with env.reset(seed=...)"
        several = "a ProcgenGymnasiumEnv plays one game; ProcgenVecEnv(num_envs, env_name, ...) plays several"
        check_argument_names(
            "ProcgenGymnasiumEnv",
            procgen_kwargs,
            {"rand_seed": seed_fix, "seed": seed_fix, "num": several, "num_envs": several, "n_envs": several},
        )
        check_render_mode(render_mode)
        self.env_name = env_name
        # Everything needed to build a ``ProcgenVecEnv`` with the same settings:
        # ``ProcgenVecEnv(n_envs, env.env_name, **env.procgen_kwargs)``
        self.procgen_kwargs = check_procgen_options(env_name, distribution_mode, num_levels, start_level, procgen_kwargs)
        self.render_mode = render_mode
        self.observation_space = observation_space()
        self.action_space = spaces.Discrete(PROCGEN_N_ACTIONS)
        self._renderer = HiresRenderer(env_name, self.procgen_kwargs)
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
        self._env = make_gym3_env(1, self.env_name, self.procgen_kwargs, rand_seed, 0, None)
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
        check_open(self)
        super().reset(seed=seed)
        if seed is not None:
            self._build(procgen_seed(seed))
        elif self._next_obs is not None:
            # The previous episode has ended, procgen already started the next one
            self._obs, self._next_obs = self._next_obs, None
        elif self._in_episode:
            self._build(int(self.np_random.integers(MAX_INT32)))
        self._in_episode = False
        return self._obs, dict(self._info)

    def step(self, action: int | np.ndarray) -> tuple[np.ndarray, SupportsFloat, bool, bool, dict[str, Any]]:
        """
        Take one step.

        :param action: An integer in ``[0, 15)`` (python or numpy, scalar or of shape ``(1,)``)
        :return: observation, reward, terminated, truncated (always ``False``), info
        """
        check_open(self)
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
        close_native_env(self)


def _find_procgen_gym3_env(env: Any) -> Any:
    """
    Find the ``procgen.ProcgenGym3Env`` inside a legacy gym procgen env.

    :param env: What ``gym.make("procgen:procgen-<game>-v0")`` returns (or shimmy's wrapper of it)
    :return: The ``ProcgenGym3Env``, or ``None`` (always with procgen-gym, which has no legacy gym envs)
    """
    gym3_env_class = backend().gym3_env_class
    if gym3_env_class is None:
        return None
    # shimmy's GymV21CompatibilityV0 / GymV26CompatibilityV0 keep the legacy env in ``gym_env``
    inner = getattr(env, "gym_env", env)
    # gym wrappers -> gym3.interop.ToGymEnv
    inner = getattr(inner, "unwrapped", inner)
    # gym3 wrappers (ExtractDictObWrapper, ViewerWrapper) keep the wrapped env in ``env``
    for _ in range(10):
        if isinstance(inner, gym3_env_class):
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
    defaults = {**PROCGEN_OPTIONS, "resource_root": backend().assets_dir}
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
