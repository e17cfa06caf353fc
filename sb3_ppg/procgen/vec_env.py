"""
:class:`ProcgenVecEnv`: a native SB3 ``VecEnv`` over procgen's vectorized C++ environment (``procgen.ProcgenGym3Env``),
all games of a kind in one C++ env stepped by ``num_threads`` worker threads.
"""

from collections.abc import Sequence
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces
from stable_baselines3.common.vec_env.base_vec_env import VecEnv, VecEnvIndices, VecEnvObs, VecEnvStepReturn

from sb3_ppg.common.threads import default_num_threads
from sb3_ppg.procgen.games import (
    MAX_INT32,
    PROCGEN_N_ACTIONS,
    PROCGEN_OPTIONS,
    check_argument_names,
    check_int,
    check_procgen_options,
    check_render_mode,
    procgen_seed,
)
from sb3_ppg.procgen.native import HiresRenderer, check_open, close_native_env, make_gym3_env, observation_space


class ProcgenVecEnv(VecEnv):
    """
    Native SB3 ``VecEnv`` over procgen's vectorized C++ environment: ``num_envs`` games stepped by ``num_threads`` C++
    threads; ``uint8`` frame observations, ``Discrete(15)`` actions (seeding, resets and infos: docs/procgen.md).

    :param num_envs: Number of parallel games
    :param env_name: Name of the game, one of ``PROCGEN_GAMES``
    :param distribution_mode: Level difficulty (see ``DISTRIBUTION_MODES`` for which games support which)
    :param num_levels: Number of unique levels to sample from (0: unlimited)
    :param start_level: Seed of the first level of the range
    :param rand_seed: Seed of the level sampler (any integer, mapped with :func:`procgen_seed`); ``None``: random
    :param num_threads: Number of procgen worker threads (0: step in the calling thread); ``None``: this process's
        share of the idle CPUs (:func:`sb3_ppg.common.threads.default_num_threads`)
    :param render_mode: ``None`` or ``"rgb_array"`` (512x512 frames, drawn on demand)
    :param channels_first: Observations of shape ``(3, 64, 64)`` instead of ``(64, 64, 3)``
    :param procgen_kwargs: Other procgen options (``center_agent``, ``use_backgrounds``, ...: see docs/procgen.md)
    """

    def __init__(
        self,
        num_envs: int,
        env_name: str,
        distribution_mode: str = "hard",
        num_levels: int = 0,
        start_level: int = 0,
        rand_seed: int | None = None,
        num_threads: int | None = None,
        render_mode: str | None = None,
        channels_first: bool = False,
        **procgen_kwargs: Any,
    ):
        check_argument_names(
            "ProcgenVecEnv",
            procgen_kwargs,
            {"seed": "pass the seed of the level sampler as rand_seed", "num": "pass the number of games as num_envs"},
        )
        num_envs = check_int("num_envs", num_envs, 1)
        if num_threads is None:
            num_threads = default_num_threads()
        self.num_threads = check_int("num_threads", num_threads, 0, 1024)
        check_render_mode(render_mode)
        self.env_name = env_name
        self.procgen_kwargs = check_procgen_options(env_name, distribution_mode, num_levels, start_level, procgen_kwargs)
        # ``VecEnv.__init__`` reads it with ``get_attr``
        self.render_mode = render_mode
        self._renderer = HiresRenderer(env_name, self.procgen_kwargs)
        self._env: Any = None
        self._build(None if rand_seed is None else procgen_seed(rand_seed), num_envs)
        self.channels_first = bool(channels_first)
        super().__init__(num_envs, observation_space(self.channels_first), spaces.Discrete(PROCGEN_N_ACTIONS))
        # Read by ``VecVideoRecorder`` (procgen runs at 15 frames per second)
        self.metadata = {**self.metadata, "render_fps": 15}
        self._actions = np.zeros(num_envs, dtype=np.int32)
        _, observations, _ = self._env.observe()
        self._last_obs: np.ndarray = observations["rgb"]
        self.reset_infos = self._env.get_info()

    def _build(self, rand_seed: int | None, num_envs: int | None = None) -> None:
        """(Re)build the C++ env (``rand_seed`` in procgen's range, ``None``: random)."""
        if self._env is not None:
            self._env.close()
        if rand_seed is None:
            rand_seed = int(np.random.SeedSequence().generate_state(1)[0]) % MAX_INT32
        self._env = make_gym3_env(
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
        check_open(self)
        seed = self._seeds[0]
        if seed is not None:
            self._build(procgen_seed(seed))
        elif self._stepped:
            self._build(int(self._seed_generator.integers(MAX_INT32)))
        self._reset_seeds()
        self._reset_options()
        _, observations, _ = self._env.observe()
        self._last_obs = observations["rgb"]
        self.reset_infos = self._env.get_info()
        return self._last_obs.transpose(0, 3, 1, 2) if self.channels_first else self._last_obs

    def step_async(self, actions: np.ndarray) -> None:
        """Check the actions (integers in ``[0, 15)``) and start the step on procgen's threads."""
        check_open(self)
        actions = np.asarray(actions)
        if actions.shape != self._actions.shape:
            if actions.shape != (self.num_envs, 1):
                raise ValueError(
                    f"Expected actions of shape ({self.num_envs},) (or ({self.num_envs}, 1)), one per env, "
                    f"got shape {actions.shape}"
                )
            actions = actions[:, 0]
        kind = actions.dtype.kind
        if not (kind in "iu" or (kind == "f" and np.all(np.mod(actions, 1) == 0))):
            raise ValueError(f"Expected integer actions, got {actions.dtype} values {actions.ravel()}")
        if actions.min() < 0 or actions.max() >= PROCGEN_N_ACTIONS:
            raise ValueError(f"Actions must be in [0, {PROCGEN_N_ACTIONS}), got {actions.ravel()}")
        self._actions[:] = actions
        self._env.act(self._actions)
        self._stepped = True

    def step_wait(self) -> VecEnvStepReturn:
        """
        Wait for the step started by ``step_async``.

        :return: observations, rewards, dones, infos
        """
        rewards, observations, dones = self._env.observe()
        observations = observations["rgb"]
        infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        if dones.any():
            # Procgen's info (level seeds, level completed) is handed out at episode ends only
            procgen_infos = self._env.get_info()
            for idx in np.flatnonzero(dones):
                # Scalars as python numbers (procgen gives numpy scalars)
                info = infos[idx] = {
                    key: value.item() if np.ndim(value) == 0 else value for key, value in procgen_infos[idx].items()
                }
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

    def get_env_settings(self) -> dict[str, Any]:
        """The settings that define the games: ``get_env_states`` fits games with the same settings."""
        settings = {"env_name": self.env_name, **PROCGEN_OPTIONS, **self.procgen_kwargs}
        return {key: value for key, value in settings.items() if key != "resource_root"}

    def get_env_states(self) -> list[bytes]:
        """The games' states (procgen's own serialization), one ``bytes`` per game, as checkpoints store them."""
        check_open(self)
        return [bytes(state) for state in self._env.get_state()]

    def set_env_states(self, states: list[bytes]) -> None:
        """
        Put back the games' states saved by ``get_env_states`` (the frames are those of the next ``step``).

        :param states: One ``bytes`` per game
        """
        check_open(self)
        if len(states) != self.num_envs:
            raise ValueError(f"{len(states)} saved game states for a ProcgenVecEnv of {self.num_envs} games.")
        self._env.set_state(list(states))
        self._stepped = True

    def close(self) -> None:
        """
        Free the C++ env.
        """
        close_native_env(self)

    def get_images(self) -> Sequence[np.ndarray | None]:
        """
        :return: One frame per env: the 512x512 render of the current state if ``render_mode="rgb_array"``, else the
            64x64 observation
        """
        if self.render_mode == "rgb_array":
            return self._renderer.render(self._env)
        return list(self._last_obs)

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        """Return an attribute of this env, once per requested index."""
        value = getattr(self, attr_name)
        return [value for _ in self._get_indices(indices)]

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        """Set an attribute of this env (shared by all indices)."""
        setattr(self, attr_name, value)

    def env_method(
        self, method_name: str, *method_args: Any, indices: VecEnvIndices = None, **method_kwargs: Any
    ) -> list[Any]:
        """Call a method of this env once, and return its result once per requested index."""
        result = getattr(self, method_name)(*method_args, **method_kwargs)
        return [result for _ in self._get_indices(indices)]

    def env_is_wrapped(self, wrapper_class: type[gymnasium.Wrapper], indices: VecEnvIndices = None) -> list[bool]:
        """
        :param wrapper_class: A gymnasium wrapper class
        :param indices: Indices of envs
        :return: ``False`` for each index: the games are not gymnasium envs, so they are never wrapped
        """
        return [False for _ in self._get_indices(indices)]
