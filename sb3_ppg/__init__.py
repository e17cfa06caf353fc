"""sb3-ppg: Phasic Policy Gradient (PPG) as a Stable-Baselines3 algorithm, with Procgen envs and a command line."""

import contextlib
import importlib.util
import io
import os
import sys

# procgen-mirror (Python <= 3.12) installs gym 0.26 for gym3; SB3 imports gym whenever it is installed, and gym prints
# a notice about its maintenance on import. sb3_ppg uses gym only inside procgen's gym3 env, so that import is done
# here first with that notice kept off the terminal: anything else printed meanwhile (a warning) still shows, and an
# error other than ImportError is raised. Imported after stable_baselines3, sb3_ppg comes too late: SB3's import has
# already printed the notice (see README.md).
if "gym" not in sys.modules and importlib.util.find_spec("gym") is not None:
    _captured_stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(_captured_stderr):
            import gym
        _notices = getattr(sys.modules.get("gym_notices.notices"), "notices", None)
        if isinstance(_notices, dict) and _notices.get(gym.__version__):
            _captured_stderr = io.StringIO(_captured_stderr.getvalue().replace(f"{_notices[gym.__version__]}\n", "", 1))
    except ImportError:  # as SB3: a gym that cannot be imported is ignored
        pass
    finally:
        sys.stderr.write(_captured_stderr.getvalue())

from sb3_ppg.buffers import AuxiliaryBuffer
from sb3_ppg.callbacks import PPGCheckpointCallback, PPGEvalCallback
from sb3_ppg.policies import CnnPolicy, MlpPolicy, MultiInputPolicy, PPGPolicy, ProcgenCnn, ProcgenCnnPolicy
from sb3_ppg.ppg import PPG
from sb3_ppg.procgen import PROCGEN_GAMES, ProcgenGymnasiumEnv, ProcgenVecEnv, make_procgen_env, register_procgen_envs

# Read version from file
version_file = os.path.join(os.path.dirname(__file__), "version.txt")
with open(version_file) as file_handler:
    __version__ = file_handler.read().strip()

# Gymnasium ids procgen/<game>-v0 for the 16 Procgen games
register_procgen_envs()

__all__ = [
    "PPG",
    "PROCGEN_GAMES",
    "AuxiliaryBuffer",
    "CnnPolicy",
    "MlpPolicy",
    "MultiInputPolicy",
    "PPGCheckpointCallback",
    "PPGEvalCallback",
    "PPGPolicy",
    "ProcgenCnn",
    "ProcgenCnnPolicy",
    "ProcgenGymnasiumEnv",
    "ProcgenVecEnv",
    "__version__",
    "make_procgen_env",
    "register_procgen_envs",
]
