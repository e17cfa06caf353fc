"""sb3-ppg: Phasic Policy Gradient (PPG) as a Stable-Baselines3 algorithm, with Procgen envs and a command line."""

import os

from sb3_ppg.common import distributed as distributed
from sb3_ppg.common.aux_buffer import AuxiliaryBuffer
from sb3_ppg.common.callbacks import PPGEvalCallback
from sb3_ppg.common.checkpoints import PPGCheckpointCallback
from sb3_ppg.ppg import PPG, CnnPolicy, MlpPolicy, MultiInputPolicy, PPGPolicy, ProcgenCnn, ProcgenCnnPolicy
from sb3_ppg.ppg_mask import MaskablePPG
from sb3_ppg.ppg_mask_recurrent import MaskableRecurrentPPG
from sb3_ppg.ppg_recurrent import RecurrentPPG
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
    "MaskablePPG",
    "MaskableRecurrentPPG",
    "MlpPolicy",
    "MultiInputPolicy",
    "PPGCheckpointCallback",
    "PPGEvalCallback",
    "PPGPolicy",
    "ProcgenCnn",
    "ProcgenCnnPolicy",
    "ProcgenGymnasiumEnv",
    "ProcgenVecEnv",
    "RecurrentPPG",
    "__version__",
    "make_procgen_env",
    "register_procgen_envs",
]
