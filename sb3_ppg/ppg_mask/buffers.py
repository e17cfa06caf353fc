"""
MaskablePPG's rollout buffers: sb3-contrib's maskable buffers with their samples, made faster as
:class:`~sb3_ppg.common.buffers.UnflattenedRolloutBuffer` says (kept observation arrays, minibatches gathered without
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

from sb3_ppg.common.buffers import SAMPLED_VALUE_ARRAYS, UnflattenedRolloutBuffer, step_major_samples


def store_action_masks(buffer: MaskableRolloutBuffer | MaskableDictRolloutBuffer, action_masks: np.ndarray | None) -> None:
    """Write one step's action masks into a maskable buffer's row ``pos``, as sb3-contrib's ``add()`` does."""
    if action_masks is not None:
        buffer.action_masks[buffer.pos] = action_masks.reshape((buffer.n_envs, buffer.mask_dims))


class MaskablePPGRolloutBuffer(UnflattenedRolloutBuffer, MaskableRolloutBuffer):
    """
    sb3-contrib's ``MaskableRolloutBuffer`` with the same samples, made faster as ``PPGRolloutBuffer``. The default of
    ``MaskablePPG``.
    """

    def add(self, *args: Any, action_masks: np.ndarray | None = None, **kwargs: Any) -> None:
        """sb3-contrib's ``add()``: the masks (where given), then the step as ``PPGRolloutBuffer`` writes it."""
        store_action_masks(self, action_masks)
        super().add(*args, **kwargs)

    def _step_major_samples(self, steps: np.ndarray, envs: np.ndarray) -> MaskableRolloutBufferSamples:
        data = (
            step_major_samples(self.observations, steps, envs),
            self.actions[steps, envs],
            *(getattr(self, name)[steps, envs] for name in SAMPLED_VALUE_ARRAYS),
            self.action_masks[steps, envs].reshape(-1, self.mask_dims),
        )
        return MaskableRolloutBufferSamples(*map(self.to_torch, data))


class MaskablePPGDictRolloutBuffer(UnflattenedRolloutBuffer, MaskableDictRolloutBuffer):
    """
    sb3-contrib's ``MaskableDictRolloutBuffer`` with the same samples, made faster as ``PPGRolloutBuffer``. The default
    of ``MaskablePPG`` for Dict observation spaces.
    """

    def add(self, *args: Any, action_masks: np.ndarray | None = None, **kwargs: Any) -> None:
        """sb3-contrib's ``add()``: the masks (where given), then the step as ``PPGRolloutBuffer`` writes it."""
        store_action_masks(self, action_masks)
        super().add(*args, **kwargs)

    def _step_major_samples(self, steps: np.ndarray, envs: np.ndarray) -> MaskableDictRolloutBufferSamples:
        return MaskableDictRolloutBufferSamples(
            {key: self.to_torch(step_major_samples(array, steps, envs)) for key, array in self.observations.items()},
            self.to_torch(self.actions[steps, envs]),
            *(self.to_torch(getattr(self, name)[steps, envs]) for name in SAMPLED_VALUE_ARRAYS),
            self.to_torch(self.action_masks[steps, envs].reshape(-1, self.mask_dims)),
        )
