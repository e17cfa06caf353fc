"""
On a CUDA device the levers that move data (the auxiliary buffer on the device, the policy phase's minibatches gathered
on the device from one copy of the rollout per train(), which the auxiliary buffer also stores from, distributions
without argument checks during rollouts and training) give bit for bit the parameters of the paths they replace.
These tests run where a GPU is (the lead's GPU sessions) and skip elsewhere; the CPU tests of each lever are in
tests/test_aux_buffer_device.py, tests/test_buffers.py, tests/test_rollout_buffers.py and tests/test_distributions.py.
"""

import contextlib

import pytest
import torch as th
from helpers import assert_identical, parameters
from test_cuda_graphs import image_model

from sb3_ppg.common import cuda
from sb3_ppg.common.cuda import device_data
from sb3_ppg.ppg import policies as policies_module
from sb3_ppg.ppg import ppg as ppg_module

pytestmark = pytest.mark.skipif(not th.cuda.is_available(), reason="needs a CUDA device")


def trained(monkeypatch: pytest.MonkeyPatch, aux_buffer_device: str, device_gather: bool, checks: bool) -> dict:
    with monkeypatch.context() as patch:
        if not device_gather:
            patch.setattr(cuda, "gathers_on_device", lambda rollout_buffer, device: False)
        if checks:
            unchecked = lambda distribution, enabled=True: contextlib.nullcontext()  # noqa: E731
            patch.setattr(ppg_module, "unchecked_distributions", unchecked)
            patch.setattr(policies_module, "unchecked_distributions", unchecked)
        model = image_model(True, "cuda", aux_buffer_device=aux_buffer_device)
        model.learn(256)
        assert model.n_aux_phases == 2
        assert device_data.gathers_on_device(model.rollout_buffer, model.device)
        return parameters(model)


def test_gpu_data_paths_are_bit_identical(monkeypatch):
    reference = trained(monkeypatch, "cpu", device_gather=False, checks=True)
    assert_identical(trained(monkeypatch, "device", device_gather=True, checks=False), reference)
    assert_identical(trained(monkeypatch, "pinned", device_gather=True, checks=False), reference)
