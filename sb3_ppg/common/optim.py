"""
One optimizer step of either phase: a minibatch cut into micro-batches, their backward passes, the KL stop of the
policy epochs, the gradients averaged over the ranks, checked finite (:class:`FiniteCheck`), clipped, and the step.
"""

from collections.abc import Callable, Iterable
from typing import TypeVar

import torch as th
from stable_baselines3.common.type_aliases import DictRolloutBufferSamples, RolloutBufferSamples

from sb3_ppg.common import distributed
from sb3_ppg.common.aux_buffer import AuxiliaryBufferSamples
from sb3_ppg.common.rollout_buffers import TensorObs

#: A minibatch's diagnostics (``sb3_ppg.ppg.losses.Diagnostics``): name -> a 0-d tensor
Diagnostics = dict[str, th.Tensor]

#: A minibatch of either phase: SB3's rollout samples or the auxiliary buffer's
Minibatch = TypeVar("Minibatch", RolloutBufferSamples, DictRolloutBufferSamples, AuxiliaryBufferSamples)


def _slice_batch(values: TensorObs | None, index: slice) -> TensorObs | None:
    """A slice (a view) of per-sample data: a tensor, or a dict of tensors (Dict observations); None stays None."""
    if values is None:
        return None
    if isinstance(values, dict):
        return {key: tensor[index] for key, tensor in values.items()}
    return values[index]


def split_observations(observations: TensorObs, size: int | None) -> list[TensorObs]:
    """Cut a batch of observations (a tensor or a dict) into parts of at most ``size`` samples (views; ``None``: one)."""
    n_samples = len(next(iter(observations.values())) if isinstance(observations, dict) else observations)
    if size is None or n_samples <= size:
        return [observations]
    return [_slice_batch(observations, slice(start, start + size)) for start in range(0, n_samples, size)]


def split_minibatch(minibatch: Minibatch, micro_batch_size: int | None) -> list[tuple[Minibatch, float]]:
    """
    Cut a minibatch into micro-batches of at most ``micro_batch_size`` samples (views), each with its share of the
    samples: a mean loss is the share-weighted sum of the micro-batches' losses, and so is its gradient.
    """
    n_samples = len(minibatch.returns)
    if micro_batch_size is None or n_samples <= micro_batch_size:
        return [(minibatch, 1.0)]
    # Every field is per sample but the rollout indices of an auxiliary minibatch (one per rollout, kept whole)
    per_sample = [name for name in minibatch._fields if name != "rollout_indices"]
    parts = []
    for start in range(0, n_samples, micro_batch_size):
        index = slice(start, start + micro_batch_size)
        fields = {name: _slice_batch(getattr(minibatch, name), index) for name in per_sample}
        parts.append((minibatch._replace(**fields), (min(start + micro_batch_size, n_samples) - start) / n_samples))
    return parts


def gradient_norm(parameters: Iterable[th.nn.Parameter]) -> th.Tensor:
    """The global L2 norm of the parameters' gradients (as ``clip_grad_norm_`` computes it), without clipping."""
    gradients = [parameter.grad for parameter in parameters if parameter.grad is not None]
    if not gradients:
        return th.zeros(())
    # th.nn.utils.get_total_norm from torch 2.6 on (one fused pass); the same norm before
    get_total_norm = getattr(th.nn.utils, "get_total_norm", None)
    if get_total_norm is not None:
        return get_total_norm(gradients)
    return th.linalg.vector_norm(th.stack([th.linalg.vector_norm(gradient) for gradient in gradients]))


#: What a non-finite loss usually comes from (the end of the error messages)
LOSS_CAUSES = (
    "Common causes: NaN/inf rewards or observations from the environment (check them, e.g. with VecCheckNan), rewards "
    "on a huge scale (use VecNormalize), or a learning rate that is too high (lower learning_rate / aux_learning_rate "
    "or set max_grad_norm)."
)
#: What non-finite gradients of a finite loss usually come from
GRADIENT_CAUSES = (
    "Common causes: a learning rate that is too high (lower learning_rate / aux_learning_rate), observations or "
    "rewards on a huge scale (use VecNormalize), or a custom network or features extractor whose gradient is not "
    "finite somewhere (e.g. sqrt or log at 0)."
)


def check_finite_loss(loss: th.Tensor, phase: str, timestep: int) -> None:
    """Stop training with a ``FloatingPointError`` naming the common causes when a loss is NaN or infinite."""
    if not th.isfinite(loss).item():
        raise FloatingPointError(
            f"PPG's {phase}-phase loss is {loss.item()} at timestep {timestep}: training stopped before "
            f"the weights were updated with it. {LOSS_CAUSES}"
        )


def clip_gradients(module: th.nn.Module, max_grad_norm: float | None, phase: str, timestep: int) -> None:
    """
    Clip the global gradient norm of a module's parameters to ``max_grad_norm`` (when set), after checking that the
    gradients are finite (a ``FloatingPointError`` otherwise, the gradients cleared).
    """
    total_norm = clipped_gradient_norm(module, max_grad_norm)
    if not th.isfinite(total_norm).item():
        module.zero_grad(set_to_none=True)
        raise FloatingPointError(
            f"PPG's {phase}-phase gradients have a non-finite norm ({total_norm.item()}) at timestep "
            f"{timestep} although the loss is finite: training stopped before the weights were updated "
            f"with them. {GRADIENT_CAUSES}"
        )


def clipped_gradient_norm(module: th.nn.Module, max_grad_norm: float | None) -> th.Tensor:
    """
    The global gradient norm of a module's parameters (a tensor, not read), after clipping it to ``max_grad_norm``
    when set (``clip_grad_norm_``, which scales the gradients without waiting for the device).
    """
    if max_grad_norm is not None:
        return th.nn.utils.clip_grad_norm_(module.parameters(), max_grad_norm)
    return gradient_norm(module.parameters())


class FiniteCheck:
    """
    The checks that keep a phase's non-finite losses and gradients from the weights and the optimizers' state, on the
    host (:func:`check_finite_loss`, :func:`clip_gradients`): the first one stops training at once. On CUDA with the
    fused Adam, ``sb3_ppg.common.cuda.DeviceFiniteCheck`` runs them on the device instead (see docs/throughput.md).

    :param phase: ``"policy"`` or ``"auxiliary"``, for the error messages (with ``timestep``)
    :param timestep: the timestep of the phase
    """

    #: Whether the checks run on the device (a subclass's)
    on_device = False

    def __init__(self, phase: str, timestep: int) -> None:
        self.phase = phase
        self.timestep = timestep
        self.n_steps = 0

    def check_loss(self, loss: th.Tensor) -> None:
        """Check a (micro-batch's) loss before its backward pass."""
        check_finite_loss(loss, self.phase, self.timestep)

    def clip_and_check_gradients(self, module: th.nn.Module, max_grad_norm: float | None) -> None:
        """Clip the gradients of a module's parameters to ``max_grad_norm`` (when set) and check their norm."""
        clip_gradients(module, max_grad_norm, self.phase, self.timestep)

    def step(self, optimizer: th.optim.Optimizer) -> None:
        """Step the optimizer."""
        self.n_steps += 1
        optimizer.step()

    def raise_if_skipped(self) -> None:
        """At the end of the phase, raise where a step was skipped (the host checks have raised already)."""


#: The optimizers whose implementation PPG chooses: multi-tensor on a CPU (:func:`configure_foreach_adam`), torch's
#: fused kernel on CUDA (``sb3_ppg.common.cuda.fused_adam``)
ADAM_OPTIMIZERS = (th.optim.Adam, th.optim.AdamW)


def implementation_chosen(optimizer_kwargs: dict) -> bool:
    """Whether the user's ``optimizer_kwargs`` choose Adam's implementation (PPG then leaves it alone)."""
    return any(optimizer_kwargs.get(name) is not None for name in ("fused", "foreach", "capturable", "differentiable"))


def configure_foreach_adam(optimizers: Iterable[th.optim.Optimizer], optimizer_kwargs: dict, device: th.device) -> None:
    """
    On a CPU, step Adam (and AdamW) with torch's multi-tensor ("foreach") implementation, unless ``optimizer_kwargs``
    choose one: the same numbers as torch's CPU default, which loops over the parameters in Python, in fewer calls.

    :param optimizers: the model's optimizers (other classes are left alone)
    :param optimizer_kwargs: the policy's optimizer arguments
    :param device: the model's device (elsewhere than on a CPU, nothing changes)
    """
    if device.type != "cpu" or implementation_chosen(optimizer_kwargs):
        return
    for optimizer in optimizers:
        if isinstance(optimizer, ADAM_OPTIMIZERS):
            for group in optimizer.param_groups:
                group["foreach"] = True


def exceeds_target_kl(approx_kl: th.Tensor, target_kl: float) -> bool:
    """
    Whether a minibatch's approx KL stops the policy epochs (SB3's PPO: above ``1.5 * target_kl``; a NaN stops too).
    In data-parallel training it is the ranks' mean, so that every rank decides the same.
    """
    if distributed.is_active():
        approx_kl = distributed.all_reduce_mean(approx_kl)
    return not approx_kl.item() <= 1.5 * target_kl


def backward(
    minibatch: Minibatch,
    compute_loss: Callable[[Minibatch], tuple[th.Tensor, Diagnostics]],
    micro_batch_size: int | None,
    check: FiniteCheck,
    divisor: int = 1,
    target_kl: float | None = None,
    module: th.nn.Module | None = None,
) -> tuple[Diagnostics, bool]:
    """
    Compute a minibatch's loss, check it and backpropagate ``loss / divisor``, one micro-batch at a time, weighted by
    their shares (the minibatch's gradient up to float rounding).

    :param compute_loss: the loss (a mean over the samples) and diagnostics of a (micro-)batch
    :param micro_batch_size: the most samples per forward and backward pass; ``None``: the whole minibatch
    :param check: the phase's finite checks
    :param divisor: what the loss is divided by (the minibatches of an accumulated gradient)
    :param target_kl: leave the minibatch out (no gradient) when its approx KL exceeds ``1.5 * target_kl``
    :param module: the module whose gradients are dropped when micro-batches exceed ``target_kl``
    :return: the minibatch's diagnostics (with its ``loss``) and whether its gradient was kept
    """
    micro_batches = split_minibatch(minibatch, micro_batch_size)
    results = []
    for micro_batch, share in micro_batches:
        loss, diagnostics = compute_loss(micro_batch)
        check.check_loss(loss)
        if target_kl is not None and len(micro_batches) == 1 and exceeds_target_kl(diagnostics["approx_kl"], target_kl):
            # One forward pass: decided before backward(), as SB3's PPO does
            return {**diagnostics, "loss": loss.detach()}, False
        (loss * share / divisor).backward()
        results.append((share, loss.detach(), diagnostics))
    if len(results) == 1:
        return {**results[0][2], "loss": results[0][1]}, True
    names = results[0][2].keys()
    totals = {name: sum(share * diagnostics[name] for share, _, diagnostics in results) for name in names}
    totals["loss"] = sum(share * loss for share, loss, _ in results)  # type: ignore[assignment]
    if target_kl is not None and exceeds_target_kl(totals["approx_kl"], target_kl):  # type: ignore[arg-type]
        # Several micro-batches: their approx KL is known only once every one has run backward(), so the
        # minibatch's gradients are dropped here instead
        assert module is not None
        module.zero_grad(set_to_none=True)
        return totals, False  # type: ignore[return-value]
    return totals, True  # type: ignore[return-value]


def step(optimizer: th.optim.Optimizer, module: th.nn.Module, max_grad_norm: float | None, check: FiniteCheck) -> None:
    """Average the gradients over the ranks, clip and check them, step the optimizer (``check.step``) and clear them."""
    if distributed.is_active():
        distributed.average_gradients(module.parameters())
    check.clip_and_check_gradients(module, max_grad_norm)
    check.step(optimizer)
    optimizer.zero_grad(set_to_none=True)
