"""
Run an LSTM over whole env sequences with episode starts inside them, in one call per minibatch.

Each sequence is cut at its episode starts into pieces; the pieces are padded (or packed, where the final states are
needed) and run through ``nn.LSTM`` once, every piece from its own initial state: the sequence's stored state for its
first piece (unless an episode starts at its first step), zeros for the others. The result equals stepping the LSTM
through each sequence and zeroing its state at every episode start (see docs/recurrent.md).
"""

from typing import NamedTuple

import torch as th
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

#: An LSTM's (hidden, cell) states, each of shape (n_layers, n_sequences, hidden_size)
LSTMStates = tuple[th.Tensor, th.Tensor]


class RNNStates(NamedTuple):
    """The states of a recurrent actor-critic: the policy network's and the value network's (sb3-contrib's layout)."""

    pi: LSTMStates
    vf: LSTMStates


def reset_states(states: LSTMStates, episode_starts: th.Tensor) -> LSTMStates:
    """
    The states with those of the sequences where an episode starts set to zeros.

    :param states: (hidden, cell), each (n_layers, n_sequences, hidden_size)
    :param episode_starts: shape (n_sequences,), 1 (or True) where an episode starts
    """
    keep = (1.0 - episode_starts.to(states[0].dtype)).view(1, -1, 1)
    return states[0] * keep, states[1] * keep


def lstm_step(
    lstm: nn.LSTM, features: th.Tensor, states: LSTMStates, episode_starts: th.Tensor
) -> tuple[th.Tensor, LSTMStates]:
    """
    One step of the LSTM for a batch of envs (a rollout step, ``predict``): the states reset where an episode starts.

    :param lstm: the LSTM (not ``batch_first``)
    :param features: shape (n_envs, input_size)
    :param states: (hidden, cell), each (n_layers, n_envs, hidden_size)
    :param episode_starts: shape (n_envs,)
    :return: the output, shape (n_envs, hidden_size), and the new states
    """
    output, new_states = lstm(features.unsqueeze(0), reset_states(states, episode_starts))
    return output.squeeze(0), new_states


def lstm_sequences(
    lstm: nn.LSTM, features: th.Tensor, states: LSTMStates, episode_starts: th.Tensor, final_states: bool = True
) -> tuple[th.Tensor, LSTMStates | None]:
    """
    Run the LSTM over ``n_sequences`` sequences of ``n_steps`` steps, its states reset at every episode start, in one
    call of the LSTM.

    :param lstm: the LSTM (not ``batch_first``)
    :param features: shape (n_sequences * n_steps, input_size), sequence-major (each sequence's steps in order)
    :param states: the states before each sequence's first step: (hidden, cell), each (n_layers, n_sequences, hidden)
    :param episode_starts: shape (n_sequences, n_steps), 1 (or True) where an episode starts (the state is reset
        before that step)
    :param final_states: return the states after each sequence (the pieces are then packed); False: ``None`` instead,
        the pieces padded (the LSTM's backward pass on a CPU is several times faster padded than packed)
    :return: the outputs, shape (n_sequences * n_steps, hidden_size), sequence-major, and the states after each
        sequence's last step (``None`` without ``final_states``)
    """
    n_sequences, n_steps = episode_starts.shape
    if n_steps == 1:
        # One step (a rollout's, predict's): no starts inside to look for
        return lstm_step(lstm, features, states, episode_starts[:, 0])
    starts = episode_starts.to(th.bool)
    if not bool(starts[:, 1:].any()):
        # No episode starts inside a sequence: the sequences themselves are the pieces
        sequences = features.reshape(n_sequences, n_steps, -1).transpose(0, 1)
        output, last_states = lstm(sequences, reset_states(states, starts[:, 0]))
        return output.transpose(0, 1).reshape(n_sequences * n_steps, -1), last_states
    device = features.device
    # Pieces: a new one at each sequence's first step and at each episode start, in sequence-major order
    boundaries = starts.clone()
    boundaries[:, 0] = True
    flat_boundaries = boundaries.reshape(-1)
    piece_starts = flat_boundaries.nonzero().squeeze(1)
    n_samples = n_sequences * n_steps
    ends = th.cat([piece_starts[1:], th.tensor([n_samples], device=device)])
    lengths = ends - piece_starts
    piece_of_sample = th.cumsum(flat_boundaries.to(th.long), 0) - 1
    step_in_piece = th.arange(n_samples, device=device) - piece_starts[piece_of_sample]
    max_length = int(lengths.max())
    padded = features.new_zeros((max_length, len(piece_starts), features.shape[-1]))
    padded = padded.index_put((step_in_piece, piece_of_sample), features)
    # The first piece of a sequence continues the given state, unless an episode starts there; the others start at zero
    sequence_of_piece = piece_starts // n_steps
    continues = ((piece_starts % n_steps) == 0) & ~starts.reshape(-1)[piece_starts]
    keep = continues.to(states[0].dtype).view(1, -1, 1)
    initial = (states[0][:, sequence_of_piece] * keep, states[1][:, sequence_of_piece] * keep)
    if not final_states:
        # The padding follows each piece's last step: the outputs of its real steps do not depend on it
        output, _ = lstm(padded, initial)
        return output[step_in_piece, piece_of_sample], None
    packed = pack_padded_sequence(padded, lengths.cpu(), enforce_sorted=False)
    packed_output, (hidden, cell) = lstm(packed, initial)
    output, _ = pad_packed_sequence(packed_output, total_length=max_length)
    # The states after each sequence's last piece
    last_pieces = piece_of_sample[(th.arange(n_sequences, device=device) + 1) * n_steps - 1]
    return output[step_in_piece, piece_of_sample], (hidden[:, last_pieces], cell[:, last_pieces])


def lstm_step_by_step(
    lstm: nn.LSTM, features: th.Tensor, states: LSTMStates, episode_starts: th.Tensor, final_states: bool = True
) -> tuple[th.Tensor, LSTMStates]:
    """
    The reference of :func:`lstm_sequences`: one LSTM call per step (slow; for tests and for the rollout's loop).

    :param lstm: the LSTM
    :param features: shape (n_sequences * n_steps, input_size), sequence-major
    :param states: (hidden, cell), each (n_layers, n_sequences, hidden_size)
    :param episode_starts: shape (n_sequences, n_steps)
    :param final_states: unused (the final states are always returned): :func:`lstm_sequences`'s signature
    :return: the outputs, shape (n_sequences * n_steps, hidden_size), and the final states
    """
    n_sequences, n_steps = episode_starts.shape
    sequences = features.reshape(n_sequences, n_steps, -1)
    outputs = []
    for step in range(n_steps):
        output, states = lstm_step(lstm, sequences[:, step], states, episode_starts[:, step])
        outputs.append(output)
    return th.stack(outputs, dim=1).reshape(n_sequences * n_steps, -1), states
