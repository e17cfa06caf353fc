"""
PPG's buffers: the rollout buffers of the policy phase (SB3's samples, gathered without flattening) and their
minibatches, and the auxiliary buffer: the last ``n_policy_iters`` rollouts, kept as whole per-env rollouts.
"""

import io
import pathlib
import warnings
from collections.abc import Callable, Generator
from typing import Any, NamedTuple

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import DictRolloutBuffer, RolloutBuffer
from stable_baselines3.common.preprocessing import get_obs_shape
from stable_baselines3.common.type_aliases import DictRolloutBufferSamples, RolloutBufferSamples
from stable_baselines3.common.utils import explained_variance, get_device, obs_as_tensor
from stable_baselines3.common.vec_env import VecEnv, VecNormalize

from sb3_ppg.common.array_files import read_array_file, space_from_json, space_to_json, write_array_file
from sb3_ppg.common.distributions import distribution_param_dim
from sb3_ppg.common.hyperparameters import AUX_BUFFER_DEVICES

AUX_BUFFER_FORMAT = "sb3_ppg.aux_buffer"
#: The versions of the auxiliary buffer's files: 1 without action masks, 2 with them (MaskablePPG's)
AUX_BUFFER_VERSIONS = (1, 2)

ObsArray = np.ndarray | dict[str, np.ndarray]
#: An array of the auxiliary buffer: a NumPy array in CPU memory (pageable or pinned), or a tensor on the device
StoredArray = np.ndarray | th.Tensor
TensorObs = th.Tensor | dict[str, th.Tensor]


class AuxiliaryBufferSamples(NamedTuple):
    """
    One auxiliary-phase minibatch: ``n`` whole rollouts of ``n_steps`` consecutive steps, flattened rollout-major.

    :param observations: observations, shape ``(n * n_steps, *obs_shape)`` (a dict of those for Dict spaces)
    :param returns: value targets, shape (n * n_steps,)
    :param old_distribution_params: old-policy distribution parameters, shape (n * n_steps, n_params)
    :param rollout_indices: the buffer rows the rollouts came from, shape (n,)
    :param action_masks: the valid actions of each state, shape (n * n_steps, mask_dims); ``None`` without masks
    """

    observations: TensorObs
    returns: th.Tensor
    old_distribution_params: th.Tensor
    rollout_indices: np.ndarray
    action_masks: th.Tensor | None = None


#: The per-step arrays that the rollout buffers' ``get()`` flattens to ``(n_envs * n_steps, ...)``, env-major: those of
#: SB3's ``RolloutBuffer`` and ``DictRolloutBuffer`` (observations a dict), and the ``action_masks`` of maskable buffers
FLATTENED_ROLLOUT_ARRAYS = ("observations", "actions", "values", "log_probs", "advantages", "returns", "action_masks")
#: The fields of SB3's rollout samples after the observations and actions, by the buffer's array they come from
SAMPLED_VALUE_ARRAYS = ("values", "log_probs", "advantages", "returns")


def _reused_zeros(kept: np.ndarray | None, fresh: np.ndarray) -> np.ndarray:
    """``kept`` filled with zeros where it has ``fresh``'s shape and dtype, else ``fresh``."""
    if kept is None or kept.shape != fresh.shape or kept.dtype != fresh.dtype:
        return fresh
    kept.fill(0)
    return kept


def step_major_samples(array: np.ndarray, steps: np.ndarray, envs: np.ndarray) -> np.ndarray:
    """
    The rows ``(steps[i], envs[i])`` of an ``(n_steps, n_envs, ...)`` array, shaped as SB3's flattened array gives them
    (``swap_and_flatten`` adds a feature axis to an array without one: a scalar observation is sampled as ``(B, 1)``).
    """
    rows = array[steps, envs]
    return rows.reshape(-1, 1) if array.ndim == 2 else rows


class UnflattenedRolloutBuffer:
    """
    What PPG's rollout buffers add to SB3's and sb3-contrib's (it comes first among their bases), with their samples:
    ``reset()`` keeps the observation arrays from one rollout to the next (zeroed, not allocated anew, whose pages would
    be mapped one at a time as the rollout writes them), ``add()`` copies each step's values once, and ``get()``
    gathers its minibatches from the ``(n_steps, n_envs, ...)`` arrays without flattening them first
    (docs/throughput.md). A subclass reads the samples of given steps and envs (``_step_major_samples``); a maskable
    one stores the masks before calling ``add()``.
    """

    # SB3's buffer attributes that the methods below read
    buffer_size: int
    n_envs: int
    pos: int
    full: bool
    generator_ready: bool
    observation_space: spaces.Space
    obs_shape: tuple[int, ...] | dict[str, tuple[int, ...]]
    action_dim: int
    observations: ObsArray
    actions: np.ndarray
    rewards: np.ndarray
    episode_starts: np.ndarray
    values: np.ndarray
    log_probs: np.ndarray

    def reset(self) -> None:
        """SB3's ``reset()``, the previous rollout's observation arrays put back zeroed where they fit."""
        kept = getattr(self, "_kept_observations", None)
        super().reset()  # type: ignore[misc]
        fresh = self.observations
        if isinstance(fresh, dict):
            kept_arrays = kept if isinstance(kept, dict) else {}
            self.observations = {key: _reused_zeros(kept_arrays.get(key), array) for key, array in fresh.items()}
            self._kept_observations: ObsArray = dict(self.observations)
        else:
            self.observations = self._kept_observations = _reused_zeros(kept if isinstance(kept, np.ndarray) else None, fresh)
        self._step_started = False

    def add(
        self,
        obs: ObsArray,
        action: np.ndarray,
        reward: np.ndarray,
        episode_start: np.ndarray,
        value: th.Tensor,
        log_prob: th.Tensor,
    ) -> None:
        """
        SB3's ``add()``, writing each value into its array once: SB3 first copies the observation (and the actions,
        rewards, values and log-probabilities) into a new array, then that array into its own. It is
        ``add_before_step()`` then ``add_after_step()``.

        :param obs: Observation (a dict of them for Dict spaces)
        :param action: Action
        :param reward: Reward
        :param episode_start: Start of episode signal
        :param value: Estimated value of the current state
        :param log_prob: Log probability of the action
        """
        self.add_before_step(obs, action, episode_start, value, log_prob)
        self.add_after_step(reward)

    def add_before_step(
        self, obs: ObsArray, action: np.ndarray, episode_start: np.ndarray, value: th.Tensor, log_prob: th.Tensor
    ) -> None:
        """
        The first part of ``add()``: what is known of the step before the envs step, written into row ``pos`` (PPG's
        rollout writes it while the envs step); ``add_after_step()`` adds the reward and ends the step.

        :param obs: Observation (a dict of them for Dict spaces)
        :param action: Action
        :param episode_start: Start of episode signal
        :param value: Estimated value of the current state
        :param log_prob: Log probability of the action
        """
        if getattr(self, "_step_started", False):
            raise RuntimeError(f"add_before_step() twice for row {self.pos} of the rollout buffer: add_after_step() first")
        if len(log_prob.shape) == 0:
            log_prob = log_prob.reshape(-1, 1)  # as SB3: a 0-d tensor broadcast into the row
        if isinstance(self.observations, dict):
            assert isinstance(obs, dict)
            for key, array in self.observations.items():
                array[self.pos] = self._observation_row(obs[key], self.observation_space[key], key)  # type: ignore[index]
        else:
            self.observations[self.pos] = self._observation_row(obs, self.observation_space, None)
        self.actions[self.pos] = action.reshape((self.n_envs, self.action_dim))
        self.episode_starts[self.pos] = episode_start
        self.values[self.pos] = value.cpu().numpy().reshape(-1)
        self.log_probs[self.pos] = log_prob.cpu().numpy()
        self._step_started = True

    def add_after_step(self, reward: np.ndarray) -> None:
        """
        The second part of ``add()``: the step's reward; the step is then complete.

        :param reward: Reward
        """
        if not getattr(self, "_step_started", False):
            raise RuntimeError(f"add_after_step() for row {self.pos} of the rollout buffer without add_before_step()")
        self.rewards[self.pos] = reward
        self._step_started = False
        self.pos += 1
        if self.pos == self.buffer_size:
            self.full = True

    def discard_before_step(self) -> None:
        """Undo ``add_before_step()`` (a rollout stopped before the step's reward): row ``pos`` as ``reset()`` left it."""
        if isinstance(self.observations, dict):
            for array in self.observations.values():
                array[self.pos] = 0
        else:
            self.observations[self.pos] = 0
        for array in (self.actions, self.episode_starts, self.values, self.log_probs):
            array[self.pos] = 0
        self._step_started = False

    def _observation_row(self, obs: np.ndarray, space: spaces.Space, key: str | None) -> np.ndarray:
        """One step's observations, as SB3 writes them (Discrete ones reshaped to ``(n_envs, 1)``)."""
        if isinstance(space, spaces.Discrete):
            obs_shape = self.obs_shape if key is None else self.obs_shape[key]  # type: ignore[index]
            return np.asarray(obs).reshape((self.n_envs, *obs_shape))
        return obs

    def get(self, batch_size: int | None = None) -> Generator[Any, None, None]:
        """SB3's minibatches: the same permutation (NumPy's global generator) of the samples, the same samples."""
        assert self.full, "The rollout buffer is not full"
        n_samples = self.buffer_size * self.n_envs
        indices = np.random.permutation(n_samples)
        batch_size = n_samples if batch_size is None else batch_size
        for start in range(0, n_samples, batch_size):
            yield self._get_samples(indices[start : start + batch_size])

    def _get_samples(self, batch_inds: np.ndarray, env: VecNormalize | None = None) -> Any:
        """The samples of SB3's flat indices (``env * n_steps + step``), read from the arrays flattened or not."""
        if self.generator_ready:
            return super()._get_samples(batch_inds, env)  # type: ignore[misc]
        return self._step_major_samples(batch_inds % self.buffer_size, batch_inds // self.buffer_size)

    def _step_major_samples(self, steps: np.ndarray, envs: np.ndarray) -> Any:
        """The samples of steps ``steps[i]`` of envs ``envs[i]``, read from the ``(n_steps, n_envs, ...)`` arrays."""
        raise NotImplementedError


def writes_while_envs_step(env: VecEnv, rollout_buffer: RolloutBuffer) -> bool:
    """
    Whether PPG's rollout writes each step into the rollout buffer while the envs step, between ``step_async()`` and
    ``step_wait()``: with PPG's buffers (``add_before_step()``) and an env whose ``step()`` is SB3's (those two calls).
    """
    steps_in_two_calls = type(env).step is VecEnv.step and "step" not in vars(env)
    return isinstance(rollout_buffer, UnflattenedRolloutBuffer) and steps_in_two_calls


class PPGRolloutBuffer(UnflattenedRolloutBuffer, RolloutBuffer):
    """
    SB3's ``RolloutBuffer`` with the same samples, made faster for large observations as
    :class:`UnflattenedRolloutBuffer` says. The default of ``PPG``.
    """

    def _step_major_samples(self, steps: np.ndarray, envs: np.ndarray) -> RolloutBufferSamples:
        data = (
            step_major_samples(self.observations, steps, envs),
            self.actions[steps, envs].astype(np.float32, copy=False),
            *(getattr(self, name)[steps, envs] for name in SAMPLED_VALUE_ARRAYS),
        )
        return RolloutBufferSamples(*map(self.to_torch, data))


class PPGDictRolloutBuffer(UnflattenedRolloutBuffer, DictRolloutBuffer):
    """
    SB3's ``DictRolloutBuffer`` made faster as :class:`PPGRolloutBuffer`, with the same samples. The default of ``PPG``
    for Dict observation spaces.
    """

    def _step_major_samples(self, steps: np.ndarray, envs: np.ndarray) -> DictRolloutBufferSamples:
        return DictRolloutBufferSamples(
            {key: self.to_torch(step_major_samples(array, steps, envs)) for key, array in self.observations.items()},
            self.to_torch(self.actions[steps, envs].astype(np.float32, copy=False)),
            *(self.to_torch(getattr(self, name)[steps, envs]) for name in SAMPLED_VALUE_ARRAYS),
        )


#: The rollout buffers whose samples :func:`device_minibatches` makes on the device (SB3's, and PPG's with SB3's samples)
DEVICE_GATHERED_BUFFERS = (RolloutBuffer, DictRolloutBuffer, PPGRolloutBuffer, PPGDictRolloutBuffer)


def flatten_rollout_buffer(rollout_buffer: RolloutBuffer) -> None:
    """
    Flatten a full rollout buffer's per-step arrays to ``(n_envs * n_steps, ...)`` as its ``get()`` does (once), so
    that sample ``env * n_steps + step`` is step ``step`` of env ``env``.
    """
    if rollout_buffer.generator_ready:
        return
    for name in FLATTENED_ROLLOUT_ARRAYS:
        array = getattr(rollout_buffer, name, None)
        if isinstance(array, dict):
            setattr(rollout_buffer, name, {key: rollout_buffer.swap_and_flatten(value) for key, value in array.items()})
        elif array is not None:
            setattr(rollout_buffer, name, rollout_buffer.swap_and_flatten(array))
    rollout_buffer.generator_ready = True


class DeviceRollout(NamedTuple):
    """
    A full rollout buffer's sampled arrays copied to a device, each as ``(n_samples, ...)`` rows (see
    :func:`rollout_to_device`).

    :param observations: the observations (a dict of them for Dict spaces)
    :param fields: the other fields of SB3's samples, in their order: actions (float32), values, log-probabilities,
        advantages, returns
    :param step_major: whether row ``step * n_envs + env`` holds a sample (the buffer's arrays as they are), else row
        ``env * n_steps + step`` (SB3's flattened arrays)
    """

    observations: TensorObs
    fields: list[th.Tensor]
    step_major: bool

    @property
    def returns(self) -> th.Tensor:
        """The value targets, flat: the last field."""
        return self.fields[-1]


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


def check_device_rollout(device_rollout: DeviceRollout, n_steps: int, n_envs: int) -> None:
    """Refuse a device copy that is not of a rollout of ``n_steps`` steps of ``n_envs`` envs."""
    n_copied = device_rollout.returns.numel()
    if n_copied != n_steps * n_envs:
        raise ValueError(
            f"The device copy of the rollout holds {n_copied} steps, not the rollout buffer's {n_steps} x {n_envs}: "
            "copy this rollout buffer (rollout_to_device)."
        )


def env_rollout_order(n_envs: int, n_steps: int, generator: np.random.Generator | None = None) -> np.ndarray:
    """
    The flat sample indices (``env * n_steps + step``) of the envs' whole rollouts in one random order of the envs,
    each env's steps in time order (``policy_minibatches="envs"``, the paper's code).

    :param generator: the generator of the permutation; ``None``: NumPy's global one (which SB3 seeds)
    """
    env_order = generator.permutation(n_envs) if generator is not None else np.random.permutation(n_envs)
    return (env_order[:, None] * n_steps + np.arange(n_steps)).reshape(-1)


def env_minibatches(
    rollout_buffer: RolloutBuffer,
    batch_size: int,
    generator: np.random.Generator | None = None,
    device: th.device | None = None,
    device_rollout: DeviceRollout | None = None,
) -> Generator[RolloutBufferSamples | DictRolloutBufferSamples, None, None]:
    """
    One epoch of policy-phase minibatches of whole env rollouts (``policy_minibatches="envs"``, the paper's code): one
    permutation of the envs cut into groups of ``batch_size // n_steps`` envs, each env's steps in time order.

    :param rollout_buffer: SB3's rollout buffer (or a subclass: its ``_get_samples`` makes the minibatches), full
    :param batch_size: the minibatch size, a multiple of ``n_steps``
    :param generator: the generator of the permutation; ``None``: NumPy's global one (which SB3 seeds)
    :param device: gather the same samples on this device (:func:`device_minibatches`); ``None``: the buffer's
        ``_get_samples``
    :param device_rollout: with ``device``, the rollout already there (see :func:`device_minibatches`)
    :return: a generator of the rollout buffer's samples
    """
    n_steps = rollout_buffer.buffer_size
    order = env_rollout_order(rollout_buffer.n_envs, n_steps, generator)
    chunk = batch_size // n_steps * n_steps
    if device is not None:
        yield from device_minibatches(rollout_buffer, chunk, device, order, device_rollout)
        return
    if not isinstance(rollout_buffer, UnflattenedRolloutBuffer):
        flatten_rollout_buffer(rollout_buffer)
    for start in range(0, len(order), chunk):
        yield rollout_buffer._get_samples(order[start : start + chunk])


def device_minibatches(
    rollout_buffer: RolloutBuffer,
    batch_size: int,
    device: th.device,
    order: np.ndarray | None = None,
    device_rollout: DeviceRollout | None = None,
) -> Generator[RolloutBufferSamples | DictRolloutBufferSamples, None, None]:
    """
    One epoch of policy-phase minibatches as SB3's ``RolloutBuffer.get(batch_size)`` makes them (the same permutation
    from NumPy's global generator, the same samples), gathered on ``device`` from one copy of the rollout
    (:func:`rollout_to_device`) instead of a copy from the host per minibatch and field (each of which waits for the
    device).

    :param rollout_buffer: a full rollout buffer of ``DEVICE_GATHERED_BUFFERS`` (not another subclass: other samples)
    :param batch_size: the minibatch size
    :param device: where the minibatches are gathered
    :param order: the flat sample indices (``env * n_steps + step``) of the epoch, in order (e.g.
        :func:`env_rollout_order`); ``None``: SB3's permutation of all samples
    :param device_rollout: the rollout already on ``device`` (made from this buffer's arrays as they are now);
        ``None``: copied for this epoch
    """
    n_steps, n_envs = rollout_buffer.buffer_size, rollout_buffer.n_envs
    indices = np.random.permutation(n_steps * n_envs) if order is None else order
    if device_rollout is None:
        device_rollout = rollout_to_device(rollout_buffer, device)
    check_device_rollout(device_rollout, n_steps, n_envs)
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


def rollout_explained_variance(rollout_buffer: RolloutBuffer) -> float:
    """The explained variance of the rollout's returns by its values, summed in SB3's (flattened, env-major) order."""
    values, returns = rollout_buffer.values, rollout_buffer.returns
    if not rollout_buffer.generator_ready:
        values, returns = values.swapaxes(0, 1), returns.swapaxes(0, 1)
    return float(explained_variance(values.flatten(), returns.flatten()))


def gathers_on_device(rollout_buffer: RolloutBuffer, device: th.device) -> bool:
    """Whether the policy phase gathers its minibatches on the device (``device_minibatches``): SB3's samples on CUDA."""
    return device.type == "cuda" and type(rollout_buffer) in DEVICE_GATHERED_BUFFERS


def memory_info() -> tuple[int | None, int | None]:
    """
    The memory available now and the memory this process can have in all, in bytes (None where unknown):
    ``MemAvailable`` and ``MemTotal`` of ``/proc/meminfo``, the total capped by a cgroup memory limit.
    """
    values = {}
    try:
        with open("/proc/meminfo") as file:
            for line in file:
                name, _, rest = line.partition(":")
                values[name] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    total = values.get("MemTotal")
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(limit_file) as file:
                limit = int(file.read().strip())
        except (OSError, ValueError):  # absent, or "max" (no limit)
            continue
        total = limit if total is None else min(total, limit)
    return values.get("MemAvailable"), total


def check_aux_buffer_memory(nbytes: int, n_policy_iters: int, n_envs: int, n_steps: int) -> None:
    """
    Check that the auxiliary buffer fits in memory before allocating it: a warning above the memory available now, a
    ``ValueError`` above the memory this process can have (see docs/ppg.md, Memory).

    :param nbytes: the buffer's size (``AuxiliaryBuffer.estimate_nbytes``); the other parameters are for the message
    """
    available, total = memory_info()
    gib = 1024**3
    size = (
        f"The auxiliary buffer needs {nbytes / gib:.3g} GiB (n_policy_iters * n_envs * n_steps = {n_policy_iters} * "
        f"{n_envs} * {n_steps} steps of {nbytes // max(1, n_policy_iters * n_envs * n_steps)} bytes)"
    )
    fix = "reduce n_policy_iters, n_steps or the number of envs (or the observations' size)"
    if total is not None and nbytes > total:
        raise ValueError(f"{size}, more than this machine's {total / gib:.3g} GiB of memory: {fix}.")
    if available is not None and nbytes > available:
        warnings.warn(
            f"{size}, more than the {available / gib:.3g} GiB of memory available now: the machine may swap or the "
            f"process be killed. If so, {fix}."
        )


#: ``aux_buffer_device="auto"`` keeps the buffer on the GPU when it takes at most this share of the GPU's free memory
#: (the rest is left to the networks' activations, the rollout buffer and the allocator's cache)
AUX_BUFFER_DEVICE_MEMORY_SHARE = 0.5


def resolve_aux_buffer_storage(
    aux_buffer_device: str,
    device: th.device,
    nbytes: int,
    device_memory_info: Callable[[th.device], tuple[int, int]] | None = None,
) -> tuple[str, str]:
    """
    Where the auxiliary buffer's arrays live (``"host"``, ``"pinned"`` or ``"device"``, see docs/ppg.md, Memory) and
    why, for the log.

    :param aux_buffer_device: ``"cpu"``, ``"pinned"``, ``"device"`` or ``"auto"``
    :param device: the model's device
    :param nbytes: the buffer's size (``AuxiliaryBuffer.estimate_nbytes``)
    :param device_memory_info: ``(free, total)`` bytes of a CUDA device; ``None``: ``torch.cuda.mem_get_info``
    :return: the storage and the reason
    """
    if aux_buffer_device not in AUX_BUFFER_DEVICES:
        raise ValueError(f"aux_buffer_device must be one of {AUX_BUFFER_DEVICES}, got {aux_buffer_device!r}.")
    gib = 1024**3
    if aux_buffer_device == "cpu":
        return "host", "aux_buffer_device='cpu'"
    if device.type != "cuda":
        if aux_buffer_device == "device":
            return "device", f"aux_buffer_device='device' (the model is on {device})"
        return "host", f"aux_buffer_device={aux_buffer_device!r} and the model is on {device}, not a CUDA device"
    if aux_buffer_device == "pinned":
        return "pinned", "aux_buffer_device='pinned'"
    free, _ = (device_memory_info or th.cuda.mem_get_info)(device)
    fits = nbytes <= AUX_BUFFER_DEVICE_MEMORY_SHARE * free
    if aux_buffer_device == "device":
        if nbytes > free:
            raise ValueError(
                f"aux_buffer_device='device': the auxiliary buffer needs {nbytes / gib:.3g} GiB, more than the "
                f"{free / gib:.3g} GiB free on {device}: use aux_buffer_device='auto' or 'pinned' (host memory)."
            )
        return "device", "aux_buffer_device='device'"
    share = f"{AUX_BUFFER_DEVICE_MEMORY_SHARE:.0%} of the {free / gib:.3g} GiB free on {device}"
    if fits:
        return "device", f"aux_buffer_device='auto': {nbytes / gib:.3g} GiB fit in {share}"
    return "pinned", f"aux_buffer_device='auto': {nbytes / gib:.3g} GiB do not fit in {share}"


def pinned_zeros(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray | None:
    """A zero array in page-locked CPU memory (a NumPy view of a pinned tensor); ``None`` where it cannot be pinned."""
    try:
        tensor = th.zeros(shape, dtype=_torch_dtype(dtype), pin_memory=True)
    except RuntimeError:
        return None
    return tensor.numpy()


def _torch_dtype(dtype: np.dtype) -> th.dtype:
    """The torch dtype of a NumPy dtype."""
    return th.from_numpy(np.zeros(0, dtype=dtype)).dtype


class AuxiliaryBuffer:
    """
    Storage for PPG's auxiliary phase: each row is one env's rollout of one policy iteration, ``n_steps`` observations
    (in the space's dtype) with their value targets and old-policy distribution parameters (see docs/ppg.md, Memory).

    :param n_policy_iters: policy iterations per auxiliary phase (N_pi)
    :param n_steps: steps per rollout
    :param n_envs: number of parallel environments
    :param observation_space: observation space
    :param action_space: action space (sets the number of distribution parameters per step)
    :param device: where minibatches are sent
    :param n_distribution_params: floats per step of the old policy's distribution; ``None``: PPG's for ``action_space``
    :param mask_dims: booleans per step of the action masks to store (``MaskablePPG``'s); 0: no masks
    :param storage: where the arrays live: ``"host"``, ``"pinned"`` or ``"device"`` (see :func:`resolve_aux_buffer_storage`)
    """

    observations: ObsArray | dict[str, th.Tensor] | th.Tensor
    returns: StoredArray
    old_distribution_params: StoredArray
    action_masks: StoredArray | None

    def __init__(
        self,
        n_policy_iters: int,
        n_steps: int,
        n_envs: int,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        device: th.device | str = "auto",
        n_distribution_params: int | None = None,
        mask_dims: int = 0,
        storage: str = "host",
    ) -> None:
        if storage not in ("host", "pinned", "device"):
            raise ValueError(f"storage must be 'host', 'pinned' or 'device', got {storage!r}.")
        self.n_policy_iters = n_policy_iters
        self.n_steps = n_steps
        self.n_envs = n_envs
        self.observation_space = observation_space
        self.action_space = action_space
        self.device = get_device(device)
        self.buffer_size = n_policy_iters * n_envs  # number of rollouts (rows)
        if n_distribution_params is None:
            n_distribution_params = distribution_param_dim(action_space)
        self.n_distribution_params = n_distribution_params
        self.mask_dims = mask_dims
        self.storage = storage
        # Whether the arrays are page-locked (storage "pinned" where pinning succeeded), and the minibatches of a
        # pinned buffer gathered into reused page-locked staging arrays (on CUDA) before their non-blocking copy
        self.pinned = storage == "pinned"
        self._staged = storage == "pinned" and self.device.type == "cuda"
        self._staging: list[dict[str, th.Tensor]] = [{}, {}]
        self._staging_events: list[Any] = [None, None]
        # Same per-step shapes as SB3's rollout buffer (a Discrete observation is stored with shape (1,))
        obs_shape = get_obs_shape(observation_space)
        if isinstance(observation_space, spaces.Dict):
            assert isinstance(obs_shape, dict)
            self.observations = {
                key: self._zeros((self.buffer_size, n_steps, *obs_shape[key]), space.dtype)
                for key, space in observation_space.spaces.items()
            }
        else:
            assert isinstance(obs_shape, tuple)
            self.observations = self._zeros((self.buffer_size, n_steps, *obs_shape), observation_space.dtype)
        self.returns = self._zeros((self.buffer_size, n_steps), np.float32)
        self.old_distribution_params = self._zeros((self.buffer_size, n_steps, self.n_distribution_params), np.float32)
        # One boolean per action and step (a byte each: masks are small next to the observations)
        self.action_masks = None
        if mask_dims > 0:
            self.action_masks = self._zeros((self.buffer_size, n_steps, mask_dims), bool)
            self.action_masks[:] = True
        self.pos = 0
        # How many times reset() emptied the buffer: a row holds the same rollout while this count stays
        self.n_resets = 0

    def _zeros(self, shape: tuple[int, ...], dtype: Any) -> StoredArray:
        """A zero array of the buffer's storage (a pinned one falls back to pageable memory, see ``pinned``)."""
        if self.storage == "device":
            return th.zeros(shape, dtype=_torch_dtype(np.dtype(dtype)), device=self.device)
        if self.storage == "pinned":
            array = pinned_zeros(shape, np.dtype(dtype))
            if array is not None:
                return array
            self.pinned = False
        return np.zeros(shape, dtype=dtype)

    def _with_dtype(self, array: StoredArray, dtype: np.dtype) -> StoredArray:
        """``array`` itself, or a new zero array of its shape and of the buffer's storage when its dtype is not ``dtype``."""
        if isinstance(array, th.Tensor):
            return array if array.dtype == _torch_dtype(dtype) else self._zeros(tuple(array.shape), dtype)
        return array if array.dtype == dtype else self._zeros(array.shape, dtype)

    def _write(self, target: StoredArray, rows: slice, values: np.ndarray) -> None:
        """Copy ``values`` (host arrays) into some rows of a stored array."""
        if isinstance(target, th.Tensor):
            target[rows] = th.as_tensor(values).to(target.device, target.dtype)
        else:
            target[rows] = values

    def _take(self, array: StoredArray, rows: np.ndarray | slice, device_rows: th.Tensor | None = None) -> StoredArray:
        """
        Some rows of a stored array (a copy for an index array, a view for a slice); ``device_rows``: the same index
        array already on the tensor's device (no copy from the host, which would wait for the device).
        """
        if isinstance(array, th.Tensor) and isinstance(rows, np.ndarray):
            return array[th.as_tensor(rows, device=array.device) if device_rows is None else device_rows]
        return array[rows]

    @staticmethod
    def _to_numpy(array: StoredArray) -> np.ndarray:
        """A stored array as a NumPy array (a view in CPU memory, a copy from a device)."""
        return array.cpu().numpy() if isinstance(array, th.Tensor) else array

    @staticmethod
    def estimate_nbytes(
        n_policy_iters: int,
        n_steps: int,
        n_envs: int,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        n_distribution_params: int | None = None,
        mask_dims: int = 0,
    ) -> int:
        """The memory the arrays of a buffer with these arguments take (its ``nbytes``), computed without allocating."""
        obs_shape = get_obs_shape(observation_space)
        if isinstance(observation_space, spaces.Dict):
            assert isinstance(obs_shape, dict)
            obs_bytes = sum(
                int(np.prod(obs_shape[key])) * np.dtype(space.dtype).itemsize
                for key, space in observation_space.spaces.items()
            )
        else:
            obs_bytes = int(np.prod(obs_shape)) * np.dtype(observation_space.dtype).itemsize
        if n_distribution_params is None:
            n_distribution_params = distribution_param_dim(action_space)
        float_bytes = np.dtype(np.float32).itemsize * (1 + n_distribution_params)
        mask_bytes = np.dtype(bool).itemsize * mask_dims
        return n_policy_iters * n_envs * n_steps * (obs_bytes + float_bytes + mask_bytes)

    @property
    def n_rollouts(self) -> int:
        """Number of rollouts (rows) stored."""
        return self.pos

    @property
    def n_iterations(self) -> int:
        """Number of policy iterations stored."""
        return self.pos // self.n_envs

    def full(self) -> bool:
        """Whether the buffer holds ``n_policy_iters`` iterations (time for the auxiliary phase)."""
        return self.pos == self.buffer_size

    def reset(self) -> None:
        """Forget the stored rollouts (the arrays are reused)."""
        self.pos = 0
        self.n_resets += 1

    @property
    def nbytes(self) -> int:
        """Memory held by the buffer's arrays (action masks included), in bytes."""
        obs_arrays = self.observations.values() if isinstance(self.observations, dict) else [self.observations]
        masks = [self.action_masks] if self.action_masks is not None else []
        return sum(array.nbytes for array in [*obs_arrays, self.returns, self.old_distribution_params, *masks])

    def _write_env_major(self, target: StoredArray, rows: slice, array: np.ndarray | th.Tensor, flattened: bool) -> None:
        """
        Copy a rollout array into some rows of a stored array as ``(n_envs, n_steps, ...)``: a rollout buffer's,
        ``(n_steps, n_envs, ...)`` or flattened by its ``get()``, or one of a :class:`DeviceRollout` on the target's
        device (``(n_samples, ...)`` rows, flattened where not ``step_major``).
        """
        step_shape = tuple(target.shape[2:])
        if flattened:
            self._write(target, rows, array.reshape(self.n_envs, self.n_steps, *step_shape))
        elif isinstance(target, th.Tensor):  # one contiguous copy to the device, the axes swapped there
            step_major = th.as_tensor(array.reshape(self.n_steps, self.n_envs, *step_shape))
            target[rows] = step_major.to(target.device, target.dtype).swapaxes(0, 1)
        else:
            target[rows] = array.reshape(self.n_steps, self.n_envs, *step_shape).swapaxes(0, 1)

    def _on_device_of(self, tensor: th.Tensor) -> bool:
        """Whether the buffer's arrays are tensors on ``tensor``'s device (storage ``"device"``)."""
        return isinstance(self.returns, th.Tensor) and self.returns.device == tensor.device

    def add(self, rollout_buffer: RolloutBuffer, device_rollout: DeviceRollout | None = None) -> None:
        """
        Copy a full rollout buffer's observations, value targets (and action masks) into the next ``n_envs`` rows.

        :param rollout_buffer: the rollout buffer
        :param device_rollout: its arrays already copied to a device (:func:`rollout_to_device`): a buffer stored on
            that device takes its observations and value targets from there instead of copying them from the host
        """
        if self.full():
            raise RuntimeError("The auxiliary buffer is full: run the auxiliary phase and reset() it before adding more.")
        if rollout_buffer.buffer_size != self.n_steps or rollout_buffer.n_envs != self.n_envs:
            raise ValueError(
                f"Rollout buffer of {rollout_buffer.buffer_size} steps x {rollout_buffer.n_envs} envs does not fit an "
                f"auxiliary buffer of {self.n_steps} steps x {self.n_envs} envs."
            )
        flattened = rollout_buffer.generator_ready
        if self.pos == 0:
            self.returns = self._with_dtype(self.returns, rollout_buffer.returns.dtype)
        rows = slice(self.pos, self.pos + self.n_envs)
        # The observations and value targets from the device copy where the buffer lives on its device, else the host
        observations: ObsArray | TensorObs = rollout_buffer.observations
        returns: np.ndarray | th.Tensor = rollout_buffer.returns
        source_flattened = flattened
        if device_rollout is not None and self._on_device_of(device_rollout.returns):
            check_device_rollout(device_rollout, self.n_steps, self.n_envs)
            observations, returns = device_rollout.observations, device_rollout.returns
            source_flattened = not device_rollout.step_major
        if isinstance(self.observations, dict):
            for key, array in self.observations.items():
                self._write_env_major(array, rows, observations[key], source_flattened)  # type: ignore[index]
        else:
            self._write_env_major(self.observations, rows, observations, source_flattened)  # type: ignore[arg-type]
        self._write_env_major(self.returns, rows, returns, source_flattened)
        if self.action_masks is not None:
            masks = rollout_buffer.action_masks.astype(bool)  # type: ignore[attr-defined]
            self._write_env_major(self.action_masks, rows, masks, flattened)
        self.pos += self.n_envs

    def _observations_to_tensor(self, rows: np.ndarray | slice, device_rows: th.Tensor | None = None) -> TensorObs:
        """Observations of some rows, flattened to (n_rows * n_steps, ...), as tensor(s) on ``self.device``."""
        if isinstance(self.observations, dict):
            obs = {
                key: self._take(array, rows, device_rows).reshape(-1, *array.shape[2:])
                for key, array in self.observations.items()
            }
        else:
            obs = self._take(self.observations, rows, device_rows).reshape(-1, *self.observations.shape[2:])
        if self.storage == "device":
            return obs  # type: ignore[return-value]
        return obs_as_tensor(obs, self.device)  # type: ignore[arg-type]

    def action_masks_to_tensor(self, rows: np.ndarray | slice, device_rows: th.Tensor | None = None) -> th.Tensor | None:
        """The action masks of some rows as a flat boolean tensor on ``self.device``; None without masks."""
        if self.action_masks is None:
            return None
        masks = self._take(self.action_masks, rows, device_rows)
        return th.as_tensor(masks.reshape(-1, self.mask_dims), device=self.device)

    def iter_rollout_chunks(self, batch_rollouts: int) -> Generator[tuple[slice, TensorObs], None, None]:
        """The stored observations in order, ``batch_rollouts`` rollouts at a time, as (rows, observations)."""
        for start in range(0, self.pos, batch_rollouts):
            rows = slice(start, min(start + batch_rollouts, self.pos))
            yield rows, self._observations_to_tensor(rows)

    def store_old_distribution_params(self, rows: slice, params: th.Tensor) -> None:
        """
        Store the old policy's distribution parameters of some rows (float64 ones in float64, others in float32).

        :param rows: the rows, as yielded by ``iter_rollout_chunks``
        :param params: tensor of shape (n_rows * n_steps, n_distribution_params), on any device
        """
        params = params.to(th.float64 if params.dtype == th.float64 else th.float32)
        if rows.start == 0:
            dtype = np.float64 if params.dtype == th.float64 else np.float32
            self.old_distribution_params = self._with_dtype(self.old_distribution_params, np.dtype(dtype))
        params = params.reshape(-1, self.n_steps, self.n_distribution_params)
        if isinstance(self.old_distribution_params, th.Tensor):
            self.old_distribution_params[rows] = params.to(self.old_distribution_params.device)
        else:
            self.old_distribution_params[rows] = params.cpu().numpy()

    def get(
        self, batch_rollouts: int, generator: np.random.Generator | None = None
    ) -> Generator[AuxiliaryBufferSamples, None, None]:
        """
        One epoch of minibatches of whole rollouts, shuffled across envs and iterations.

        :param batch_rollouts: rollouts per minibatch (the last minibatch may hold fewer)
        :param generator: random generator for the shuffle (NumPy's global one if None, which SB3 seeds)
        """
        permutation = generator.permutation(self.pos) if generator is not None else np.random.permutation(self.pos)
        if self.storage != "pinned":
            # On the device, the permutation is copied there once per epoch and each minibatch's rows sliced there
            device_permutation = th.as_tensor(permutation, device=self.device) if self.storage == "device" else None
            for start in range(0, self.pos, batch_rollouts):
                rows = slice(start, start + batch_rollouts)
                yield self._minibatch(permutation[rows], None if device_permutation is None else device_permutation[rows])
            return
        # Pinned memory: the next minibatch is gathered and its copy started before the current one is handed out,
        # so that the host prepares it while the device trains on the current one
        batches = (permutation[start : start + batch_rollouts] for start in range(0, self.pos, batch_rollouts))
        pending = None
        for index, rows in enumerate(batches):
            prepared = self._staged_minibatch(rows, index % 2) if self._staged else self._minibatch(rows)
            if pending is not None:
                yield pending
            pending = prepared
        if pending is not None:
            yield pending

    def _minibatch(self, rows: np.ndarray, device_rows: th.Tensor | None = None) -> AuxiliaryBufferSamples:
        """The auxiliary minibatch of some rows, on ``self.device`` (``device_rows``: the rows on the device too)."""
        old_params = self._take(self.old_distribution_params, rows, device_rows)
        return AuxiliaryBufferSamples(
            observations=self._observations_to_tensor(rows, device_rows),
            returns=th.as_tensor(self._take(self.returns, rows, device_rows).reshape(-1), device=self.device),
            old_distribution_params=th.as_tensor(old_params.reshape(-1, self.n_distribution_params), device=self.device),
            rollout_indices=rows,
            action_masks=self.action_masks_to_tensor(rows, device_rows),
        )

    def _staged_minibatch(self, rows: np.ndarray, slot: int) -> AuxiliaryBufferSamples:
        """
        The minibatch of some rows, gathered into the page-locked staging arrays ``slot`` (two, used in turn) and copied
        to ``self.device`` without blocking. A slot is reused once the copy out of it (two minibatches ago) is done.
        """
        event = self._staging_events[slot]
        if event is not None:
            event.synchronize()
        staging = self._staging[slot]
        tensors = {}
        for name, source in self._rows_arrays(slice(0, self.pos), with_old_distributions=True).items():
            dtype = _torch_dtype(source.dtype)
            if name not in staging or staging[name].dtype != dtype or len(staging[name]) < len(rows):
                shape = (len(rows), *source.shape[1:])
                try:
                    staging[name] = th.zeros(shape, dtype=dtype, pin_memory=True)
                except RuntimeError:  # pinning refused: pageable (the copy then waits)
                    staging[name] = th.zeros(shape, dtype=dtype)
            target = staging[name][: len(rows)]
            np.take(source, rows, axis=0, out=target.numpy())
            tensors[name] = target.reshape(-1, *source.shape[2:]).to(self.device, non_blocking=True)
        if self.device.type == "cuda":
            self._staging_events[slot] = th.cuda.Event()
            self._staging_events[slot].record()
        prefix = "observations."
        observations = {name[len(prefix) :]: tensor for name, tensor in tensors.items() if name.startswith(prefix)}
        return AuxiliaryBufferSamples(
            observations=observations or tensors["observations"],
            returns=tensors["returns"],
            old_distribution_params=tensors["old_distribution_params"],
            rollout_indices=rows,
            action_masks=tensors.get("action_masks"),
        )

    def layout_metadata(self) -> dict[str, Any]:
        """
        The buffer's layout and spaces, in JSON: what a saved buffer must match to be loaded (``mask_dims`` only for a
        buffer that stores action masks, so that the files of PPG's buffers are those of earlier versions).
        """
        layout = {
            "n_policy_iters": self.n_policy_iters,
            "n_steps": self.n_steps,
            "n_envs": self.n_envs,
            "n_distribution_params": self.n_distribution_params,
            "observation_space": space_to_json(self.observation_space),
            "action_space": space_to_json(self.action_space),
        }
        if self.mask_dims > 0:
            layout["mask_dims"] = self.mask_dims
        return layout

    @property
    def file_version(self) -> int:
        """The version of this buffer's files (its own and the checkpoints' rollouts): 2 with action masks, else 1."""
        return 2 if self.action_masks is not None else 1

    def iteration_arrays(self, iteration: int, with_old_distributions: bool = False) -> dict[str, np.ndarray]:
        """
        The arrays of one stored policy iteration (its ``n_envs`` rows), as plain arrays by name.

        :param with_old_distributions: include the old-policy distribution parameters (meaningful during a phase only)
        """
        return self._rows_arrays(slice(iteration * self.n_envs, (iteration + 1) * self.n_envs), with_old_distributions)

    def _rows_arrays(self, rows: slice, with_old_distributions: bool) -> dict[str, np.ndarray]:
        """The arrays of some rows by name, as NumPy arrays (views in CPU memory, copies from a device)."""
        if isinstance(self.observations, dict):
            arrays = {f"observations.{key}": self._to_numpy(array[rows]) for key, array in self.observations.items()}
        else:
            arrays = {"observations": self._to_numpy(self.observations[rows])}
        arrays["returns"] = self._to_numpy(self.returns[rows])
        if self.action_masks is not None:
            arrays["action_masks"] = self._to_numpy(self.action_masks[rows])
        if with_old_distributions:
            arrays["old_distribution_params"] = self._to_numpy(self.old_distribution_params[rows])
        return arrays

    def _set_rows_arrays(self, start: int, arrays: dict[str, np.ndarray], source: object) -> int:
        """Copy arrays made by ``_rows_arrays`` into the rows from ``start``; return the number of rows."""
        expected = self._rows_arrays(slice(0, 0), "old_distribution_params" in arrays)
        if set(arrays) != set(expected):
            raise ValueError(f"{source!r} holds arrays {sorted(arrays)}, expected {sorted(expected)}.")
        n_rows = len(arrays["returns"])
        if start + n_rows > self.buffer_size:
            raise ValueError(f"{source!r} holds {n_rows} rollouts: more than fit in the auxiliary buffer.")
        for name, target in expected.items():
            array = arrays[name]
            if array.dtype != target.dtype or array.shape[1:] != target.shape[1:] or len(array) != n_rows:
                raise ValueError(
                    f"Array {name!r} of {source!r} is {array.dtype} {array.shape}, expected {target.dtype} "
                    f"({n_rows}, {', '.join(map(str, target.shape[1:]))})."
                )
        rows = slice(start, start + n_rows)
        if isinstance(self.observations, dict):
            for key, array in self.observations.items():
                self._write(array, rows, arrays[f"observations.{key}"])
        else:
            self._write(self.observations, rows, arrays["observations"])
        self._write(self.returns, rows, arrays["returns"])
        if self.action_masks is not None:
            self._write(self.action_masks, rows, arrays["action_masks"])
        if "old_distribution_params" in arrays:
            self._write(self.old_distribution_params, rows, arrays["old_distribution_params"])
        return n_rows

    def copy_from(self, other: "AuxiliaryBuffer", source: object) -> None:
        """Replace the stored rollouts with those of ``other`` (a buffer of the same layout), checked first."""
        other.check_compatible(self, source)
        self.reset()
        self._set_rows_arrays(0, other._rows_arrays(slice(0, other.pos), with_old_distributions=True), source)
        self.pos = other.pos

    def add_iteration_arrays(self, arrays: dict[str, np.ndarray], source: object) -> None:
        """Add one policy iteration saved from ``iteration_arrays`` after the stored ones, checked first."""
        if self.full():
            raise ValueError(f"{source!r}: the auxiliary buffer is full already.")
        if self._set_rows_arrays(self.pos, arrays, source) != self.n_envs:
            raise ValueError(f"{source!r} does not hold one policy iteration of {self.n_envs} envs.")
        self.pos += self.n_envs

    def save(self, path: str | pathlib.Path | io.BufferedIOBase, verbose: int = 0) -> None:
        """
        Save the stored rollouts as plain arrays (``.npz`` with JSON metadata and checksums), atomically; nothing is pickled.

        :param path: Path to the file; ".npz" is appended to a str path without a suffix
        :param verbose: print where the buffer was saved when >= 2
        """
        if isinstance(path, str) and not pathlib.Path(path).suffix:
            path = path + ".npz"
        metadata = {"format": AUX_BUFFER_FORMAT, "version": self.file_version, **self.layout_metadata(), "pos": self.pos}
        write_array_file(path, self._rows_arrays(slice(0, self.pos), with_old_distributions=True), metadata)  # type: ignore[arg-type]
        if verbose >= 2:
            print(f"Saved the auxiliary buffer ({self.n_iterations} policy iterations) to {path}")

    def check_compatible(self, other: "AuxiliaryBuffer", source: object) -> None:
        """Raise a ``ValueError`` naming every difference in layout or spaces from ``other``."""
        names = ("n_policy_iters", "n_steps", "n_envs", "observation_space", "action_space", "mask_dims")
        mismatches = [
            f"{name}: buffer {getattr(self, name)} != model {getattr(other, name)}"
            for name in names
            if getattr(self, name) != getattr(other, name)
        ]
        if mismatches:
            raise ValueError(f"The auxiliary buffer in {source!r} does not fit this model ({'; '.join(mismatches)}).")

    @classmethod
    def load(cls, path: str | pathlib.Path | io.BufferedIOBase, verbose: int = 0) -> "AuxiliaryBuffer":
        """
        Load a buffer saved by ``save``, every array checked against its checksum and the layout (a pickle is refused).

        :param path: Path to the file
        :param verbose: print where the buffer was loaded from when >= 2
        :return: the buffer (on the CPU device; the model moves it)
        """
        metadata, arrays = read_array_file(path, AUX_BUFFER_FORMAT)  # type: ignore[arg-type]
        try:
            if metadata.get("version") not in AUX_BUFFER_VERSIONS:
                raise ValueError(f"unsupported version {metadata.get('version')!r}")
            # Version 1 files (no action masks) have no mask_dims; their n_distribution_params is PPG's
            buffer = cls(
                int(metadata["n_policy_iters"]),
                int(metadata["n_steps"]),
                int(metadata["n_envs"]),
                space_from_json(metadata["observation_space"]),
                space_from_json(metadata["action_space"]),
                device="cpu",
                n_distribution_params=int(metadata["n_distribution_params"]),
                mask_dims=int(metadata.get("mask_dims", 0)),
            )
            if metadata["version"] != buffer.file_version:
                raise ValueError(f"version {metadata['version']} does not match its mask_dims {buffer.mask_dims}")
            pos = metadata["pos"]
            if not isinstance(pos, int) or not 0 <= pos <= buffer.buffer_size or pos % buffer.n_envs != 0:
                raise ValueError(f"position {pos!r} is not a multiple of n_envs in [0, {buffer.buffer_size}]")
            if len(arrays.get("returns", ())) != pos:
                raise ValueError(f"position {pos} does not match the {len(arrays.get('returns', ()))} stored rollouts")
            buffer._set_rows_arrays(0, arrays, path)
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"{path!r} is not a valid auxiliary buffer file: {error}.") from error
        buffer.pos = pos
        if verbose >= 2:
            print(f"Loaded an auxiliary buffer ({buffer.n_iterations} policy iterations) from {path}")
        return buffer


def aux_buffer_storage(
    n_policy_iters: int,
    n_steps: int,
    n_envs: int,
    observation_space: spaces.Space,
    action_space: spaces.Space,
    aux_buffer_device: str,
    device: th.device,
    **buffer_kwargs: Any,
) -> tuple[str, str]:
    """Where an auxiliary buffer lives and why, its fit in host memory checked before it is allocated there."""
    layout = dict(n_policy_iters=n_policy_iters, n_steps=n_steps, n_envs=n_envs)
    nbytes = AuxiliaryBuffer.estimate_nbytes(
        **layout, observation_space=observation_space, action_space=action_space, **buffer_kwargs
    )
    storage, reason = resolve_aux_buffer_storage(aux_buffer_device, device, nbytes)
    if storage != "device":
        check_aux_buffer_memory(nbytes, **layout)
    return storage, reason


def make_aux_buffer(
    n_policy_iters: int,
    n_steps: int,
    n_envs: int,
    observation_space: spaces.Space,
    action_space: spaces.Space,
    device: th.device,
    storage: tuple[str, str],
    **buffer_kwargs: Any,
) -> tuple["AuxiliaryBuffer", tuple[str, str]]:
    """A new auxiliary buffer, and where it lives and why (pageable memory where page-locking failed)."""
    where, reason = storage
    layout = (n_policy_iters, n_steps, n_envs, observation_space, action_space)
    buffer = AuxiliaryBuffer(*layout, device=device, storage=where, **buffer_kwargs)
    if where == "pinned" and not buffer.pinned:
        # Its minibatches are still prepared ahead, from pageable memory
        where, reason = "host", f"{reason}; page-locking failed, so pageable memory"
    return buffer, (where, reason)


def aux_buffer_summary(buffer: "AuxiliaryBuffer", next_aux_step: int, storage: str, reason: str, device: th.device) -> str:
    """The auxiliary buffer's size, the step of its next phase and where it lives, for the log."""
    n_buffer_steps = buffer.n_policy_iters * buffer.n_envs * buffer.n_steps
    nbytes = buffer.nbytes
    size = f"{nbytes / 1e6:,.1f} MB" if nbytes >= 100_000 else f"{nbytes / 1e3:,.1f} kB"
    observations = buffer.observations
    obs_nbytes = sum(array.nbytes for array in (observations.values() if isinstance(observations, dict) else [observations]))
    places = {"host": "CPU memory", "pinned": "page-locked CPU memory", "device": f"{device} memory"}
    return (
        f"Auxiliary buffer: n_policy_iters * n_envs * n_steps = {buffer.n_policy_iters} * {buffer.n_envs} * "
        f"{buffer.n_steps} steps of {nbytes // n_buffer_steps:,} bytes ({obs_nbytes // n_buffer_steps:,} of "
        f"observations), {size}, taken as rollouts arrive; next auxiliary phase at step {next_aux_step:,}. "
        f"It lives in {places[storage]} ({reason})."
    )
