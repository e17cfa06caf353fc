"""MaskableRecurrentPPG: PPG with LSTM policies and invalid action masking, MaskablePPG and RecurrentPPG composed."""

from typing import ClassVar

import torch as th
from gymnasium import spaces
from stable_baselines3.common.policies import BasePolicy

from sb3_ppg.common.recurrent.buffers import RecurrentRolloutSamples, RecurrentStartStates
from sb3_ppg.ppg_mask import MaskablePPG
from sb3_ppg.ppg_mask_recurrent.buffers import MaskableRecurrentDictRolloutBuffer, MaskableRecurrentRolloutBuffer
from sb3_ppg.ppg_mask_recurrent.policies import (
    CnnLstmPolicy,
    MaskableRecurrentPPGPolicy,
    MlpLstmPolicy,
    MultiInputLstmPolicy,
    ProcgenCnnLstm,
)
from sb3_ppg.ppg_recurrent import RecurrentPPG


class MaskableRecurrentPPG(MaskablePPG, RecurrentPPG):
    """
    Phasic Policy Gradient with LSTM policies and invalid action masking: ``RecurrentPPG``'s sequences in both phases
    and ``MaskablePPG``'s masks (``action_masks()`` on the env, ``learn(..., use_masking=True)``,
    ``predict(obs, state, episode_start, deterministic, action_masks=...)``). See docs/recurrent.md.

    The masks enter the rollout's steps, the policy phase's sequence passes (the masked log-probabilities and
    entropies) and the auxiliary phase's behaviour-cloning KL (over each state's valid actions, as ``MaskablePPG``).

    :param policy: The policy model to use (MlpLstmPolicy, CnnLstmPolicy, MultiInputLstmPolicy, ProcgenCnnLstm, ...)
    :param env: The environment to learn from (if registered in Gym, can be str); it needs ``action_masks()``
    :param kwargs: ``RecurrentPPG``'s arguments (``aux_start_states``...) and ``PPG``'s
    """

    policy_aliases: ClassVar[dict[str, type[BasePolicy]]] = {
        "MlpLstmPolicy": MlpLstmPolicy,
        "CnnLstmPolicy": CnnLstmPolicy,
        "MultiInputLstmPolicy": MultiInputLstmPolicy,
        "ProcgenCnnLstm": ProcgenCnnLstm,
        "ProcgenCnnLstmPolicy": ProcgenCnnLstm,
    }
    policy: MaskableRecurrentPPGPolicy  # type: ignore[assignment]

    def _setup_model(self) -> None:
        """MaskablePPG's and RecurrentPPG's, with a rollout buffer that is both (masks and start states)."""
        # (A policy class read from a zip is not a class here: load() has checked its algorithm)
        if isinstance(self.policy_class, type) and not issubclass(self.policy_class, MaskableRecurrentPPGPolicy):
            raise ValueError(
                f"MaskableRecurrentPPG needs a maskable recurrent policy: {self.policy_class.__name__} is not a "
                "MaskableRecurrentPPGPolicy. Use 'MlpLstmPolicy', 'CnnLstmPolicy', 'MultiInputLstmPolicy', "
                "'ProcgenCnnLstm', or a subclass of sb3_ppg.ppg_mask_recurrent.policies.MaskableRecurrentPPGPolicy."
            )
        if self.rollout_buffer_class is None:
            dict_obs = isinstance(self.observation_space, spaces.Dict)
            self.rollout_buffer_class = MaskableRecurrentDictRolloutBuffer if dict_obs else MaskableRecurrentRolloutBuffer
        if not issubclass(self.rollout_buffer_class, RecurrentStartStates):
            raise ValueError(
                f"MaskableRecurrentPPG stores the LSTM states at each rollout's start in its rollout buffer: "
                f"rollout_buffer_class={self.rollout_buffer_class.__name__} does not (use None, or a subclass of "
                "sb3_ppg.ppg_mask_recurrent.buffers.MaskableRecurrentRolloutBuffer)."
            )
        super()._setup_model()

    def _evaluate_actions(self, rollout_data: RecurrentRolloutSamples) -> tuple[th.Tensor, th.Tensor, th.Tensor | None]:  # type: ignore[override]
        """The masked distribution's values, log-probabilities and entropies over a minibatch's sequences."""
        return self.policy.evaluate_actions(
            rollout_data.observations,
            self._actions(rollout_data),  # type: ignore[arg-type]
            rollout_data.lstm_states,
            rollout_data.episode_starts,
            action_masks=rollout_data.action_masks,
        )


__all__ = ["MaskableRecurrentPPG"]
