"""RecurrentPPG: PPG with LSTM policies (sb3-contrib's RecurrentPPO API)."""

from sb3_ppg.ppg_recurrent.policies import (
    CnnLstmPolicy,
    MlpLstmPolicy,
    MultiInputLstmPolicy,
    ProcgenCnnLstm,
    ProcgenCnnLstmPolicy,
    RecurrentPPGPolicy,
)
from sb3_ppg.ppg_recurrent.ppg_recurrent import RecurrentPPG

__all__ = [
    "CnnLstmPolicy",
    "MlpLstmPolicy",
    "MultiInputLstmPolicy",
    "ProcgenCnnLstm",
    "ProcgenCnnLstmPolicy",
    "RecurrentPPG",
    "RecurrentPPGPolicy",
]
