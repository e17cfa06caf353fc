"""
The compute precision of PPG's phases, the micro-batch size of its forward and backward passes, and what they are
chosen from on ``"auto"``: the hardware (AMX, the memory) and the policy (convolutions or not).
"""

import torch as th

PRECISIONS = {"fp32": th.float32, "bf16": th.bfloat16}
#: The name of each of those dtypes
PRECISION_NAMES = {dtype: name for name, dtype in PRECISIONS.items()}
PHASES = ("rollout", "policy", "aux")
#: What ``precision="auto"`` means where bfloat16 is faster with the same learning curves (see resolve_precision)
AUTO_BF16 = {"rollout": "bf16", "policy": "bf16", "aux": "bf16"}
#: What ``micro_batch_size="auto"`` means for a convolutional policy on a CPU (see resolve_micro_batch_size)
AUTO_CPU_MICRO_BATCH_SIZE = 256


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
    The compute dtype of the features extractors in each phase; ``"auto"``: :data:`AUTO_BF16` for a CNN on an AMX CPU,
    float32 elsewhere (see docs/ppg.md, Precision and speed).

    :param precision: ``"auto"``, ``"fp32"``, ``"bf16"``, or a dict per phase (missing phases: ``"fp32"``)
    :param device: the model's device (for ``"auto"``; None: float32)
    :param convolutional: whether the policy's features extractors hold convolutions
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
    The most samples per forward and backward pass (``None``: whole minibatches); ``"auto"``:
    :data:`AUTO_CPU_MICRO_BATCH_SIZE` for a CNN on a CPU, else ``None`` (see docs/ppg.md, Memory).
    """
    if micro_batch_size == "auto":
        return AUTO_CPU_MICRO_BATCH_SIZE if th.device(device).type == "cpu" and convolutional else None
    return micro_batch_size  # type: ignore[return-value]
