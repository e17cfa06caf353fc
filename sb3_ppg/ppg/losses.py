"""
The loss terms of PPG's two phases, as plain functions of tensors (policy surrogate, value, auxiliary joint loss), and
the diagnostics they give (gathered for the logger by :class:`PhaseStats`).
"""

from collections import defaultdict

import torch as th
from torch.nn import functional as F

# Per-minibatch diagnostics, detached 0-d tensors keyed by the name they are logged under
Diagnostics = dict[str, th.Tensor]


class PhaseStats:
    """The diagnostics of a phase's minibatches, gathered for the logger."""

    def __init__(self) -> None:
        self.values: dict[str, list[th.Tensor]] = defaultdict(list)

    def add(self, diagnostics: Diagnostics) -> None:
        """Add one minibatch's diagnostics."""
        for name, value in diagnostics.items():
            self.values[name].append(value)

    def mean(self, name: str) -> float | None:
        """The mean of a diagnostic over the minibatches, or None when no minibatch had it."""
        return th.stack(self.values[name]).mean().item() if self.values.get(name) else None

    def last(self, name: str) -> float | None:
        """The last minibatch's value of a diagnostic, or None when no minibatch had it."""
        return self.values[name][-1].item() if self.values.get(name) else None

    def read(self, last: tuple[str, ...] = ("loss",)) -> dict[str, float]:
        """
        Every diagnostic's mean over the minibatches, and the last value of those in ``last`` (``"last_<name>"``),
        copied from the device at once.
        """
        names = [name for name, values in self.values.items() if values]
        tensors = [th.stack(self.values[name]).mean() for name in names]
        for name in last:
            if self.values.get(name):
                names.append(f"last_{name}")
                tensors.append(self.values[name][-1])
        if not tensors:
            return {}
        # float64 holds every float32 (or float64) value exactly: the same numbers as mean() and last()
        return dict(zip(names, th.stack([tensor.to(th.float64) for tensor in tensors]).tolist(), strict=True))


def normalize_advantages(advantages: th.Tensor) -> th.Tensor:
    """Advantages normalized to mean 0 and std 1 (a single sample is left as it is)."""
    if len(advantages) > 1:
        return (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    return advantages


def policy_loss(
    advantages: th.Tensor,
    log_prob: th.Tensor,
    old_log_prob: th.Tensor,
    entropy: th.Tensor | None,
    clip_range: float | None,
    ent_coef: float,
    kl_coef: float,
) -> tuple[th.Tensor, Diagnostics]:
    """
    The policy phase's policy loss: PPO's clipped surrogate (unclipped with ``clip_range=None``), the entropy bonus and
    the KL penalty ``0.5 * mean(log_ratio ** 2)``.

    :param advantages: the minibatch's advantages
    :param log_prob: log-probabilities of its actions under the current policy
    :param old_log_prob: log-probabilities of its actions under the behaviour policy
    :param entropy: entropies of the current policy (``None``: ``-log_prob`` is used)
    :param clip_range: the surrogate's clip range, ``None`` for no clipping
    :param ent_coef: entropy coefficient
    :param kl_coef: KL-penalty coefficient (0: no penalty)
    :return: the loss and its diagnostics
    """
    log_ratio = log_prob - old_log_prob
    ratio = th.exp(log_ratio)
    diagnostics: Diagnostics = {}
    if clip_range is None:
        surrogate_loss = -(advantages * ratio).mean()
    else:
        clipped_ratio = th.clamp(ratio, 1 - clip_range, 1 + clip_range)
        surrogate_loss = -th.min(advantages * ratio, advantages * clipped_ratio).mean()
        diagnostics["clip_fraction"] = th.mean((th.abs(ratio - 1) > clip_range).float()).detach()
    entropy_loss = -th.mean(-log_prob) if entropy is None else -th.mean(entropy)
    loss = surrogate_loss + ent_coef * entropy_loss
    if kl_coef > 0:
        kl_penalty = 0.5 * th.mean(log_ratio**2)
        loss = loss + kl_coef * kl_penalty
        diagnostics["kl_penalty"] = kl_penalty.detach()
    diagnostics["policy_gradient_loss"] = surrogate_loss.detach()
    diagnostics["entropy_loss"] = entropy_loss.detach()
    with th.no_grad():
        diagnostics["approx_kl"] = th.mean((ratio - 1) - log_ratio)
    return loss, diagnostics


def value_loss(
    values: th.Tensor,
    returns: th.Tensor,
    old_values: th.Tensor,
    clip_range_vf: float | None,
    value_clipping: str = "sb3",
) -> tuple[th.Tensor, Diagnostics]:
    """
    The policy phase's value loss (not yet weighted by ``vf_coef``); with ``clip_range_vf``, SB3's clipped prediction
    (``"sb3"``) or the larger of the clipped and unclipped errors (``"max"``, CleanRL's; see docs/differences_from_ppo.md).

    :param values: the value function's predictions, shape (batch,)
    :param returns: the value targets, shape (batch,)
    :param old_values: the values predicted when the rollout was collected, shape (batch,)
    :param clip_range_vf: the value clip range, ``None`` for no clipping
    :param value_clipping: ``"sb3"`` or ``"max"``
    :return: the loss and its diagnostics
    """
    if clip_range_vf is None:
        loss = F.mse_loss(returns, values)
    else:
        clipped_values = old_values + th.clamp(values - old_values, -clip_range_vf, clip_range_vf)
        if value_clipping == "max":
            loss = th.max((values - returns) ** 2, (clipped_values - returns) ** 2).mean()
        else:
            loss = F.mse_loss(returns, clipped_values)
    return loss, {"value_loss": loss.detach()}


def aux_loss_from_kl(
    kl: th.Tensor,
    values: th.Tensor,
    aux_values: th.Tensor,
    returns: th.Tensor,
    beta_clone: float,
    vf_true_coef: float,
) -> tuple[th.Tensor, Diagnostics]:
    """
    The auxiliary phase's joint loss
    ``beta_clone * KL(pi_old || pi) + 0.5 * MSE(aux_value, target) + vf_true_coef * 0.5 * MSE(value, target)`` from
    the KL of each state, however computed (``PPG._behaviour_cloning_kl``).

    :param kl: ``KL(pi_old || pi)`` of each state, shape (batch,)
    :param values: the true value function's predictions, shape (batch, 1)
    :param aux_values: the auxiliary value head's predictions, shape (batch, 1)
    :param returns: the value targets, shape (batch,)
    :param beta_clone: weight of the behaviour-cloning KL term
    :param vf_true_coef: weight of the true value function's loss
    :return: the loss and its diagnostics
    """
    kl_loss = kl.mean()
    aux_value_loss = 0.5 * F.mse_loss(aux_values.flatten(), returns)
    real_value_loss = 0.5 * F.mse_loss(values.flatten(), returns)
    loss = beta_clone * kl_loss + aux_value_loss + vf_true_coef * real_value_loss
    diagnostics = {
        "kl_loss": kl_loss.detach(),
        "aux_value_loss": aux_value_loss.detach(),
        "real_value_loss": real_value_loss.detach(),
    }
    return loss, diagnostics
