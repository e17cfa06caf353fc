"""
The recurrent buffers: PPG's rollout buffers with the LSTM states at the rollout's start, and PPG's auxiliary buffer
with each stored rollout's start states and episode starts. One state per env and rollout, not one per step.
"""

from collections.abc import Generator
from typing import Any, NamedTuple

import numpy as np
import torch as th
from stable_baselines3.common.buffers import RolloutBuffer

from sb3_ppg.common.aux_buffer import AuxiliaryBuffer
from sb3_ppg.common.recurrent.sequences import RNNStates
from sb3_ppg.common.rollout_buffers import DeviceRollout, PPGDictRolloutBuffer, PPGRolloutBuffer, TensorObs

#: The four LSTM states of a model stacked as one array: policy (hidden, cell), value (hidden, cell)
N_STATE_ARRAYS = 4


def stack_states(states: RNNStates) -> th.Tensor:
    """The model's states as one tensor of shape (4, n_layers, n_envs, hidden_size)."""
    return th.stack([states.pi[0], states.pi[1], states.vf[0], states.vf[1]])


def unstack_states(stacked: th.Tensor) -> RNNStates:
    """The inverse of :func:`stack_states`."""
    return RNNStates((stacked[0], stacked[1]), (stacked[2], stacked[3]))


class RecurrentRolloutSamples(NamedTuple):
    """
    A policy-phase minibatch of whole env rollouts, sequence-major: SB3's rollout samples, the episode starts and the
    states at the rollout's start of its envs.

    :param episode_starts: shape (n_seq, n_steps)
    :param lstm_states: the states before each sequence, each (n_layers, n_seq, hidden_size)
    :param action_masks: the valid actions of each state, shape (n_seq * n_steps, mask_dims), from a maskable rollout
        buffer (``MaskableRecurrentPPG``'s); ``None`` without masks
    """

    observations: TensorObs
    actions: th.Tensor
    old_values: th.Tensor
    old_log_prob: th.Tensor
    advantages: th.Tensor
    returns: th.Tensor
    episode_starts: th.Tensor
    lstm_states: RNNStates
    action_masks: th.Tensor | None = None


class RecurrentAuxiliaryBufferSamples(NamedTuple):
    """
    An auxiliary minibatch of whole rollouts (see ``AuxiliaryBufferSamples``), with their episode starts, shape
    (n, n_steps), and the states at their start (each (n_layers, n, hidden_size)).
    """

    observations: TensorObs
    returns: th.Tensor
    old_distribution_params: th.Tensor
    rollout_indices: np.ndarray
    action_masks: th.Tensor | None
    episode_starts: th.Tensor
    lstm_states: RNNStates


class RecurrentStartStates:
    """What the recurrent rollout buffers add: the model's LSTM states at the rollout's first step (set by the model)."""

    #: Shape (4, n_layers, n_envs, hidden_size) (see :func:`stack_states`); set before the rollout's first step
    lstm_start_states: np.ndarray | None = None


class RecurrentRolloutBuffer(RecurrentStartStates, PPGRolloutBuffer):
    """PPG's rollout buffer with the LSTM states at the rollout's start (``RecurrentPPG``'s)."""


class RecurrentDictRolloutBuffer(RecurrentStartStates, PPGDictRolloutBuffer):
    """PPG's rollout buffer for Dict observations with the LSTM states at the rollout's start (``RecurrentPPG``'s)."""


def sequence_minibatches(
    rollout_buffer: RolloutBuffer, batch_size: int, device: th.device
) -> Generator[RecurrentRolloutSamples, None, None]:
    """
    One epoch of policy-phase minibatches of whole env rollouts: one permutation of the envs (NumPy's global generator,
    as ``env_minibatches``) cut into groups of ``batch_size // n_steps`` envs.

    :param rollout_buffer: a full recurrent rollout buffer (its start states set)
    :param batch_size: the minibatch size, a multiple of ``n_steps``
    :param device: where the episode starts and states go
    """
    assert isinstance(rollout_buffer, RecurrentStartStates) and rollout_buffer.lstm_start_states is not None
    n_steps, n_envs = rollout_buffer.buffer_size, rollout_buffer.n_envs
    env_order = np.random.permutation(n_envs)
    envs_per_batch = max(1, batch_size // n_steps)
    start_states = th.as_tensor(rollout_buffer.lstm_start_states, device=device)
    for start in range(0, n_envs, envs_per_batch):
        envs = env_order[start : start + envs_per_batch]
        samples = rollout_buffer._get_samples((envs[:, None] * n_steps + np.arange(n_steps)).reshape(-1))._asdict()
        episode_starts = th.as_tensor(rollout_buffer.episode_starts[:, envs].T.copy(), device=device)
        states = unstack_states(start_states[:, :, th.as_tensor(envs, device=device)])
        # A maskable buffer's samples hold the action masks (sb3-contrib's samples: their last field)
        masks = samples.pop("action_masks", None)
        yield RecurrentRolloutSamples(**samples, episode_starts=episode_starts, lstm_states=states, action_masks=masks)


def take_rows(array: th.Tensor, rows: th.Tensor | slice) -> th.Tensor:
    """Some rows of a stored tensor (``rows``: a slice, or indices where it lives), unflattened."""
    return array[rows] if isinstance(rows, slice) else array.index_select(0, rows)


class RecurrentAuxiliaryBuffer(AuxiliaryBuffer):
    """
    PPG's auxiliary buffer, each row (one env's rollout of one iteration) with its episode starts and the four LSTM
    states at its first step (a few MB: one state per rollout), torch tensors stored where its other arrays are.

    :param args: ``AuxiliaryBuffer``'s
    :param lstm_state_shape: (n_lstm_layers, lstm_hidden_size); ``None``: from the first arrays written (a loaded file)
    :param kwargs: ``AuxiliaryBuffer``'s
    """

    #: Shape (buffer_size, n_steps)
    episode_starts: th.Tensor
    #: Shape (buffer_size, 4, n_lstm_layers, lstm_hidden_size) (the four states of :func:`stack_states` of each row)
    lstm_start_states: th.Tensor

    def __init__(self, *args: Any, lstm_state_shape: tuple[int, int] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.episode_starts = self._zeros((self.buffer_size, self.n_steps), th.bool)
        self.lstm_state_shape = lstm_state_shape
        self.lstm_start_states = self._states_tensor(lstm_state_shape or (0, 0))

    def _states_tensor(self, lstm_state_shape: tuple[int, int]) -> th.Tensor:
        return self._zeros((self.buffer_size, N_STATE_ARRAYS, *lstm_state_shape), th.float32)

    @staticmethod
    def estimate_nbytes(  # type: ignore[override]
        n_policy_iters: int,
        n_steps: int,
        n_envs: int,
        *args: Any,
        lstm_state_shape: tuple[int, int] | None = None,
        **kwargs: Any,
    ) -> int:
        """:meth:`AuxiliaryBuffer.estimate_nbytes` with the episode starts and the rollouts' start states."""
        nbytes = AuxiliaryBuffer.estimate_nbytes(n_policy_iters, n_steps, n_envs, *args, **kwargs)
        n_rollouts = n_policy_iters * n_envs
        state_floats = N_STATE_ARRAYS * int(np.prod(lstm_state_shape or (0, 0)))
        return nbytes + n_rollouts * (n_steps * np.dtype(bool).itemsize + state_floats * np.dtype(np.float32).itemsize)

    def _arrays(self) -> list[th.Tensor]:
        """``AuxiliaryBuffer``'s tensors, the episode starts and the start states (all counted in ``nbytes``)."""
        return [*super()._arrays(), self.episode_starts, self.lstm_start_states]

    def add(self, rollout_buffer: RolloutBuffer, device_rollout: DeviceRollout | None = None) -> None:
        """``AuxiliaryBuffer.add``, with the rollout's episode starts and start states."""
        rows = slice(self.pos, self.pos + self.n_envs)
        super().add(rollout_buffer, device_rollout)
        assert isinstance(rollout_buffer, RecurrentStartStates) and rollout_buffer.lstm_start_states is not None
        self._write(self.episode_starts, rows, rollout_buffer.episode_starts.T)
        self._write(self.lstm_start_states, rows, rollout_buffer.lstm_start_states.transpose(2, 0, 1, 3))

    def sequence_inputs(self, rows: th.Tensor | slice) -> tuple[th.Tensor, RNNStates]:
        """
        The episode starts, shape (n, n_steps), and the start states of some rows, on ``self.device``.

        :param rows: a slice, or row indices on the device where the tensors live
        """
        episode_starts = take_rows(self.episode_starts, rows).to(self.device)
        states = take_rows(self.lstm_start_states, rows).to(self.device).permute(1, 2, 0, 3)
        return episode_starts, unstack_states(states)

    def store_start_states(self, rows: slice, states: RNNStates) -> None:
        """Replace the start states of some rows (the auxiliary phase's recomputed ones), in float32."""
        self._write(self.lstm_start_states, rows, stack_states(states).permute(2, 0, 1, 3))

    def _minibatch(self, rows: np.ndarray, stored_rows: th.Tensor) -> RecurrentAuxiliaryBufferSamples:  # type: ignore[override]
        episode_starts, states = self.sequence_inputs(stored_rows)
        samples = super()._minibatch(rows, stored_rows)
        return RecurrentAuxiliaryBufferSamples(*samples, episode_starts=episode_starts, lstm_states=states)

    def layout_metadata(self) -> dict[str, Any]:
        return {**super().layout_metadata(), "lstm_state_shape": list(self.lstm_state_shape or ())}

    def _rows_arrays(self, rows: slice, with_old_distributions: bool) -> dict[str, np.ndarray]:
        arrays = super()._rows_arrays(rows, with_old_distributions)
        arrays["episode_starts"] = self._to_numpy(self.episode_starts[rows])
        arrays["lstm_start_states"] = self._to_numpy(self.lstm_start_states[rows])
        return arrays

    def _set_rows_arrays(self, start: int, arrays: dict[str, np.ndarray], source: object) -> int:
        states = arrays.get("lstm_start_states")
        if self.lstm_state_shape is None and states is not None and states.ndim == 4:
            # A buffer loaded from a file takes the shape of the file's states
            self.lstm_state_shape = (int(states.shape[2]), int(states.shape[3]))
            self.lstm_start_states = self._states_tensor(self.lstm_state_shape)
        n_rows = super()._set_rows_arrays(start, arrays, source)  # checks every array's name, dtype and shape
        rows = slice(start, start + n_rows)
        self._write(self.episode_starts, rows, arrays["episode_starts"])
        self._write(self.lstm_start_states, rows, arrays["lstm_start_states"])
        return n_rows
