"""Run a model in float64, for tests that compare two runs which must compute the same function."""

from typing import TypeVar

import torch as th
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor


def _inputs_to_float64(module: th.nn.Module, args: tuple) -> tuple:
    """Forward pre-hook: the observations (a tensor, or a dict of tensors) in float64."""
    observations = args[0]
    if isinstance(observations, dict):
        return ({key: value.double() for key, value in observations.items()}, *args[1:])
    return (observations.double(), *args[1:])


AlgorithmType = TypeVar("AlgorithmType", bound=BaseAlgorithm)


def run_in_float64(model: AlgorithmType) -> AlgorithmType:
    """
    Make a model's networks (PPG's, or another SB3 algorithm's) compute in float64: the policy's parameters (its
    optimizers keep the same parameter objects), and the inputs of its features extractors (SB3's preprocessing gives
    float32 observations). The buffers still store float32, the same values in both runs being compared.

    Two float32 runs that compute the same function in another order (another memory layout, micro-batches, ranks,
    another implementation) differ in their last bits by amounts that depend on the CPU's kernels, and Adam turns a
    rounding difference in a near-zero gradient into a step of up to a learning rate. In float64 the rounding
    differences are ~1e-16 relative, and Adam amplifies a gradient difference by at most ``learning_rate / eps`` per
    step (5e4 with PPG's 5e-4 and 1e-8), so after a few steps such runs agree to ~1e-11 or better on any CPU: far below
    the tolerances of the tests (1e-8 with Adam's eps 1e-8, 1e-10 with SGD or eps 1e-5), and far below any real
    difference (a fraction of a learning rate).

    :param model: a model, before training
    :return: the model
    """
    model.policy.double()
    for module in model.policy.modules():
        if isinstance(module, BaseFeaturesExtractor):
            module.register_forward_pre_hook(_inputs_to_float64)
    return model
