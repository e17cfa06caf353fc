"""Helpers of an optimizer step: checks that a loss and its gradients are finite, gradient clipping."""

from collections.abc import Iterable

import torch as th


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
