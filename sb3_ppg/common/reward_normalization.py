"""
The PPG paper code's reward normalization, once per rollout (``PPG(normalize_reward=True)``; docs/fidelity.md):
:class:`RolloutRewardNormalizer`.
"""

import math
import warnings
from typing import Any

import numpy as np
import torch as th
from stable_baselines3.common.vec_env import VecEnv, unwrap_vec_normalize

from sb3_ppg.common import distributed

#: The keys of ``PPG(reward_normalizer_kwargs=...)``, with the original code's defaults
REWARD_NORMALIZER_DEFAULTS: dict[str, float] = {"gamma": 0.99, "clip_reward": 10.0, "epsilon": 1e-8}


def reward_normalizer_problems(kwargs: Any) -> list[str]:
    """
    What is wrong with ``reward_normalizer_kwargs`` (``None`` or a dict with some of :data:`REWARD_NORMALIZER_DEFAULTS`'s
    keys); an empty list when nothing is.
    """
    if kwargs is None:
        return []
    if not isinstance(kwargs, dict):
        return [f"reward_normalizer_kwargs must be a dict or None, got {kwargs!r} ({type(kwargs).__name__})"]
    problems = []
    unknown = sorted(str(key) for key in kwargs if key not in REWARD_NORMALIZER_DEFAULTS)
    if unknown:
        problems.append(
            f"reward_normalizer_kwargs has unknown keys {unknown}: the keys are {sorted(REWARD_NORMALIZER_DEFAULTS)}"
        )
    for name, low, closed in (("gamma", 0.0, True), ("clip_reward", 0.0, False), ("epsilon", 0.0, False)):
        if name not in kwargs:
            continue
        value = kwargs[name]
        number = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
        valid = number and math.isfinite(value) and (value >= low if closed else value > low)
        if name == "gamma":
            valid = valid and value < 1.0
        if not valid:
            bounds = "in [0, 1)" if name == "gamma" else "a number > 0"
            problems.append(f"reward_normalizer_kwargs['{name}'] must be {bounds}, got {value!r}")
    return problems


class RolloutRewardNormalizer:
    """
    Scales the rewards of each finished rollout as openai/phasic-policy-gradient's ``RewardNormalizer``: a running
    discounted return per env (reset where an episode starts) gives the rollout's ``n_steps * n_envs`` returns, which
    update one running mean and variance at once; every reward of the rollout is then divided by the standard deviation
    after that update, and clipped. Under torchrun the ranks average their rollouts' mean, variance and count first, as
    the original code's all-reduce does. State in float64.

    :param n_envs: Number of envs (of this process)
    :param gamma: Discount of the running return (the original code's 0.99, whatever the RL discount)
    :param clip_reward: Normalized rewards are clipped to ``[-clip_reward, clip_reward]``
    :param epsilon: Added to the variance before the square root
    """

    def __init__(self, n_envs: int, gamma: float = 0.99, clip_reward: float = 10.0, epsilon: float = 1e-8) -> None:
        problems = reward_normalizer_problems(dict(gamma=gamma, clip_reward=clip_reward, epsilon=epsilon))
        if problems:
            raise ValueError("; ".join(problems))
        self.n_envs = n_envs
        self.gamma, self.clip_reward, self.epsilon = float(gamma), float(clip_reward), float(epsilon)
        self.running_return = np.zeros(n_envs, dtype=np.float64)
        # The original code's RunningMeanStd starts from mean 0, variance 1 and a count of 1e-4
        self.mean, self.var, self.count = 0.0, 1.0, 1e-4

    @property
    def std(self) -> float:
        """The standard deviation the rewards are divided by: ``sqrt(var + epsilon)``."""
        return math.sqrt(self.var + self.epsilon)

    def normalize(self, rewards: np.ndarray, episode_starts: np.ndarray) -> np.ndarray:
        """
        Update the statistics with a finished rollout and return its normalized rewards (under torchrun: collective,
        every rank calls this or :meth:`skip_rollout` once per rollout).

        :param rewards: The rollout's raw rewards, ``(n_steps, n_envs)``
        :param episode_starts: Whether each step's observation starts an episode, ``(n_steps, n_envs)``
        :return: The normalized rewards, float64; the raw ones (and the state unchanged) when a rank stopped mid-rollout
        """
        rewards = np.asarray(rewards, dtype=np.float64)
        starts = np.asarray(episode_starts, dtype=np.float64)
        if rewards.ndim != 2 or rewards.shape[1] != self.n_envs or starts.shape != rewards.shape:
            raise ValueError(
                f"Expected rewards and episode starts of shape (n_steps, {self.n_envs}), got {rewards.shape} and "
                f"{starts.shape}"
            )
        returns = np.empty_like(rewards)
        running_return = self.running_return
        for step in range(len(rewards)):
            running_return = rewards[step] + self.gamma * (1.0 - starts[step]) * running_return
            returns[step] = running_return
        batch = (float(returns.mean()), float(returns.var()), float(returns.size))
        if distributed.is_active():
            moments = self._all_reduce(*batch, stopped=False)
            if moments is None:
                return rewards
            batch = moments
        self._update(*batch)
        self.running_return = running_return.copy()
        return np.clip(rewards / self.std, -self.clip_reward, self.clip_reward)

    def skip_rollout(self) -> None:
        """
        Under torchrun, on a rank whose rollout stopped before its end (a callback returned False): take part in the
        other ranks' reduction, which then leave their statistics unchanged (the rollout is not trained on).
        """
        if distributed.is_active():
            self._all_reduce(0.0, 0.0, 0.0, stopped=True)

    def _all_reduce(self, mean: float, var: float, count: float, stopped: bool) -> tuple[float, float, float] | None:
        """The ranks' averaged rollout mean and variance, and their total count; ``None`` when a rank stopped."""
        world_size = distributed.get_world_size()
        averaged = distributed.all_reduce_mean(th.tensor([mean, var, count, float(stopped)], dtype=th.float64)).tolist()
        if averaged[3] > 0.0:
            return None
        return averaged[0], averaged[1], averaged[2] * world_size

    def _update(self, batch_mean: float, batch_var: float, batch_count: float) -> None:
        """Merge a batch's moments into the running mean and variance (the parallel-variance formula)."""
        delta = batch_mean - self.mean
        total = self.count + batch_count
        self.mean = self.mean + delta * batch_count / total
        self.var = (self.var * self.count + batch_var * batch_count + delta**2 * self.count * batch_count / total) / total
        self.count = total

    def state_dict(self) -> dict[str, th.Tensor]:
        """The statistics and running returns as float64 tensors (saved in the model zip as ``reward_normalizer.pth``)."""
        return {
            "running_return": th.from_numpy(self.running_return.copy()),
            "mean": th.tensor(self.mean, dtype=th.float64),
            "var": th.tensor(self.var, dtype=th.float64),
            "count": th.tensor(self.count, dtype=th.float64),
        }

    def load_state_dict(self, state: dict[str, th.Tensor], strict: bool = True) -> None:
        """
        Put back a :meth:`state_dict`; running returns of another number of envs restart at 0 (with a warning).

        :param state: The state
        :param strict: Refuse a state with other keys (as ``torch.nn.Module.load_state_dict``)
        """
        keys = {"running_return", "mean", "var", "count"}
        if strict and set(state) != keys:
            raise ValueError(f"A reward normalizer state has the keys {sorted(keys)}, got {sorted(state)}")
        for name in ("mean", "var", "count"):
            if name in state:
                setattr(self, name, float(state[name]))
        if "running_return" in state:
            self.set_running_return(state["running_return"].detach().cpu().numpy())

    def reset_running_return(self, n_envs: int) -> None:
        """
        Start the running returns of ``n_envs`` envs at 0 (``PPG.set_env`` with another number of envs); the statistics
        are kept.

        :param n_envs: The new number of envs
        """
        self.n_envs = n_envs
        self.running_return = np.zeros(n_envs, dtype=np.float64)

    def set_running_return(self, running_return: np.ndarray) -> None:
        """
        Set the running discounted returns (one per env); those of another number of envs are dropped (with a warning).

        :param running_return: The running returns, ``(n_envs,)``
        """
        running_return = np.asarray(running_return, dtype=np.float64)
        if running_return.shape != (self.n_envs,):
            warnings.warn(
                f"The saved running returns of the reward normalizer are for {running_return.size} envs, this model has "
                f"{self.n_envs}: they restart at 0 (the statistics are kept).",
                stacklevel=2,
            )
            running_return = np.zeros(self.n_envs, dtype=np.float64)
        self.running_return = running_return.copy()

    def __repr__(self) -> str:
        return (
            f"RolloutRewardNormalizer(n_envs={self.n_envs}, gamma={self.gamma}, clip_reward={self.clip_reward}, "
            f"epsilon={self.epsilon}, mean={self.mean}, var={self.var}, count={self.count})"
        )


def check_reward_normalization(normalize_reward: bool, env: VecEnv | None) -> None:
    """
    Refuse ``normalize_reward`` over an env whose ``VecNormalize`` normalizes the rewards too.

    :param normalize_reward: The model's ``normalize_reward``
    :param env: The model's env
    """
    vec_normalize = unwrap_vec_normalize(env) if env is not None else None
    if normalize_reward and vec_normalize is not None and vec_normalize.norm_reward:
        raise ValueError(
            "PPG(normalize_reward=True) normalizes the rewards of each rollout, and the env's VecNormalize normalizes "
            "them too: they would be scaled twice. Build the env without reward normalization (VecNormalize("
            "norm_reward=False), make_procgen_env(..., normalize_reward=False)), or pass normalize_reward=False."
        )
