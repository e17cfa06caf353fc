"""
The GPU levers, each in one module: CUDA graphs of the rollout's forward pass (``cuda_graphs``), a second stream for
``arch="dual"``'s value network (``cuda_streams``), the rollout and its minibatches on the device (``device_data``),
and torch's fused Adam with the finite checks on the device (``fused_adam``, the one user of torch's private APIs).
Only the algorithm and its policies (``sb3_ppg.ppg``) import them (tests/test_layering.py); see docs/throughput.md.
"""

from sb3_ppg.common.cuda.device_data import (
    DEVICE_GATHERED_BUFFERS,
    device_env_minibatches,
    device_minibatches,
    gathers_on_device,
    rollout_to_device,
)
from sb3_ppg.common.cuda.fused_adam import DeviceFiniteCheck, configure_optimizers, finite_check
from sb3_ppg.common.rollout_buffers import DeviceRollout

__all__ = [
    "DEVICE_GATHERED_BUFFERS",
    "DeviceFiniteCheck",
    "DeviceRollout",
    "configure_optimizers",
    "device_env_minibatches",
    "device_minibatches",
    "finite_check",
    "gathers_on_device",
    "rollout_to_device",
]
