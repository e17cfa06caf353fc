"""
Faster versions of two SB3 ``VecEnv`` wrappers, for vectorized envs with many games per step (Procgen: 64).

Each is a subclass of the SB3 wrapper it speeds up, gives the same outputs (tested step by step against SB3's), and is
found by SB3's helpers (``unwrap_vec_normalize``, ``is_vecenv_wrapped``, ``sync_envs_normalization``, saving and
loading of ``VecNormalize`` statistics). They matter because every step of a 64-game Procgen env takes about a
millisecond, and the Python code of the wrappers runs while procgen's worker threads wait for the next action: each
numpy call costs several times more there than in a micro-benchmark, where the caches are warm, and a python scan of
a list of 64 flags costs less than the numpy call that would do the same work.

- :class:`FastVecMonitor`: ``VecMonitor`` that visits the finished episodes only, instead of looping over all games.
- :class:`RewardOnlyVecNormalize`: ``VecNormalize`` for reward normalization only, without the per-step observation
  copy and with fewer numpy calls.
"""

import math
import time
from typing import Any

import numpy as np
from stable_baselines3.common.vec_env import VecMonitor, VecNormalize
from stable_baselines3.common.vec_env.base_vec_env import VecEnv, VecEnvStepReturn

__all__ = ["FastVecMonitor", "RewardOnlyVecNormalize", "finished_indices"]

# Up to this many envs, per-step bookkeeping on python lists costs less than numpy calls (see the module docstring)
MAX_ENVS_FOR_PYTHON_LOOPS = 256


def finished_indices(dones: np.ndarray) -> list[int]:
    """
    Indices of the envs whose episode ended at this step.

    For up to ``MAX_ENVS_FOR_PYTHON_LOOPS`` envs the flags are scanned as a python list, which costs less than
    ``np.flatnonzero`` between two steps of a fast vectorized env; beyond that, numpy.

    :param dones: The ``dones`` of a ``VecEnv`` step, shape ``(n_envs,)``
    :return: The indices of the true entries, as python ints, in increasing order
    """
    if dones.shape[0] > MAX_ENVS_FOR_PYTHON_LOOPS:
        return dones.nonzero()[0].tolist()
    flags = dones.tolist()
    if True not in flags:
        return []
    return [idx for idx, done in enumerate(flags) if done]


class FastVecMonitor(VecMonitor):
    """
    SB3's ``VecMonitor`` (episode returns, lengths and times in the infos of finished episodes, optional CSV log) with
    the per-step loop over every game replaced by a loop over the games whose episode just ended. Same infos, same
    log, same arguments.
    """

    def __init__(self, venv: VecEnv, filename: str | None = None, info_keywords: tuple[str, ...] = ()):
        super().__init__(venv, filename=filename, info_keywords=info_keywords)
        # Added to the episode lengths at every step (an array operand: numpy calls with python scalars cost more)
        self._one_step = np.ones(self.num_envs, dtype=self.episode_lengths.dtype)

    def step_wait(self) -> VecEnvStepReturn:
        """
        Step the env and add ``info["episode"]`` (``r``, ``l``, ``t`` and the ``info_keywords``) to the infos of the
        finished episodes.

        :return: observations, rewards, dones, infos
        """
        obs, rewards, dones, infos = self.venv.step_wait()
        self.episode_returns += rewards
        self.episode_lengths += self._one_step
        done_indices = finished_indices(dones)
        if not done_indices:
            return obs, rewards, dones, infos
        new_infos = list(infos)
        for idx in done_indices:
            info = infos[idx].copy()
            episode_info = {
                "r": self.episode_returns[idx],
                "l": self.episode_lengths[idx],
                "t": round(time.time() - self.t_start, 6),
            }
            for key in self.info_keywords:
                episode_info[key] = info[key]
            info["episode"] = episode_info
            self.episode_count += 1
            self.episode_returns[idx] = 0
            self.episode_lengths[idx] = 0
            if self.results_writer:
                self.results_writer.write_row(episode_info)
            new_infos[idx] = info
        return obs, rewards, dones, new_infos


class _StepConstants:
    """
    Arrays of ``n_envs`` values used at every step by :class:`RewardOnlyVecNormalize`.

    :param key: What they were built from
    :param n_envs: Number of envs
    :param gamma: Discount of the running return
    :param clip_reward: Bound of the normalized rewards
    :param reward_dtype: dtype of the rewards
    """

    def __init__(self, key: tuple, n_envs: int, gamma: float, clip_reward: float, reward_dtype: np.dtype):
        self.key = key
        self.gamma = np.full(n_envs, gamma)
        self.ones = np.ones(n_envs)
        self.low = np.full(n_envs, -clip_reward, dtype=reward_dtype)
        self.high = np.full(n_envs, clip_reward, dtype=reward_dtype)
        # Filled with the scale at every step
        self.std = np.empty(n_envs, dtype=reward_dtype)


class RewardOnlyVecNormalize(VecNormalize):
    """
    SB3's ``VecNormalize`` for chains that normalize rewards only (``norm_obs=False``): the observations are passed
    through as they are instead of being deep-copied at every step (SB3 copies them to protect observations it
    modifies; with 64 Procgen envs that is 786 KB per step), the terminal observations are not revisited, and the
    reward statistics are updated with fewer numpy calls. Rewards and statistics are the same as SB3's (tested step
    by step); ``save``/``load`` and ``sync_envs_normalization`` are SB3's. With ``norm_obs=True`` it is SB3's
    ``VecNormalize`` unchanged.
    """

    def normalize_obs(self, obs: np.ndarray | dict[str, np.ndarray]) -> np.ndarray | dict[str, np.ndarray]:
        """
        The observations themselves when they are not normalized, else SB3's normalization.

        :param obs: observations
        :return: the (normalized) observations
        """
        if not self.norm_obs:
            return obs
        return super().normalize_obs(obs)

    def step_wait(self) -> VecEnvStepReturn:
        """
        SB3's ``VecNormalize.step_wait`` without the observation work when observations are not normalized (no
        statistics, no copies, no pass over the terminal observations): reward statistics and normalization only.

        :return: observations, normalized rewards, dones, infos
        """
        if self.norm_obs:
            return super().step_wait()
        obs, rewards, dones, infos = self.venv.step_wait()
        self.old_obs = obs
        self.old_reward = rewards
        if self.training:
            self._update_reward(rewards)
        rewards = self.normalize_reward(rewards)
        self.returns[dones] = 0
        return obs, rewards, dones, infos

    def _update_reward(self, reward: np.ndarray) -> None:
        """
        SB3's update of the reward statistics (the running variance of the discounted returns, Chan et al.'s parallel
        update), computed with two dot products and Python floats instead of a dozen numpy calls on 0-d arrays.

        :param reward: the raw rewards of this step
        """
        constants = self._step_constants(reward.dtype)
        returns = self.returns
        returns *= constants.gamma
        returns += reward
        n_returns = returns.shape[0]
        batch_mean = float(np.dot(returns, constants.ones)) / n_returns
        deviations = returns - batch_mean
        batch_var = float(np.dot(deviations, deviations)) / n_returns
        ret_rms = self.ret_rms
        mean, var, count = float(ret_rms.mean), float(ret_rms.var), float(ret_rms.count)
        delta = batch_mean - mean
        total_count = count + n_returns
        m_2 = var * count + batch_var * n_returns + delta * delta * count * n_returns / total_count
        # 0-d float64 arrays, as SB3's RunningMeanStd keeps them (new objects, as SB3 does)
        ret_rms.mean = np.array(mean + delta * n_returns / total_count)
        ret_rms.var = np.array(m_2 / total_count)
        ret_rms.count = total_count

    def normalize_reward(self, reward: np.ndarray) -> np.ndarray:
        """
        SB3's reward normalization (divide by the standard deviation of the discounted return, clip, cast to float32)
        with in-place clipping. For float rewards of shape ``(num_envs,)`` the scale and the clipping bounds are
        cached arrays in the reward's dtype (the same float operations as SB3's division by a 0-d array, without
        numpy's handling of scalar operands); otherwise they are python floats.

        :param reward: raw rewards
        :return: normalized rewards (float32); the rewards themselves are not modified
        """
        if not self.norm_reward:
            return reward.astype(np.float32)
        std = math.sqrt(float(self.ret_rms.var) + self.epsilon)
        if reward.dtype.kind == "f" and reward.shape == (self.num_envs,):
            constants = self._step_constants(reward.dtype)
            constants.std.fill(std)
            scale, low, high = constants.std, constants.low, constants.high
        else:
            scale, low, high = std, -self.clip_reward, self.clip_reward
        normalized = reward / scale
        np.maximum(normalized, low, out=normalized)
        np.minimum(normalized, high, out=normalized)
        return normalized.astype(np.float32, copy=False)

    def _step_constants(self, reward_dtype: np.dtype) -> "_StepConstants":
        """
        The per-step constants as arrays of ``num_envs`` values: between two steps of a fast env, a numpy call with a
        python scalar operand costs several microseconds more than with an array (numpy resolves the scalar's type
        first). Rebuilt when ``gamma``, ``clip_reward`` or the reward dtype change.

        :param reward_dtype: dtype of the rewards (the clipping bounds and the scale are in this dtype)
        :return: The arrays
        """
        key = (self.gamma, self.clip_reward, self.num_envs, reward_dtype)
        constants = self.__dict__.get("_constants")
        if constants is None or constants.key != key:
            constants = _StepConstants(key, self.num_envs, self.gamma, self.clip_reward, reward_dtype)
            self._constants = constants
        return constants

    def __getstate__(self) -> dict[str, Any]:
        """
        SB3's state for pickling (``save``), without the cached per-step constants.

        :return: The state
        """
        state = super().__getstate__()
        state.pop("_constants", None)
        return state
