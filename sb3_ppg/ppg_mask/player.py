"""A MaskablePPG model that plays in a vectorized env with that env's action masks."""

import numpy as np
from sb3_contrib.common.maskable.utils import get_action_masks, is_masking_supported
from stable_baselines3.common.vec_env import VecEnv

from sb3_ppg.ppg_mask.distributions import check_action_masks
from sb3_ppg.ppg_mask.ppg_mask import MaskablePPG


class MaskedPlayer:
    """
    A :class:`~sb3_ppg.MaskablePPG` model playing in a vectorized env: each ``predict()`` reads, checks and acts among
    the env's current valid actions, for programs that call ``model.predict(obs)`` without masks (the RL Zoo's
    ``enjoy``). An env without ``action_masks()`` is played without masks.
    """

    def __init__(self, model: MaskablePPG, env: VecEnv) -> None:
        self.model = model
        self.env = env
        self.use_masking = is_masking_supported(env)

    def action_masks(self) -> np.ndarray | None:
        """The env's masks for its current states, checked (shape ``(n_envs, mask_dims)``); None without masking."""
        if not self.use_masking:
            return None
        return check_action_masks(
            get_action_masks(self.env), self.model.action_space, self.env.num_envs, "the env's action_masks()"
        )

    def predict(
        self,
        observation: np.ndarray | dict[str, np.ndarray],
        state: tuple[np.ndarray, ...] | None = None,
        episode_start: np.ndarray | None = None,
        deterministic: bool = False,
    ) -> tuple[np.ndarray, tuple[np.ndarray, ...] | None]:
        """
        The model's actions for the env's current observations, among its states' valid actions (SB3's arguments).
        """
        return self.model.predict(observation, state, episode_start, deterministic, action_masks=self.action_masks())
