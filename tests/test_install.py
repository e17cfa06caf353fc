"""What a user sees on install: importing sb3_ppg, SB3 or the zoo prints nothing, on every Python (gym's notice included)."""

import importlib.util
import os
import subprocess
import sys

import pytest
from helpers import setup_arguments

pytestmark = pytest.mark.slow  # each test imports sb3_ppg in a new interpreter

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def test_import_prints_nothing(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (ROOT, os.environ.get("PYTHONPATH")))))
    env.pop("PYTHONWARNINGS", None)
    result = subprocess.run(
        [sys.executable, "-c", "import sb3_ppg"], cwd=str(tmp_path), capture_output=True, text=True, timeout=300, env=env
    )
    assert result.returncode == 0, result.stderr
    output = result.stdout + result.stderr
    # Python 3.13 (procgen-gym): no gym at all; below, procgen-mirror's gym 0.26 is imported without its notice
    assert output == "", output


def test_import_leaves_procgen_unloaded(tmp_path):
    """
    ``import sb3_ppg`` imports neither the Procgen package nor gym3 (regression: it did, with procgen's native env
    module and gym3's cffi wrappers); the first Procgen env does.
    """
    code = (
        "import sys, sb3_ppg; print(sorted({m.split('.')[0] for m in sys.modules} & {'procgen', 'procgen_gym', 'gym3'}))"
        "; sb3_ppg.ProcgenVecEnv(1, 'starpilot').close()"
        "; print(sorted({m.split('.')[0] for m in sys.modules} & {'procgen', 'procgen_gym'}))"
    )
    package = "procgen_gym" if sys.version_info >= (3, 13) else "procgen"
    assert run_python(code, str(tmp_path)).splitlines() == ["[]", f"['{package}']"]


def run_python(code: str, cwd: str) -> str:
    """Standard output and error of ``python -c code`` (which must succeed), with this checkout first on the path."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (ROOT, os.environ.get("PYTHONPATH")))))
    env.pop("PYTHONWARNINGS", None)
    result = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout + result.stderr


def test_procgen_is_an_extra():
    """
    The package alone requires no Procgen package and no numpy below 2 (regression: it pulled procgen-mirror, gym 0.26
    and numpy<2 on Python 3.10-3.12); the procgen extra brings them, and the zoo and tests extras include it.
    """
    arguments = setup_arguments()
    required, extras = arguments["install_requires"], arguments["extras_require"]
    procgen_or_numpy_1 = [r for r in required if r.startswith(("procgen", "gym-", "gym3", "pandas")) or "numpy>=1.20," in r]
    assert not procgen_or_numpy_1, required
    assert any(r.startswith("procgen-mirror==0.10.7;") for r in extras["procgen"])
    assert any(r.startswith("procgen-gym") and "python_version>='3.13'" in r for r in extras["procgen"])
    assert "numpy>=1.20,<2.0; python_version<'3.13'" in extras["procgen"]
    for name in ("zoo", "tests"):
        assert set(extras["procgen"]) <= set(extras[name]), name


def test_without_procgen(tmp_path):
    """
    ``pip install .`` brings no Procgen package (the procgen extra does): sb3_ppg imports and trains on other envs,
    and every way to a Procgen game (make_procgen_env, ProcgenVecEnv, the gymnasium id) raises an error naming the
    extra. The missing packages are simulated (None in sys.modules makes their import fail).
    """
    code = (
        "import sys; sys.modules.update(dict.fromkeys(['procgen', 'procgen_gym', 'procgen.env', 'procgen_gym.env']))\n"
        "import gymnasium, sb3_ppg\n"
        "model = sb3_ppg.PPG('MlpPolicy', 'CartPole-v1', n_steps=32, batch_size=32, n_policy_iters=1, aux_batch_rollouts=1)\n"
        "model.learn(32)\n"
        "for make in (lambda: sb3_ppg.make_procgen_env('coinrun', 1), lambda: sb3_ppg.ProcgenVecEnv(1, 'coinrun'),\n"
        "             lambda: gymnasium.make('procgen/coinrun-v0')):\n"
        "    try:\n"
        "        make()\n"
        "    except ImportError as error:\n"
        "        print(error)\n"
    )
    lines = run_python(code, str(tmp_path)).splitlines()
    assert len(lines) == 3, lines
    for line in lines:
        assert 'pip install -e ".[procgen]"' in line and "procgen-gym" in line, line


@pytest.mark.parametrize("code", ["import stable_baselines3, sb3_ppg", "import rl_zoo3, sb3_ppg", "import sb3_ppg, gym"])
def test_any_import_order_prints_nothing(tmp_path, code):
    """
    Regression: SB3 (and the zoo) import gym whenever it is installed, so importing them before sb3_ppg printed gym's
    notice, as did every example. setup.py pins gym-notices below the version that holds it.
    """
    assert run_python(code if importlib.util.find_spec("gym") is not None else code.replace(", gym", ""), str(tmp_path)) == ""


def test_procgen_package_for_this_python():
    """procgen-gym (numpy 2) on Python >= 3.13, procgen / procgen-mirror (numpy 1) below."""
    import numpy as np

    from sb3_ppg.procgen.backend import BACKEND

    if sys.version_info >= (3, 13):
        assert BACKEND == "procgen-gym" and np.lib.NumpyVersion(np.__version__) >= "2.0.0"
    else:
        assert BACKEND == "procgen" and np.lib.NumpyVersion(np.__version__) < "2.0.0"


def test_suite_runs_without_pytest_xdist():
    """
    pyproject.toml's ``addopts`` ask pytest-xdist for a worker per CPU; where it is not loaded, tests/conftest.py
    accepts those options and the run says it stays in one process, instead of pytest's "unrecognized arguments".
    """
    env = {name: value for name, value in os.environ.items() if name != "PYTEST_ADDOPTS"}
    # xdist left out by name, then with every installed plugin left unloaded
    for args, extra_env in ((["-p", "no:xdist"], {}), ([], {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})):
        result = subprocess.run(
            [sys.executable, "-m", "pytest", *args, "-p", "no:cacheprovider", "--collect-only", "tests/test_layering.py"],
            cwd=ROOT, capture_output=True, text=True, timeout=300, env={**env, **extra_env},
        )  # fmt: skip
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        assert "pytest-xdist is not loaded: the tests run in one process" in result.stdout
        assert "<Module test_layering.py>" in result.stdout and "workers" not in result.stdout
