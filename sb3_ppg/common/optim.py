"""
One optimizer step of either phase: a minibatch cut into micro-batches, their backward passes, the KL stop of the
policy epochs, the gradients averaged over the ranks, checked, clipped, and the step.
"""

from collections.abc import Callable, Iterable
from typing import TypeVar

import torch as th
from stable_baselines3.common.type_aliases import DictRolloutBufferSamples, RolloutBufferSamples

from sb3_ppg.common import distributed
from sb3_ppg.common.buffers import AuxiliaryBufferSamples, TensorObs

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
    """
    Cut a batch of observations into consecutive parts of at most ``size`` samples (views, no copies).

    :param observations: a batch of observations, a tensor or a dict of tensors
    :param size: the most samples per part; ``None``: the whole batch is one part
    :return: the parts, in order
    """
    n_samples = len(next(iter(observations.values())) if isinstance(observations, dict) else observations)
    if size is None or n_samples <= size:
        return [observations]
    return [_slice_batch(observations, slice(start, start + size)) for start in range(0, n_samples, size)]


def split_minibatch(minibatch: Minibatch, micro_batch_size: int | None) -> list[tuple[Minibatch, float]]:
    """
    Cut a minibatch into consecutive micro-batches of at most ``micro_batch_size`` samples (views, no copies), each
    with its share of the minibatch's samples. A loss that is a mean over the samples is the sum of the micro-batches'
    losses weighted by their shares, and so is its gradient.

    :param minibatch: a policy-phase (SB3's ``RolloutBufferSamples``) or auxiliary-phase minibatch
    :param micro_batch_size: the most samples per micro-batch; ``None``: the whole minibatch, with share 1
    :return: the (micro-batch, share) pairs, in order
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
    """
    The global L2 norm of the parameters' gradients (the norm ``clip_grad_norm_`` computes), without clipping.

    :param parameters: the parameters (those without a gradient are skipped)
    :return: a 0-d tensor (0 when no parameter has a gradient)
    """
    gradients = [parameter.grad for parameter in parameters if parameter.grad is not None]
    if not gradients:
        return th.zeros(())
    # th.nn.utils.get_total_norm from torch 2.6 on (one fused pass); the same norm before
    get_total_norm = getattr(th.nn.utils, "get_total_norm", None)
    if get_total_norm is not None:
        return get_total_norm(gradients)
    return th.linalg.vector_norm(th.stack([th.linalg.vector_norm(gradient) for gradient in gradients]))


def check_finite_loss(loss: th.Tensor, phase: str, timestep: int) -> None:
    """
    Stop training with a clear error when a loss is NaN or infinite (before it corrupts the weights).

    :param loss: the loss about to be backpropagated
    :param phase: "policy" or "auxiliary", for the message
    :param timestep: the model's ``num_timesteps``, for the message
    :raises FloatingPointError: naming the common causes
    """
    if not th.isfinite(loss).item():
        raise FloatingPointError(
            f"PPG's {phase}-phase loss is {loss.item()} at timestep {timestep}: training stopped before "
            "the weights were updated with it. Common causes: NaN/inf rewards or observations from the "
            "environment (check them, e.g. with VecCheckNan), rewards on a huge scale (use VecNormalize), or a "
            "learning rate that is too high (lower learning_rate / aux_learning_rate or set max_grad_norm)."
        )


def clip_gradients(module: th.nn.Module, max_grad_norm: float | None, phase: str, timestep: int) -> None:
    """
    Clip the global gradient norm of a module's parameters to ``max_grad_norm`` (when set), after checking that the
    gradients are finite: a finite loss can still have inf or NaN gradients, which must not reach the weights.

    :param module: the module (the policy)
    :param max_grad_norm: the largest global norm; None: no clipping
    :param phase: "policy" or "auxiliary", for the message
    :param timestep: the model's ``num_timesteps``, for the message
    :raises FloatingPointError: when the gradients' global norm is not finite (the gradients are cleared)
    """
    if max_grad_norm is not None:
        total_norm = th.nn.utils.clip_grad_norm_(module.parameters(), max_grad_norm)
    else:
        total_norm = gradient_norm(module.parameters())
    if not th.isfinite(total_norm).item():
        module.zero_grad(set_to_none=True)
        raise FloatingPointError(
            f"PPG's {phase}-phase gradients have a non-finite norm ({total_norm.item()}) at timestep "
            f"{timestep} although the loss is finite: training stopped before the weights were updated "
            "with them. Common causes: a learning rate that is too high (lower learning_rate / "
            "aux_learning_rate), observations or rewards on a huge scale (use VecNormalize), or a custom network "
            "or features extractor whose gradient is not finite somewhere (e.g. sqrt or log at 0)."
        )


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
    phase: str,
    timestep: int,
    divisor: int = 1,
    target_kl: float | None = None,
    module: th.nn.Module | None = None,
) -> tuple[Diagnostics, bool]:
    """
    Compute a minibatch's loss, check it and backpropagate ``loss / divisor`` (adding to the gradients), one
    micro-batch at a time: their losses are weighted by their share of the samples, so the gradient is the
    minibatch's up to float rounding.

    :param minibatch: the minibatch
    :param compute_loss: its loss (a mean over the samples) and diagnostics (means as well)
    :param micro_batch_size: the most samples per forward and backward pass; ``None``: the whole minibatch
    :param phase: ``"policy"`` or ``"auxiliary"``, for the error message of a non-finite loss
    :param timestep: the model's ``num_timesteps``, for that message
    :param divisor: what the loss is divided by (the minibatches of an accumulated gradient)
    :param target_kl: leave the minibatch out (no gradient) when its approx KL exceeds ``1.5 * target_kl``
    :param module: the module whose gradients are dropped when micro-batches exceed ``target_kl``
    :return: the minibatch's diagnostics (with its ``loss``) and whether its gradient was kept
    """
    micro_batches = split_minibatch(minibatch, micro_batch_size)
    results = []
    for micro_batch, share in micro_batches:
        loss, diagnostics = compute_loss(micro_batch)
        check_finite_loss(loss, phase, timestep)
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


def step(optimizer: th.optim.Optimizer, module: th.nn.Module, max_grad_norm: float | None, phase: str, timestep: int) -> None:
    """
    Average the gradients over the ranks, check and clip them, step the optimizer and clear them.

    :param optimizer: the optimizer
    :param module: the module it trains (the policy)
    :param max_grad_norm: the largest global gradient norm; ``None``: no clipping
    :param phase: ``"policy"`` or ``"auxiliary"``, for the error message of a non-finite gradient
    :param timestep: the model's ``num_timesteps``, for that message
    """
    if distributed.is_active():
        distributed.average_gradients(module.parameters())
    clip_gradients(module, max_grad_norm, phase, timestep)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


#: The optimizers whose implementation :func:`configure_adam_implementation` chooses (torch's fused kernels exist)
FUSABLE_OPTIMIZERS = (th.optim.Adam, th.optim.AdamW)


def uses_fused_adam(optimizer_class: type, optimizer_kwargs: dict, device: th.device) -> bool:
    """
    Whether PPG steps an optimizer with torch's fused kernel: an Adam or AdamW on a CUDA device, unless its
    ``optimizer_kwargs`` choose an implementation (``fused``, ``foreach``, ``capturable`` or ``differentiable``). On any
    other device the optimizer is left as torch builds it.

    :param optimizer_class: the policy's ``optimizer_class``
    :param optimizer_kwargs: the policy's ``optimizer_kwargs``
    :param device: the model's device
    """
    chosen = any(optimizer_kwargs.get(name) is not None for name in ("fused", "foreach", "capturable", "differentiable"))
    return device.type == "cuda" and issubclass(optimizer_class, FUSABLE_OPTIMIZERS) and not chosen


def configure_adam_implementation(optimizer: th.optim.Optimizer, fused: bool) -> None:
    """
    Step an Adam (or AdamW) with torch's fused kernel (``fused=True``: one kernel for all parameters, the same update
    up to float rounding; docs/throughput.md) or with the implementation torch picks by default (``fused=False``: what
    a model saved with fused steps gets back on a CPU). Its state is kept; the step counts move to where each
    implementation keeps them (fused: float32 on the parameters' device; default: float32 on the CPU).

    :param optimizer: the optimizer (any other class is left alone)
    :param fused: whether to use the fused kernel
    """
    if not isinstance(optimizer, FUSABLE_OPTIMIZERS):
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
    if fused:
        optimizer._step_supports_amp_scaling = True  # type: ignore[attr-defined]
