"""What a user sees on install: `import sb3_ppg` prints nothing, on every Python (gym's notice included)."""

import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
# The four lines gym 0.26 prints when it is imported
GYM_NOTICE_LINES = (
    "Gym has been unmaintained since 2022",
    "Please upgrade to Gymnasium",
    "Users of this version of Gym",
    "See the migration guide",
)


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
    if importlib.util.find_spec("gym") is not None:
        # The notice is what gym prints when imported on its own: the test sees it, so it can fail
        direct = subprocess.run(
            [sys.executable, "-c", "import gym"], cwd=str(tmp_path), capture_output=True, text=True, timeout=300, env=env
        )
        assert any(line.startswith(GYM_NOTICE_LINES) for line in direct.stderr.splitlines()), direct.stderr


# Run in a subprocess before `import sb3_ppg`: prints a line and warns while gym (if installed) is being imported
NOISY_GYM_IMPORT = """
import sys, warnings

class NoisyGymImport:
    def find_spec(self, name, path=None, target=None):
        if name == "gym.version":
            print("a line printed while gym is imported", file=sys.stderr)
            warnings.warn("a warning while gym is imported")
        return None

sys.meta_path.insert(0, NoisyGymImport())
"""


def run_python(code: str, cwd: str) -> str:
    """Standard output and error of ``python -c code`` (which must succeed), with this checkout first on the path."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (ROOT, os.environ.get("PYTHONPATH")))))
    env.pop("PYTHONWARNINGS", None)
    result = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout + result.stderr


@pytest.mark.skipif(importlib.util.find_spec("gym") is None, reason="gym is not installed (Python >= 3.13)")
def test_gym_notice_is_the_only_output_kept_off_the_terminal(tmp_path):
    """
    sb3_ppg imports gym first with its maintenance notice kept off the terminal, and nothing else: on main, everything
    printed during that import was dropped. SB3 imported after sb3_ppg prints nothing either.
    """
    output = run_python(NOISY_GYM_IMPORT + "import sb3_ppg, stable_baselines3", str(tmp_path))
    assert "a line printed while gym is imported" in output and "UserWarning: a warning while gym is imported" in output
    assert not any(line.startswith(GYM_NOTICE_LINES) for line in output.splitlines()), output


@pytest.mark.skipif(importlib.util.find_spec("gym") is None, reason="gym is not installed (Python >= 3.13)")
def test_gym_notice_after_stable_baselines3_is_sb3s(tmp_path):
    """
    What README.md says: `import stable_baselines3` before sb3_ppg prints gym's notice itself (SB3 imports gym whenever
    it is installed), before sb3_ppg's code runs; sb3_ppg adds nothing to it.
    """
    lines = run_python("import stable_baselines3, sb3_ppg", str(tmp_path)).splitlines()
    assert len(lines) == len(GYM_NOTICE_LINES) and all(line.startswith(GYM_NOTICE_LINES) for line in lines), lines


def test_procgen_package_for_this_python():
    """procgen-gym (numpy 2) on Python >= 3.13, procgen / procgen-mirror (numpy 1) below."""
    import numpy as np

    from sb3_ppg.procgen.backend import BACKEND

    if sys.version_info >= (3, 13):
        assert BACKEND == "procgen-gym" and np.lib.NumpyVersion(np.__version__) >= "2.0.0"
    else:
        assert BACKEND == "procgen" and np.lib.NumpyVersion(np.__version__) < "2.0.0"
