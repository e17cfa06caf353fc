"""Small envs of sb3_ppg's own: a Dict-observation CartPole (for ``MultiInputPolicy``, the zoo's hyperparameters and tests)."""

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.envs.classic_control import CartPoleEnv

DICT_CARTPOLE_ID = "sb3_ppg/DictCartPole-v1"


class DictObservationCartPole(gym.ObservationWrapper):
    """CartPole with a ``Dict`` observation (``cart``, ``pole``), registered as ``sb3_ppg/DictCartPole-v1``."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        assert isinstance(env.observation_space, spaces.Box)
        low, high = env.observation_space.low, env.observation_space.high
        self.observation_space = spaces.Dict(
            {
                "cart": spaces.Box(low[:2], high[:2], dtype=np.float32),
                "pole": spaces.Box(low[2:], high[2:], dtype=np.float32),
            }
        )

    def observation(self, observation: np.ndarray) -> dict[str, np.ndarray]:
        """
        :param observation: CartPole's observation
        :return: The Dict observation
        """
        observation = np.asarray(observation, dtype=np.float32)
        return {"cart": observation[:2], "pole": observation[2:]}


def make_dict_cartpole(**kwargs: Any) -> gym.Env:
    """Entry point of ``sb3_ppg/DictCartPole-v1`` (keyword arguments of ``CartPoleEnv``)."""
    return DictObservationCartPole(CartPoleEnv(**kwargs))


def register_dict_cartpole() -> None:
    """Register ``sb3_ppg/DictCartPole-v1`` (once)."""
    if DICT_CARTPOLE_ID not in gym.envs.registry:
        gym.register(
            id=DICT_CARTPOLE_ID,
            entry_point="sb3_ppg.common.envs:make_dict_cartpole",
            max_episode_steps=500,
            reward_threshold=475.0,
        )
