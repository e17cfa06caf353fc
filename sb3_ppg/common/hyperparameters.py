"""Checks of PPG's hyperparameters and policy architecture, each failing with a ``ValueError`` that names the fix."""

import difflib
import math
import warnings
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch as th

if TYPE_CHECKING:
    from sb3_ppg.ppg import PPG

ADVANTAGE_NORMALIZATIONS = ("batch", "minibatch", "none")
PRECISIONS = {"fp32": th.float32, "bf16": th.bfloat16}
PHASES = ("rollout", "policy", "aux")
#: What ``precision="auto"`` means where bfloat16 was measured faster with learning parity (see resolve_precision)
AUTO_BF16 = {"rollout": "fp32", "policy": "bf16", "aux": "bf16"}
NET_ARCH_KEYS = ("pi", "vf")
#: The hyperparameters that every PPG model zip holds (since the first release): a file without one of them was edited
#: or damaged, and loading it would silently use the constructor's default. Those added later (``micro_batch_size``,
#: ``precision``) take their defaults, which keep the older models' behaviour.
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
#: What ``micro_batch_size="auto"`` means for a convolutional policy on a CPU (see resolve_micro_batch_size)
AUTO_CPU_MICRO_BATCH_SIZE = 256


def is_integer(value: object) -> bool:
    """Whether ``value`` is an integer (a Python or NumPy one; bools are not)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    """Whether ``value`` is a real number (a Python or NumPy int or float; bools are not)."""
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


class HyperparameterError(ValueError):
    """
    Invalid or missing hyperparameters (of the constructor, of ``load()``'s arguments or of a saved model). It says
    what is wrong with each; ``problems`` holds ``(hyperparameter name, message)`` pairs, so that ``PPG.load`` can
    tell where each value came from.

    :param problems: ``(name, message)`` for each problem
    :param header: the first line of the message
    :param footer: what to do, after the problems (optional)
    """

    def __init__(
        self, problems: list[tuple[str, str]], header: str = "Invalid PPG hyperparameters:", footer: str = ""
    ) -> None:
        self.problems = problems
        message = header + "\n- " + "\n- ".join(text for _, text in problems)
        super().__init__(message + (f"\n{footer}" if footer else ""))


class _Checker:
    """Collects the problems of a model's hyperparameters; each check looks at the type first, so none raises."""

    def __init__(self, model: "PPG") -> None:
        self.model = model
        self.problems: list[tuple[str, str]] = []

    def check(self, name: str, condition: bool, message: str) -> None:
        if not condition:
            self.problems.append((name, message))

    def type_error(self, name: str, expected: str) -> None:
        value = getattr(self.model, name)
        self.problems.append((name, f"{name} must be {expected}, got {value!r} ({type(value).__name__})"))

    def integer(self, name: str, minimum: int, hint: str = "") -> bool:
        """An integer >= ``minimum`` (a NumPy integer becomes a Python int); whether it is valid."""
        value = getattr(self.model, name)
        if not is_integer(value):
            self.type_error(name, "an integer")
            return False
        setattr(self.model, name, int(value))
        self.check(name, value >= minimum, f"{name} must be >= {minimum}{hint}, got {value}")
        return value >= minimum

    def number(self, name: str, minimum: float, positive: bool = False, optional: bool = False, hint: str = "") -> None:
        """A finite number >= ``minimum`` (> with ``positive``), or None when ``optional``."""
        value = getattr(self.model, name)
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
        value = getattr(self.model, name)
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


def check_hyperparameters(model: "PPG") -> None:
    """
    Raise one ``HyperparameterError`` (a ``ValueError``) listing every invalid hyperparameter that does not depend
    on the env. Integer hyperparameters given as NumPy integers are converted to Python ints. The constructor and
    ``_setup_model`` run it, so that the values a model is loaded with (from the file, ``custom_objects`` or
    ``load()``'s keyword arguments) are checked as the constructor's.

    :param model: the PPG model, its hyperparameters set but its networks not built yet
    """
    checker = _Checker(model)
    checker.integer("n_steps", 1)
    if model.batch_size is not None:
        checker.integer("batch_size", 1, " (or None)")
    checker.integer("n_epochs", 1)
    checker.integer("n_value_epochs", 0, " (or None)")
    for name in ("gamma", "gae_lambda"):
        value = getattr(model, name)
        checker.check(name, is_number(value) and 0.0 <= value <= 1.0, f"{name} must be in [0, 1], got {value!r}")
    checker.check(
        "normalize_advantage",
        isinstance(model.normalize_advantage, str) and model.normalize_advantage in ADVANTAGE_NORMALIZATIONS,
        f"normalize_advantage must be one of {ADVANTAGE_NORMALIZATIONS} (or a bool), got {model.normalize_advantage!r}",
    )
    for name in ("ent_coef", "vf_coef", "kl_coef", "beta_clone", "vf_true_coef"):
        checker.number(name, 0)
    checker.check(
        "separate_aux_optimizer",
        isinstance(model.separate_aux_optimizer, (bool, np.bool_)),
        f"separate_aux_optimizer must be a bool, got {model.separate_aux_optimizer!r}",
    )
    checker.number_or_schedule("learning_rate")
    checker.number_or_schedule("aux_learning_rate", optional=True)
    for name in ("clip_range", "clip_range_vf"):
        checker.number_or_schedule(name, positive=True, optional=True, hint=": pass None to disable clipping")
    checker.number("max_grad_norm", 0, positive=True, optional=True, hint=": pass None to disable gradient clipping")
    checker.number("target_kl", 0, positive=True, optional=True, hint=" (or None for no limit)")
    if model.micro_batch_size is not None and model.micro_batch_size != "auto":
        if is_integer(model.micro_batch_size):
            checker.integer("micro_batch_size", 1, " (or 'auto', or None: whole minibatches)")
        else:
            checker.type_error("micro_batch_size", "an integer >= 1, 'auto' or None (whole minibatches)")
    if checker.integer("n_aux_epochs", 0, " (0 disables the auxiliary phase)") and model.n_aux_epochs > 0:
        checker.integer("n_policy_iters", 1, " when n_aux_epochs > 0 (set n_aux_epochs=0 for plain PPO)")
        checker.integer("aux_batch_rollouts", 1)
        checker.integer("n_aux_grad_accum", 1)
    try:
        resolve_precision(model.precision)
    except ValueError as error:
        checker.problems.append(("precision", str(error)))
    if checker.problems:
        raise HyperparameterError(checker.problems)


def load_arguments(kwargs: dict[str, Any], saved: dict[str, Any]) -> dict[str, Any]:
    """
    ``load()``'s keyword arguments with the meaning the constructor gives them: ``batch_size=None`` follows the number
    of envs again (and a number stops following it); ``n_value_epochs=None`` is ``n_epochs``, and a new ``n_epochs``
    alone keeps the value epochs joint with the policy epochs when they were (``n_value_epochs == n_epochs`` in the
    file), as ``n_value_epochs=None`` does in the constructor.

    :param kwargs: the keyword arguments given to ``load()``
    :param saved: the hyperparameters stored in the file (its plain JSON values)
    :return: the keyword arguments to set on the model (a new dict)
    """
    kwargs = dict(kwargs)
    if "batch_size" in kwargs:
        kwargs["_auto_batch_size"] = kwargs["batch_size"] is None
    n_epochs = kwargs.get("n_epochs", saved.get("n_epochs"))
    if is_integer(n_epochs):
        if "n_value_epochs" in kwargs and kwargs["n_value_epochs"] is None:
            kwargs["n_value_epochs"] = n_epochs
        elif "n_epochs" in kwargs and "n_value_epochs" not in kwargs and saved.get("n_value_epochs") == saved.get("n_epochs"):
            kwargs["n_value_epochs"] = n_epochs
    return kwargs


def check_load_arguments(kwargs: dict[str, Any], saved: dict[str, Any], parameters: Iterable[str], where: str) -> None:
    """
    Refuse keyword arguments of ``load()`` that are neither constructor parameters nor attributes stored in the file
    (SB3's ``load`` would set a misspelled name as a new attribute, silently), and a file that lacks one of the
    :data:`SAVED_HYPERPARAMETERS` (loading would silently use the constructor's default) unless ``load()`` is given it.

    :param kwargs: the keyword arguments given to ``load()``
    :param saved: the file's ``data`` (plain JSON)
    :param parameters: the names of the constructor's parameters
    :param where: the file, for the messages
    :raises HyperparameterError: naming each unknown argument (with the closest valid name) or missing hyperparameter
    """
    known = set(parameters) | set(saved)
    unknown = [name for name in kwargs if name not in known]
    if unknown:
        problems = []
        for name in unknown:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append((name, f"{name!r} is neither a PPG hyperparameter nor an attribute stored in the file{hint}"))
        raise HyperparameterError(problems, header=f"Unknown keyword arguments of load() for {where}:")
    missing = [name for name in SAVED_HYPERPARAMETERS if name not in saved and name not in kwargs]
    if missing:
        raise HyperparameterError(
            [(name, f"{name} is missing") for name in missing],
            header=(
                f"{where} holds no value for these PPG hyperparameters, which every PPG model zip stores (the file was "
                "edited or damaged; loading it would silently use the constructor's defaults):"
            ),
            footer=(
                f"Pass the run's values to load() (e.g. PPG.load(path, env, {missing[0]}=...)), or load an intact copy "
                "of the file."
            ),
        )


def check_saved_optimizers(values: dict[str, Any], members: set[str], changed: Iterable[str], where: str) -> None:
    """
    Refuse hyperparameters that need other optimizers than those a model zip holds: ``load()`` restores the saved
    optimizers as they are, so it can neither add one (its state would be missing) nor drop one. The auxiliary phase
    has its own optimizer when ``n_aux_epochs > 0`` and ``separate_aux_optimizer``; separate value epochs have theirs
    when ``n_value_epochs != n_epochs``. Values of a wrong type are left to ``check_hyperparameters``.

    :param values: the hyperparameters the model would be loaded with (the file's, replaced by ``load()``'s)
    :param members: the names of the zip's members (``aux_optimizer.pth``, ``value_optimizer.pth``)
    :param changed: the names given to ``load()`` (keyword arguments or ``custom_objects``)
    :param where: the file, for the message
    :raises HyperparameterError: naming the optimizer, the values and what to do
    """
    n_aux_epochs, separate = values.get("n_aux_epochs"), values.get("separate_aux_optimizer")
    n_epochs, n_value_epochs = values.get("n_epochs"), values.get("n_value_epochs")
    optimizers = []  # (name, needed, saved, the hyperparameters that decide it, what it is for)
    if is_integer(n_aux_epochs) and isinstance(separate, (bool, np.bool_)):
        optimizers.append(
            (
                "aux_optimizer",
                n_aux_epochs > 0 and bool(separate),
                "aux_optimizer.pth" in members,
                ("n_aux_epochs", "separate_aux_optimizer"),
                "the auxiliary phase's own optimizer (n_aux_epochs > 0 with separate_aux_optimizer=True)",
            )
        )
    if is_integer(n_epochs) and is_integer(n_value_epochs):
        optimizers.append(
            (
                "value_optimizer",
                n_epochs != n_value_epochs,
                "value_optimizer.pth" in members,
                ("n_epochs", "n_value_epochs"),
                "the optimizer of separate value epochs (n_value_epochs != n_epochs)",
            )
        )
    problems = []
    for name, needed, saved, deciding, purpose in optimizers:
        if needed == saved:
            continue
        settings = ", ".join(f"{key}={values[key]!r}" for key in deciding)
        given = [key for key in deciding if key in changed]
        source = f"{', '.join(given)} given to load()" if given else "the file's own values (an edited or damaged file)"
        if saved:
            problems.append((name, f"{settings} ({source}) drops {name}: the file holds the state of {purpose}"))
        else:
            problems.append((name, f"{settings} ({source}) needs {name}, {purpose}, which the file does not hold"))
    if problems:
        raise HyperparameterError(
            problems,
            header=f"Cannot load {where} with these hyperparameters: load() restores the saved optimizers, it cannot "
            "add or drop one:",
            footer=(
                "Load the file without changing these settings. To train its weights with other settings, build a model "
                "with them (and the saved policy_kwargs) and copy the policy's weights: model = PPG(policy, env, ...); "
                "model.policy.load_state_dict(PPG.load(path).policy.state_dict())."
            ),
        )


def schedule_value(schedule: Callable[[float], float], name: str, progress_remaining: float) -> float:
    """
    Evaluate a schedule (a learning rate or a clip range), checking its value.

    :param schedule: the schedule
    :param name: the hyperparameter it was given as, for the message
    :param progress_remaining: the remaining progress (from 1 to 0)
    :return: the schedule's value
    :raises ValueError: when the value is negative or not finite
    """
    value = schedule(progress_remaining)
    if not (is_number(value) and math.isfinite(value) and value >= 0):
        raise ValueError(
            f"The {name} schedule returned {value!r} at progress_remaining={progress_remaining:.6g}: a schedule must "
            f"return a finite number >= 0 for every progress_remaining from 1 to 0. Fix the function passed as {name}."
        )
    return value


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
    if rollout_size < 2 and model.normalize_advantage != "none":
        raise ValueError(
            f"n_steps * n_envs must be > 1 with normalize_advantage={model.normalize_advantage!r} (the advantages of "
            f"one sample normalize to 0), got {rollout_size}: collect more steps or pass normalize_advantage='none'."
        )
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
            f"there will be a truncated mini-batch of size {rollout_size % batch_size} in each epoch. We recommend "
            "a batch_size that divides n_steps * n_envs."
        )
    return batch_size


def cpu_has_amx() -> bool:
    """Whether this CPU has AMX tiles (Intel Sapphire Rapids and later: bfloat16 matrix units), as torch detects it."""
    is_supported = getattr(th.cpu, "_is_amx_tile_supported", None)
    return bool(is_supported is not None and is_supported())


def has_convolutions(module: th.nn.Module) -> bool:
    """Whether ``module`` holds a convolution (``Conv1d``/``Conv2d``/``Conv3d``)."""
    return any(isinstance(layer, th.nn.modules.conv._ConvNd) for layer in module.modules())


def resolve_precision(
    precision: str | dict[str, str], device: th.device | str | None = None, convolutional: bool = False
) -> dict[str, th.dtype]:
    """
    The compute dtype of the features extractors in each phase.

    ``"auto"`` is :data:`AUTO_BF16` (bfloat16 autocast in the policy and auxiliary phases, float32 rollouts) for a
    convolutional features extractor on a CPU with AMX, where that was measured 2.1x faster end to end with the same
    learning curves (docs/throughput.md, docs/bf16_parity.md); float32 everywhere else (MLP extractors gain nothing;
    GPUs are not measured yet).

    :param precision: ``"auto"``, ``"fp32"`` / ``"bf16"`` for every phase, or a dict from phase (``"rollout"``,
        ``"policy"``, ``"aux"``) to ``"fp32"`` / ``"bf16"`` (missing phases: ``"fp32"``)
    :param device: the model's device (for ``"auto"``; None: float32)
    :param convolutional: whether the policy's features extractors hold convolutions (for ``"auto"``)
    :return: a dtype for each phase
    """
    if precision == "auto":
        fast_bf16 = device is not None and th.device(device).type == "cpu" and convolutional and cpu_has_amx()
        precision = dict(AUTO_BF16) if fast_bf16 else "fp32"
    per_phase = dict.fromkeys(PHASES, precision) if isinstance(precision, str) else dict.fromkeys(PHASES, "fp32")
    if isinstance(precision, dict):
        unknown = sorted(set(precision) - set(PHASES))
        if unknown:
            raise ValueError(f"precision has unknown phases {unknown}: use the keys {list(PHASES)}.")
        per_phase.update(precision)
    elif not isinstance(precision, str):
        raise ValueError(f"precision must be 'auto', 'fp32', 'bf16' or a dict of those per phase, got {precision!r}")
    for phase, name in per_phase.items():
        if name not in PRECISIONS:
            raise ValueError(f"precision {name!r} (phase {phase!r}) is not one of {list(PRECISIONS)} (or 'auto').")
    return {phase: PRECISIONS[name] for phase, name in per_phase.items()}


def resolve_micro_batch_size(micro_batch_size: int | str | None, device: th.device | str, convolutional: bool) -> int | None:
    """
    The most samples per forward and backward pass of training (``None``: whole minibatches).

    ``"auto"`` is :data:`AUTO_CPU_MICRO_BATCH_SIZE` for a convolutional features extractor on a CPU, where the
    activations of the backward pass live in host memory and smaller passes were measured faster (1.26x end to end
    with policy minibatches of 2,048 Procgen frames, and 1 GiB less memory: docs/throughput.md); whole minibatches
    elsewhere (MLP extractors; GPUs, where larger batches use the device better).

    :param micro_batch_size: ``"auto"``, a positive integer, or ``None``
    :param device: the model's device
    :param convolutional: whether the policy's features extractors hold convolutions
    :return: the micro-batch size, or ``None``
    """
    if micro_batch_size == "auto":
        return AUTO_CPU_MICRO_BATCH_SIZE if th.device(device).type == "cpu" and convolutional else None
    return micro_batch_size  # type: ignore[return-value]


def check_net_arch(net_arch: object) -> list[int] | dict[str, list[int]] | None:
    """
    Check a policy's ``net_arch`` and return it as a list of layer sizes or a dict with the keys ``"pi"`` and
    ``"vf"`` (layer sizes as Python ints). SB3's old format ``[dict(pi=..., vf=...)]`` is accepted with SB3's
    warning; any entry next to the dict (the shared layers that SB3 removed in v1.8.0) is an error, never dropped.

    :param net_arch: the ``net_arch`` given to the policy (None: the policy's default)
    :return: the same architecture
    :raises ValueError: naming the problem and the expected format
    """
    if net_arch is None:
        return None
    if isinstance(net_arch, (list, tuple)) and any(isinstance(entry, dict) for entry in net_arch):
        if len(net_arch) > 1:
            raise ValueError(
                f"net_arch={net_arch!r} mixes layer sizes and a dict (SB3's format before v1.8.0, whose shared layers "
                "SB3 removed): the other entries would be dropped. Pass a dict of separate networks, e.g. "
                "net_arch=dict(pi=[64, 64], vf=[64, 64]), or a list of layer sizes with policy_kwargs=dict("
                "arch='shared') (or 'detach') for one network shared by the policy and the value function."
            )
        warnings.warn(
            "As shared layers in the mlp_extractor are removed since SB3 v1.8.0, you should now pass directly a "
            "dictionary and not a list (net_arch=dict(pi=..., vf=...) instead of net_arch=[dict(pi=..., vf=...)])"
        )
        net_arch = net_arch[0]
    if isinstance(net_arch, dict):
        unknown = [key for key in net_arch if key not in NET_ARCH_KEYS]
        if unknown:
            raise ValueError(
                f"net_arch has unknown keys {unknown}: the valid keys are 'pi' (the policy network) and 'vf' (the value "
                "network), e.g. net_arch=dict(pi=[64, 64], vf=[64, 64])."
            )
        return {key: _layer_sizes(layers, f"net_arch[{key!r}]") for key, layers in net_arch.items()}
    return _layer_sizes(net_arch, "net_arch")


def _layer_sizes(layers: object, where: str) -> list[int]:
    """The hidden-layer sizes of one network, checked (a list or tuple of positive integers)."""
    if not isinstance(layers, (list, tuple)):
        raise ValueError(
            f"{where} must be a list of layer sizes (positive ints, e.g. [64, 64]) or, for net_arch, a dict "
            f"dict(pi=[...], vf=[...]); got {layers!r} ({type(layers).__name__})."
        )
    invalid = [size for size in layers if not (is_integer(size) and size >= 1)]
    if invalid:
        raise ValueError(f"{where}={layers!r} holds invalid layer sizes {invalid!r}: each must be a positive int.")
    return [int(size) for size in layers]


def check_finite_observations(obs: th.Tensor | dict[str, th.Tensor]) -> None:
    """
    Refuse observations holding NaN or inf before they reach the networks (integer observations, such as uint8
    images, cannot hold them and are not looked at).

    :param obs: an observation tensor, or a dict of them
    :raises ValueError: naming the fix
    """
    for key, tensor in obs.items() if isinstance(obs, dict) else [(None, obs)]:
        if tensor.is_floating_point() and not th.isfinite(tensor).all():
            where = f"Observation key {key!r}" if key is not None else "The observation"
            raise ValueError(
                f"{where} holds NaN or inf values: the policy cannot act on them. Check the environment (wrap it in "
                "VecCheckNan(env, raise_exception=True) to find the step that produces them), and scale unbounded "
                "observations (e.g. VecNormalize, which also clips them)."
            )


def memory_info() -> tuple[int | None, int | None]:
    """
    The memory available now and the memory this process can have in all, in bytes (None where unknown):
    ``MemAvailable`` and ``MemTotal`` of ``/proc/meminfo``, the total capped by a cgroup memory limit.
    """
    values = {}
    try:
        with open("/proc/meminfo") as file:
            for line in file:
                name, _, rest = line.partition(":")
                values[name] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    total = values.get("MemTotal")
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(limit_file) as file:
                limit = int(file.read().strip())
        except (OSError, ValueError):  # absent, or "max" (no limit)
            continue
        total = limit if total is None else min(total, limit)
    return values.get("MemAvailable"), total


def check_aux_buffer_memory(nbytes: int, n_policy_iters: int, n_envs: int, n_steps: int) -> None:
    """
    Check, before allocating it, that the auxiliary buffer fits in memory: warn when it exceeds the memory
    available now, raise when it exceeds the memory this process can have in all.

    :param nbytes: the buffer's size (``AuxiliaryBuffer.estimate_nbytes``)
    :param n_policy_iters: N_pi, for the message
    :param n_envs: the number of envs, for the message
    :param n_steps: the rollout length, for the message
    :raises ValueError: when the buffer cannot fit
    """
    available, total = memory_info()
    gib = 1024**3
    size = (
        f"The auxiliary buffer needs {nbytes / gib:.3g} GiB (n_policy_iters * n_envs * n_steps = {n_policy_iters} * "
        f"{n_envs} * {n_steps} steps of {nbytes // max(1, n_policy_iters * n_envs * n_steps)} bytes)"
    )
    fix = "reduce n_policy_iters, n_steps or the number of envs (or the observations' size)"
    if total is not None and nbytes > total:
        raise ValueError(f"{size}, more than this machine's {total / gib:.3g} GiB of memory: {fix}.")
    if available is not None and nbytes > available:
        warnings.warn(
            f"{size}, more than the {available / gib:.3g} GiB of memory available now: the machine may swap or the "
            f"process be killed. If so, {fix}."
        )


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
