"""MaskablePPG: Phasic Policy Gradient for environments with invalid actions, in sb3-contrib's MaskablePPO API."""

from typing import Any, ClassVar, TypeVar

import numpy as np
import torch as th
from gymnasium import spaces
from sb3_contrib.common.maskable.buffers import MaskableDictRolloutBuffer, MaskableRolloutBuffer
from sb3_contrib.common.maskable.utils import get_action_masks, is_masking_supported
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.distributions import Distribution
from stable_baselines3.common.policies import BasePolicy
from stable_baselines3.common.type_aliases import MaybeCallback, RolloutBufferSamples
from stable_baselines3.common.vec_env import VecEnv

from sb3_ppg.common.aux_buffer import AuxiliaryBufferSamples
from sb3_ppg.ppg.ppg import PPG
from sb3_ppg.ppg_mask.buffers import MaskablePPGDictRolloutBuffer, MaskablePPGRolloutBuffer
from sb3_ppg.ppg_mask.distributions import (
    check_action_masks,
    get_unmasked_params,
    make_maskable_distribution,
    mask_dims,
    masked_kl_divergence,
)
from sb3_ppg.ppg_mask.policies import CnnPolicy, MaskablePPGPolicy, MlpPolicy, MultiInputPolicy, ProcgenCnn

SelfMaskablePPG = TypeVar("SelfMaskablePPG", bound="MaskablePPG")


class MaskablePPG(PPG):
    """
    Phasic Policy Gradient with invalid action masking, as sb3-contrib's ``MaskablePPO`` is PPO with it: PPG's
    constructor and sb3-contrib's conventions (``action_masks()`` on the env, ``learn(..., use_masking=True)``,
    ``predict(obs, action_masks=...)``). How the masks enter both phases: docs/maskable.md.

    See :class:`~sb3_ppg.PPG` for the parameters.
    """

    policy_aliases: ClassVar[dict[str, type[BasePolicy]]] = {
        "MlpPolicy": MlpPolicy,
        "CnnPolicy": CnnPolicy,
        "MultiInputPolicy": MultiInputPolicy,
        "ProcgenCnn": ProcgenCnn,
        "ProcgenCnnPolicy": ProcgenCnn,
    }
    policy: MaskablePPGPolicy  # type: ignore[assignment]

    def _setup_model(self) -> None:
        # A clear error for an action space that masks do not apply to, before anything is built
        make_maskable_distribution(self.action_space)
        if self.rollout_buffer_class is None:
            dict_obs = isinstance(self.observation_space, spaces.Dict)
            self.rollout_buffer_class = MaskablePPGDictRolloutBuffer if dict_obs else MaskablePPGRolloutBuffer
        if not issubclass(self.rollout_buffer_class, (MaskableRolloutBuffer, MaskableDictRolloutBuffer)):
            raise ValueError(
                f"MaskablePPG stores the action masks in its rollout buffer: rollout_buffer_class="
                f"{self.rollout_buffer_class.__name__} does not (use sb3-contrib's MaskableRolloutBuffer or "
                "MaskableDictRolloutBuffer, a subclass of them, or None)."
            )
        # Whether the rollouts of the current learn() use masks (see learn())
        self._use_masking = True
        super()._setup_model()
        if not isinstance(self.policy, MaskablePPGPolicy):
            raise ValueError(
                f"MaskablePPG needs a maskable policy: {type(self.policy).__name__} is not a MaskablePPGPolicy. Use "
                "'MlpPolicy', 'CnnPolicy', 'MultiInputPolicy', 'ProcgenCnn', or a subclass of "
                "sb3_ppg.ppg_mask.policies.MaskablePPGPolicy."
            )

    def _aux_buffer_kwargs(self) -> dict[str, Any]:
        """The auxiliary buffer stores the masks and the maskable distributions' logits (one per mask entry)."""
        dims = mask_dims(self.action_space)
        return {**super()._aux_buffer_kwargs(), "n_distribution_params": dims, "mask_dims": dims}

    def _excluded_save_params(self) -> list[str]:
        return [*super()._excluded_save_params(), "_use_masking"]

    def learn(  # type: ignore[override]
        self: SelfMaskablePPG,
        total_timesteps: int,
        callback: MaybeCallback = None,
        log_interval: int = 1,
        tb_log_name: str = "MaskablePPG",
        reset_num_timesteps: bool = True,
        use_masking: bool = True,
        progress_bar: bool = False,
    ) -> SelfMaskablePPG:
        """
        SB3's ``learn()`` (sb3-contrib's ``MaskablePPO.learn`` arguments).

        :param total_timesteps: The total number of samples (env steps) to train on
        :param callback: callback(s) called at every step with state of the algorithm
        :param log_interval: the number of iterations between logs
        :param tb_log_name: the name of the run for TensorBoard logging
        :param reset_num_timesteps: whether or not to reset the current timestep number (used in logging)
        :param use_masking: collect the env's action masks with every sample (the env needs ``action_masks()``)
        :param progress_bar: Display a progress bar using tqdm and rich
        :return: the trained model
        """
        if use_masking and self.env is not None:
            self._check_masking_supported(self.env)
        self._use_masking = use_masking
        return super().learn(
            total_timesteps,
            callback=callback,
            log_interval=log_interval,
            tb_log_name=tb_log_name,
            reset_num_timesteps=reset_num_timesteps,
            progress_bar=progress_bar,
        )

    def _check_masking_supported(self, env: VecEnv) -> None:
        """Raise a ``ValueError`` naming the fixes when the env has no ``action_masks()`` method."""
        if not is_masking_supported(env):
            raise ValueError(
                f"{type(self).__name__}.learn(use_masking=True) needs an env with an action_masks() method that returns "
                "the valid actions of the current state, and this env has none. Wrap the env with "
                "sb3_contrib.common.wrappers.ActionMasker(env, mask_fn), give it an action_masks() method, or call "
                "learn(..., use_masking=False) to train without masks."
            )

    def predict(  # type: ignore[override]
        self,
        observation: np.ndarray | dict[str, np.ndarray],
        state: tuple[np.ndarray, ...] | None = None,
        episode_start: np.ndarray | None = None,
        deterministic: bool = False,
        action_masks: np.ndarray | None = None,
    ) -> tuple[np.ndarray, tuple[np.ndarray, ...] | None]:
        """
        The model's action for an observation or a batch of them (sb3-contrib's ``MaskablePPO.predict``; SB3's arguments).

        :param action_masks: the valid actions (True) of each observation (``get_action_masks(env)``); None: no masking
        :return: the action(s) and the state
        """
        return self.policy.predict(observation, state, episode_start, deterministic, action_masks=action_masks)

    def _collect_rollout(
        self, env: VecEnv, callback: BaseCallback, rollout_buffer: RolloutBuffer, n_rollout_steps: int
    ) -> bool:
        """PPG's rollout (SB3's), with the env's action masks when ``learn()`` masks (see ``_action_masks``)."""
        if self._use_masking:
            self._check_masking_supported(env)
        return super()._collect_rollout(env, callback, rollout_buffer, n_rollout_steps)

    def _action_masks(self, env: VecEnv) -> np.ndarray | None:
        """The env's action masks for a rollout step, checked (when ``learn()`` masks, else None)."""
        if not self._use_masking:
            return None
        return check_action_masks(get_action_masks(env), self.action_space, env.num_envs, "the env's action_masks()")

    def _evaluate_actions(self, rollout_data: RolloutBufferSamples) -> tuple[th.Tensor, th.Tensor, th.Tensor | None]:
        """The masked distribution's values, log-probabilities and entropies on a policy-phase minibatch."""
        return self.policy.evaluate_actions(
            rollout_data.observations,
            self._actions(rollout_data),
            action_masks=rollout_data.action_masks,  # type: ignore[attr-defined]
        )

    def _distribution_params(self, distribution: Distribution) -> th.Tensor:
        """pi_old's unmasked logits (the auxiliary buffer holds the masks beside them)."""
        return get_unmasked_params(distribution)  # type: ignore[arg-type]

    def _behaviour_cloning_kl(self, batch: AuxiliaryBufferSamples, distribution: Distribution) -> th.Tensor:
        """``KL(pi_old || pi)`` over each state's valid actions (see ``masked_kl_divergence``)."""
        return masked_kl_divergence(batch.old_distribution_params, distribution, batch.action_masks)  # type: ignore[arg-type]
