"""Recurrent PPG policies: PPG's actor-critic with an LSTM after each network's features extractor."""

from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.distributions import Distribution
from stable_baselines3.common.torch_layers import CombinedExtractor, MlpExtractor, NatureCNN
from stable_baselines3.common.type_aliases import PyTorchObs, Schedule
from torch import nn

from sb3_ppg.common.preprocessing import check_finite_observations
from sb3_ppg.common.recurrent import LSTMStates, RNNStates, lstm_sequences, sequence_layout
from sb3_ppg.common.torch_layers import ImpalaCNN
from sb3_ppg.ppg.policies import ARCHS, PPGPolicy


def resolve_lstm_arch(
    arch: str | None, share_features_extractor: bool | None, shared_lstm: bool, enable_critic_lstm: bool | None
) -> tuple[str, bool]:
    """
    PPG's ``arch`` and whether the value network has an LSTM of its own, from sb3-contrib's ``shared_lstm`` and
    ``enable_critic_lstm`` (see docs/recurrent.md); a combination without a PPG meaning is an error.

    :return: the architecture and ``enable_critic_lstm`` resolved
    """
    if arch is not None and arch not in ARCHS:
        raise ValueError(f"Unknown PPG arch {arch!r}: choose one of {', '.join(repr(a) for a in ARCHS)}.")
    if shared_lstm and enable_critic_lstm:
        raise ValueError(
            "shared_lstm=True and enable_critic_lstm=True contradict each other: the value head either reads the policy "
            "network's LSTM (shared_lstm=True: arch='detach' or 'shared') or has an LSTM of its own (arch='dual')."
        )
    if arch is None:
        if shared_lstm:
            arch = "detach"  # sb3-contrib's shared LSTM: the value head does not train it
        elif share_features_extractor:
            raise ValueError(
                "share_features_extractor=True without shared_lstm: PPG's networks are either separate (arch='dual', "
                "an LSTM each) or one network with one LSTM (shared_lstm=True, or arch='detach' / 'shared'). Pass one."
            )
        else:
            arch = "dual"
    if arch == "dual":
        if shared_lstm:
            raise ValueError(
                "shared_lstm=True contradicts arch='dual': the dual networks have an LSTM each. Use arch='detach' "
                "(or 'shared') for one network with one LSTM, or leave shared_lstm=False."
            )
        if share_features_extractor:
            raise ValueError("share_features_extractor=True contradicts arch='dual' (separate networks): pass only one.")
        return arch, True if enable_critic_lstm is None else bool(enable_critic_lstm)
    if enable_critic_lstm:
        raise ValueError(
            f"enable_critic_lstm=True contradicts arch={arch!r}: one network has one LSTM, which the value head reads. "
            "Use arch='dual' for a value network with an LSTM of its own."
        )
    if share_features_extractor is False:
        raise ValueError(f"share_features_extractor=False contradicts arch={arch!r} (one network): pass only one.")
    return arch, False


class RecurrentPPGPolicy(PPGPolicy):
    """
    PPG's actor-critic with an LSTM (``"MlpLstmPolicy"``): features extractor, LSTM, MLP, heads, in each network of
    ``arch`` (see ``PPGPolicy``); sb3-contrib's ``RecurrentActorCriticPolicy`` keyword arguments for the LSTMs.

    :param lstm_hidden_size: Number of hidden units of each LSTM layer
    :param n_lstm_layers: Number of LSTM layers
    :param shared_lstm: One network with one LSTM, which the value head reads (``arch="detach"`` by default)
    :param enable_critic_lstm: With ``arch="dual"``, whether the value network has an LSTM (False: feed-forward);
        ``None``: True for ``"dual"``
    :param lstm_kwargs: Additional keyword arguments of the ``nn.LSTM`` s
    :param kwargs: ``PPGPolicy``'s arguments (``arch``, ``net_arch``, ``normed_init``...)
    """

    algorithm_name = "RecurrentPPG"

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        lr_schedule: Schedule,
        *args: Any,
        lstm_hidden_size: int = 256,
        n_lstm_layers: int = 1,
        shared_lstm: bool = False,
        enable_critic_lstm: bool | None = None,
        lstm_kwargs: dict[str, Any] | None = None,
        arch: str | None = None,
        share_features_extractor: bool | None = None,
        **kwargs: Any,
    ):
        arch, enable_critic_lstm = resolve_lstm_arch(arch, share_features_extractor, shared_lstm, enable_critic_lstm)
        lstm_kwargs = dict(lstm_kwargs or {})
        if lstm_kwargs.get("batch_first"):
            raise ValueError("lstm_kwargs batch_first=True is not supported: the sequences are run time-major.")
        self.lstm_hidden_size = lstm_hidden_size
        self.n_lstm_layers = n_lstm_layers
        self.shared_lstm = arch != "dual"
        self.enable_critic_lstm = enable_critic_lstm
        self.lstm_kwargs = lstm_kwargs
        # For predict(): the states of one env, (n_lstm_layers, 1, lstm_hidden_size) (sb3-contrib's attribute)
        self.lstm_hidden_state_shape = (n_lstm_layers, 1, lstm_hidden_size)
        super().__init__(observation_space, action_space, lr_schedule, *args, arch=arch, **kwargs)

    def _build_mlp_extractor(self) -> None:
        """The LSTMs (built here, before the optimizer), then the MLPs on their outputs."""
        # SB3's features_dim is a NumPy integer for some spaces (MultiDiscrete observations), which nn.LSTM refuses
        features_dim = int(self.features_dim)
        self.lstm_actor = nn.LSTM(features_dim, self.lstm_hidden_size, num_layers=self.n_lstm_layers, **self.lstm_kwargs)
        self.lstm_critic: nn.LSTM | None = None
        self.critic: nn.Linear | None = None
        if self.arch == "dual":
            if self.enable_critic_lstm:
                self.lstm_critic = nn.LSTM(
                    features_dim, self.lstm_hidden_size, num_layers=self.n_lstm_layers, **self.lstm_kwargs
                )
            else:
                # A feed-forward value network: its features mapped to the LSTM's width (sb3-contrib's critic)
                self.critic = nn.Linear(features_dim, self.lstm_hidden_size)
        self.mlp_extractor = MlpExtractor(
            self.lstm_hidden_size, net_arch=self.net_arch, activation_fn=self.activation_fn, device=self.device
        )

    def _get_constructor_parameters(self) -> dict[str, Any]:
        data = super()._get_constructor_parameters()
        data.pop("share_features_extractor", None)
        data.update(
            lstm_hidden_size=self.lstm_hidden_size,
            n_lstm_layers=self.n_lstm_layers,
            shared_lstm=self.shared_lstm,
            enable_critic_lstm=self.enable_critic_lstm,
            lstm_kwargs=self.lstm_kwargs,
        )
        return data

    def initial_states(self, n_envs: int) -> RNNStates:
        """Zero states for ``n_envs`` envs (the policy network's and the value network's)."""
        shape = (self.n_lstm_layers, n_envs, self.lstm_hidden_size)
        dtype = self.action_net.weight.dtype
        zeros = [th.zeros(shape, dtype=dtype, device=self.device) for _ in range(4)]
        return RNNStates((zeros[0], zeros[1]), (zeros[2], zeros[3]))

    # ------------------------------------------------------------------------------------------------------------
    # The networks over sequences: features, LSTM, MLP
    # ------------------------------------------------------------------------------------------------------------

    def _sequence_latents(
        self,
        obs: PyTorchObs,
        lstm_states: RNNStates,
        episode_starts: th.Tensor,
        detach_value: bool,
        value: bool = True,
        final_states: bool = True,
    ) -> tuple[th.Tensor, th.Tensor | None, RNNStates | None]:
        """
        One pass through the networks over ``n_seq`` sequences (observations sequence-major): the policy latent, the
        latent the value head reads (None when ``value`` is False) and the states after the sequences.

        :param episode_starts: shape (n_seq, n_steps), or (n_seq,) for one step
        :param detach_value: for the one-network architectures, stop the value head's gradient at the trunk
        :param value: run the value network (else its latent is None and its states are returned unchanged)
        :param final_states: compute the states after the sequences (else None: the faster pass of training)
        """
        check_finite_observations(obs)
        if episode_starts.dim() == 1:
            episode_starts = episode_starts.unsqueeze(1)
        if self.arch == "dual":
            pi_features = self._features(obs, self.pi_features_extractor)
        else:
            pi_features = self.extract_features(obs)
        # The pieces the sequences are cut into at their episode starts, the same for both LSTMs
        layout = sequence_layout(episode_starts, lstm_states.pi[0].dtype)
        lstm_pi, states_pi = lstm_sequences(self.lstm_actor, pi_features, lstm_states.pi, episode_starts, final_states, layout)
        latent_pi = self.mlp_extractor.forward_actor(lstm_pi)
        if not value:
            return latent_pi, None, RNNStates(states_pi, lstm_states.vf) if final_states else None
        if self.arch != "dual":
            states = RNNStates(states_pi, states_pi) if final_states else None
            return latent_pi, latent_pi.detach() if detach_value else latent_pi, states
        vf_features = self._features(obs, self.vf_features_extractor)
        if self.lstm_critic is not None:
            lstm_vf, states_vf = lstm_sequences(
                self.lstm_critic, vf_features, lstm_states.vf, episode_starts, final_states, layout
            )
        else:
            assert self.critic is not None
            lstm_vf, states_vf = self.critic(vf_features), states_pi
        states = RNNStates(states_pi, states_vf) if final_states else None
        return latent_pi, self.mlp_extractor.forward_critic(lstm_vf), states  # type: ignore[arg-type]

    def forward(  # type: ignore[override]
        self, obs: PyTorchObs, lstm_states: RNNStates, episode_starts: th.Tensor, deterministic: bool = False
    ) -> tuple[th.Tensor, th.Tensor, th.Tensor, RNNStates]:
        """
        One rollout step of all the networks.

        :param obs: Observations of the envs
        :param lstm_states: The states before this step
        :param episode_starts: Whether each observation starts an episode (its states are reset), shape (n_envs,)
        :param deterministic: Whether to sample or use deterministic actions
        :return: actions, values, log probabilities of the actions and the states after this step
        """
        latent_pi, latent_vf, states = self._sequence_latents(
            obs, lstm_states, episode_starts, self._detach_value_in_policy_phase
        )
        with self._unchecked_sampling():
            distribution = self._get_action_dist_from_latent(latent_pi)
            actions = distribution.get_actions(deterministic=deterministic)
            log_prob = distribution.log_prob(actions)
        actions = actions.reshape((-1, *self.action_space.shape))  # type: ignore[misc]
        return actions, self.value_net(latent_vf), log_prob, states

    def get_distribution(  # type: ignore[override]
        self, obs: PyTorchObs, lstm_states: LSTMStates, episode_starts: th.Tensor
    ) -> tuple[Distribution, LSTMStates]:
        """
        The action distribution over sequences (the policy network only), and its states after them (sb3-contrib's).

        :param lstm_states: the policy network's states (hidden, cell)
        :param episode_starts: shape (n_seq, n_steps), or (n_seq,) for one step
        """
        states = RNNStates(lstm_states, lstm_states)
        latent_pi, _, new_states = self._sequence_latents(obs, states, episode_starts, False, value=False)
        return self._get_action_dist_from_latent(latent_pi), new_states.pi

    def sequence_distribution(
        self, obs: PyTorchObs, lstm_states: RNNStates, episode_starts: th.Tensor, value_states: bool = True
    ) -> tuple[Distribution, RNNStates]:
        """
        The action distribution over sequences and the states after them (the auxiliary phase's pass over its buffer).

        :param value_states: compute the states after the sequences, the value network's too (else ``lstm_states`` are
            returned unchanged)
        """
        latent_pi, _, new_states = self._sequence_latents(
            obs, lstm_states, episode_starts, False, value=value_states, final_states=value_states
        )
        return self._get_action_dist_from_latent(latent_pi), new_states if value_states else lstm_states

    def predict_values(  # type: ignore[override]
        self, obs: PyTorchObs, lstm_states: LSTMStates, episode_starts: th.Tensor
    ) -> th.Tensor:
        """
        The values over sequences (sb3-contrib's signature).

        :param lstm_states: the value network's states (``arch="dual"``), else the policy network's
        :param episode_starts: shape (n_seq, n_steps), or (n_seq,) for one step
        """
        states = RNNStates(lstm_states, lstm_states)
        _, latent_vf, _ = self._sequence_latents(
            obs, states, episode_starts, self._detach_value_in_policy_phase, final_states=False
        )
        return self.value_net(latent_vf)

    def evaluate_actions(  # type: ignore[override]
        self, obs: PyTorchObs, actions: th.Tensor, lstm_states: RNNStates, episode_starts: th.Tensor
    ) -> tuple[th.Tensor, th.Tensor, th.Tensor | None]:
        """
        The values, log-probabilities of ``actions`` and entropies over sequences (the policy phase's pass).

        :param lstm_states: the states before each sequence
        :param episode_starts: shape (n_seq, n_steps)
        """
        latent_pi, latent_vf, _ = self._sequence_latents(
            obs, lstm_states, episode_starts, self._detach_value_in_policy_phase, final_states=False
        )
        distribution = self._get_action_dist_from_latent(latent_pi)
        return self.value_net(latent_vf), distribution.log_prob(actions), distribution.entropy()

    def forward_aux(  # type: ignore[override]
        self, obs: PyTorchObs, lstm_states: RNNStates, episode_starts: th.Tensor
    ) -> tuple[Distribution, th.Tensor, th.Tensor]:
        """The auxiliary phase's pass over sequences: the action distribution, the true value and the auxiliary value."""
        detach_value = self.arch == "detach" and self.detach_value_in_aux
        latent_pi, latent_vf, _ = self._sequence_latents(obs, lstm_states, episode_starts, detach_value, final_states=False)
        distribution = self._get_action_dist_from_latent(latent_pi)
        return distribution, self.value_net(latent_vf), self.aux_value_net(latent_pi)

    # ------------------------------------------------------------------------------------------------------------
    # predict(): sb3-contrib's API, the states carried by the caller
    # ------------------------------------------------------------------------------------------------------------

    def _predict(  # type: ignore[override]
        self, observation: PyTorchObs, lstm_states: LSTMStates, episode_starts: th.Tensor, deterministic: bool = False
    ) -> tuple[th.Tensor, LSTMStates]:
        distribution, states = self.get_distribution(observation, lstm_states, episode_starts)
        return distribution.get_actions(deterministic=deterministic), states

    def predict(  # type: ignore[override]
        self,
        observation: np.ndarray | dict[str, np.ndarray],
        state: tuple[np.ndarray, ...] | None = None,
        episode_start: np.ndarray | None = None,
        deterministic: bool = False,
    ) -> tuple[np.ndarray, tuple[np.ndarray, ...] | None]:
        """
        The policy's actions and its next states (sb3-contrib's ``predict``).

        :param observation: the observations
        :param state: the policy network's (hidden, cell) states, each (n_lstm_layers, n_envs, lstm_hidden_size);
            ``None``: zeros
        :param episode_start: whether each observation starts an episode (its state is reset); ``None``: none does
        :param deterministic: whether to return deterministic actions
        :return: the actions and the next states
        """
        self.set_training_mode(False)
        obs_tensor, vectorized_env = self.obs_to_tensor(observation)
        states, starts = self._predict_states(obs_tensor, state, episode_start)
        with th.no_grad():
            actions, new_states = self._predict(obs_tensor, states, starts, deterministic)
        return self._predicted_actions(actions, vectorized_env), (new_states[0].cpu().numpy(), new_states[1].cpu().numpy())

    def _predict_states(
        self, obs_tensor: PyTorchObs, state: tuple[np.ndarray, ...] | None, episode_start: np.ndarray | None
    ) -> tuple[LSTMStates, th.Tensor]:
        """``predict()``'s state and episode starts, checked, as tensors (one state and start per observation)."""
        first = next(iter(obs_tensor.values())) if isinstance(obs_tensor, dict) else obs_tensor
        n_envs = first.shape[0]
        expected_shape = (self.n_lstm_layers, n_envs, self.lstm_hidden_size)
        if state is None:
            zeros = np.zeros(expected_shape, dtype=np.float32)
            state = (zeros, zeros)
        if len(state) != 2 or any(np.shape(part) != expected_shape for part in state):
            shapes = [np.shape(part) for part in state]
            raise ValueError(
                f"state must be (hidden, cell) of shape {expected_shape} each (n_lstm_layers, n_envs, lstm_hidden_size), "
                f"got shapes {shapes}: pass the state predict() returned for the same envs, or None to start at zeros."
            )
        if episode_start is None:
            episode_start = np.zeros(n_envs, dtype=bool)
        dtype = self.action_net.weight.dtype
        hidden, cell = (th.as_tensor(np.asarray(part), dtype=dtype, device=self.device) for part in state)
        starts = th.as_tensor(np.asarray(episode_start), dtype=dtype, device=self.device).reshape(n_envs)
        return (hidden, cell), starts

    def _predicted_actions(self, actions: th.Tensor, vectorized_env: bool) -> np.ndarray:
        """``predict()``'s actions in NumPy: Box actions unscaled or clipped, one observation's without the batch axis."""
        actions_array = actions.cpu().numpy().reshape((-1, *self.action_space.shape))  # type: ignore[misc]
        if isinstance(self.action_space, spaces.Box):
            if self.squash_output:
                actions_array = self.unscale_action(actions_array)
            else:
                actions_array = np.clip(actions_array, self.action_space.low, self.action_space.high)
        if not vectorized_env:
            actions_array = actions_array.squeeze(axis=0)
        return actions_array


class RecurrentPPGCnnPolicy(RecurrentPPGPolicy):
    """``RecurrentPPGPolicy`` with SB3's ``NatureCNN`` (``"CnnLstmPolicy"``)."""

    default_features_extractor_class = NatureCNN


class RecurrentPPGMultiInputPolicy(RecurrentPPGPolicy):
    """``RecurrentPPGPolicy`` for Dict observations with SB3's ``CombinedExtractor`` (``"MultiInputLstmPolicy"``)."""

    default_features_extractor_class = CombinedExtractor


class ProcgenCnnLstmPolicy(RecurrentPPGPolicy):
    """
    The PPG paper's Procgen network with an LSTM (``"ProcgenCnnLstm"``): the IMPALA CNN, an LSTM of 256 units, ReLU
    and the paper's normalized initialization of the dense layers and heads (the LSTM keeps torch's).
    """

    default_features_extractor_class = ImpalaCNN

    def __init__(
        self,
        *args: Any,
        activation_fn: type[nn.Module] = nn.ReLU,
        ortho_init: bool = False,
        normed_init: bool = True,
        **kwargs: Any,
    ):
        super().__init__(*args, activation_fn=activation_fn, ortho_init=ortho_init, normed_init=normed_init, **kwargs)


MlpLstmPolicy = RecurrentPPGPolicy
CnnLstmPolicy = RecurrentPPGCnnPolicy
MultiInputLstmPolicy = RecurrentPPGMultiInputPolicy
ProcgenCnnLstm = ProcgenCnnLstmPolicy

__all__ = [
    "CnnLstmPolicy",
    "MlpLstmPolicy",
    "MultiInputLstmPolicy",
    "ProcgenCnnLstm",
    "ProcgenCnnLstmPolicy",
    "RecurrentPPGCnnPolicy",
    "RecurrentPPGMultiInputPolicy",
    "RecurrentPPGPolicy",
]
