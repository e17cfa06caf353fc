"""
MaskablePPG's rollout buffers: sb3-contrib's maskable buffers with their samples, made faster as
:class:`~sb3_ppg.common.rollout_buffers.UnflattenedRolloutBuffer` says (kept observation arrays, minibatches gathered without
flattening).
"""

from typing import Any

import numpy as np
from sb3_contrib.common.maskable.buffers import (
    MaskableDictRolloutBuffer,
    MaskableDictRolloutBufferSamples,
    MaskableRolloutBuffer,
    MaskableRolloutBufferSamples,
)

from sb3_ppg.common.rollout_buffers import SAMPLED_VALUE_ARRAYS, UnflattenedRolloutBuffer, step_major_samples


class UnflattenedMaskableRolloutBuffer(UnflattenedRolloutBuffer):
    """
    What MaskablePPG's rollout buffers add to sb3-contrib's (it comes first among their bases): PPG's
    (:class:`~sb3_ppg.common.rollout_buffers.UnflattenedRolloutBuffer`), with ``add()`` storing the masks as
    sb3-contrib's does.
    """

    # sb3-contrib's buffer attributes that add() writes
    action_masks: np.ndarray
    mask_dims: int

    def add(self, *args: Any, action_masks: np.ndarray | None = None, **kwargs: Any) -> None:
        """sb3-contrib's ``add()``: the masks (where given) in row ``pos``, then the step as ``PPGRolloutBuffer`` writes it."""
        if action_masks is not None:
            self.action_masks[self.pos] = action_masks.reshape((self.n_envs, self.mask_dims))
        super().add(*args, **kwargs)

    def add_before_step(self, *args: Any, action_masks: np.ndarray | None = None, **kwargs: Any) -> None:
        """``add()``'s first part (see ``UnflattenedRolloutBuffer``), the masks (where given) first, as ``add()``."""
        if action_masks is not None:
            self.action_masks[self.pos] = action_masks.reshape((self.n_envs, self.mask_dims))
        super().add_before_step(*args, **kwargs)

    def discard_before_step(self) -> None:
        """Undo ``add_before_step()``: row ``pos`` as ``reset()`` left it, its masks all valid."""
        self.action_masks[self.pos] = 1
        super().discard_before_step()


class MaskablePPGRolloutBuffer(UnflattenedMaskableRolloutBuffer, MaskableRolloutBuffer):
    """
    sb3-contrib's ``MaskableRolloutBuffer`` with the same samples, made faster as ``PPGRolloutBuffer``. The default of
    ``MaskablePPG``.
    """

    def _step_major_samples(self, steps: np.ndarray, envs: np.ndarray) -> MaskableRolloutBufferSamples:
        data = (
            step_major_samples(self.observations, steps, envs),
            self.actions[steps, envs],
            *(getattr(self, name)[steps, envs] for name in SAMPLED_VALUE_ARRAYS),
            self.action_masks[steps, envs].reshape(-1, self.mask_dims),
        )
        return MaskableRolloutBufferSamples(*map(self.to_torch, data))


class MaskablePPGDictRolloutBuffer(UnflattenedMaskableRolloutBuffer, MaskableDictRolloutBuffer):
    """
    sb3-contrib's ``MaskableDictRolloutBuffer`` with the same samples, made faster as ``PPGRolloutBuffer``. The default
    of ``MaskablePPG`` for Dict observation spaces.
    """

    def _step_major_samples(self, steps: np.ndarray, envs: np.ndarray) -> MaskableDictRolloutBufferSamples:
        return MaskableDictRolloutBufferSamples(
            {key: self.to_torch(step_major_samples(array, steps, envs)) for key, array in self.observations.items()},
            self.to_torch(self.actions[steps, envs]),
            *(self.to_torch(getattr(self, name)[steps, envs]) for name in SAMPLED_VALUE_ARRAYS),
            self.to_torch(self.action_masks[steps, envs].reshape(-1, self.mask_dims)),
        )
