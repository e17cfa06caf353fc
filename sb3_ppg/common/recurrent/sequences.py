"""
Run an LSTM over whole env sequences with episode starts inside them, in one call per minibatch.

Each sequence is cut at its episode starts into pieces; the pieces are padded (or packed, where the final states are
needed) and run through ``nn.LSTM`` once, every piece from its own initial state: the sequence's stored state for its
first piece (unless an episode starts at its first step), zeros for the others. The result equals stepping the LSTM
through each sequence and zeroing its state at every episode start (see docs/recurrent.md).
"""

from typing import NamedTuple

import numpy as np
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
    Each layer runs torch's LSTM cell, the same computation as ``nn.LSTM`` (equal up to float rounding) at a third of
    its cost for one step; an LSTM with projections, two directions or dropout in training runs ``nn.LSTM`` itself.

    :param lstm: the LSTM (not ``batch_first``)
    :param features: shape (n_envs, input_size)
    :param states: (hidden, cell), each (n_layers, n_envs, hidden_size)
    :param episode_starts: shape (n_envs,)
    :return: the output, shape (n_envs, hidden_size), and the new states
    """
    hidden, cell = reset_states(states, episode_starts)
    if lstm.proj_size > 0 or lstm.bidirectional or (lstm.dropout > 0 and lstm.training):
        output, new_states = lstm(features.unsqueeze(0), (hidden, cell))
        return output.squeeze(0), new_states
    layer_input, hiddens, cells = features, [], []
    for layer in range(lstm.num_layers):
        biases = (getattr(lstm, f"bias_ih_l{layer}"), getattr(lstm, f"bias_hh_l{layer}")) if lstm.bias else (None, None)
        layer_input, layer_cell = th.lstm_cell(
            layer_input,
            (hidden[layer], cell[layer]),
            getattr(lstm, f"weight_ih_l{layer}"),
            getattr(lstm, f"weight_hh_l{layer}"),
            *biases,
        )
        hiddens.append(layer_input)
        cells.append(layer_cell)
    return layer_input, (th.stack(hiddens), th.stack(cells))


class SequenceLayout(NamedTuple):
    """
    How a minibatch's sequences are cut into pieces at their episode starts (:func:`sequence_layout`): computed once
    per minibatch and shared by the networks' LSTMs.

    :param episode_starts: shape (n_sequences, n_steps), bool
    :param n_pieces: the number of pieces (0: no episode starts inside the sequences, which are the pieces)
    :param max_length: the longest piece's length (the padded length)
    :param slots: each sample's row in the padded time-major pieces (step in its piece * n_pieces + piece)
    :param lengths: each piece's length
    :param sequence_of_piece: the sequence each piece belongs to
    :param continues: 1 where a piece continues its sequence's given state, 0 where it starts from zeros, (1, n_pieces, 1)
    :param last_pieces: each sequence's last piece
    """

    episode_starts: th.Tensor
    n_pieces: int = 0
    max_length: int = 0
    slots: th.Tensor | None = None
    lengths: th.Tensor | None = None
    sequence_of_piece: th.Tensor | None = None
    continues: th.Tensor | None = None
    last_pieces: th.Tensor | None = None


def sequence_layout(episode_starts: th.Tensor, dtype: th.dtype = th.float32) -> SequenceLayout:
    """
    Cut sequences into pieces: a new piece at each sequence's first step and at each episode start inside it. The
    indices are computed with NumPy from one copy of the episode starts on the host and go to their device at once.

    :param episode_starts: shape (n_sequences, n_steps), 1 (or True) where an episode starts
    :param dtype: the states' dtype (of ``continues``)
    """
    starts_tensor = episode_starts.detach().to(th.bool)
    n_sequences, n_steps = starts_tensor.shape
    if n_steps == 1:
        return SequenceLayout(starts_tensor)
    starts = starts_tensor.cpu().numpy()
    if not starts[:, 1:].any():
        return SequenceLayout(starts_tensor)
    # Pieces in sequence-major order
    boundaries = starts.copy()
    boundaries[:, 0] = True
    flat_boundaries = boundaries.reshape(-1)
    piece_starts = np.flatnonzero(flat_boundaries)
    n_samples, n_pieces = n_sequences * n_steps, len(piece_starts)
    lengths = np.diff(piece_starts, append=n_samples)
    piece_of_sample = np.cumsum(flat_boundaries) - 1
    step_in_piece = np.arange(n_samples) - piece_starts[piece_of_sample]
    # The first piece of a sequence continues the given state, unless an episode starts there; the others start at zero
    continues = ((piece_starts % n_steps) == 0) & ~starts.reshape(-1)[piece_starts]
    indices = th.as_tensor(
        np.concatenate(
            [
                step_in_piece * n_pieces + piece_of_sample,
                piece_starts // n_steps,
                piece_of_sample[n_steps - 1 :: n_steps],
                continues,
            ]
        ),
        device=episode_starts.device,
    )
    slots, sequence_of_piece, last_pieces, continue_flags = th.split(indices, [n_samples, n_pieces, n_sequences, n_pieces])
    return SequenceLayout(
        episode_starts=starts_tensor,
        n_pieces=n_pieces,
        max_length=int(lengths.max()),
        slots=slots,
        lengths=th.as_tensor(lengths),
        sequence_of_piece=sequence_of_piece,
        continues=continue_flags.to(dtype).view(1, -1, 1),
        last_pieces=last_pieces,
    )


def lstm_sequences(
    lstm: nn.LSTM,
    features: th.Tensor,
    states: LSTMStates,
    episode_starts: th.Tensor,
    final_states: bool = True,
    layout: SequenceLayout | None = None,
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
    :param layout: ``sequence_layout(episode_starts)`` when already computed (for another LSTM on the same sequences)
    :return: the outputs, shape (n_sequences * n_steps, hidden_size), sequence-major, and the states after each
        sequence's last step (``None`` without ``final_states``)
    """
    if layout is None:
        layout = sequence_layout(episode_starts, states[0].dtype)
    n_sequences, n_steps = layout.episode_starts.shape
    if n_steps == 1:
        # One step (a rollout's, predict's)
        return lstm_step(lstm, features, states, layout.episode_starts[:, 0])
    if layout.n_pieces == 0:
        # No episode starts inside a sequence: the sequences themselves are the pieces
        sequences = features.reshape(n_sequences, n_steps, -1).transpose(0, 1)
        output, last_states = lstm(sequences, reset_states(states, layout.episode_starts[:, 0]))
        return output.transpose(0, 1).reshape(n_sequences * n_steps, -1), last_states
    assert layout.slots is not None and layout.sequence_of_piece is not None and layout.continues is not None
    padded = features.new_zeros((layout.max_length * layout.n_pieces, features.shape[-1]))
    padded = padded.index_copy(0, layout.slots, features).view(layout.max_length, layout.n_pieces, -1)
    initial = (
        states[0].index_select(1, layout.sequence_of_piece) * layout.continues,
        states[1].index_select(1, layout.sequence_of_piece) * layout.continues,
    )
    if not final_states:
        # The padding follows each piece's last step: the outputs of its real steps do not depend on it
        output, _ = lstm(padded, initial)
        return output.reshape(layout.max_length * layout.n_pieces, -1).index_select(0, layout.slots), None
    assert layout.lengths is not None and layout.last_pieces is not None
    packed = pack_padded_sequence(padded, layout.lengths.cpu(), enforce_sorted=False)
    packed_output, (hidden, cell) = lstm(packed, initial)
    output, _ = pad_packed_sequence(packed_output, total_length=layout.max_length)
    output = output.reshape(layout.max_length * layout.n_pieces, -1).index_select(0, layout.slots)
    # The states after each sequence's last piece
    return output, (hidden.index_select(1, layout.last_pieces), cell.index_select(1, layout.last_pieces))


def lstm_step_by_step(
    lstm: nn.LSTM, features: th.Tensor, states: LSTMStates, episode_starts: th.Tensor, final_states: bool = True
) -> tuple[th.Tensor, LSTMStates]:
    """
    :func:`lstm_sequences` one step at a time through :func:`lstm_step` (slow: a reference; tests compare the two).

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
