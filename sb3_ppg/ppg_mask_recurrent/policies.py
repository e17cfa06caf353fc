"""MaskableRecurrentPPG's policies: RecurrentPPG's LSTM policies with MaskablePPG's maskable action distributions."""

import numpy as np
import torch as th
from stable_baselines3.common.type_aliases import PyTorchObs

from sb3_ppg.common.recurrent import LSTMStates, RNNStates
from sb3_ppg.ppg_mask.distributions import MaskableDistribution, check_action_masks
from sb3_ppg.ppg_mask.policies import MaskablePPGPolicy, MaybeMasks
from sb3_ppg.ppg_recurrent.policies import (
    ProcgenCnnLstmPolicy,
    RecurrentPPGCnnPolicy,
    RecurrentPPGMultiInputPolicy,
    RecurrentPPGPolicy,
)


class MaskableRecurrentPPGPolicy(RecurrentPPGPolicy, MaskablePPGPolicy):
    """
    ``RecurrentPPGPolicy`` (its LSTMs, sequences and keyword arguments) whose action distribution is
    ``MaskablePPGPolicy``'s maskable one: the methods that act or evaluate actions take ``action_masks`` (None: no
    masking), one row per state, as sb3-contrib's ``MaskableActorCriticPolicy``. The auxiliary phase's passes stay
    unmasked: the masks enter its behaviour-cloning KL (see ``MaskablePPG``).
    """

    algorithm_name = "MaskableRecurrentPPG"

    def forward(  # type: ignore[override]
        self,
        obs: PyTorchObs,
        lstm_states: RNNStates,
        episode_starts: th.Tensor,
        deterministic: bool = False,
        action_masks: MaybeMasks = None,
    ) -> tuple[th.Tensor, th.Tensor, th.Tensor, RNNStates]:
        """
        One rollout step of all the networks, masked by ``action_masks`` (see ``RecurrentPPGPolicy.forward``).

        :return: actions, values, log probabilities of the actions and the states after this step
        """
        latent_pi, latent_vf, states = self._sequence_latents(
            obs, lstm_states, episode_starts, self._detach_value_in_policy_phase
        )
        with self._unchecked_sampling():
            distribution = self._masked_distribution(latent_pi, action_masks)
            actions = distribution.get_actions(deterministic=deterministic)
            log_prob = distribution.log_prob(actions)
        actions = actions.reshape((-1, *self.action_space.shape))  # type: ignore[misc]
        return actions, self.value_net(latent_vf), log_prob, states  # type: ignore[return-value]

    def evaluate_actions(  # type: ignore[override]
        self,
        obs: PyTorchObs,
        actions: th.Tensor,
        lstm_states: RNNStates,
        episode_starts: th.Tensor,
        action_masks: MaybeMasks = None,
    ) -> tuple[th.Tensor, th.Tensor, th.Tensor | None]:
        """
        The values, log-probabilities of ``actions`` and entropies over sequences, under the masked distribution.

        :param action_masks: the valid actions of each state, sequence-major as the observations, or None
        """
        latent_pi, latent_vf, _ = self._sequence_latents(
            obs, lstm_states, episode_starts, self._detach_value_in_policy_phase, final_states=False
        )
        distribution = self._masked_distribution(latent_pi, action_masks)
        return self.value_net(latent_vf), distribution.log_prob(actions), distribution.entropy()

    def get_distribution(  # type: ignore[override]
        self, obs: PyTorchObs, lstm_states: LSTMStates, episode_starts: th.Tensor, action_masks: MaybeMasks = None
    ) -> tuple[MaskableDistribution, LSTMStates]:
        """The action distribution over sequences, masked by ``action_masks``, and the policy network's states after them."""
        distribution, states = super().get_distribution(obs, lstm_states, episode_starts)
        if action_masks is not None:
            distribution.apply_masking(action_masks)  # type: ignore[attr-defined]
        return distribution, states  # type: ignore[return-value]

    def _masked_distribution(self, latent_pi: th.Tensor, action_masks: MaybeMasks) -> MaskableDistribution:
        """The action distribution of a policy latent, masked by ``action_masks`` (None: not masked)."""
        distribution = self._get_action_dist_from_latent(latent_pi)
        if action_masks is not None:
            distribution.apply_masking(action_masks)
        return distribution

    def _predict(  # type: ignore[override]
        self,
        observation: PyTorchObs,
        lstm_states: LSTMStates,
        episode_starts: th.Tensor,
        deterministic: bool = False,
        action_masks: MaybeMasks = None,
    ) -> tuple[th.Tensor, LSTMStates]:
        distribution, states = self.get_distribution(observation, lstm_states, episode_starts, action_masks)
        return distribution.get_actions(deterministic=deterministic), states

    def predict(  # type: ignore[override]
        self,
        observation: np.ndarray | dict[str, np.ndarray],
        state: tuple[np.ndarray, ...] | None = None,
        episode_start: np.ndarray | None = None,
        deterministic: bool = False,
        action_masks: np.ndarray | None = None,
    ) -> tuple[np.ndarray, tuple[np.ndarray, ...] | None]:
        """
        The policy's actions among the valid ones and its next states (sb3-contrib's ``predict`` of both policies).

        :param state: the policy network's (hidden, cell) states, as ``RecurrentPPGPolicy.predict``; ``None``: zeros
        :param episode_start: whether each observation starts an episode (its state is reset); ``None``: none does
        :param action_masks: the valid actions (True) of each observation (``get_action_masks(env)``); None: no masking
        :return: the actions and the next states
        """
        self.set_training_mode(False)
        obs_tensor, vectorized_env = self.obs_to_tensor(observation)
        states, starts = self._predict_states(obs_tensor, state, episode_start)
        if action_masks is not None:
            action_masks = check_action_masks(action_masks, self.action_space, len(starts), "predict()'s action_masks")
        with th.no_grad():
            actions, new_states = self._predict(obs_tensor, states, starts, deterministic, action_masks)
        return self._predicted_actions(actions, vectorized_env), (new_states[0].cpu().numpy(), new_states[1].cpu().numpy())


class MaskableRecurrentPPGCnnPolicy(MaskableRecurrentPPGPolicy, RecurrentPPGCnnPolicy):
    """``MaskableRecurrentPPGPolicy`` with SB3's ``NatureCNN`` (``"CnnLstmPolicy"``)."""


class MaskableRecurrentPPGMultiInputPolicy(MaskableRecurrentPPGPolicy, RecurrentPPGMultiInputPolicy):
    """``MaskableRecurrentPPGPolicy`` for Dict observations (``"MultiInputLstmPolicy"``)."""


class MaskableProcgenCnnLstmPolicy(MaskableRecurrentPPGPolicy, ProcgenCnnLstmPolicy):
    """``MaskableRecurrentPPGPolicy`` with the PPG paper's Procgen network and an LSTM (``"ProcgenCnnLstm"``)."""


MlpLstmPolicy = MaskableRecurrentPPGPolicy
CnnLstmPolicy = MaskableRecurrentPPGCnnPolicy
MultiInputLstmPolicy = MaskableRecurrentPPGMultiInputPolicy
ProcgenCnnLstm = MaskableProcgenCnnLstmPolicy
