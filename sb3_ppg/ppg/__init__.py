"""The algorithm: :class:`PPG`, its policies and its losses."""

from sb3_ppg.ppg.policies import CnnPolicy, MlpPolicy, MultiInputPolicy, PPGPolicy, ProcgenCnn, ProcgenCnnPolicy
from sb3_ppg.ppg.ppg import PPG

__all__ = ["PPG", "CnnPolicy", "MlpPolicy", "MultiInputPolicy", "PPGPolicy", "ProcgenCnn", "ProcgenCnnPolicy"]
