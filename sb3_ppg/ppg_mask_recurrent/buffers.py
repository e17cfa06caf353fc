"""MaskableRecurrentPPG's rollout buffers: MaskablePPG's (the action masks of each step) with the rollout's start states."""

from sb3_ppg.common.recurrent.buffers import RecurrentStartStates
from sb3_ppg.ppg_mask.buffers import MaskablePPGDictRolloutBuffer, MaskablePPGRolloutBuffer


class MaskableRecurrentRolloutBuffer(RecurrentStartStates, MaskablePPGRolloutBuffer):
    """``MaskablePPGRolloutBuffer`` with the LSTM states at the rollout's start (``MaskableRecurrentPPG``'s)."""


class MaskableRecurrentDictRolloutBuffer(RecurrentStartStates, MaskablePPGDictRolloutBuffer):
    """
    ``MaskablePPGDictRolloutBuffer`` with the LSTM states at the rollout's start (``MaskableRecurrentPPG``'s for Dict
    observations).
    """
