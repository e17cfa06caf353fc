"""MaskablePPG's policies: PPG's (every architecture, ProcgenCnn included) with sb3-contrib's maskable distributions."""

import numpy as np
import torch as th
from sb3_contrib.common.maskable.distributions import MaskableDistribution
from stable_baselines3.common.distributions import MultiCategoricalDistribution
from stable_baselines3.common.type_aliases import PyTorchObs, Schedule

from sb3_ppg.common.preprocessing import check_finite_observations
from sb3_ppg.ppg.policies import PPGCnnPolicy, PPGMultiInputPolicy, PPGPolicy, ProcgenCnnPolicy
from sb3_ppg.ppg_mask.distributions import check_action_masks, make_maskable_distribution

MaybeMasks = th.Tensor | np.ndarray | None


class MaskablePPGPolicy(PPGPolicy):
    """
    ``PPGPolicy`` whose action distribution is sb3-contrib's maskable one, with ``action_masks`` arguments as in
    sb3-contrib's ``MaskableActorCriticPolicy``; see ``PPGPolicy`` for the parameters.
    """

    action_dist: MaskableDistribution  # type: ignore[assignment]
    algorithm_name = "MaskablePPG"

    def _build(self, lr_schedule: Schedule) -> None:
        """Build PPG's networks (see ``_make_action_dist``), then the maskable distribution replaces SB3's."""
        super()._build(lr_schedule)
        self.action_dist = make_maskable_distribution(self.action_space)

    def _make_action_dist(self) -> MultiCategoricalDistribution:  # type: ignore[override]
        """An SB3 distribution with the maskable one's logits, whose action network SB3's ``_build`` makes."""
        return MultiCategoricalDistribution(make_maskable_distribution(self.action_space).action_dims)  # type: ignore[attr-defined]

    def _get_action_dist_from_latent(self, latent_pi: th.Tensor) -> MaskableDistribution:  # type: ignore[override]
        """The (unmasked) action distribution of a policy latent."""
        return self.action_dist.proba_distribution(action_logits=self.action_net(latent_pi))  # type: ignore[return-value]

    def forward(  # type: ignore[override]
        self, obs: th.Tensor, deterministic: bool = False, action_masks: MaybeMasks = None
    ) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
        """
        Forward pass in all the networks (actor and critic), masked by ``action_masks`` (None: none).

        :return: action, value and log probability of the action
        """
        check_finite_observations(obs)
        latent_pi, values = self.rollout_latent_and_values(obs)
        with self._unchecked_sampling():
            distribution = self._get_action_dist_from_latent(latent_pi)
            if action_masks is not None:
                distribution.apply_masking(action_masks)
            actions = distribution.get_actions(deterministic=deterministic)
            log_prob = distribution.log_prob(actions)
        actions = actions.reshape((-1, *self.action_space.shape))  # type: ignore[misc]
        return actions, values, log_prob

    def evaluate_actions(  # type: ignore[override]
        self, obs: PyTorchObs, actions: th.Tensor, action_masks: MaybeMasks = None
    ) -> tuple[th.Tensor, th.Tensor, th.Tensor | None]:
        """
        Evaluate actions according to the current policy (the masked distribution's when masks are given).

        :param action_masks: the valid actions of each state (True), or None for no masking
        :return: estimated value, log likelihood of taking those actions and entropy of the action distribution
        """
        latent_pi, latent_vf = self._get_latents(obs, self._detach_value_in_policy_phase)
        distribution = self._get_action_dist_from_latent(latent_pi)
        if action_masks is not None:
            distribution.apply_masking(action_masks)
        log_prob = distribution.log_prob(actions)
        values = self.value_net(latent_vf)
        return values, log_prob, distribution.entropy()

    def get_distribution(self, obs: PyTorchObs, action_masks: MaybeMasks = None) -> MaskableDistribution:  # type: ignore[override]
        """The current policy's action distribution for the observations, masked by ``action_masks`` (None: none)."""
        distribution: MaskableDistribution = super().get_distribution(obs)  # type: ignore[assignment]
        if action_masks is not None:
            distribution.apply_masking(action_masks)
        return distribution

    def _predict(  # type: ignore[override]
        self, observation: PyTorchObs, deterministic: bool = False, action_masks: MaybeMasks = None
    ) -> th.Tensor:
        """The policy's action for observations (tensors), masked by ``action_masks`` (None: none)."""
        return self.get_distribution(observation, action_masks).get_actions(deterministic=deterministic)

    def predict(  # type: ignore[override]
        self,
        observation: np.ndarray | dict[str, np.ndarray],
        state: tuple[np.ndarray, ...] | None = None,
        episode_start: np.ndarray | None = None,
        deterministic: bool = False,
        action_masks: np.ndarray | None = None,
    ) -> tuple[np.ndarray, tuple[np.ndarray, ...] | None]:
        """
        The policy's action for an observation or a batch of them (sb3-contrib's ``predict``; SB3's arguments).

        :param action_masks: the valid actions (True) of each observation (``get_action_masks(env)``); None: no masking
        :return: the action(s) and the state
        """
        self.set_training_mode(False)
        if isinstance(observation, tuple) and len(observation) == 2 and isinstance(observation[1], dict):
            raise ValueError(
                "predict() was given a tuple (obs, info), as a gymnasium env's reset() returns: pass the observation "
                "only (obs, _ = env.reset()), or use a VecEnv, whose reset() returns the observation."
            )
        obs_tensor, vectorized_env = self.obs_to_tensor(observation)
        if action_masks is not None:
            first = next(iter(obs_tensor.values())) if isinstance(obs_tensor, dict) else obs_tensor
            action_masks = check_action_masks(action_masks, self.action_space, len(first), "predict()'s action_masks")
        with th.no_grad():
            actions = self._predict(obs_tensor, deterministic=deterministic, action_masks=action_masks)
        actions_array = actions.cpu().numpy().reshape((-1, *self.action_space.shape))  # type: ignore[misc]
        if not vectorized_env:
            actions_array = actions_array.squeeze(axis=0)
        return actions_array, state


class MaskablePPGCnnPolicy(MaskablePPGPolicy, PPGCnnPolicy):
    """MaskablePPG's policy with SB3's ``NatureCNN`` (``"CnnPolicy"``). See ``PPGPolicy`` for the parameters."""


class MaskablePPGMultiInputPolicy(MaskablePPGPolicy, PPGMultiInputPolicy):
    """MaskablePPG's policy for Dict observations (``"MultiInputPolicy"``). See ``PPGPolicy`` for the parameters."""


class MaskableProcgenCnnPolicy(MaskablePPGPolicy, ProcgenCnnPolicy):
    """
    MaskablePPG's policy with the PPG paper's Procgen network (``"ProcgenCnn"``: IMPALA CNN, normalized
    initialization). See ``ProcgenCnnPolicy`` and ``PPGPolicy`` for the parameters.
    """


MlpPolicy = MaskablePPGPolicy
CnnPolicy = MaskablePPGCnnPolicy
MultiInputPolicy = MaskablePPGMultiInputPolicy
ProcgenCnn = MaskableProcgenCnnPolicy
