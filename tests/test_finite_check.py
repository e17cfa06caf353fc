"""
Issue 27's finite check on the device (sb3_ppg.common.cuda.fused_adam.DeviceFiniteCheck): where the fused Adam can
skip a step, a non-finite loss or gradient sets a flag on the device instead of being read each minibatch, the step is
skipped there and the error comes at the end of the phase. On a CPU the check stays on the host unless a test forces
it; torch's fused Adam runs on the CPU too, so both paths are compared here (and on a CUDA device where there is one:
those tests skip elsewhere).
"""

import pathlib
import sys
import types
import warnings

import pytest
import torch as th
from sb3_contrib.common.envs import InvalidActionEnvDiscrete
from stable_baselines3.common.envs import FakeImageEnv

from sb3_ppg import PPG, MaskablePPG
from sb3_ppg.common import optim
from sb3_ppg.common.cuda import fused_adam

# The paths on the same fused Adam: the device's check forced on the CPU, or the host's
PATHS = {"device": True, "host": False}
FUSED = dict(optimizer_kwargs=dict(fused=True))
NEEDS_CUDA = pytest.mark.skipif(not th.cuda.is_available(), reason="needs a CUDA device")
# The device's check uses torch's private APIs: on other torch versions than those checked, the host's runs instead
CHECKED_TORCH = pytest.mark.skipif(
    not fused_adam.private_apis_checked(), reason=f"torch {th.__version__} is not among {fused_adam.CHECKED_TORCH_VERSIONS}"
)


def adam(**kwargs) -> th.optim.Adam:
    return th.optim.Adam([th.nn.Parameter(th.zeros(3))], **kwargs)


@CHECKED_TORCH
def test_the_check_runs_on_the_device_for_a_fused_adam_on_cuda(monkeypatch):
    class SteppedOtherwise(th.optim.Adam):
        def step(self, closure=None):
            return super().step(closure)

    on_cuda = adam(fused=True)
    # (no CUDA here: a stand-in for the parameter, of which only the device is read)
    on_cuda.param_groups[0]["params"] = [types.SimpleNamespace(device=th.device("cuda"))]
    assert fused_adam.checks_finite_on_device(on_cuda)
    adamw = th.optim.AdamW([th.nn.Parameter(th.zeros(3))], fused=True)
    for optimizer in (adam(fused=True), adamw, adam(), adam(foreach=True)):
        assert not fused_adam.checks_finite_on_device(optimizer)
    # Forced on the device (tests): where the optimizer can skip a step there, and only there
    monkeypatch.setattr(fused_adam, "FINITE_CHECK_ON_DEVICE", True)
    assert fused_adam.checks_finite_on_device(adam(fused=True)) and fused_adam.checks_finite_on_device(adamw)
    others = (
        adam(),
        SteppedOtherwise([th.nn.Parameter(th.zeros(3))], fused=True),
        th.optim.SGD([th.nn.Parameter(th.zeros(3))]),
    )
    for optimizer in others:
        assert not fused_adam.checks_finite_on_device(optimizer)
    monkeypatch.setattr(fused_adam, "FINITE_CHECK_ON_DEVICE", False)
    assert not fused_adam.checks_finite_on_device(on_cuda)


def optimizer_states(model: PPG) -> list[dict[str, th.Tensor]]:
    """Every optimizer's state (step count and moments) of every parameter, copied."""
    return [
        {
            f"{index}.{key}": value.clone()
            for index, state in optimizer.state_dict()["state"].items()
            for key, value in state.items()
        }
        for optimizer in model._optimizers()
    ]


def assert_same_training_state(model: PPG, other: PPG) -> None:
    """Bit for bit the same parameters and optimizer states."""
    for name, tensor in model.policy.state_dict().items():
        assert th.equal(tensor, other.policy.state_dict()[name]), name
    states = optimizer_states(model)
    assert states[0]  # the policy phase's optimizer has stepped
    for state, other_state in zip(states, optimizer_states(other), strict=True):
        assert state.keys() == other_state.keys()
        for key in state:
            assert th.equal(state[key], other_state[key]), key


def count_device_checks(monkeypatch) -> list[bool]:
    """Where each phase's FiniteCheck runs (True: on the device), appended as the phases start."""
    where = []
    init = optim.FiniteCheck.__init__

    def recording_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        where.append(self.on_device)

    monkeypatch.setattr(optim.FiniteCheck, "__init__", recording_init)
    return where


def cnn_model(**kwargs) -> PPG:
    env = FakeImageEnv(screen_height=16, screen_width=16, n_channels=3, discrete=True)
    env.observation_space.seed(0)
    policy_kwargs = dict(features_extractor_kwargs=dict(channels=(4, 8), features_dim=16), **FUSED)
    return PPG("ProcgenCnn", env, policy_kwargs=policy_kwargs, precision="fp32", **kwargs)


CONFIGS = {
    # Two phases' worth of the small MLP: a value optimizer of its own, clipping, micro-batches, accumulated aux steps
    "mlp": dict(n_epochs=2, n_value_epochs=1, batch_size=8, max_grad_norm=0.5, micro_batch_size=4, n_aux_grad_accum=2),
    "mlp_unclipped": dict(n_epochs=2, batch_size=8, max_grad_norm=None, separate_aux_optimizer=False, n_aux_epochs=2),
    "cnn": dict(n_epochs=2, batch_size=8, max_grad_norm=0.5),
    "maskable": dict(n_epochs=2, batch_size=8, max_grad_norm=0.5),
}


@CHECKED_TORCH
@pytest.mark.parametrize("config", list(CONFIGS))
def test_finite_training_is_bit_identical_on_both_paths(make_model, monkeypatch, config):
    """Without a non-finite value, the device's check changes nothing: the same parameters and Adam state, bit for bit."""
    settings = dict(n_steps=16, n_policy_iters=2, aux_batch_rollouts=1, seed=0, device="cpu", **CONFIGS[config])
    models = {}
    for path, on_device in PATHS.items():
        monkeypatch.setattr(fused_adam, "FINITE_CHECK_ON_DEVICE", on_device)
        where = count_device_checks(monkeypatch)
        if config == "cnn":
            model = cnn_model(**settings)
        elif config == "maskable":
            env = InvalidActionEnvDiscrete(dim=4, n_invalid_actions=2)
            model = MaskablePPG("MlpPolicy", env, policy_kwargs=dict(net_arch=[16], **FUSED), **settings)
        else:
            model = make_model(policy_kwargs=dict(net_arch=[16], **FUSED), **settings)
        model.learn(2 * 16)
        assert model.n_aux_phases == 1
        assert where == [on_device] * 3  # two policy phases, an auxiliary phase
        assert all(group["fused"] for optimizer in model._optimizers() for group in optimizer.param_groups)
        models[path] = model
    assert_same_training_state(models["device"], models["host"])


@CHECKED_TORCH
@NEEDS_CUDA
def test_on_cuda_the_default_adam_checks_on_the_device_with_the_same_updates(make_model, monkeypatch):
    """On a CUDA device PPG's default Adam (fused there) checks on the device, and trains as with the host's checks."""
    settings = dict(n_steps=16, n_policy_iters=2, n_epochs=2, batch_size=8, max_grad_norm=0.5, device="cuda")
    models = {}
    for path, switch in (("device", None), ("host", False)):
        monkeypatch.setattr(fused_adam, "FINITE_CHECK_ON_DEVICE", switch)
        where = count_device_checks(monkeypatch)
        model = make_model(**settings)
        model.learn(2 * 16)
        assert where == [switch is None] * 3
        models[path] = model
    assert_same_training_state(models["device"], models["host"])


def inject(monkeypatch, model: PPG, phase: str, kind: str, at_step: int) -> None:
    """
    Make the loss (``kind="loss"``) or the gradient of one weight (``"gradients"``) NaN at the ``at_step``-th optimizer
    step of the phase (counted over the whole run).
    """
    steps = []
    step = optim.step

    def counting_step(optimizer, module, max_grad_norm, check):
        if check.phase == phase:
            steps.append(1)
        step(optimizer, module, max_grad_norm, check)

    monkeypatch.setattr(optim, "step", counting_step)

    def bad_now() -> bool:
        return len(steps) == at_step - 1

    if kind == "loss":
        name = "_joint_loss" if phase == "policy" else "_aux_loss"
        compute_loss = getattr(type(model), name)

        def nan_loss(self, *args, **kwargs):
            loss, diagnostics = compute_loss(self, *args, **kwargs)
            return (loss * float("nan") if bad_now() else loss), diagnostics

        monkeypatch.setattr(type(model), name, nan_loss)
    else:
        # A finite loss whose gradient is NaN in one weight
        model.policy.value_net.weight.register_hook(lambda grad: grad * float("nan") if bad_now() else grad)


def skip_step(monkeypatch, phase: str, at_step: int) -> None:
    """Leave out the ``at_step``-th optimizer step of the phase (its gradients cleared): the reference run."""
    steps = []
    step = optim.step

    def skipping_step(optimizer, module, max_grad_norm, check):
        if check.phase == phase:
            steps.append(1)
            if len(steps) == at_step:
                optimizer.zero_grad(set_to_none=True)
                return
        step(optimizer, module, max_grad_norm, check)

    monkeypatch.setattr(optim, "step", skipping_step)


@CHECKED_TORCH
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=NEEDS_CUDA)])
@pytest.mark.parametrize("kind", ["loss", "gradients"])
@pytest.mark.parametrize("phase", ["policy", "auxiliary"])
def test_a_non_finite_step_is_skipped_on_the_device_and_reported_at_the_end_of_the_phase(
    make_model, monkeypatch, phase, kind, device
):
    """
    A NaN loss or gradient at one step of the second policy phase (4 steps each) or of the auxiliary phase (4 steps,
    after two policy phases): the weights and the Adam state are exactly those of a run without that step, and the
    error comes at the end of the phase, naming it, the timestep, the step and what was not finite.
    """
    # Four policy iterations per auxiliary phase in the policy case: learn() ends with the second policy phase
    n_policy_iters = 4 if phase == "policy" else 2
    settings = dict(n_steps=16, n_epochs=2, batch_size=8, n_policy_iters=n_policy_iters, n_aux_epochs=2, max_grad_norm=0.5)
    at_step = 6 if phase == "policy" else 2  # the second policy phase's second step; the aux phase's second
    models = []
    for on_device in (True, False):
        with monkeypatch.context() as patch:
            patch.setattr(fused_adam, "FINITE_CHECK_ON_DEVICE", on_device)
            model = make_model(policy_kwargs=dict(net_arch=[16], **FUSED), device=device, **settings)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # learn() ends before the first auxiliary phase (the policy case)
                if on_device:
                    inject(patch, model, phase, kind, at_step)
                    with pytest.raises(FloatingPointError) as error:
                        model.learn(2 * 16)
                else:
                    skip_step(patch, phase, at_step)
                    model.learn(2 * 16)
        models.append(model)
    message = str(error.value)
    what = "loss is nan" if kind == "loss" else r"gradients have a non-finite norm \(nan\)"
    step_in_phase = at_step - 4 if phase == "policy" else at_step
    pattern = rf"PPG's {phase}-phase {what} at timestep 32 \(optimizer step {step_in_phase} of the phase\)"
    assert error.match(pattern), message
    assert "1 of the phase's 4 optimizer steps" in message and "skipped" in message
    assert ("VecNormalize" in message) and (("VecCheckNan" in message) == (kind == "loss"))
    assert_same_training_state(models[0], models[1])
    assert all(parameter.grad is None for parameter in models[0].policy.parameters())
    if phase == "auxiliary":
        # The phase counts as interrupted: its buffer stays full, learn() again reruns it (docs/checkpoints.md)
        assert models[0].n_aux_phases == 0 and models[0].aux_buffer.full()
        assert "learn() again reruns that phase" in "".join(error.value.__notes__)


def host_reads(monkeypatch, package: str | None = None) -> list[str]:
    """
    The tensor methods that copy a value to the host, as they are called: by the code of ``package`` (a folder; the
    default sb3_ppg's, not counting torch's own, such as the argument checks of its distributions), or by any code
    (``package=""``).
    """
    package = str(pathlib.Path(optim.__file__).parents[1]) if package is None else package
    reads = []
    for name in ("item", "tolist", "__bool__", "__float__", "__int__"):
        method = getattr(th.Tensor, name)

        def recording(self, *args, _method=method, _name=name):
            if sys._getframe(1).f_code.co_filename.startswith(package):
                reads.append(_name)
            return _method(self, *args)

        monkeypatch.setattr(th.Tensor, name, recording)
    return reads


@CHECKED_TORCH
@pytest.mark.parametrize("max_grad_norm", [0.5, None])
def test_clipping_and_the_gradient_check_read_nothing(monkeypatch, max_grad_norm):
    """
    The device path's clipping and check, torch's included, copy nothing to the host; the clipped gradients stay
    finite (clipping scales by a finite factor of at most 1) and the flag stays 0.
    """
    monkeypatch.setattr(fused_adam, "FINITE_CHECK_ON_DEVICE", True)
    module = th.nn.Linear(3, 2)
    module(th.full((4, 3), 1e3)).sum().backward()
    check = fused_adam.finite_check("policy", 0, [th.optim.Adam(module.parameters(), fused=True)])
    assert check.on_device
    with monkeypatch.context() as patch:
        reads = host_reads(patch, package="")
        check.clip_and_check_gradients(module, max_grad_norm)
    assert reads == []
    assert all(th.isfinite(parameter.grad).all() for parameter in module.parameters())
    assert check.found_inf.item() == 0.0
    if max_grad_norm is not None:
        assert optim.gradient_norm(module.parameters()).item() == pytest.approx(max_grad_norm, rel=1e-5)


@CHECKED_TORCH
@pytest.mark.parametrize("path", list(PATHS))
def test_the_device_check_reads_nothing_per_minibatch(make_model, monkeypatch, path):
    """
    On the device, training reads from the device as often with 8 minibatches per phase as with 1 (a read per phase):
    the checks cost no host synchronization per minibatch. On the host each minibatch reads its loss and gradient norm.
    """
    monkeypatch.setattr(fused_adam, "FINITE_CHECK_ON_DEVICE", PATHS[path])
    counts = []
    for batch_size in (16, 2):
        model = make_model(policy_kwargs=dict(net_arch=[16], **FUSED), batch_size=batch_size, max_grad_norm=0.5, device="cpu")
        with pytest.warns(UserWarning, match="before PPG's first auxiliary phase"):
            model.learn(16)  # collect the rollout (its reads do not depend on the minibatches)
        with monkeypatch.context() as patch:
            reads = host_reads(patch)
            model.train()
        counts.append(len(reads))
    if path == "device":
        assert counts[0] == counts[1]
    else:
        assert counts[1] - counts[0] == 2 * (8 - 1)


@CHECKED_TORCH
def test_a_non_finite_minibatch_that_target_kl_stops_at_is_reported(make_model, monkeypatch):
    """
    A NaN loss and approx KL at the first minibatch of a policy phase with target_kl: the KL stop leaves it without a
    step, and its flag still stops training at the end of the phase, the weights and Adam state untouched.
    """
    monkeypatch.setattr(fused_adam, "FINITE_CHECK_ON_DEVICE", True)
    model = make_model(policy_kwargs=dict(net_arch=[16], **FUSED), n_policy_iters=4, target_kl=0.01, device="cpu")
    with pytest.warns(UserWarning, match="before PPG's first auxiliary phase"):
        model.learn(16)
    parameters = {name: tensor.clone() for name, tensor in model.policy.state_dict().items()}
    states = optimizer_states(model)
    compute_loss = type(model)._joint_loss

    def nan_loss(self, *args, **kwargs):
        loss, diagnostics = compute_loss(self, *args, **kwargs)
        return loss * float("nan"), {**diagnostics, "approx_kl": diagnostics["approx_kl"] * float("nan")}

    monkeypatch.setattr(type(model), "_joint_loss", nan_loss)
    pattern = r"policy-phase loss is nan at timestep 32 \(optimizer step 1 of the phase\)"
    with pytest.raises(FloatingPointError, match=pattern) as error, pytest.warns(UserWarning, match="first auxiliary"):
        model.learn(16, reset_num_timesteps=False)
    assert "1 of the phase's 1 optimizer steps" in str(error.value)
    for name, tensor in model.policy.state_dict().items():
        assert th.equal(tensor, parameters[name]), name
    for state, saved in zip(optimizer_states(model), states, strict=True):
        assert all(th.equal(state[key], saved[key]) for key in saved)


def test_the_private_apis_are_used_on_the_checked_torch_versions_only(monkeypatch):
    """
    The fused Adam's ``found_inf`` contract was checked on torch 2.11 (CUDA) and 2.13 (CPU and CUDA); on any other
    version a phase's checks run on the host, as for an optimizer that cannot skip a step on the device.
    """
    assert fused_adam.CHECKED_TORCH_VERSIONS == ("2.11", "2.13")
    assert fused_adam.private_apis_checked("2.13.0+cpu") and fused_adam.private_apis_checked("2.11.0+cu130")
    for version in ("2.12.1", "2.14.0", "3.0.0", "2.1.0"):
        assert not fused_adam.private_apis_checked(version)
    monkeypatch.setattr(fused_adam, "FINITE_CHECK_ON_DEVICE", True)
    assert fused_adam.checks_finite_on_device(adam(fused=True), torch_version="2.13.0")
    assert not fused_adam.checks_finite_on_device(adam(fused=True), torch_version="2.14.0")
    check = fused_adam.finite_check("policy", 0, [adam(fused=True)])
    assert type(check) is (fused_adam.DeviceFiniteCheck if fused_adam.private_apis_checked() else optim.FiniteCheck)


@CHECKED_TORCH
def test_the_fused_adam_skips_a_step_flagged_found_inf():
    """torch's contract that the device's check relies on: a fused Adam step with ``found_inf`` 1.0 changes nothing."""
    parameter = th.nn.Parameter(th.ones(3))
    optimizer = th.optim.Adam([parameter], lr=0.1, fused=True)
    parameter.grad = th.ones(3)
    check = fused_adam.DeviceFiniteCheck("policy", 0, parameter.device)
    check.check_loss(th.tensor(float("nan")))
    check.step(optimizer)
    assert th.equal(parameter.detach(), th.ones(3)) and optimizer.state[parameter]["step"].item() == 0
    check.check_loss(th.tensor(1.0))
    check.step(optimizer)
    assert not th.equal(parameter.detach(), th.ones(3)) and optimizer.state[parameter]["step"].item() == 1
    with pytest.raises(FloatingPointError, match="1 of the phase's 2 optimizer steps"):
        check.raise_if_skipped()
