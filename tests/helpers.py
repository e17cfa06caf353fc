"""
What the tests share: the small PPG model (tests use it through the ``make_model`` fixture of conftest.py; the scripts
that tests run in subprocesses import it from here, tests/ being on their path), a model's parameters and their
bit-for-bit comparison, a process holding a checkpoint folder's lock, the command line's quiet CPU run options, the
environment of a subprocess that must run with glibc's own malloc settings.
"""

import os
from pathlib import Path
from typing import Any

import torch as th
from stable_baselines3.common.env_util import make_vec_env

from sb3_ppg import PPG
from sb3_ppg.cli import host_memory
from sb3_ppg.common.checkpoints import lock_folder

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


#: The command line's options of a quiet, seeded run on the CPU
QUIET_CPU_RUN = ["--seed", "0", "--device", "cpu", "--verbose", "0"]


def run_folder_args(folder: Path, seed: int = 0) -> list[str]:
    """The command line's options of a quiet run on the CPU with this seed, logging into ``folder``."""
    return ["-f", str(folder), "--seed", str(seed), "--device", "cpu", "--verbose", "0"]


def parameters(model: PPG) -> dict[str, th.Tensor]:
    """A copy of the policy's parameters and buffers, by name."""
    return {name: tensor.detach().clone() for name, tensor in model.policy.state_dict().items()}


def assert_identical(params_a: dict[str, th.Tensor], params_b: dict[str, th.Tensor]) -> None:
    """The same names and, bit for bit, the same tensors."""
    assert params_a.keys() == params_b.keys()
    for name in params_a:
        assert th.equal(params_a[name], params_b[name]), f"{name} differs"


def assert_same_samples(mine: list, expected: list) -> None:
    """The same rollout minibatches: type, fields, dtypes, shapes and values (observation dicts key by key)."""
    assert len(mine) == len(expected) > 0
    for a, b in zip(mine, expected, strict=True):
        assert type(a) is type(b)
        for name in b._fields:
            x, y = getattr(a, name), getattr(b, name)
            pairs = [(x[key], y[key]) for key in y] if isinstance(y, dict) else [(x, y)]
            for u, v in pairs:
                assert u.dtype == v.dtype and u.shape == v.shape and th.equal(u, v), name


def hold_lock(folder: str, ready: Any, release: Any) -> None:
    """In a child process: lock ``folder`` as a training run does, tell the parent (``ready``), wait for ``release``."""
    lock_folder(folder)
    ready.set()
    release.wait(30)


def environment_with_glibc_defaults() -> dict[str, str]:
    """This process's environment without the variables that configure glibc's malloc (``MALLOC_*_``, ``GLIBC_TUNABLES``)."""
    env = {key: value for key, value in os.environ.items() if key not in host_memory.MALLOC_ENVIRONMENT}
    env.pop("GLIBC_TUNABLES", None)
    return env
