"""
sb3-contrib's maskable action distributions for MaskablePPG: the masks as PPG stores them, checks of the masks that
an env or a user gives, and the behaviour-cloning ``KL(pi_old || pi)`` over the valid actions only.
"""

import numpy as np
import torch as th
from gymnasium import spaces
from sb3_contrib.common.maskable.distributions import (
    MaskableCategorical,
    MaskableCategoricalDistribution,
    MaskableDistribution,
    MaskableMultiCategoricalDistribution,
    MaybeMasks,
)
from torch.distributions import Categorical, kl_divergence


class PPGMaskableCategorical(MaskableCategorical):
    """
    sb3-contrib's ``MaskableCategorical``, the logits normalized once when nothing is masked, so that it is exactly SB3's
    ``Categorical`` then (and ``MaskablePPG`` without masks computes what ``PPG`` computes, bit for bit).
    """

    def apply_masking(self, masks: MaybeMasks) -> None:
        """
        Mask the invalid actions (probability 0) or, with ``masks=None``, remove earlier masks.

        :param masks: booleans of the logits' shape (True: valid), or None
        """
        if masks is not None:
            masks = th.as_tensor(masks, dtype=th.bool, device=self.logits.device).reshape(self.logits.shape)
            if bool(masks.all()):
                masks = None
        if masks is None and self.masks is None:
            return  # nothing to mask, nothing to restore: the logits stay as SB3's Categorical has them
        super().apply_masking(masks)

    @property
    def unmasked_logits(self) -> th.Tensor:
        """The normalized logits before masking (what PPG stores as pi_old's parameters)."""
        return self._original_logits


class PPGMaskableCategoricalDistribution(MaskableCategoricalDistribution):
    """sb3-contrib's ``MaskableCategoricalDistribution`` (Discrete actions) on :class:`PPGMaskableCategorical`."""

    #: Whether the categoricals built check their arguments (None: torch's default; see ``unchecked_distributions``)
    validate_args: bool | None = None

    def proba_distribution(self, action_logits: th.Tensor) -> "PPGMaskableCategoricalDistribution":
        """Set the distribution's parameters from the action network's output, (batch, n)."""
        logits = action_logits.view(-1, self.action_dim)
        self.distribution = PPGMaskableCategorical(logits=logits, validate_args=self.validate_args)
        return self

    @property
    def categoricals(self) -> list[PPGMaskableCategorical]:
        """The categorical distributions of the action's parts (one for Discrete)."""
        return [self.distribution]  # type: ignore[list-item]

    @property
    def action_dims(self) -> list[int]:
        """The number of choices of each part of the action."""
        return [self.action_dim]


class PPGMaskableMultiCategoricalDistribution(MaskableMultiCategoricalDistribution):
    """sb3-contrib's ``MaskableMultiCategoricalDistribution`` (MultiDiscrete actions) on :class:`PPGMaskableCategorical`."""

    validate_args: bool | None = None

    def proba_distribution(self, action_logits: th.Tensor) -> "PPGMaskableMultiCategoricalDistribution":
        """Set the distribution's parameters from the action network's output, (batch, sum(action_dims))."""
        parts = th.split(action_logits.view(-1, sum(self.action_dims)), list(self.action_dims), dim=1)
        self.distributions = [PPGMaskableCategorical(logits=part, validate_args=self.validate_args) for part in parts]
        return self

    @property
    def categoricals(self) -> list[PPGMaskableCategorical]:
        """The categorical distributions of the action's parts."""
        return self.distributions  # type: ignore[return-value]


class PPGMaskableBernoulliDistribution(PPGMaskableMultiCategoricalDistribution):
    """MultiBinary actions as sb3-contrib masks them: one two-way categorical per binary action."""

    def __init__(self, action_dim: int):
        super().__init__([2] * action_dim)


def make_maskable_distribution(action_space: spaces.Space) -> MaskableDistribution:
    """The maskable distribution of a Discrete, MultiDiscrete or one-dimensional MultiBinary action space."""
    if isinstance(action_space, spaces.Discrete):
        return PPGMaskableCategoricalDistribution(int(action_space.n))
    if isinstance(action_space, spaces.MultiDiscrete) and action_space.nvec.ndim == 1:
        return PPGMaskableMultiCategoricalDistribution([int(n) for n in action_space.nvec])
    if isinstance(action_space, spaces.MultiBinary) and isinstance(action_space.n, (int, np.integer)):
        return PPGMaskableBernoulliDistribution(int(action_space.n))
    raise ValueError(
        f"MaskablePPG does not support the action space {action_space}: action masks need Discrete, MultiDiscrete "
        "(one-dimensional nvec) or MultiBinary(n) actions. Flatten a multi-dimensional space, or use PPG for Box actions."
    )


def mask_dims(action_space: spaces.Space) -> int:
    """The number of mask entries per state (sb3-contrib's layout; see docs/maskable.md)."""
    return sum(make_maskable_distribution(action_space).action_dims)  # type: ignore[attr-defined]


def check_action_masks(masks: object, action_space: spaces.Space, n_states: int, source: str) -> np.ndarray:
    """
    Check action masks (see docs/maskable.md) and return them as booleans of shape (n_states, mask_dims).

    :param masks: booleans (or 0 / 1 numbers), one row per state (a single state may be one row without the batch axis)
    :param n_states: the number of states (envs, or observations given to ``predict``)
    :param source: where the masks come from, for the messages
    """
    dims = mask_dims(action_space)
    if isinstance(action_space, spaces.Discrete):
        entries = "one per action"
    elif isinstance(action_space, spaces.MultiDiscrete):
        entries = "one per choice of each part of the action"
    else:
        entries = "2 per binary action: whether 0 and whether 1 are allowed"
    layout = f"{dims} booleans per state for {action_space} ({entries})"
    array = np.asarray(masks)
    if array.dtype != bool:
        numeric = array.dtype.kind in "iuf"
        if not numeric or not np.isin(array, (0, 1)).all():
            values = " with values other than 0 and 1" if numeric else ""
            raise ValueError(
                f"Action masks from {source} have dtype {array.dtype}{values}: they must be booleans (True: the action "
                f"is valid), {layout}."
            )
        array = array.astype(bool)
    if array.size != n_states * dims:
        raise ValueError(
            f"Action masks from {source} have shape {array.shape}, expected ({n_states}, {dims}) for {n_states} "
            f"state(s): {layout}."
        )
    array = array.reshape(n_states, dims)
    for part, (start, size) in enumerate(_parts(action_space)):
        empty = np.flatnonzero(~array[:, start : start + size].any(axis=1))
        if len(empty) > 0:
            where = f" in part {part} of the action (mask entries {start} to {start + size - 1})" if dims != size else ""
            raise ValueError(
                f"Action masks from {source} allow no action{where} in state(s) {empty.tolist()}: every state needs at "
                "least one valid action. Fix the env's action_masks() (or end the episode before such a state)."
            )
    return array


def _parts(action_space: spaces.Space) -> list[tuple[int, int]]:
    """The (first mask entry, number of entries) of each part of the action."""
    dims = make_maskable_distribution(action_space).action_dims  # type: ignore[attr-defined]
    starts = np.cumsum([0, *dims[:-1]])
    return [(int(start), int(size)) for start, size in zip(starts, dims, strict=True)]


def get_unmasked_params(distribution: MaskableDistribution) -> th.Tensor:
    """pi's normalized logits before masking, concatenated over the action's parts: what the auxiliary buffer stores."""
    logits = [categorical.unmasked_logits for categorical in distribution.categoricals]  # type: ignore[attr-defined]
    return logits[0] if len(logits) == 1 else th.cat(logits, dim=1)


def masked_kl_divergence(old_params: th.Tensor, distribution: MaskableDistribution, masks: th.Tensor | None) -> th.Tensor:
    """
    ``KL(pi_old || pi)`` per state over the valid actions only, both renormalized on them (finite value and gradient);
    PPG's KL without masks (see docs/maskable.md).

    :param old_params: pi_old's unmasked logits (:func:`get_unmasked_params`), shape (batch, mask_dims)
    :param distribution: pi on the same states, unmasked (gradients flow through it)
    :param masks: the valid actions, booleans of shape (batch, mask_dims), or None
    """
    dims = distribution.action_dims  # type: ignore[attr-defined]
    old_parts = th.split(old_params, list(dims), dim=1)
    mask_parts = th.split(masks, list(dims), dim=1) if masks is not None else [None] * len(dims)
    per_part = []
    for old_logits, categorical, part_masks in zip(old_parts, distribution.categoricals, mask_parts, strict=True):  # type: ignore[attr-defined]
        if part_masks is None or bool(part_masks.all()):
            per_part.append(kl_divergence(Categorical(logits=old_logits, validate_args=False), categorical))
            continue
        old_log_p = th.log_softmax(old_logits.masked_fill(~part_masks, -th.inf), dim=1)
        log_p = th.log_softmax(categorical.unmasked_logits.masked_fill(~part_masks, -th.inf), dim=1)
        # The invalid entries are -inf: replaced by 0 before any arithmetic, so no inf or NaN reaches the gradient
        old_log_p = th.where(part_masks, old_log_p, 0.0)
        log_p = th.where(part_masks, log_p, 0.0)
        per_part.append((part_masks * old_log_p.exp() * (old_log_p - log_p)).sum(dim=1))
    if len(per_part) == 1:
        return per_part[0]
    return th.stack(per_part, dim=1).sum(dim=1)
