"""MaskableRecurrentPPG: PPG with LSTM policies and invalid action masking (sb3-contrib's APIs of both)."""

from sb3_ppg.ppg_mask_recurrent.policies import (
    CnnLstmPolicy,
    MaskableProcgenCnnLstmPolicy,
    MaskableRecurrentPPGCnnPolicy,
    MaskableRecurrentPPGMultiInputPolicy,
    MaskableRecurrentPPGPolicy,
    MlpLstmPolicy,
    MultiInputLstmPolicy,
    ProcgenCnnLstm,
)
from sb3_ppg.ppg_mask_recurrent.ppg_mask_recurrent import MaskableRecurrentPPG

__all__ = [
    "CnnLstmPolicy",
    "MaskableProcgenCnnLstmPolicy",
    "MaskableRecurrentPPG",
    "MaskableRecurrentPPGCnnPolicy",
    "MaskableRecurrentPPGMultiInputPolicy",
    "MaskableRecurrentPPGPolicy",
    "MlpLstmPolicy",
    "MultiInputLstmPolicy",
    "ProcgenCnnLstm",
]
