"""Test-suite settings (one torch thread per process), the small PPG model the tests share (``make_model``), the RL Zoo
with PPG registered (``registered_zoo``)."""

import os

# Inherited by the subprocesses some tests start (command-line entry points, examples)
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

from collections.abc import Callable

import pytest
import torch as th
from helpers import small_ppg  # tests/ is on sys.path (pytest's rootdir-relative imports)

from sb3_ppg import PPG

th.set_num_threads(1)


@pytest.fixture(scope="session")
def make_model() -> Callable[..., PPG]:
    """
    The builder of the small PPG model the tests share (``tests/helpers.py``): ``make_model(env, policy,
    policy_kwargs=..., n_envs=..., seed=..., **hyperparameters)``.
    """
    return small_ppg


@pytest.fixture(scope="module")
def registered_zoo() -> None:
    """PPG and the packaged envs registered in the RL Zoo (``pytestmark = pytest.mark.usefixtures("registered_zoo")``)."""
    from sb3_ppg.cli import zoo

    zoo.register_zoo()
