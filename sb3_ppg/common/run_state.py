"""
Where a run is, beyond its weights and optimizers (:class:`RunState`), and what a model offers to the code that saves
and resumes runs (:class:`ResumableModel`): checkpoints and data-parallel training read and write these, never the
model's private attributes.
"""

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
from stable_baselines3.common.vec_env import VecEnv

from sb3_ppg.common.buffers import AuxiliaryBuffer

#: The last observations of a run: an array, a dict of arrays (Dict spaces), or None (the env is reset first)
Observations = np.ndarray | dict[str, np.ndarray] | None


@dataclass
class RunState:
    """
    The counters, statistics and last observations of a run: what, with the weights, the optimizers, the auxiliary
    buffer, the envs and the random generators, continues it exactly.

    :param num_timesteps: env steps so far (of all ranks under torchrun)
    :param total_timesteps: the total of the current ``learn()``
    :param num_timesteps_at_start: ``num_timesteps`` when the current ``learn()`` started (for the fps)
    :param n_updates: policy-phase epochs so far (value epochs included)
    :param n_aux_phases: auxiliary phases so far
    :param n_aux_updates: auxiliary-phase optimizer steps so far
    :param episode_num: episodes so far (SB3's counter)
    :param current_progress_remaining: SB3's remaining progress, from 1 to 0 (what schedules are evaluated at)
    :param ep_info_buffer: the last episodes' statistics (SB3's ``ep_info_buffer``)
    :param ep_success_buffer: the last episodes' successes (SB3's ``ep_success_buffer``)
    :param last_obs: the observations the next rollout starts from
    :param last_original_obs: the same before ``VecNormalize`` (None without it)
    :param last_episode_starts: whether each env's last observation starts an episode
    """

    num_timesteps: int
    total_timesteps: int
    num_timesteps_at_start: int
    n_updates: int
    n_aux_phases: int
    n_aux_updates: int
    episode_num: int
    current_progress_remaining: float
    ep_info_buffer: list[dict[str, Any]]
    ep_success_buffer: list[Any]
    last_obs: Observations
    last_original_obs: Observations
    last_episode_starts: np.ndarray | None


@runtime_checkable
class ResumableModel(Protocol):
    """
    What checkpoints (:mod:`sb3_ppg.common.checkpoints`) need from a model: :class:`~sb3_ppg.PPG` is one. A model
    is resumable exactly at a rollout boundary: once ``train()`` has consumed the last rollout collected, before the
    next rollout draws anything.
    """

    env: VecEnv | None
    n_envs: int
    num_timesteps: int
    aux_buffer: AuxiliaryBuffer | None

    @property
    def at_rollout_boundary(self) -> bool:
        """Whether the model is at a rollout boundary (False from the start of a rollout until its ``train()`` returns)."""

    def get_run_state(self) -> RunState:
        """The run's state (see :class:`RunState`)."""

    def set_run_state(self, state: RunState) -> None:
        """Put back a run state from :meth:`get_run_state`."""

    def save(self, path: Any) -> None:
        """Save the model zip (weights, optimizers, hyperparameters)."""
