"""Test-suite settings (one torch thread per process; pyproject's pytest-xdist options accepted without it), the small
PPG model the tests share (``make_model``), the RL Zoo with PPG registered (``registered_zoo``)."""

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


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    """
    pyproject.toml's ``addopts`` ask pytest-xdist (the tests extra) for a worker per CPU: where it is not loaded (not
    installed, ``-p no:xdist``), its two options (long forms) are accepted and ignored, and the run stays in one process.
    """
    if not pluginmanager.has_plugin("xdist"):
        parser.addoption("--numprocesses", dest="numprocesses", default=None, help="ignored: no pytest-xdist")
        parser.addoption("--dist", dest="dist", default="no", help="ignored: no pytest-xdist")


def pytest_report_header(config: pytest.Config) -> str | None:
    if not config.pluginmanager.has_plugin("xdist"):
        return "pytest-xdist is not loaded: the tests run in one process (pip install pytest-xdist for a worker per CPU)"
    return None


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
