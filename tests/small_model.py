"""
The small PPG model the tests share (tests use it through the ``make_model`` fixture of conftest.py; the scripts that
tests run in subprocesses import it from here, tests/ being on their path).
"""

from typing import Any

from stable_baselines3.common.env_util import make_vec_env

from sb3_ppg import PPG

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
