"""
MaskablePPG's rollout buffers: sb3-contrib's maskable buffers with their samples, made faster as
:class:`~sb3_ppg.common.buffers.PPGRolloutBuffer` (kept observation arrays, minibatches gathered without flattening).
"""

from collections.abc import Generator

import numpy as np
from sb3_contrib.common.maskable.buffers import (
    MaskableDictRolloutBuffer,
    MaskableDictRolloutBufferSamples,
    MaskableRolloutBuffer,
    MaskableRolloutBufferSamples,
)
from stable_baselines3.common.vec_env import VecNormalize

from sb3_ppg.common.buffers import SAMPLED_VALUE_ARRAYS, reuse_observation_arrays, step_major_samples, transition_minibatches


class MaskablePPGRolloutBuffer(MaskableRolloutBuffer):
    """
    sb3-contrib's ``MaskableRolloutBuffer`` with the same samples, made faster as ``PPGRolloutBuffer``. The default of
    ``MaskablePPG``.
    """

    #: ``_get_samples`` takes SB3's flat sample indices whether the arrays are flattened or not
    samples_unflattened = True

    def reset(self) -> None:
        kept = getattr(self, "_kept_observations", None)
        super().reset()
        self._kept_observations = reuse_observation_arrays(self, kept)

    def get(self, batch_size: int | None = None) -> Generator[MaskableRolloutBufferSamples, None, None]:  # type: ignore[override]
        """sb3-contrib's minibatches: the same permutation of the ``n_envs * n_steps`` samples, the same samples."""
        yield from transition_minibatches(self, batch_size)  # type: ignore[misc]

    def _get_samples(self, batch_inds: np.ndarray, env: VecNormalize | None = None) -> MaskableRolloutBufferSamples:  # type: ignore[override]
        """The samples of SB3's flat indices (``env * n_steps + step``), read from the arrays flattened or not."""
        if self.generator_ready:
            return super()._get_samples(batch_inds, env)
        steps, envs = batch_inds % self.buffer_size, batch_inds // self.buffer_size
        data = (
            step_major_samples(self.observations, steps, envs),
            self.actions[steps, envs],
            *(getattr(self, name)[steps, envs] for name in SAMPLED_VALUE_ARRAYS),
            self.action_masks[steps, envs].reshape(-1, self.mask_dims),
        )
        return MaskableRolloutBufferSamples(*map(self.to_torch, data))


class MaskablePPGDictRolloutBuffer(MaskableDictRolloutBuffer):
    """
    sb3-contrib's ``MaskableDictRolloutBuffer`` with the same samples, made faster as ``PPGRolloutBuffer``. The default
    of ``MaskablePPG`` for Dict observation spaces.
    """

    samples_unflattened = True

    def reset(self) -> None:
        kept = getattr(self, "_kept_observations", None)
        super().reset()
        self._kept_observations = reuse_observation_arrays(self, kept)

    def get(self, batch_size: int | None = None) -> Generator[MaskableDictRolloutBufferSamples, None, None]:  # type: ignore[override]
        """sb3-contrib's minibatches: the same permutation of the ``n_envs * n_steps`` samples, the same samples."""
        yield from transition_minibatches(self, batch_size)  # type: ignore[misc]

    def _get_samples(self, batch_inds: np.ndarray, env: VecNormalize | None = None) -> MaskableDictRolloutBufferSamples:  # type: ignore[override]
        """The samples of SB3's flat indices (``env * n_steps + step``), read from the arrays flattened or not."""
        if self.generator_ready:
            return super()._get_samples(batch_inds, env)
        steps, envs = batch_inds % self.buffer_size, batch_inds // self.buffer_size
        return MaskableDictRolloutBufferSamples(
            {key: self.to_torch(step_major_samples(array, steps, envs)) for key, array in self.observations.items()},
            self.to_torch(self.actions[steps, envs]),
            *(self.to_torch(getattr(self, name)[steps, envs]) for name in SAMPLED_VALUE_ARRAYS),
            self.to_torch(self.action_masks[steps, envs].reshape(-1, self.mask_dims)),
        )
