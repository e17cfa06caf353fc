"""Recurrent PPG: PPG with LSTM policies, trained on whole env sequences in both phases."""

from collections.abc import Iterator
from typing import Any, ClassVar

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.policies import BasePolicy
from stable_baselines3.common.type_aliases import GymEnv, PyTorchObs
from stable_baselines3.common.utils import obs_as_tensor
from stable_baselines3.common.vec_env import VecEnv

from sb3_ppg.common.checkpoints import RunState
from sb3_ppg.common.recurrent import RNNStates
from sb3_ppg.common.recurrent.buffers import (
    RecurrentAuxiliaryBuffer,
    RecurrentAuxiliaryBufferSamples,
    RecurrentDictRolloutBuffer,
    RecurrentRolloutBuffer,
    RecurrentRolloutSamples,
    sequence_minibatches,
    stack_states,
    unstack_states,
)
from sb3_ppg.ppg import losses
from sb3_ppg.ppg.losses import Diagnostics
from sb3_ppg.ppg.ppg import PPG
from sb3_ppg.ppg_recurrent.policies import (
    CnnLstmPolicy,
    MlpLstmPolicy,
    MultiInputLstmPolicy,
    ProcgenCnnLstm,
    RecurrentPPGPolicy,
)

#: How the auxiliary phase starts each stored rollout's sequence (see docs/recurrent.md)
AUX_START_STATES = ("stored", "recomputed")


class RecurrentPPG(PPG):
    """
    Phasic Policy Gradient with recurrent (LSTM) policies: sb3-contrib's ``RecurrentPPO`` API on PPG (docs/recurrent.md).

    Both phases train on whole env rollouts (``policy_minibatches="envs"``), each started from the LSTM states the
    model had at that rollout's first step, the states reset at every episode start inside it.

    :param policy: The policy model to use (MlpLstmPolicy, CnnLstmPolicy, MultiInputLstmPolicy, ProcgenCnnLstm, ...)
    :param env: The environment to learn from (if registered in Gym, can be str)
    :param aux_start_states: Where the auxiliary phase starts each stored rollout: ``"stored"``, from the states at
        rollout time (the paper's code), or ``"recomputed"``, from the states the current networks reach when the pass
        over the buffer before the auxiliary epochs runs through each env's rollouts in order
    :param cuda_graphs: Must be False: PPG's CUDA graphs do not apply to rollout steps with states
    :param parallel_networks: Must be False: PPG's two CUDA streams do not apply to the LSTM networks
    :param kwargs: ``PPG``'s arguments (``n_steps``, ``batch_size`` a multiple of ``n_steps``, ``n_policy_iters``...);
        ``policy_minibatches`` is ``"envs"`` and ``micro_batch_size`` ``None``
    """

    policy_aliases: ClassVar[dict[str, type[BasePolicy]]] = {
        "MlpLstmPolicy": MlpLstmPolicy,
        "CnnLstmPolicy": CnnLstmPolicy,
        "MultiInputLstmPolicy": MultiInputLstmPolicy,
        "ProcgenCnnLstm": ProcgenCnnLstm,
        "ProcgenCnnLstmPolicy": ProcgenCnnLstm,
    }
    policy: RecurrentPPGPolicy  # type: ignore[assignment]
    aux_buffer: RecurrentAuxiliaryBuffer | None  # type: ignore[assignment]
    aux_buffer_class = RecurrentAuxiliaryBuffer
    # Adam's fused kernel on a CPU too: its updates differ from the multi-tensor one's in the last bits, and are faster
    # (docs/recurrent.md); PPG's stay those of torch's default there (its fixed-seed records)
    fused_adam_on_cpu = True

    def __init__(
        self,
        policy: str | type[RecurrentPPGPolicy],
        env: GymEnv | str,
        aux_start_states: str = "stored",
        policy_minibatches: str = "envs",
        micro_batch_size: int | str | None = None,
        cuda_graphs: bool = False,
        parallel_networks: bool = False,
        _init_setup_model: bool = True,
        **kwargs: Any,
    ):
        for name, value in (("cuda_graphs", cuda_graphs), ("parallel_networks", parallel_networks)):
            if value:
                raise ValueError(
                    f"RecurrentPPG does not support {name}=True: PPG's CUDA graphs and two-stream networks are built for "
                    "feed-forward rollout steps, RecurrentPPG's carry LSTM states (docs/recurrent.md). Leave it False."
                )
        if policy_minibatches != "envs":
            raise ValueError(
                f"RecurrentPPG trains on whole env sequences: policy_minibatches must be 'envs', got {policy_minibatches!r}."
            )
        if micro_batch_size is not None:
            raise ValueError(
                f"RecurrentPPG does not cut minibatches into micro-batches (they would cut its sequences): "
                f"micro_batch_size must be None, got {micro_batch_size!r}."
            )
        if aux_start_states not in AUX_START_STATES:
            raise ValueError(f"aux_start_states must be one of {AUX_START_STATES}, got {aux_start_states!r}.")
        self.aux_start_states = aux_start_states
        # The LSTM states after the last rollout step (the next step's input), built by _setup_model
        self._last_lstm_states: RNNStates | None = None
        super().__init__(
            policy,
            env,
            policy_minibatches=policy_minibatches,
            micro_batch_size=micro_batch_size,
            cuda_graphs=False,
            parallel_networks=False,
            _init_setup_model=False,
            **kwargs,
        )
        if _init_setup_model:
            self._setup_model()

    def _setup_model(self) -> None:
        if self.rollout_buffer_class is None:
            dict_obs = isinstance(self.observation_space, spaces.Dict)
            self.rollout_buffer_class = RecurrentDictRolloutBuffer if dict_obs else RecurrentRolloutBuffer
        super()._setup_model()
        if not isinstance(self.policy, RecurrentPPGPolicy):
            raise ValueError(f"RecurrentPPG needs a recurrent policy (MlpLstmPolicy...), got {type(self.policy).__name__}.")
        self._last_lstm_states = self.policy.initial_states(self.n_envs)

    def _aux_buffer_kwargs(self) -> dict[str, Any]:
        """The auxiliary buffer's LSTM state shape (its rollouts' start states: ``RecurrentAuxiliaryBuffer``)."""
        return {**super()._aux_buffer_kwargs(), "lstm_state_shape": (self.policy.n_lstm_layers, self.policy.lstm_hidden_size)}

    def set_env(self, env: GymEnv, force_reset: bool = True) -> None:
        """PPG's ``set_env``; the LSTM states start from zeros for the new envs when their number changes."""
        n_envs = self.n_envs
        super().set_env(env, force_reset=force_reset)
        if self.n_envs != n_envs:
            self._last_lstm_states = self.policy.initial_states(self.n_envs)

    # ------------------------------------------------------------------------------------------------------------
    # The rollout: PPG's loop, the LSTM states carried from step to step
    # ------------------------------------------------------------------------------------------------------------

    def _on_rollout_start(self, env: VecEnv, rollout_buffer: RolloutBuffer) -> None:
        """Keep the LSTM states at the rollout's first step in the rollout buffer (one per env)."""
        assert self._last_lstm_states is not None
        rollout_buffer.lstm_start_states = stack_states(self._last_lstm_states).cpu().numpy().copy()  # type: ignore[attr-defined]

    def _policy_step(self, obs_tensor: PyTorchObs, env: VecEnv) -> tuple[th.Tensor, th.Tensor, th.Tensor, dict[str, Any]]:
        """
        A rollout step from the last states; the states reset where an episode starts, then advanced. The action masks
        of ``_action_masks`` (none here; ``MaskableRecurrentPPG``'s) go to the policy and are stored with the step.
        """
        assert self._last_lstm_states is not None
        action_masks = self._action_masks(env)
        stored = {} if action_masks is None else {"action_masks": action_masks}
        episode_starts = th.as_tensor(self._last_episode_starts, dtype=th.float32, device=self.device)
        actions, values, log_probs, self._last_lstm_states = self.policy(
            obs_tensor, self._last_lstm_states, episode_starts, **stored
        )
        return actions, values, log_probs, stored

    def _terminal_value(self, env_index: int, terminal_obs: PyTorchObs) -> th.Tensor:
        """The value of a truncated episode's last observation, from its env's states after the step."""
        assert self._last_lstm_states is not None
        hidden, cell = self._last_lstm_states.vf
        states = (hidden[:, env_index : env_index + 1].contiguous(), cell[:, env_index : env_index + 1].contiguous())
        with th.no_grad():
            return self.policy.predict_values(terminal_obs, states, th.zeros(1, device=self.device))[0]

    def _last_values(self, new_obs: Any, dones: np.ndarray) -> th.Tensor:
        """The values after the rollout's last step, from the states after it (reset where an episode starts)."""
        assert self._last_lstm_states is not None
        episode_starts = th.as_tensor(dones, dtype=th.float32, device=self.device)
        with th.no_grad():
            return self.policy.predict_values(obs_as_tensor(new_obs, self.device), self._last_lstm_states.vf, episode_starts)  # type: ignore[arg-type]

    # ------------------------------------------------------------------------------------------------------------
    # The policy phase: whole env sequences
    # ------------------------------------------------------------------------------------------------------------

    def _rollout_minibatches(self) -> Iterator[RecurrentRolloutSamples]:  # type: ignore[override]
        """One epoch of minibatches of whole env rollouts with their episode starts and start states."""
        return sequence_minibatches(self.rollout_buffer, self.batch_size, self.device)  # type: ignore[arg-type]

    def _evaluate_actions(self, rollout_data: RecurrentRolloutSamples) -> tuple[th.Tensor, th.Tensor, th.Tensor | None]:  # type: ignore[override]
        return self.policy.evaluate_actions(
            rollout_data.observations,
            self._actions(rollout_data),
            rollout_data.lstm_states,
            rollout_data.episode_starts,  # type: ignore[arg-type]
        )

    def _value_loss(self, rollout_data: RecurrentRolloutSamples, clip_range_vf: float | None) -> tuple[th.Tensor, Diagnostics]:  # type: ignore[override]
        """``vf_coef`` * the value loss of a value epoch, over the minibatch's sequences."""
        values = self.policy.predict_values(
            rollout_data.observations, rollout_data.lstm_states.vf, rollout_data.episode_starts
        )
        value_loss, diagnostics = losses.value_loss(
            values.flatten(), rollout_data.returns, rollout_data.old_values, clip_range_vf, self.value_clipping
        )
        return self.vf_coef * value_loss, diagnostics

    # ------------------------------------------------------------------------------------------------------------
    # The auxiliary phase: whole stored rollouts, from their start states
    # ------------------------------------------------------------------------------------------------------------

    def _compute_old_distributions(self) -> None:
        """
        pi_old on every buffered state, over whole rollouts from their start states. With
        ``aux_start_states="recomputed"`` each env's rollouts run in order, each from the states the current networks
        reached at the end of the one before (the first from its stored states), and those states replace the stored
        ones for the auxiliary epochs.
        """
        buffer = self.aux_buffer
        assert buffer is not None
        n_envs, recompute = buffer.n_envs, self.aux_start_states == "recomputed"
        with th.inference_mode():
            for first_env in range(0, n_envs, self.aux_batch_rollouts):
                envs = slice(first_env, min(first_env + self.aux_batch_rollouts, n_envs))
                states: RNNStates | None = None
                for iteration in range(buffer.n_iterations):
                    rows = slice(iteration * n_envs + envs.start, iteration * n_envs + envs.stop)
                    episode_starts, stored_states = buffer.sequence_inputs(rows)
                    if states is None or not recompute:
                        states = stored_states
                    else:
                        buffer.store_start_states(rows, states)
                    observations = buffer._observations_to_tensor(rows)
                    distribution, states = self.policy.sequence_distribution(
                        observations, states, episode_starts, value_states=recompute
                    )
                    buffer.store_old_distribution_params(rows, self._distribution_params(distribution))

    def _aux_loss(self, batch: RecurrentAuxiliaryBufferSamples) -> tuple[th.Tensor, Diagnostics]:  # type: ignore[override]
        """The auxiliary loss of a minibatch of whole rollouts, one forward pass from their start states."""
        distribution, values, aux_values = self.policy.forward_aux(batch.observations, batch.lstm_states, batch.episode_starts)
        kl = self._behaviour_cloning_kl(batch, distribution)  # type: ignore[arg-type]
        return losses.aux_loss_from_kl(kl, values, aux_values, batch.returns, self.beta_clone, self.vf_true_coef)

    # ------------------------------------------------------------------------------------------------------------
    # Persistence
    # ------------------------------------------------------------------------------------------------------------

    def get_run_state(self) -> RunState:
        """PPG's run state with the live LSTM states (the next rollout step's input): checkpoints resume them exactly."""
        state = super().get_run_state()
        assert self._last_lstm_states is not None
        state.last_lstm_states = stack_states(self._last_lstm_states).cpu().numpy()
        return state

    def set_run_state(self, state: RunState) -> None:
        """Put back a run state from :meth:`get_run_state`, the live LSTM states included."""
        expected = (4, self.policy.n_lstm_layers, self.n_envs, self.policy.lstm_hidden_size)
        if state.last_lstm_states is None or state.last_lstm_states.shape != expected:
            shape = None if state.last_lstm_states is None else state.last_lstm_states.shape
            raise ValueError(
                f"The run state holds LSTM states of shape {shape}, expected {expected} (4 states, n_lstm_layers, "
                "n_envs, lstm_hidden_size): it was not written by this RecurrentPPG model's run."
            )
        super().set_run_state(state)
        dtype = self.policy.action_net.weight.dtype
        self._last_lstm_states = unstack_states(th.as_tensor(state.last_lstm_states, dtype=dtype, device=self.device))

    def _excluded_save_params(self) -> list[str]:
        return [*super()._excluded_save_params(), "_last_lstm_states"]

    def _setup_learn(self, *args: Any, **kwargs: Any) -> tuple[int, BaseCallback]:
        """
        PPG's; the LSTM states start from zeros when the envs are reset (``reset_num_timesteps`` or a new env). Under
        torchrun each rank keeps the states of its own envs.
        """
        last_obs = self._last_obs
        result = super()._setup_learn(*args, **kwargs)
        if self._last_lstm_states is None or self._last_obs is not last_obs:
            self._last_lstm_states = self.policy.initial_states(self.n_envs)
        return result


__all__ = ["AUX_START_STATES", "RecurrentPPG"]
