"""Checks of PPG's hyperparameters, each failing with a ``ValueError`` that names the problem and the fix."""

import warnings
from typing import TYPE_CHECKING

import torch as th

if TYPE_CHECKING:
    from sb3_ppg.ppg import PPG

ADVANTAGE_NORMALIZATIONS = ("batch", "minibatch", "none")
PRECISIONS = {"fp32": th.float32, "bf16": th.bfloat16}
PHASES = ("rollout", "policy", "aux")


def check_hyperparameters(model: "PPG") -> None:
    """
    Raise one ``ValueError`` listing every invalid hyperparameter that does not depend on the env.

    :param model: the PPG model, its hyperparameters set but its networks not built yet
    """
    errors = []

    def check(condition: bool, message: str) -> None:
        if not condition:
            errors.append(message)

    check(model.n_steps >= 1, f"n_steps must be >= 1, got {model.n_steps}")
    check(model.batch_size is None or model.batch_size >= 1, f"batch_size must be >= 1 (or None), got {model.batch_size}")
    check(model.n_epochs >= 1, f"n_epochs must be >= 1, got {model.n_epochs}")
    check(model.n_value_epochs >= 0, f"n_value_epochs must be >= 0 (or None), got {model.n_value_epochs}")
    check(0.0 <= model.gamma <= 1.0, f"gamma must be in [0, 1], got {model.gamma}")
    check(0.0 <= model.gae_lambda <= 1.0, f"gae_lambda must be in [0, 1], got {model.gae_lambda}")
    check(
        model.normalize_advantage in ADVANTAGE_NORMALIZATIONS,
        f"normalize_advantage must be one of {ADVANTAGE_NORMALIZATIONS} (or a bool), got {model.normalize_advantage!r}",
    )
    for name in ("ent_coef", "vf_coef", "kl_coef", "beta_clone", "vf_true_coef"):
        value = getattr(model, name)
        check(isinstance(value, (int, float)) and value >= 0, f"{name} must be a number >= 0, got {value!r}")
    for name in ("clip_range", "clip_range_vf"):
        value = getattr(model, name)
        if isinstance(value, (int, float)):
            check(value > 0, f"{name} must be > 0, got {value}: pass None to disable clipping")
    check(
        model.max_grad_norm is None or model.max_grad_norm > 0,
        f"max_grad_norm must be > 0, got {model.max_grad_norm}: pass None to disable gradient clipping",
    )
    check(model.target_kl is None or model.target_kl > 0, f"target_kl must be > 0 (or None), got {model.target_kl}")
    check(model.n_aux_epochs >= 0, f"n_aux_epochs must be >= 0 (0 disables the auxiliary phase), got {model.n_aux_epochs}")
    if model.n_aux_epochs > 0:
        check(
            model.n_policy_iters >= 1,
            f"n_policy_iters must be >= 1 when n_aux_epochs > 0, got {model.n_policy_iters} "
            "(set n_aux_epochs=0 for plain PPO)",
        )
        check(model.aux_batch_rollouts >= 1, f"aux_batch_rollouts must be >= 1, got {model.aux_batch_rollouts}")
        check(model.n_aux_grad_accum >= 1, f"n_aux_grad_accum must be >= 1, got {model.n_aux_grad_accum}")
    try:
        resolve_precision(model.precision)
    except ValueError as error:
        errors.append(str(error))
    if errors:
        raise ValueError("Invalid PPG hyperparameters:\n- " + "\n- ".join(errors))


def resolve_batch_size(model: "PPG", n_envs: int) -> int:
    """
    The policy-phase minibatch size for ``n_envs`` environments (``batch_size=None``: 8 minibatches per rollout),
    after checking that every minibatch fits in what it is drawn from.

    :param model: the PPG model
    :param n_envs: the number of environments to check for
    :return: the minibatch size
    """
    rollout_size = model.n_steps * n_envs
    batch_size = max(1, rollout_size // 8) if model._auto_batch_size else model.batch_size
    if rollout_size < 2:
        raise ValueError(f"n_steps * n_envs must be > 1 (one rollout needs at least 2 samples), got {rollout_size}")
    assert batch_size is not None
    if batch_size > rollout_size:
        raise ValueError(
            f"batch_size={batch_size} is larger than the rollout (n_steps * n_envs = {model.n_steps} * "
            f"{n_envs} = {rollout_size}): use a batch_size <= {rollout_size}."
        )
    if model.normalize_advantage == "minibatch" and batch_size < 2:
        raise ValueError("normalize_advantage='minibatch' needs batch_size > 1 (the std of one sample is undefined).")
    if model.n_aux_epochs > 0:
        n_rollouts = model.n_policy_iters * n_envs
        if model.aux_batch_rollouts > n_rollouts:
            raise ValueError(
                f"aux_batch_rollouts={model.aux_batch_rollouts} is larger than the auxiliary buffer "
                f"(n_policy_iters * n_envs = {model.n_policy_iters} * {n_envs} = {n_rollouts} rollouts): "
                f"use aux_batch_rollouts <= {n_rollouts}."
            )
    if rollout_size % batch_size != 0:
        warnings.warn(
            f"The rollout size (n_steps * n_envs = {rollout_size}) is not a multiple of batch_size={batch_size}: "
            f"the last minibatch of each epoch holds {rollout_size % batch_size} samples."
        )
    return batch_size


def resolve_precision(precision: str | dict[str, str]) -> dict[str, th.dtype]:
    """
    The compute dtype of the features extractors in each phase.

    :param precision: ``"fp32"`` / ``"bf16"`` for every phase, or a dict from phase (``"rollout"``, ``"policy"``,
        ``"aux"``) to one of those (missing phases: ``"fp32"``)
    :return: a dtype for each phase
    """
    per_phase = dict.fromkeys(PHASES, precision) if isinstance(precision, str) else dict.fromkeys(PHASES, "fp32")
    if isinstance(precision, dict):
        unknown = sorted(set(precision) - set(PHASES))
        if unknown:
            raise ValueError(f"precision has unknown phases {unknown}: use the keys {list(PHASES)}.")
        per_phase.update(precision)
    elif not isinstance(precision, str):
        raise ValueError(f"precision must be 'fp32', 'bf16' or a dict of those per phase, got {precision!r}")
    for phase, name in per_phase.items():
        if name not in PRECISIONS:
            raise ValueError(f"precision {name!r} (phase {phase!r}) is not one of {list(PRECISIONS)}.")
    return {phase: PRECISIONS[name] for phase, name in per_phase.items()}
