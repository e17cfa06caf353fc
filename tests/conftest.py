"""Test-suite settings (one torch thread per process) and the small PPG model the tests share (``make_model``)."""

import os

# Inherited by the subprocesses some tests start (command-line entry points, examples)
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

from collections.abc import Callable

import pytest
import torch as th
from small_model import small_ppg  # tests/ is on sys.path (pytest's rootdir-relative imports)

from sb3_ppg import PPG

th.set_num_threads(1)


@pytest.fixture(scope="session")
def make_model() -> Callable[..., PPG]:
    """
    The builder of the small PPG model the tests share (``tests/small_model.py``): ``make_model(env, policy,
    policy_kwargs=..., n_envs=..., seed=..., **hyperparameters)``.
    """
    return small_ppg
