"""
The 16 Procgen games (Cobbe et al. 2020) for Stable-Baselines3: a native ``VecEnv`` (:class:`ProcgenVecEnv`), the
PPG paper's wrapper chain (:func:`make_procgen_env`) and one-game gymnasium envs ``procgen/<game>-v0``.
"""

import warnings

from sb3_ppg.procgen.games import (
    DISTRIBUTION_MODES,
    PROCGEN_GAMES,
    PROCGEN_OPTIONS,
    check_procgen_options,
    procgen_seed,
    register_procgen_envs,
)
from sb3_ppg.procgen.gymnasium_env import ProcgenGymnasiumEnv, convert_legacy_procgen_env
from sb3_ppg.procgen.presets import PROCGEN_PRESETS, ProcgenPreset, get_procgen_preset
from sb3_ppg.procgen.vec_env import ProcgenVecEnv
from sb3_ppg.procgen.wrappers import make_procgen_env, save_reward_statistics

# Recording a video (VecVideoRecorder -> moviepy) imports the imageio-ffmpeg that gym3 pins (0.3), which imports
# pkg_resources and so prints setuptools' deprecation notice: nothing the user can act on (the zoo extra pins
# setuptools < 81 for it), so it is silenced for that module only
warnings.filterwarnings("ignore", message="pkg_resources is deprecated", category=UserWarning, module=r"imageio_ffmpeg\.")

__all__ = [
    "DISTRIBUTION_MODES",
    "PROCGEN_GAMES",
    "PROCGEN_OPTIONS",
    "PROCGEN_PRESETS",
    "ProcgenGymnasiumEnv",
    "ProcgenPreset",
    "ProcgenVecEnv",
    "check_procgen_options",
    "convert_legacy_procgen_env",
    "get_procgen_preset",
    "make_procgen_env",
    "procgen_seed",
    "register_procgen_envs",
    "save_reward_statistics",
]
