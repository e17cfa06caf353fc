"""
Checks of PPG's hyperparameters: each takes values and returns values (or raises a ``ValueError`` that names the problem
and the fix); none reads or changes a model.
"""

import math
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from sb3_ppg.common.precision import resolve_precision

ADVANTAGE_NORMALIZATIONS = ("batch", "minibatch", "none")
#: ``value_clipping``: SB3's clipped value loss, or the larger of the clipped and unclipped errors (baselines, CleanRL)
VALUE_CLIPPINGS = ("sb3", "max")
#: ``aux_buffer_device``: where the auxiliary buffer lives (see ``sb3_ppg.common.aux_buffer.resolve_aux_buffer_storage``)
AUX_BUFFER_DEVICES = ("cpu", "pinned", "device", "auto")
#: ``policy_minibatches``: shuffled transitions (SB3's PPO, CleanRL), or whole env rollouts (the paper's code)
POLICY_MINIBATCHES = ("transitions", "envs")
#: The hyperparameters that every PPG model zip holds (since the first release): a file without one of them was edited
#: or damaged, and loading it would silently use the constructor's default. Those added later (``micro_batch_size``,
#: ``precision``, ``value_clipping``, ``policy_minibatches``, ``aux_buffer_device``, ``cuda_graphs``,
#: ``parallel_networks``) take their defaults, which keep the older models' behaviour.
SAVED_HYPERPARAMETERS = (
    "learning_rate",
    "n_steps",
    "batch_size",
    "n_epochs",
    "n_value_epochs",
    "gamma",
    "gae_lambda",
    "clip_range",
    "clip_range_vf",
    "normalize_advantage",
    "ent_coef",
    "vf_coef",
    "max_grad_norm",
    "kl_coef",
    "n_policy_iters",
    "n_aux_epochs",
    "aux_batch_rollouts",
    "beta_clone",
    "vf_true_coef",
    "aux_learning_rate",
    "separate_aux_optimizer",
    "n_aux_grad_accum",
    "target_kl",
)
#: The hyperparameters :func:`check_hyperparameters` checks (those that do not depend on the env)
CHECKED_HYPERPARAMETERS = (
    *SAVED_HYPERPARAMETERS,
    "micro_batch_size",
    "precision",
    "value_clipping",
    "policy_minibatches",
    "aux_buffer_device",
    "cuda_graphs",
    "parallel_networks",
)

#: Options removed from PPG, each with what replaced it: the constructor and ``load()`` refuse them
#: (:func:`refuse_removed_options`); a model zip of an earlier version that stored one loads without it.
REMOVED_OPTIONS = {
    "overlap_rollouts": (
        "overlapped rollouts (env groups stepped while the network acts on the next group) were measured not to pay "
        "(docs/throughput.md) and were removed; nothing replaces them: leave the option out"
    ),
    "keep_freed_memory": (
        "PPG no longer changes the process's malloc settings (its mallopt calls changed them for the rest of the "
        "process). The command line keeps freed memory in its own process; a Python program gets the same CPU speed "
        "from glibc's variables, set before Python starts: MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=2147483647 "
        "(docs/throughput.md)"
    ),
}


def refuse_removed_options(call: str, kwargs: dict[str, Any], unknown: bool = True) -> None:
    """
    Refuse a removed option (:data:`REMOVED_OPTIONS`) with what replaced it, and with ``unknown`` any other name as
    Python does (a ``TypeError``).

    :param call: what was called, for the message (``"PPG"``, ``"PPG.load"``)
    :param kwargs: the keyword arguments to check
    :param unknown: whether every name is unknown (the constructor's ``**kwargs``), not only the removed ones
    """
    for name, value in kwargs.items():
        if name in REMOVED_OPTIONS:
            raise TypeError(f"{call}({name}={value!r}): {REMOVED_OPTIONS[name]}.")
        if unknown:
            raise TypeError(f"{call}.__init__() got an unexpected keyword argument {name!r}")


def is_integer(value: object) -> bool:
    """Whether ``value`` is an integer (a Python or NumPy one; bools are not)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    """Whether ``value`` is a real number (a Python or NumPy int or float; bools are not)."""
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


class HyperparameterError(ValueError):
    """
    Invalid or missing hyperparameters (of the constructor, ``load()`` or a saved model), one message per problem;
    ``problems`` holds ``(name, message)`` pairs so that ``PPG.load`` can tell where each value came from.
    """

    def __init__(
        self, problems: list[tuple[str, str]], header: str = "Invalid PPG hyperparameters:", footer: str = ""
    ) -> None:
        self.problems = problems
        message = header + "\n- " + "\n- ".join(text for _, text in problems)
        super().__init__(message + (f"\n{footer}" if footer else ""))


class _Checker:
    """
    Collects the problems of hyperparameters; each check looks at the type first, so none raises.

    :param values: the hyperparameters by name (a copy: integers are converted in it)
    """

    def __init__(self, values: dict[str, Any]) -> None:
        self.values = dict(values)
        self.problems: list[tuple[str, str]] = []

    def check(self, name: str, condition: bool, message: str) -> None:
        if not condition:
            self.problems.append((name, message))

    def type_error(self, name: str, expected: str) -> None:
        value = self.values[name]
        self.problems.append((name, f"{name} must be {expected}, got {value!r} ({type(value).__name__})"))

    def integer(self, name: str, minimum: int, hint: str = "") -> bool:
        """An integer >= ``minimum`` (a NumPy integer becomes a Python int); whether it is valid."""
        value = self.values[name]
        if not is_integer(value):
            self.type_error(name, "an integer")
            return False
        self.values[name] = int(value)
        self.check(name, value >= minimum, f"{name} must be >= {minimum}{hint}, got {value}")
        return value >= minimum

    def number(self, name: str, minimum: float, positive: bool = False, optional: bool = False, hint: str = "") -> None:
        """A finite number >= ``minimum`` (> with ``positive``), or None when ``optional``."""
        value = self.values[name]
        if value is None and optional:
            return
        if not is_number(value):
            self.type_error(name, "a number" + " or None" * optional)
            return
        in_range = value > minimum if positive else value >= minimum
        self.check(
            name,
            math.isfinite(value) and in_range,
            f"{name} must be a number {'>' if positive else '>='} {minimum}, got {value}{hint}",
        )

    def number_or_schedule(self, name: str, positive: bool = False, optional: bool = False, hint: str = "") -> None:
        """A number (see ``number``) or a schedule, whose values are checked when it is evaluated (``schedule_value``)."""
        value = self.values[name]
        if callable(value):
            return
        if (value is None and optional) or is_number(value):
            self.number(name, 0, positive=positive, optional=optional, hint=hint)
        else:
            self.type_error(name, "a number, a schedule (a function of the remaining progress)" + " or None" * optional)


def resolve_normalize_advantage(normalize_advantage: object) -> object:
    """``normalize_advantage`` with the bools the constructor accepts as their names (``True``: ``"batch"``,
    ``False``: ``"none"``); any other value as it is (``check_hyperparameters`` judges it)."""
    if normalize_advantage is True:
        return "batch"
    if normalize_advantage is False:
        return "none"
    return normalize_advantage


def check_hyperparameters(values: dict[str, Any]) -> dict[str, Any]:
    """
    Check the hyperparameters that do not depend on the env (:data:`CHECKED_HYPERPARAMETERS`), for the constructor and
    ``_setup_model`` (so loaded values too).

    :param values: the hyperparameters by name (``n_value_epochs`` and ``normalize_advantage`` resolved already)
    :return: the same values, NumPy integers converted to Python ints
    """
    checker = _Checker(values)
    checker.integer("n_steps", 1)
    if values["batch_size"] is not None:
        checker.integer("batch_size", 1, " (or None)")
    checker.integer("n_epochs", 1)
    checker.integer("n_value_epochs", 0, " (or None)")
    for name in ("gamma", "gae_lambda"):
        value = values[name]
        checker.check(name, is_number(value) and 0.0 <= value <= 1.0, f"{name} must be in [0, 1], got {value!r}")
    checker.check(
        "normalize_advantage",
        isinstance(values["normalize_advantage"], str) and values["normalize_advantage"] in ADVANTAGE_NORMALIZATIONS,
        f"normalize_advantage must be one of {ADVANTAGE_NORMALIZATIONS} (or a bool), got {values['normalize_advantage']!r}",
    )
    for name, choices in (
        ("value_clipping", VALUE_CLIPPINGS),
        ("policy_minibatches", POLICY_MINIBATCHES),
        ("aux_buffer_device", AUX_BUFFER_DEVICES),
    ):
        checker.check(
            name,
            isinstance(values[name], str) and values[name] in choices,
            f"{name} must be one of {choices}, got {values[name]!r}",
        )
    for name in ("ent_coef", "vf_coef", "kl_coef", "beta_clone", "vf_true_coef"):
        checker.number(name, 0)
    for name in ("separate_aux_optimizer", "cuda_graphs", "parallel_networks"):
        checker.check(name, isinstance(values[name], (bool, np.bool_)), f"{name} must be a bool, got {values[name]!r}")
    checker.number_or_schedule("learning_rate")
    checker.number_or_schedule("aux_learning_rate", optional=True)
    for name in ("clip_range", "clip_range_vf"):
        checker.number_or_schedule(name, positive=True, optional=True, hint=": pass None to disable clipping")
    checker.number("max_grad_norm", 0, positive=True, optional=True, hint=": pass None to disable gradient clipping")
    checker.number("target_kl", 0, positive=True, optional=True, hint=" (or None for no limit)")
    if values["micro_batch_size"] is not None and values["micro_batch_size"] != "auto":
        if is_integer(values["micro_batch_size"]):
            checker.integer("micro_batch_size", 1, " (or 'auto', or None: whole minibatches)")
        else:
            checker.type_error("micro_batch_size", "an integer >= 1, 'auto' or None (whole minibatches)")
    if checker.integer("n_aux_epochs", 0, " (0 disables the auxiliary phase)") and values["n_aux_epochs"] > 0:
        checker.integer("n_policy_iters", 1, " when n_aux_epochs > 0 (set n_aux_epochs=0 for plain PPO)")
        checker.integer("aux_batch_rollouts", 1)
        checker.integer("n_aux_grad_accum", 1)
    try:
        resolve_precision(values["precision"])
    except ValueError as error:
        checker.problems.append(("precision", str(error)))
    if checker.problems:
        raise HyperparameterError(checker.problems)
    return checker.values


def schedule_value(schedule: Callable[[float], float], name: str, progress_remaining: float) -> float:
    """
    Evaluate a schedule (a learning rate or a clip range) at ``progress_remaining``; a ``ValueError`` when negative
    or not finite.
    """
    value = schedule(progress_remaining)
    if not (is_number(value) and math.isfinite(value) and value >= 0):
        raise ValueError(
            f"The {name} schedule returned {value!r} at progress_remaining={progress_remaining:.6g}: a schedule must "
            f"return a finite number >= 0 for every progress_remaining from 1 to 0. Fix the function passed as {name}."
        )
    return value


def resolve_batch_size(
    batch_size: int | None,
    n_steps: int,
    n_envs: int,
    normalize_advantage: str,
    n_aux_epochs: int,
    n_policy_iters: int,
    aux_batch_rollouts: int,
    policy_minibatches: str = "transitions",
) -> int:
    """
    The policy-phase minibatch size for ``n_envs`` environments, checked so that every minibatch of either phase fits in
    what it is drawn from; ``batch_size=None``: 8 minibatches per rollout.
    """
    rollout_size = n_steps * n_envs
    if batch_size is None:
        batch_size = -(-n_envs // 8) * n_steps if policy_minibatches == "envs" else max(1, rollout_size // 8)
    if rollout_size < 2 and normalize_advantage != "none":
        raise ValueError(
            f"n_steps * n_envs must be > 1 with normalize_advantage={normalize_advantage!r} (the advantages of "
            f"one sample normalize to 0), got {rollout_size}: collect more steps or pass normalize_advantage='none'."
        )
    if batch_size > rollout_size:
        # As SB3's PPO: a warning, and the whole rollout is each epoch's one minibatch (PPG.load with fewer envs)
        warnings.warn(
            f"batch_size={batch_size} is larger than the rollout (n_steps * n_envs = {n_steps} * {n_envs} = "
            f"{rollout_size}): each epoch trains on the whole rollout as one minibatch. Pass batch_size=None (8 "
            f"minibatches per rollout, following n_envs) or a batch_size <= {rollout_size} (to PPG.load() too)."
        )
    if policy_minibatches == "envs" and batch_size % n_steps != 0:
        envs_per_minibatch = max(1, batch_size // n_steps)
        raise ValueError(
            f"policy_minibatches='envs' makes each minibatch of whole env rollouts of n_steps={n_steps} steps, so "
            f"batch_size must be a multiple of n_steps, got batch_size={batch_size}: use e.g. "
            f"batch_size={envs_per_minibatch * n_steps} ({envs_per_minibatch} env(s) per minibatch), batch_size=None "
            "(8 minibatches), or policy_minibatches='transitions'."
        )
    if normalize_advantage == "minibatch" and batch_size < 2:
        raise ValueError("normalize_advantage='minibatch' needs batch_size > 1 (the std of one sample is undefined).")
    if n_aux_epochs > 0:
        n_rollouts = n_policy_iters * n_envs
        if aux_batch_rollouts > n_rollouts:
            raise ValueError(
                f"aux_batch_rollouts={aux_batch_rollouts} is larger than the auxiliary buffer "
                f"(n_policy_iters * n_envs = {n_policy_iters} * {n_envs} = {n_rollouts} rollouts): "
                f"use aux_batch_rollouts <= {n_rollouts}."
            )
    if rollout_size % batch_size != 0 and batch_size < rollout_size:
        if policy_minibatches == "envs":
            envs_per_minibatch = batch_size // n_steps
            warnings.warn(
                f"n_envs={n_envs} is not a multiple of the {envs_per_minibatch} envs per minibatch (batch_size // "
                f"n_steps): the last minibatch of each epoch holds {n_envs % envs_per_minibatch} env(s) (as the "
                "paper's code's torch.chunk). We recommend a number of envs per minibatch that divides n_envs."
            )
        else:
            warnings.warn(
                f"The rollout size (n_steps * n_envs = {rollout_size}) is not a multiple of batch_size={batch_size}: "
                f"there will be a truncated mini-batch of size {rollout_size % batch_size} in each epoch. We recommend "
                "a batch_size that divides n_steps * n_envs."
            )
    return batch_size


def warn_if_no_aux_phase(model: Any, given_timesteps: int, total_timesteps: int, aux_step: int, world_size: int) -> None:
    """
    Warn when ``learn()`` ends before the run's first auxiliary phase, so trains as PPO (see docs/ppg.md).

    :param given_timesteps: ``learn()``'s ``total_timesteps`` argument
    :param total_timesteps: SB3's total of this ``learn()``, counted from the run's start
    """
    steps_per_rollout = model.n_steps * model.n_envs * world_size
    # SB3 collects whole rollouts while num_timesteps < total_timesteps
    n_rollouts = max(0, -(-(total_timesteps - model.num_timesteps) // steps_per_rollout))
    stop_step = model.num_timesteps + n_rollouts * steps_per_rollout
    if model.n_aux_phases > 0 or n_rollouts == 0 or stop_step >= aux_step:
        return
    rollout = f"{model.n_steps} steps x {model.n_envs} envs"
    if world_size > 1:
        rollout += f" x {world_size} ranks"
    stored = model.aux_buffer.n_iterations
    if stored > 0:
        held = f"; the auxiliary buffer holds {stored} of them"
        fix = ""
    else:
        held = ""
        fix = f"Lower n_policy_iters (to at most {n_rollouts} for this budget) or n_steps, or "
    warnings.warn(
        f"learn(total_timesteps={given_timesteps:,}) stops at step {stop_step:,}, before PPG's first auxiliary "
        f"phase at step {aux_step:,} (after n_policy_iters={model.n_policy_iters} rollouts of {rollout}{held}): "
        "this learn() trains as plain PPO. "
        f"{fix}{'r' if fix else 'R'}aise total_timesteps to at least {aux_step - total_timesteps + given_timesteps:,}.",
        stacklevel=5,
    )
