"""
The module path of PPG's buffers in sb3_ppg 0.1.0a0: a model zip pickles its ``rollout_buffer_class`` by this path, so
that the zips saved then load. The buffers are in :mod:`sb3_ppg.common.rollout_buffers` and
:mod:`sb3_ppg.common.aux_buffer`.
"""

from sb3_ppg.common.aux_buffer import AuxiliaryBuffer, AuxiliaryBufferSamples
from sb3_ppg.common.rollout_buffers import PPGDictRolloutBuffer, PPGRolloutBuffer, UnflattenedRolloutBuffer

__all__ = ["AuxiliaryBuffer", "AuxiliaryBufferSamples", "PPGDictRolloutBuffer", "PPGRolloutBuffer", "UnflattenedRolloutBuffer"]
