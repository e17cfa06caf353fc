"""
torch's fused Adam on CUDA, and the finite checks that run on the device with it: the one place where PPG uses torch's
private APIs, ``optimizer.found_inf`` (the contract of ``torch.amp.GradScaler`` with the fused kernels: a step is
skipped where it is 1.0) and ``optimizer._step_supports_amp_scaling``. They are used on the torch versions where they
were checked (:data:`CHECKED_TORCH_VERSIONS`); on other versions the checks run on the host (see docs/throughput.md).
"""

from collections.abc import Iterable

import torch as th

from sb3_ppg.common import distributed
from sb3_ppg.common.optim import (
    ADAM_OPTIMIZERS,
    GRADIENT_CAUSES,
    LOSS_CAUSES,
    FiniteCheck,
    clipped_gradient_norm,
    configure_foreach_adam,
    implementation_chosen,
)

#: The torch versions (major.minor) on which the fused Adam's ``found_inf`` contract was checked (tests/test_finite_check.py
#: on a CPU, and on CUDA devices: docs/throughput.md)
CHECKED_TORCH_VERSIONS = ("2.11", "2.13")

#: Where the losses and gradients are checked finite: ``None`` lets :func:`checks_finite_on_device` choose, ``True`` or
#: ``False`` forces the device or the host wherever the optimizer can skip a step on the device (tests set it)
FINITE_CHECK_ON_DEVICE: bool | None = None


def private_apis_checked(torch_version: str = th.__version__) -> bool:
    """Whether PPG was checked against this torch version's private APIs (:data:`CHECKED_TORCH_VERSIONS`)."""
    return ".".join(torch_version.split("+")[0].split(".")[:2]) in CHECKED_TORCH_VERSIONS


def skips_steps_on_device(optimizer: th.optim.Optimizer) -> bool:
    """Whether an optimizer skips its step on the device when told (``found_inf``): torch's fused Adam and AdamW."""
    fused = all(group.get("fused") for group in optimizer.param_groups)
    return fused and type(optimizer).step in (th.optim.Adam.step, th.optim.AdamW.step)


def checks_finite_on_device(optimizer: th.optim.Optimizer, torch_version: str = th.__version__) -> bool:
    """
    Whether the finite checks of the optimizer's steps run on the device (:class:`DeviceFiniteCheck`): on CUDA, where
    reading a value waits for the device, when the optimizer skips steps there (:func:`skips_steps_on_device`) and
    torch's version was checked (:func:`private_apis_checked`); elsewhere on the host. ``FINITE_CHECK_ON_DEVICE``
    overrides the device's choice.
    """
    if not private_apis_checked(torch_version) or not skips_steps_on_device(optimizer):
        return False
    if FINITE_CHECK_ON_DEVICE is not None:
        return FINITE_CHECK_ON_DEVICE
    return optimizer.param_groups[0]["params"][0].device.type == "cuda"


class DeviceFiniteCheck(FiniteCheck):
    """
    :class:`~sb3_ppg.common.optim.FiniteCheck` on the device: a non-finite loss or gradient norm sets a flag
    (``found_inf``, as ``torch.amp.GradScaler``) on which the fused Adam skips the step, and :meth:`raise_if_skipped`
    stops training at the end of the phase (see docs/throughput.md).

    :param phase: ``"policy"`` or ``"auxiliary"``, for the error messages (with ``timestep``)
    :param timestep: the timestep of the phase
    :param device: the device of the optimizers' parameters
    """

    on_device = True
    # The kind of the first bad step (``first_kind``)
    NONE, LOSS, GRADIENTS = 0.0, 1.0, 2.0

    def __init__(self, phase: str, timestep: int, device: th.device) -> None:
        super().__init__(phase, timestep)
        # This step's flag (1.0: skip it), the steps skipped, the first bad step's kind, value and index
        self.found_inf, self.n_skipped, self.first_kind, self.first_value, self.first_step = (
            th.zeros((), dtype=th.float32, device=device) for _ in range(5)
        )

    def check_loss(self, loss: th.Tensor) -> None:
        """Flag a (micro-batch's) non-finite loss before its backward pass."""
        self._flag(loss, self.LOSS)

    def clip_and_check_gradients(self, module: th.nn.Module, max_grad_norm: float | None) -> None:
        """Clip the gradients of a module's parameters to ``max_grad_norm`` (when set) and flag a non-finite norm."""
        self._flag(clipped_gradient_norm(module, max_grad_norm), self.GRADIENTS)

    def _flag(self, value: th.Tensor, kind: float) -> None:
        """Set this step's flag when ``value`` is not finite (on the device), remembering the phase's first one."""
        value = value.detach()
        bad = ~th.isfinite(value)
        first = bad & (self.first_kind == self.NONE)
        self.first_kind = th.where(first, kind, self.first_kind)
        self.first_value = th.where(first, value.to(th.float32), self.first_value)
        self.first_step = th.where(first, float(self.n_steps + 1), self.first_step)
        # Exactly 1.0: the fused kernels skip a step only then, and the step count is put back by subtracting it
        self.found_inf = th.where(bad, 1.0, self.found_inf)

    def step(self, optimizer: th.optim.Optimizer) -> None:
        """
        Step the optimizer, skipped when this step's loss or gradients were not finite (on any rank in data-parallel
        training).
        """
        self.n_steps += 1
        found_inf = distributed.all_reduce_max(self.found_inf) if distributed.is_active() else self.found_inf
        optimizer.found_inf = found_inf  # type: ignore[attr-defined]
        try:
            optimizer.step()
        finally:
            del optimizer.found_inf  # type: ignore[attr-defined]
        self.n_skipped += found_inf
        self.found_inf.zero_()

    def raise_if_skipped(self) -> None:
        """
        At the end of the phase, a ``FloatingPointError`` naming the first bad step when the device skipped any (read
        from the device at once).
        """
        # A flag that no step consumed (``pending``): target_kl stopped the epochs at that minibatch
        any_bad = self.n_skipped + self.found_inf
        if distributed.is_active():
            any_bad = distributed.all_reduce_max(any_bad)  # every rank raises together
        values = th.stack([any_bad, self.n_skipped, self.found_inf, self.first_kind, self.first_value, self.first_step])
        any_bad, n_skipped, pending, first_kind, first_value, first_step = values.tolist()
        if any_bad == 0:
            return
        skipped = (
            f"{int(n_skipped + pending)} of the phase's {self.n_steps + int(pending)} optimizer steps had a non-finite "
            "loss or gradients and were skipped, so the weights and the optimizer's state hold only finite updates; "
            "training stopped at the end of the phase."
        )
        where = f"at timestep {self.timestep} (optimizer step {int(first_step)} of the phase)"
        if first_kind == self.LOSS:
            message = f"PPG's {self.phase}-phase loss is {first_value} {where}: {skipped} {LOSS_CAUSES}"
        elif first_kind == self.GRADIENTS:
            message = (
                f"PPG's {self.phase}-phase gradients have a non-finite norm ({first_value}) {where} although the loss "
                f"is finite: {skipped} {GRADIENT_CAUSES}"
            )
        else:
            message = (
                f"PPG's {self.phase}-phase loss or gradients were not finite on another rank at timestep "
                f"{self.timestep}: {skipped} {LOSS_CAUSES}"
            )
        raise FloatingPointError(message)


def finite_check(phase: str, timestep: int, optimizers: Iterable[th.optim.Optimizer]) -> FiniteCheck:
    """
    A phase's finite checks: on the device where every one of its optimizers can skip a step there
    (:func:`checks_finite_on_device`), else on the host.

    :param phase: ``"policy"`` or ``"auxiliary"``, for the error messages (with ``timestep``)
    :param timestep: the timestep of the phase
    :param optimizers: the phase's optimizers
    """
    optimizers = list(optimizers)
    if optimizers and all(checks_finite_on_device(optimizer) for optimizer in optimizers):
        return DeviceFiniteCheck(phase, timestep, optimizers[0].param_groups[0]["params"][0].device)
    return FiniteCheck(phase, timestep)


def uses_fused_adam(optimizer_class: type, optimizer_kwargs: dict, device: th.device, fused_on_cpu: bool = False) -> bool:
    """
    Whether PPG steps the optimizer with torch's fused kernel: an Adam or AdamW on CUDA (and on a CPU with
    ``fused_on_cpu``: ``RecurrentPPG``'s), unless ``optimizer_kwargs`` choose an implementation.
    """
    fused_device = device.type == "cuda" or (fused_on_cpu and device.type == "cpu")
    return fused_device and issubclass(optimizer_class, ADAM_OPTIMIZERS) and not implementation_chosen(optimizer_kwargs)


def configure_adam_implementation(optimizer: th.optim.Optimizer, fused: bool) -> None:
    """
    Step an Adam (or AdamW) with torch's fused kernel or, ``fused=False``, torch's default (see docs/throughput.md),
    keeping its state; other classes are left alone.
    """
    if not isinstance(optimizer, ADAM_OPTIMIZERS):
        return
    for group in optimizer.param_groups:
        group["fused"] = True if fused else None
        if fused:
            group["foreach"] = None
        for parameter in group["params"]:
            state = optimizer.state.get(parameter)
            if state and th.is_tensor(state.get("step")):
                device = parameter.device if fused else th.device("cpu")
                state["step"] = state["step"].to(device=device, dtype=th.float32)
    if fused and private_apis_checked():
        optimizer._step_supports_amp_scaling = True  # type: ignore[attr-defined]


def configure_optimizers(
    optimizers: Iterable[th.optim.Optimizer],
    optimizer_class: type,
    optimizer_kwargs: dict,
    device: th.device,
    fused_on_cpu: bool = False,
) -> None:
    """
    Step Adam with torch's fused kernel on CUDA (``uses_fused_adam``); on a CPU, with its multi-tensor implementation
    (:func:`~sb3_ppg.common.optim.configure_foreach_adam`), or its fused kernel with ``fused_on_cpu``.
    """
    optimizers = list(optimizers)
    fused = uses_fused_adam(optimizer_class, optimizer_kwargs, device, fused_on_cpu)
    for optimizer in optimizers:
        # A fused optimizer that the user did not ask for (loaded from a CUDA run) steps as torch's default again
        saved_fused = any(group.get("fused") for group in optimizer.param_groups)
        if fused or (saved_fused and not optimizer_kwargs.get("fused")):
            configure_adam_implementation(optimizer, fused)
    if not fused:
        configure_foreach_adam(optimizers, optimizer_kwargs, device)
