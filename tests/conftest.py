"""Test-suite settings (one torch thread per process) and the small PPG models the tests share."""

import os

# Inherited by the subprocesses some tests start (command-line entry points, examples)
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

from collections.abc import Callable
from typing import Any

import pytest
import torch as th
from stable_baselines3.common.env_util import make_vec_env

from sb3_ppg import PPG

th.set_num_threads(1)

# One auxiliary phase every 2 iterations of 16 steps, one-rollout aux minibatches, a 16-unit MLP
SMALL_PPG = dict(n_steps=16, batch_size=16, n_policy_iters=2, n_aux_epochs=1, aux_batch_rollouts=1)


def small_ppg(
    env: Any = "CartPole-v1",
    policy: str = "MlpPolicy",
    policy_kwargs: dict[str, Any] | None = None,
    n_envs: int | None = None,
    seed: int = 0,
    **overrides: Any,
) -> PPG:
    """
    A PPG model small enough for a unit test.

    :param env: an env, or an env id (given to PPG as is, one env, unless ``n_envs`` is set)
    :param policy: the policy
    :param policy_kwargs: policy keyword arguments (default: ``net_arch=[16]``)
    :param n_envs: with an env id, build ``n_envs`` envs with ``make_vec_env`` (seeded with ``seed``)
    :param seed: the model's seed
    :param overrides: hyperparameters that replace ``SMALL_PPG``'s
    """
    if isinstance(env, str) and n_envs is not None:
        env = make_vec_env(env, n_envs=n_envs, seed=seed)
    policy_kwargs = dict(net_arch=[16]) if policy_kwargs is None else policy_kwargs
    return PPG(policy, env, policy_kwargs=policy_kwargs, seed=seed, **{**SMALL_PPG, **overrides})


@pytest.fixture
def make_model() -> Callable[..., PPG]:
    """The small-model builder (see ``small_ppg``); a test module may override it with other defaults."""
    return small_ppg
