"""
The rollout loop: SB3's ``collect_rollouts()`` (``on_policy_algorithm.py``), with PPG's rollout buffers written while
the envs step, in a base class whose subclasses change a step through small hooks instead of copying the loop: the
action masks (``MaskablePPG``), the policy's step and the values it bootstraps from (a recurrent policy's states).
"""

from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from stable_baselines3.common.utils import obs_as_tensor
from stable_baselines3.common.vec_env import VecEnv

from sb3_ppg.common.preprocessing import env_actions
from sb3_ppg.common.rollout_buffers import UnflattenedRolloutBuffer


def writes_while_envs_step(env: VecEnv, rollout_buffer: RolloutBuffer) -> bool:
    """
    Whether the rollout writes each step into the rollout buffer while the envs step, between ``step_async()`` and
    ``step_wait()``: with PPG's buffers (``add_before_step()``) and an env whose ``step()`` is SB3's (those two calls).
    """
    steps_in_two_calls = type(env).step is VecEnv.step and "step" not in vars(env)
    return isinstance(rollout_buffer, UnflattenedRolloutBuffer) and steps_in_two_calls


class RolloutAlgorithm(OnPolicyAlgorithm):
    """
    SB3's ``OnPolicyAlgorithm`` whose rollout (``_collect_rollout``, SB3's ``collect_rollouts()``) is changed through
    hooks: ``_on_rollout_start`` (once per rollout), ``_action_masks`` and ``_policy_step`` (each step),
    ``_terminal_value`` (a truncated episode's last observation) and ``_last_values`` (the values after the rollout).
    """

    def _make_rollout_buffer(self) -> RolloutBuffer:
        """A new rollout buffer of ``rollout_buffer_class`` for the current ``n_envs`` (as SB3's ``_setup_model``)."""
        return self.rollout_buffer_class(  # type: ignore[misc]
            self.n_steps,
            self.observation_space,  # type: ignore[arg-type]
            self.action_space,
            device=self.device,
            gamma=self.gamma,
            gae_lambda=self.gae_lambda,
            n_envs=self.n_envs,
            **self.rollout_buffer_kwargs,
        )

    def _collect_rollout(
        self, env: VecEnv, callback: BaseCallback, rollout_buffer: RolloutBuffer, n_rollout_steps: int
    ) -> bool:
        """
        Collect one rollout: SB3's ``collect_rollouts()``, with PPG's rollout buffers written while the envs step (the
        same rollout; see ``writes_while_envs_step``), and what ``_policy_step`` returns beyond the actions, values and
        log-probabilities (the action masks of ``_action_masks``) stored with each step.
        """
        assert self._last_obs is not None, "No previous observation was provided"
        self.policy.set_training_mode(False)
        n_steps = 0
        rollout_buffer.reset()
        if self.use_sde:
            self.policy.reset_noise(env.num_envs)  # new weights for the state-dependent exploration
        callback.on_rollout_start()
        self._on_rollout_start(env, rollout_buffer)
        during_step = writes_while_envs_step(env, rollout_buffer)
        while n_steps < n_rollout_steps:
            if self.use_sde and self.sde_sample_freq > 0 and n_steps % self.sde_sample_freq == 0:
                self.policy.reset_noise(env.num_envs)
            with th.no_grad():
                obs_tensor = obs_as_tensor(self._last_obs, self.device)  # type: ignore[arg-type]
                actions_tensor, values, log_probs, stored = self._policy_step(obs_tensor, env)
            actions = actions_tensor.cpu().numpy()
            clipped_actions = env_actions(actions, self.policy, self.action_space)  # Box: unscaled or clipped
            if during_step:  # the step's observations, actions, values, masks... copied while the envs step
                env.step_async(clipped_actions)
                rollout_buffer.add_before_step(  # type: ignore[attr-defined]
                    self._last_obs, actions, self._last_episode_starts, values, log_probs, **stored
                )
                new_obs, rewards, dones, infos = env.step_wait()
            else:
                new_obs, rewards, dones, infos = env.step(clipped_actions)
            self.num_timesteps += env.num_envs
            callback.update_locals(locals())
            if not callback.on_step():
                if during_step:
                    rollout_buffer.discard_before_step()  # type: ignore[attr-defined]
                return False
            self._update_info_buffer(infos, dones)
            n_steps += 1
            if isinstance(self.action_space, spaces.Discrete):
                actions = actions.reshape(-1, 1)
            # Handle timeouts by bootstrapping with the value function (SB3's, with its local names)
            for idx, done in enumerate(dones):
                if (
                    done
                    and infos[idx].get("terminal_observation") is not None
                    and infos[idx].get("TimeLimit.truncated", False)
                ):
                    terminal_obs = self.policy.obs_to_tensor(infos[idx]["terminal_observation"])[0]
                    terminal_value = self._terminal_value(idx, terminal_obs)
                    rewards[idx] += self.gamma * terminal_value
            if during_step:
                rollout_buffer.add_after_step(rewards)  # type: ignore[attr-defined]
            else:
                rollout_buffer.add(
                    self._last_obs,  # type: ignore[arg-type]
                    actions,
                    rewards,
                    self._last_episode_starts,  # type: ignore[arg-type]
                    values,
                    log_probs,
                    **stored,
                )
            self._last_obs = new_obs  # type: ignore[assignment]
            self._last_episode_starts = dones
        values = self._last_values(new_obs, dones)
        rollout_buffer.compute_returns_and_advantage(last_values=values, dones=dones)
        callback.update_locals(locals())
        callback.on_rollout_end()
        return True

    def _on_rollout_start(self, env: VecEnv, rollout_buffer: RolloutBuffer) -> None:
        """Called once per rollout, after ``rollout_buffer.reset()`` and the callbacks' ``on_rollout_start()``."""

    def _action_masks(self, env: VecEnv) -> np.ndarray | None:
        """The valid actions of the envs' current states for a rollout step; None: no masks (``MaskablePPG``'s hook)."""
        return None

    def _policy_step(self, obs_tensor: Any, env: VecEnv) -> tuple[th.Tensor, th.Tensor, th.Tensor, dict[str, Any]]:
        """
        The policy's step on the current observations (without gradients): actions, values, log-probabilities, and
        the keyword arguments stored with the step by the rollout buffer's ``add`` (the action masks, if any).
        """
        action_masks = self._action_masks(env)
        stored = {} if action_masks is None else {"action_masks": action_masks}
        actions, values, log_probs = self.policy(obs_tensor, **stored)
        return actions, values, log_probs, stored

    def _terminal_value(self, env_index: int, terminal_obs: Any) -> th.Tensor:
        """The value of env ``env_index``'s last observation (a tensor) of a truncated episode (the reward's bootstrap)."""
        with th.no_grad():
            return self.policy.predict_values(terminal_obs)[0]

    def _last_values(self, new_obs: Any, dones: np.ndarray) -> th.Tensor:
        """The values of the observations after the rollout's last step (the returns' bootstrap)."""
        with th.no_grad():
            return self.policy.predict_values(obs_as_tensor(new_obs, self.device))  # type: ignore[arg-type]
