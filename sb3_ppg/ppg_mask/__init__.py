"""MaskablePPG: PPG with invalid action masking, in sb3-contrib's MaskablePPO API (the only layer importing sb3-contrib)."""

from sb3_ppg.ppg_mask.player import MaskedPlayer
from sb3_ppg.ppg_mask.policies import (
    CnnPolicy,
    MaskablePPGCnnPolicy,
    MaskablePPGMultiInputPolicy,
    MaskablePPGPolicy,
    MaskableProcgenCnnPolicy,
    MlpPolicy,
    MultiInputPolicy,
    ProcgenCnn,
)
from sb3_ppg.ppg_mask.ppg_mask import MaskablePPG

__all__ = [
    "CnnPolicy",
    "MaskablePPG",
    "MaskablePPGCnnPolicy",
    "MaskablePPGMultiInputPolicy",
    "MaskablePPGPolicy",
    "MaskableProcgenCnnPolicy",
    "MaskedPlayer",
    "MlpPolicy",
    "MultiInputPolicy",
    "ProcgenCnn",
]
