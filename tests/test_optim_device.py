"""
Issue 27's levers of the optimizer step: fused Adam on CUDA only (a CPU model steps as before, a model saved from a
fused run steps as before on a CPU) and the phases' statistics read from the device once per phase.
"""

import io

import numpy as np
import pytest
import torch as th

from sb3_ppg.common.cuda import fused_adam
from sb3_ppg.ppg.losses import PhaseStats

CUDA, CPU = th.device("cuda"), th.device("cpu")


def test_fused_adam_is_chosen_on_cuda_only_and_never_over_the_users_choice():
    assert fused_adam.uses_fused_adam(th.optim.Adam, {}, CUDA)
    assert fused_adam.uses_fused_adam(th.optim.AdamW, {"eps": 1e-5}, CUDA)
    assert not fused_adam.uses_fused_adam(th.optim.Adam, {}, CPU)
    assert not fused_adam.uses_fused_adam(th.optim.SGD, {}, CUDA)
    for choice in ({"fused": False}, {"foreach": True}, {"capturable": True}, {"differentiable": True}):
        assert not fused_adam.uses_fused_adam(th.optim.Adam, choice, CUDA), choice


def adam_steps(fused: bool, n_steps: int = 5) -> tuple[th.Tensor, th.optim.Adam]:
    """Adam on fixed gradients (they do not depend on the parameters, so rounding differences cannot feed back)."""
    generator = th.Generator().manual_seed(0)
    parameter = th.nn.Parameter(th.randn(1000, generator=generator))
    optimizer = th.optim.Adam([parameter], lr=5e-4, eps=1e-8, foreach=None if fused else True)
    for step in range(n_steps):
        if step == 2:
            # Switched after two steps: the state (moments, step count) carries over
            fused_adam.configure_adam_implementation(optimizer, fused)
        parameter.grad = th.randn(1000, generator=generator)
        optimizer.step()
    return parameter.detach(), optimizer


def test_fused_adam_makes_the_same_update_up_to_float_rounding():
    """
    The tolerance: both kernels evaluate the same formula in float32 in another order, each of its ~8 operations
    within half an ulp, so one step's update differs by at most 8 * 2**-24 of its size (at most lr * R, with
    R = (1 - b1) / sqrt(1 - b2) / sqrt(1 - b1**2 / b2) ~ 3.2 the bound of Adam's bias-corrected ratio) plus one ulp of
    the parameter for the subtraction; over n steps n times that (fixed gradients: no feedback).
    """
    reference, _ = adam_steps(fused=False)
    fused, optimizer = adam_steps(fused=True)
    assert all(group["fused"] for group in optimizer.param_groups)
    beta1, beta2, lr, n_steps = 0.9, 0.999, 5e-4, 5
    ratio = (1 - beta1) / np.sqrt(1 - beta2) / np.sqrt(1 - beta1**2 / beta2)
    ulp = np.spacing(np.float32(reference.abs().max().item()))
    tolerance = n_steps * (8 * 2.0**-24 * lr * ratio + ulp)
    assert (fused - reference).abs().max().item() <= tolerance
    # The step count lives where the fused kernel wants it: float32 on the parameters' device
    (state,) = optimizer.state.values()
    assert state["step"].dtype == th.float32 and state["step"].device == reference.device and state["step"].item() == 5


def test_cpu_models_step_as_torch_builds_them(make_model):
    model = make_model(device="cpu")
    assert all(group["fused"] is None for optimizer in model._optimizers() for group in optimizer.param_groups)


def test_a_model_saved_with_fused_steps_trains_on_the_cpu_as_one_saved_without(make_model):
    """A zip from a CUDA run (its Adam groups say fused=True) loads on a CPU with torch's default implementation."""
    model = make_model()
    model.learn(64)
    plain, fused = io.BytesIO(), io.BytesIO()
    model.save(plain)
    for optimizer in model._optimizers():
        fused_adam.configure_adam_implementation(optimizer, fused=True)
    model.save(fused)
    models = []
    for file in (plain, fused):
        file.seek(0)
        loaded = type(model).load(file, env=make_model().get_env(), device="cpu")
        assert all(not group["fused"] for optimizer in loaded._optimizers() for group in optimizer.param_groups)
        loaded.learn(64, reset_num_timesteps=False)
        models.append(loaded)
    for name, tensor in models[0].policy.state_dict().items():
        assert th.equal(models[1].policy.state_dict()[name], tensor), name


@pytest.mark.parametrize("dtype", [th.float32, th.float64])
def test_phase_statistics_are_read_at_once_with_the_same_values(dtype, monkeypatch):
    stats = PhaseStats()
    generator = th.Generator().manual_seed(0)
    for _ in range(7):
        stats.add({name: th.rand((), generator=generator, dtype=dtype) for name in ("loss", "approx_kl", "clip_fraction")})
    stats.add({"loss": th.tensor(0.3, dtype=dtype)})  # a diagnostic only some minibatches have
    copies = []
    tolist = th.Tensor.tolist
    monkeypatch.setattr(th.Tensor, "tolist", lambda self: copies.append(self) or tolist(self))
    values = stats.read()
    assert len(copies) == 1  # one copy from the device
    assert values == {**{name: stats.mean(name) for name in stats.values}, "last_loss": stats.last("loss")}
    assert PhaseStats().read() == {}


def test_logged_statistics_are_those_of_the_per_name_reads(make_model, monkeypatch):
    """What train() logs through read() is what mean() and last() give, name by name (the code before read())."""
    compared = []
    read = PhaseStats.read

    def checked_read(self, *args, **kwargs):
        values = read(self, *args, **kwargs)
        assert values == {**{name: self.mean(name) for name in self.values}, "last_loss": self.last("loss")}
        compared.append(values)
        return values

    monkeypatch.setattr(PhaseStats, "read", checked_read)
    model = make_model(target_kl=10.0)
    model.learn(64)
    assert len(compared) == 6  # 4 policy phases and 2 auxiliary phases
    assert model.logger.name_to_value["aux/kl_loss"] == compared[-1]["kl_loss"]


def test_adam_steps_multi_tensor_on_a_cpu_unless_the_user_chose(make_model):
    model = make_model(device="cpu")
    assert all(group["foreach"] is True for optimizer in model._optimizers() for group in optimizer.param_groups)
    # A loaded model steps the same way
    file = io.BytesIO()
    model.save(file)
    file.seek(0)
    loaded = type(model).load(file, env=make_model().get_env(), device="cpu")
    assert all(group["foreach"] is True for optimizer in loaded._optimizers() for group in optimizer.param_groups)
    for choice in ({"foreach": False}, {"fused": True}, {"differentiable": False}):
        chosen = make_model(device="cpu", policy_kwargs=dict(optimizer_kwargs=choice))
        assert all(group["foreach"] is not True for group in chosen.policy.optimizer.param_groups), choice
    sgd = make_model(device="cpu", policy_kwargs=dict(optimizer_class=th.optim.SGD))
    assert not any(group["foreach"] for group in sgd.policy.optimizer.param_groups)


def test_multi_tensor_adam_makes_the_same_steps_as_torchs_cpu_default(make_model):
    """Exact (CPU): the multi-tensor kernels apply the same per-tensor operations as torch's loop over the parameters."""
    initial = make_model(device="cpu", seed=0).policy.state_dict()
    weights = []
    for kwargs in (dict(optimizer_kwargs=dict(foreach=False)), {}):  # torch's CPU default, PPG's choice
        model = make_model(device="cpu", seed=0, policy_kwargs=kwargs)
        model.learn(256)
        weights.append(model.policy.state_dict())
    assert any(not th.equal(initial[name], weights[0][name]) for name in initial)
    assert all(th.equal(weights[0][name], weights[1][name]) for name in initial)
