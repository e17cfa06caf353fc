"""
The LSTM over whole sequences in one call equals ``nn.LSTM`` stepped one step at a time (float64), resets inside the
sequences; the one-step path (torch's LSTM cell, the rollout's) equals ``nn.LSTM``'s step.
"""

import pytest
import torch as th
from torch import nn

from sb3_ppg.common.recurrent import lstm_sequences, lstm_step, lstm_step_by_step, reset_states, sequence_layout


def nn_lstm_step_by_step(lstm, features, states, episode_starts, final_states=True):
    """The reference: ``nn.LSTM`` called on one step at a time, its states zeroed at each episode start."""
    n_sequences, n_steps = episode_starts.shape
    sequences = features.reshape(n_sequences, n_steps, -1)
    outputs = []
    for step in range(n_steps):
        output, states = lstm(sequences[:, step].unsqueeze(0), reset_states(states, episode_starts[:, step]))
        outputs.append(output.squeeze(0))
    return th.stack(outputs, dim=1).reshape(n_sequences * n_steps, -1), states


def _inputs(n_sequences: int, n_steps: int, n_layers: int, starts: list[tuple[int, int]], seed: int = 0):
    generator = th.Generator().manual_seed(seed)
    lstm = nn.LSTM(5, 7, num_layers=n_layers).double()
    with th.no_grad():
        for parameter in lstm.parameters():
            parameter.copy_(th.randn(parameter.shape, generator=generator, dtype=th.float64) * 0.5)
    features = th.randn(n_sequences * n_steps, 5, generator=generator, dtype=th.float64, requires_grad=True)
    hidden = th.randn(n_layers, n_sequences, 7, generator=generator, dtype=th.float64, requires_grad=True)
    cell = th.randn(n_layers, n_sequences, 7, generator=generator, dtype=th.float64, requires_grad=True)
    episode_starts = th.zeros(n_sequences, n_steps, dtype=th.float64)
    for sequence, step in starts:
        episode_starts[sequence, step] = 1.0
    return lstm, features, (hidden, cell), episode_starts


def _outputs_and_gradients(function, lstm, features, states, episode_starts, final_states=True):
    output, last_states = function(lstm, features, states, episode_starts, final_states)
    if final_states:
        hidden, cell = last_states
    else:
        # Padded pieces: no final states (those of the step-by-step reference are left out of the loss)
        hidden, cell = th.zeros(1, dtype=th.float64), th.zeros(1, dtype=th.float64)
    # A loss that weighs every output and final state differently, so that any misplaced value changes a gradient
    weights = th.linspace(-1, 1, output.numel(), dtype=th.float64).view_as(output)
    loss = (output * weights).sum() + (hidden**2).sum() + (cell * 0.3).sum()
    inputs = [features, *states, *lstm.parameters()]
    gradients = th.autograd.grad(loss, inputs, allow_unused=True, materialize_grads=True)
    return output.detach(), hidden.detach(), cell.detach(), gradients


@pytest.mark.parametrize(
    "n_layers, starts",
    [
        (1, [(0, 3), (0, 4), (1, 0), (2, 7), (3, 1), (3, 5)]),  # resets inside, at the first and at the last step
        (2, [(1, 2), (2, 2), (2, 6)]),  # two layers
        (1, []),  # no reset: the path without pieces
        (1, [(0, 0), (2, 0)]),  # resets at the first steps only
    ],
)
@pytest.mark.parametrize("final_states", [True, False])
@pytest.mark.parametrize("one_step", [False, True])
def test_sequences_equal_step_by_step(
    n_layers: int, starts: list[tuple[int, int]], final_states: bool, one_step: bool
) -> None:
    """``one_step``: sequences of one step (a rollout's), the starts at their first step kept, the others dropped."""
    if one_step:
        starts = [(sequence, step) for sequence, step in starts if step == 0]
    lstm, features, states, episode_starts = _inputs(4, 1 if one_step else 8, n_layers, starts)
    fast = _outputs_and_gradients(lstm_sequences, lstm, features, states, episode_starts, final_states)
    reference = _outputs_and_gradients(nn_lstm_step_by_step, lstm, features, states, episode_starts, final_states)
    for fast_value, reference_value in zip(fast[:3], reference[:3], strict=True):
        th.testing.assert_close(fast_value, reference_value, rtol=1e-12, atol=1e-12)
    for fast_gradient, reference_gradient in zip(fast[3], reference[3], strict=True):
        th.testing.assert_close(fast_gradient, reference_gradient, rtol=1e-12, atol=1e-12)


def test_reset_discards_the_stored_state() -> None:
    """A piece after an episode start does not depend on the stored state, nor on the steps before the start."""
    lstm, features, states, episode_starts = _inputs(2, 6, 1, [(0, 3)])
    output, _ = lstm_sequences(lstm, features, states, episode_starts)
    gradient_state, gradient_features = th.autograd.grad(output.view(2, 6, -1)[0, 3:].sum(), [states[0], features])
    assert th.all(gradient_state == 0)
    assert th.all(gradient_features[:3] == 0) and th.any(gradient_features[3:6] != 0)
    assert th.all(gradient_features[6:] == 0)


def test_sequence_continues_the_stored_state() -> None:
    """Running two halves, the second from the first's final states, equals running the whole sequence."""
    lstm, features, states, episode_starts = _inputs(3, 8, 2, [(0, 2), (1, 5), (2, 4)])
    whole, whole_states = lstm_sequences(lstm, features, states, episode_starts)
    halves = features.view(3, 8, -1)
    first, middle_states = lstm_sequences(lstm, halves[:, :4].reshape(12, -1), states, episode_starts[:, :4])
    second, end_states = lstm_sequences(lstm, halves[:, 4:].reshape(12, -1), middle_states, episode_starts[:, 4:])
    joined = th.cat([first.view(3, 4, -1), second.view(3, 4, -1)], dim=1).reshape(24, -1)
    th.testing.assert_close(joined, whole, rtol=1e-12, atol=1e-12)
    for end, expected in zip(end_states, whole_states, strict=True):
        th.testing.assert_close(end, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("n_layers, bias", [(1, True), (2, True), (2, False)])
def test_lstm_cell_steps_equal_nn_lstm(n_layers: int, bias: bool) -> None:
    """lstm_step (torch's LSTM cell per layer) and lstm_step_by_step: nn.LSTM's outputs, states and gradients."""
    lstm, features, states, episode_starts = _inputs(3, 5, n_layers, [(0, 2), (1, 0), (2, 4)])
    if not bias:
        lstm = nn.LSTM(5, 7, num_layers=n_layers, bias=False).double()
    fast = _outputs_and_gradients(lstm_step_by_step, lstm, features, states, episode_starts)
    reference = _outputs_and_gradients(nn_lstm_step_by_step, lstm, features, states, episode_starts)
    for fast_value, reference_value in zip([*fast[:3], *fast[3]], [*reference[:3], *reference[3]], strict=True):
        th.testing.assert_close(fast_value, reference_value, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("lstm_kwargs", [dict(proj_size=3), dict(num_layers=2, dropout=0.5)])
def test_lstm_step_runs_nn_lstm_where_the_cell_does_not_apply(lstm_kwargs: dict) -> None:
    """Projections, or dropout between layers in training: nn.LSTM itself (the same dropout draws)."""
    lstm = nn.LSTM(5, 7, **lstm_kwargs).double().train()
    n_layers, out_size = lstm.num_layers, lstm.proj_size or 7
    features = th.randn(4, 5, dtype=th.float64)
    states = (th.randn(n_layers, 4, out_size, dtype=th.float64), th.randn(n_layers, 4, 7, dtype=th.float64))
    starts = th.tensor([0.0, 1.0, 0.0, 0.0], dtype=th.float64)
    th.manual_seed(0)
    output, (hidden, cell) = lstm_step(lstm, features, states, starts)
    th.manual_seed(0)
    expected, (expected_hidden, expected_cell) = lstm(features.unsqueeze(0), reset_states(states, starts))
    assert output.shape == (4, out_size)
    assert th.equal(output, expected[0]) and th.equal(hidden, expected_hidden) and th.equal(cell, expected_cell)


def test_one_layout_serves_any_lstm_on_the_sequences() -> None:
    """A layout computed once (as the policy does for its two LSTMs) gives what each call computes alone, bit for bit."""
    lstm, features, states, episode_starts = _inputs(4, 8, 1, [(0, 3), (2, 0), (2, 6), (3, 7)])
    layout = sequence_layout(episode_starts, th.float64)
    for final_states in (True, False):
        alone = lstm_sequences(lstm, features, states, episode_starts, final_states)
        shared = lstm_sequences(lstm, features, states, episode_starts, final_states, layout)
        assert th.equal(alone[0], shared[0])
        if final_states:
            assert all(th.equal(a, b) for a, b in zip(alone[1], shared[1], strict=True))
    # 4 sequences and 3 starts after their first step: 7 pieces, the longest 8 steps (sequence 1 has no start)
    assert (layout.n_pieces, layout.max_length) == (7, 8)
