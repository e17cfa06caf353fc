"""
The rollout on the device: copied there once per ``train()`` (:func:`rollout_to_device`), and the policy phase's
minibatches gathered there (:func:`device_minibatches`) instead of one copy from the host per minibatch and field.
"""

from collections.abc import Generator

import numpy as np
import torch as th
from stable_baselines3.common.buffers import DictRolloutBuffer, RolloutBuffer
from stable_baselines3.common.type_aliases import DictRolloutBufferSamples, RolloutBufferSamples

from sb3_ppg.common.rollout_buffers import (
    SAMPLED_VALUE_ARRAYS,
    DeviceRollout,
    PPGDictRolloutBuffer,
    PPGRolloutBuffer,
    TensorObs,
    env_rollout_order,
)

#: The rollout buffers whose samples :func:`device_minibatches` makes on the device (SB3's, and PPG's with SB3's samples)
DEVICE_GATHERED_BUFFERS = (RolloutBuffer, DictRolloutBuffer, PPGRolloutBuffer, PPGDictRolloutBuffer)


def gathers_on_device(rollout_buffer: RolloutBuffer, device: th.device) -> bool:
    """Whether the policy phase gathers its minibatches on the device (``device_minibatches``): SB3's samples on CUDA."""
    return device.type == "cuda" and type(rollout_buffer) in DEVICE_GATHERED_BUFFERS


def rollout_to_device(rollout_buffer: RolloutBuffer, device: th.device) -> DeviceRollout:
    """
    A full rollout buffer's arrays on ``device``, one contiguous copy each (views on the CPU): what
    :func:`device_minibatches` gathers from, and ``AuxiliaryBuffer.add`` stores from.

    :param rollout_buffer: a full rollout buffer of ``DEVICE_GATHERED_BUFFERS``
    :param device: where to copy the arrays
    """
    n_samples = rollout_buffer.buffer_size * rollout_buffer.n_envs
    step_dims = 1 if rollout_buffer.generator_ready else 2

    def to_device(array: np.ndarray) -> th.Tensor:
        """An array as ``(n_samples, ...)`` rows; one without feature axis as ``(n_samples, 1)`` as SB3 flattens it."""
        return th.as_tensor(array.reshape(n_samples, *(array.shape[step_dims:] or (1,)))).to(device)

    observations = rollout_buffer.observations
    if isinstance(observations, dict):
        device_observations: TensorObs = {key: to_device(value) for key, value in observations.items()}
    else:
        device_observations = to_device(observations)
    # SB3's samples: actions as float32, the per-step values flat
    fields = [to_device(rollout_buffer.actions.astype(np.float32, copy=False))] + [
        to_device(getattr(rollout_buffer, name)).reshape(-1) for name in SAMPLED_VALUE_ARRAYS
    ]
    return DeviceRollout(device_observations, fields, not rollout_buffer.generator_ready)


def device_minibatches(
    rollout_buffer: RolloutBuffer,
    batch_size: int,
    device: th.device,
    order: np.ndarray | None = None,
    device_rollout: DeviceRollout | None = None,
) -> Generator[RolloutBufferSamples | DictRolloutBufferSamples, None, None]:
    """
    One epoch of policy-phase minibatches as SB3's ``RolloutBuffer.get(batch_size)`` makes them (the same permutation
    from NumPy's global generator, the same samples), gathered on ``device`` from one copy of the rollout.

    :param rollout_buffer: a full rollout buffer of ``DEVICE_GATHERED_BUFFERS`` (not another subclass: other samples)
    :param batch_size: the minibatch size
    :param device: where the minibatches are gathered
    :param order: the flat sample indices (``env * n_steps + step``) of the epoch, in order (e.g.
        ``env_rollout_order``); ``None``: SB3's permutation of all samples
    :param device_rollout: the rollout already on ``device`` (made from this buffer's arrays as they are now);
        ``None``: copied for this epoch
    """
    n_steps, n_envs = rollout_buffer.buffer_size, rollout_buffer.n_envs
    indices = np.random.permutation(n_steps * n_envs) if order is None else order
    if device_rollout is None:
        device_rollout = rollout_to_device(rollout_buffer, device)
    device_rollout.check(n_steps, n_envs)
    if device_rollout.step_major:  # row = step * n_envs + env
        rows = indices % n_steps * n_envs + indices // n_steps
    else:  # flattened (by SB3's get()): row = sample index
        rows = indices
    observations = device_rollout.observations
    samples_class = DictRolloutBufferSamples if isinstance(observations, dict) else RolloutBufferSamples
    device_rows = th.as_tensor(rows).to(device)
    for start in range(0, len(rows), batch_size):
        minibatch_rows = device_rows[start : start + batch_size]
        if isinstance(observations, dict):
            minibatch_observations: TensorObs = {key: value[minibatch_rows] for key, value in observations.items()}
        else:
            minibatch_observations = observations[minibatch_rows]
        fields = (field[minibatch_rows] for field in device_rollout.fields)
        yield samples_class(minibatch_observations, *fields)  # type: ignore[arg-type]


def device_env_minibatches(
    rollout_buffer: RolloutBuffer,
    batch_size: int,
    device: th.device,
    generator: np.random.Generator | None = None,
    device_rollout: DeviceRollout | None = None,
) -> Generator[RolloutBufferSamples | DictRolloutBufferSamples, None, None]:
    """
    ``env_minibatches`` gathered on the device: the same whole env rollouts in the same order
    (:func:`device_minibatches` of ``env_rollout_order``).

    :param generator: the generator of the permutation of the envs; ``None``: NumPy's global one (which SB3 seeds)
    """
    n_steps = rollout_buffer.buffer_size
    order = env_rollout_order(rollout_buffer.n_envs, n_steps, generator)
    yield from device_minibatches(rollout_buffer, batch_size // n_steps * n_steps, device, order, device_rollout)
