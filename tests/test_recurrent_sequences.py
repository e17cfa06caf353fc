"""The LSTM over whole sequences in one call equals the step-by-step LSTM (float64), resets inside the sequences."""

import pytest
import torch as th
from torch import nn

from sb3_ppg.common.recurrent import lstm_sequences, lstm_step_by_step


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
    reference = _outputs_and_gradients(lstm_step_by_step, lstm, features, states, episode_starts, final_states)
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
