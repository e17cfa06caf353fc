"""
The compute precision of PPG's phases, the micro-batch size of its forward and backward passes, and what they are
chosen from on ``"auto"``: the hardware (the CPU's bfloat16 units, the memory) and the policy (convolutions or not).
"""

import functools

import torch as th

PRECISIONS = {"fp32": th.float32, "bf16": th.bfloat16}
#: The name of each of those dtypes
PRECISION_NAMES = {dtype: name for name, dtype in PRECISIONS.items()}
PHASES = ("rollout", "policy", "aux")
#: What ``precision="auto"`` means where bfloat16 is faster with the same learning curves (see resolve_precision)
AUTO_BF16 = {"rollout": "bf16", "policy": "bf16", "aux": "bf16"}
#: What ``micro_batch_size="auto"`` means for a convolutional policy on a CPU (see resolve_micro_batch_size)
AUTO_CPU_MICRO_BATCH_SIZE = 256


#: Where Linux reports the CPU's feature flags
CPUINFO_PATH = "/proc/cpuinfo"
#: The CPU flags of native bfloat16 matrix units, which make bf16 convolutions faster than fp32 (docs/ppg.md,
#: Precision and speed): AMX (Intel Sapphire Rapids and later) and AVX512-BF16 (Intel Cooper Lake, AMD Zen 4 and later).
#: Without them (AVX2-only CPUs) torch emulates bfloat16, many times slower than float32.
NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16")


@functools.cache
def cpu_flags(cpuinfo_path: str = CPUINFO_PATH) -> frozenset[str]:
    """
    The feature flags the CPU reports (the first ``flags`` line of Linux's ``/proc/cpuinfo``).

    :param cpuinfo_path: The file to read
    :return: The flags; empty where the file is missing or has no ``flags`` line (other systems, other architectures)
    """
    try:
        with open(cpuinfo_path) as cpuinfo:
            for line in cpuinfo:
                name, _, value = line.partition(":")
                if name.strip() == "flags":
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def cpu_has_amx(flags: frozenset[str] | None = None) -> bool:
    """
    Whether the CPU has AMX bfloat16 tiles (Intel Sapphire Rapids and later).

    :param flags: The CPU's flags (default: :func:`cpu_flags`)
    """
    return "amx_bf16" in (cpu_flags() if flags is None else flags)


def cpu_has_native_bf16(flags: frozenset[str] | None = None) -> bool:
    """
    Whether the CPU computes bfloat16 matrix products natively (one of :data:`NATIVE_BF16_FLAGS`).

    :param flags: The CPU's flags (default: :func:`cpu_flags`)
    """
    return not (cpu_flags() if flags is None else flags).isdisjoint(NATIVE_BF16_FLAGS)


def has_convolutions(module: th.nn.Module) -> bool:
    """Whether ``module`` holds a convolution (``Conv1d``/``Conv2d``/``Conv3d``)."""
    return any(isinstance(layer, th.nn.modules.conv._ConvNd) for layer in module.modules())


def resolve_precision(
    precision: str | dict[str, str], device: th.device | str | None = None, convolutional: bool = False
) -> dict[str, th.dtype]:
    """
    The compute dtype of the features extractors in each phase; ``"auto"``: :data:`AUTO_BF16` for a CNN on a CPU
    with native bfloat16 units (:func:`cpu_has_native_bf16`: AMX or AVX512-BF16), float32 elsewhere (see docs/ppg.md,
    Precision and speed).

    :param precision: ``"auto"``, ``"fp32"``, ``"bf16"``, or a dict per phase (missing phases: ``"fp32"``)
    :param device: the model's device (for ``"auto"``; None: float32)
    :param convolutional: whether the policy's features extractors hold convolutions
    """
    if precision == "auto":
        fast_bf16 = device is not None and th.device(device).type == "cpu" and convolutional and cpu_has_native_bf16()
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
