"""The algorithms the command line adds to the RL Zoo, by their ``--algo`` name."""

from sb3_ppg.ppg import PPG
from sb3_ppg.ppg_mask import MaskablePPG
from sb3_ppg.ppg_recurrent import RecurrentPPG

#: ``--algo`` name -> class: every one gets PPG's checkpoints, resume, evaluation callback and data parallelism
PPG_ALGORITHMS: dict[str, type[PPG]] = {"ppg": PPG, "maskable_ppg": MaskablePPG, "recurrent_ppg": RecurrentPPG}
