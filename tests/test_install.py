"""What a user sees on install: `import sb3_ppg` prints nothing, on every Python (gym's notice included)."""

import importlib.util
import os
import subprocess
import sys

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


def test_procgen_package_for_this_python():
    """procgen-gym (numpy 2) on Python >= 3.13, procgen / procgen-mirror (numpy 1) below."""
    import numpy as np

    from sb3_ppg.procgen.backend import BACKEND

    if sys.version_info >= (3, 13):
        assert BACKEND == "procgen-gym" and np.lib.NumpyVersion(np.__version__) >= "2.0.0"
    else:
        assert BACKEND == "procgen" and np.lib.NumpyVersion(np.__version__) < "2.0.0"
