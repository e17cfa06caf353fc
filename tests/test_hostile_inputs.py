"""Hostile inputs: wrong types, negative or non-finite values and schedules, malformed ``net_arch``, NaN
observations, non-finite gradients and oversized auxiliary buffers, each refused with an error naming the fix."""

import re

import gymnasium as gym
import numpy as np
import pytest
import torch as th

from sb3_ppg import PPG

INTEGER_HYPERPARAMETERS = (
    "n_steps",
    "batch_size",
    "n_epochs",
    "n_value_epochs",
    "n_policy_iters",
    "n_aux_epochs",
    "aux_batch_rollouts",
    "n_aux_grad_accum",
)


@pytest.mark.parametrize("name", INTEGER_HYPERPARAMETERS)
@pytest.mark.parametrize("value", [2.5, "256", True, None, [4]])
def test_non_integer_hyperparameters_are_named(make_model, name, value):
    if value is None and name in ("batch_size", "n_value_epochs"):
        return  # None is their documented default
    with pytest.raises(ValueError, match=rf"{name} must be an integer, got {re.escape(repr(value))}"):
        make_model(**{name: value})


def test_numpy_integers_are_accepted_as_python_ints(make_model):
    model = make_model(**{name: np.int64(value) for name, value in dict(n_steps=16, batch_size=8, n_epochs=2).items()})
    assert type(model.n_steps) is int and type(model.batch_size) is int and type(model.n_epochs) is int
    model.learn(32)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(learning_rate=-1e-3), "learning_rate must be a number >= 0, got -0.001"),
        (dict(aux_learning_rate=-1e-3), "aux_learning_rate must be a number >= 0, got -0.001"),
        (dict(learning_rate=float("nan")), "learning_rate must be a number >= 0, got nan"),
        (dict(learning_rate="3e-4"), "learning_rate must be a number, a schedule"),
        (dict(gamma="0.99"), r"gamma must be in \[0, 1\], got '0.99'"),
        (dict(ent_coef=float("inf")), "ent_coef must be a number >= 0, got inf"),
        (dict(clip_range="0.2"), "clip_range must be a number, a schedule"),
        (dict(max_grad_norm="0.5"), "max_grad_norm must be a number or None"),
        (dict(target_kl=-0.01), "target_kl must be a number > 0"),
    ],
)
def test_bad_float_hyperparameters(make_model, kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_model(**kwargs)


@pytest.mark.parametrize("name", ["learning_rate", "aux_learning_rate", "clip_range", "clip_range_vf"])
@pytest.mark.parametrize("bad", [-0.1, float("nan"), float("inf")])
def test_schedule_with_bad_value_stops_at_phase_start(make_model, name, bad):
    # Fine at the start (progress 1), bad once training has progressed
    model = make_model(**{name: lambda progress: 1e-3 if progress == 1 else bad})
    before = [p.detach().clone() for p in model.policy.parameters()]
    with pytest.raises(ValueError, match=rf"The {name} schedule returned {bad!r} at progress_remaining=.*Fix the function"):
        model.learn(4 * 16)
    if name != "aux_learning_rate":
        # Stopped at the start of the policy phase, before any update with the bad value
        assert all(th.equal(a, b) for a, b in zip(before, model.policy.parameters()))


def test_schedules_reaching_zero_are_fine(make_model):
    make_model(learning_rate=lambda p: 1e-3 * p, clip_range=lambda p: 0.2 * p, clip_range_vf=lambda p: p).learn(64)


def test_valid_integer_and_float_types_still_train(make_model):
    model = make_model(gamma=np.float32(0.99), ent_coef=0, learning_rate=np.float64(1e-3), n_aux_epochs=np.int32(1))
    model.learn(32)
    assert gym is not None
