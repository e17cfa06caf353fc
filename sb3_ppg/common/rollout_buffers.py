"""
PPG's rollout buffers: SB3's samples, gathered without flattening the rollout, and the policy phase's minibatches of
whole env rollouts (``policy_minibatches="envs"``).
"""

from collections.abc import Generator
from typing import Any, NamedTuple

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import DictRolloutBuffer, RolloutBuffer
from stable_baselines3.common.type_aliases import DictRolloutBufferSamples, RolloutBufferSamples
from stable_baselines3.common.utils import explained_variance
from stable_baselines3.common.vec_env import VecNormalize

ObsArray = np.ndarray | dict[str, np.ndarray]
TensorObs = th.Tensor | dict[str, th.Tensor]


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
    A full rollout buffer's sampled arrays copied to a device, each as ``(n_samples, ...)`` rows (made by
    :func:`sb3_ppg.common.cuda.rollout_to_device`).

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

    def check(self, n_steps: int, n_envs: int) -> None:
        """Refuse a copy that is not of a rollout of ``n_steps`` steps of ``n_envs`` envs."""
        n_copied = self.returns.numel()
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
) -> Generator[RolloutBufferSamples | DictRolloutBufferSamples, None, None]:
    """
    One epoch of policy-phase minibatches of whole env rollouts (``policy_minibatches="envs"``, the paper's code): one
    permutation of the envs cut into groups of ``batch_size // n_steps`` envs, each env's steps in time order.

    :param rollout_buffer: SB3's rollout buffer (or a subclass: its ``_get_samples`` makes the minibatches), full
    :param batch_size: the minibatch size, a multiple of ``n_steps``
    :param generator: the generator of the permutation; ``None``: NumPy's global one (which SB3 seeds)
    :return: a generator of the rollout buffer's samples
    """
    n_steps = rollout_buffer.buffer_size
    order = env_rollout_order(rollout_buffer.n_envs, n_steps, generator)
    chunk = batch_size // n_steps * n_steps
    if not isinstance(rollout_buffer, UnflattenedRolloutBuffer):
        flatten_rollout_buffer(rollout_buffer)
    for start in range(0, len(order), chunk):
        yield rollout_buffer._get_samples(order[start : start + chunk])


def rollout_explained_variance(rollout_buffer: RolloutBuffer) -> float:
    """The explained variance of the rollout's returns by its values, summed in SB3's (flattened, env-major) order."""
    values, returns = rollout_buffer.values, rollout_buffer.returns
    if not rollout_buffer.generator_ready:
        values, returns = values.swapaxes(0, 1), returns.swapaxes(0, 1)
    return float(explained_variance(values.flatten(), returns.flatten()))
