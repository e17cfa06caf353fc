"""sb3_ppg.ppg.losses: each loss term against its formula written out by hand."""

import pytest
import torch as th

from sb3_ppg.ppg.losses import aux_loss_from_kl, normalize_advantages, policy_loss, value_loss


def test_clipped_surrogate_entropy_and_diagnostics() -> None:
    advantages = th.tensor([1.0, -2.0, 0.5, 3.0])
    old_log_prob = th.tensor([-1.0, -1.0, -2.0, -0.5])
    log_prob = old_log_prob + th.tensor([0.5, -0.5, 0.05, 0.0])
    entropy = th.tensor([1.0, 2.0, 3.0, 4.0])
    loss, diagnostics = policy_loss(advantages, log_prob, old_log_prob, entropy, 0.2, 0.01, 0.0)
    ratio = (log_prob - old_log_prob).exp()
    surrogate = th.min(advantages * ratio, advantages * ratio.clamp(0.8, 1.2))
    th.testing.assert_close(loss, -surrogate.mean() - 0.01 * entropy.mean())
    assert diagnostics["clip_fraction"].item() == pytest.approx(0.5)  # ratios e^0.5 and e^-0.5 are clipped
    assert set(diagnostics) == {"clip_fraction", "policy_gradient_loss", "entropy_loss", "approx_kl"}


def test_kl_penalty_objective_and_minibatch_normalization() -> None:
    advantages = th.tensor([1.0, 3.0])
    old_log_prob = th.tensor([-1.0, -1.0])
    log_prob = th.tensor([-0.8, -1.1])
    normalized = normalize_advantages(advantages)
    th.testing.assert_close(normalized, th.tensor([-1.0, 1.0]) / 2**0.5)  # mean 0, std 1 (unbiased)
    th.testing.assert_close(normalize_advantages(th.tensor([5.0])), th.tensor([5.0]))  # one sample: unchanged
    loss, diagnostics = policy_loss(normalized, log_prob, old_log_prob, None, None, 0.0, 1.0)
    log_ratio = log_prob - old_log_prob
    th.testing.assert_close(loss, -(normalized * log_ratio.exp()).mean() + 0.5 * (log_ratio**2).mean())
    assert "clip_fraction" not in diagnostics and diagnostics["kl_penalty"] > 0


def test_value_loss_plain_and_clipped() -> None:
    values, returns, old_values = th.tensor([1.0, 2.0]), th.tensor([0.0, 4.0]), th.tensor([1.5, 1.5])
    loss, _ = value_loss(values, returns, old_values, None)
    th.testing.assert_close(loss, th.tensor((1.0 + 4.0) / 2))
    # Clipped to old_values +- 0.1: predictions 1.4 and 1.6
    loss, diagnostics = value_loss(values, returns, old_values, 0.1)
    th.testing.assert_close(loss, th.tensor((1.4**2 + 2.4**2) / 2))
    assert diagnostics["value_loss"] == loss


def test_value_clipping_forms() -> None:
    """
    "sb3": the clipped prediction's error; "max" (baselines, CleanRL): the larger of the unclipped and clipped errors.
    Where a value moved past the clip range, "sb3" gives it no gradient; "max" gives it the unclipped error's gradient
    when that error is the larger (sample 0), none when the clipped one is (sample 1).
    """
    old_values, returns = th.tensor([1.5, 1.5]), th.tensor([3.0, 4.0])
    # Both values moved 0.5 from the old ones, past the clip range 0.1: clipped predictions 1.4 and 1.6
    gradients = {}
    for form, expected in (("sb3", (1.6**2 + 2.4**2) / 2), ("max", (2.0**2 + 2.4**2) / 2)):
        values = th.tensor([1.0, 2.0], requires_grad=True)
        loss, diagnostics = value_loss(values, returns, old_values, 0.1, form)
        th.testing.assert_close(loss, th.tensor(expected))
        assert diagnostics["value_loss"] == loss
        loss.backward()
        gradients[form] = values.grad
    th.testing.assert_close(gradients["sb3"], th.tensor([0.0, 0.0]))
    th.testing.assert_close(gradients["max"], th.tensor([(1.0 - 3.0), 0.0]))  # d/dV of (V - R)^2 / 2
    # Without clip_range_vf the form does not matter
    values = th.tensor([1.0, 2.0])
    assert value_loss(values, returns, old_values, None, "max")[0] == value_loss(values, returns, old_values, None)[0]


def test_aux_loss_weights() -> None:
    kl_per_state = th.tensor([0.5, 0.25])
    values, aux_values, returns = th.tensor([[1.0], [2.0]]), th.tensor([[0.0], [0.0]]), th.tensor([1.0, 1.0])
    loss, diagnostics = aux_loss_from_kl(kl_per_state, values, aux_values, returns, beta_clone=2.0, vf_true_coef=3.0)
    kl = diagnostics["kl_loss"]
    th.testing.assert_close(kl, th.tensor(0.375))  # the mean over states
    th.testing.assert_close(diagnostics["aux_value_loss"], th.tensor(0.5))
    th.testing.assert_close(diagnostics["real_value_loss"], th.tensor(0.25))
    th.testing.assert_close(loss, 2.0 * kl + 0.5 + 3.0 * 0.25)
