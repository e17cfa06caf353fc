"""
ATen's max-pool backward against the gather-style backward of ``MaxPool3x3Stride2`` (sb3_ppg/common/torch_layers.py),
for the IMPALA stacks' 3x3 stride-2 padding-1 max-pools: for each input shape, dtype and memory layout, the median
time of ATen's forward (with indices), of ATen's backward kernel and of the gather backward (CUDA events on a GPU,
wall time on a CPU), and whether the two input gradients hold the same bits (expected on CUDA; on a CPU in bf16 or fp16
ATen's own kernel rounds each addition, so there they differ within the bound of tests/test_max_pool.py).

Usage, from the repository root (the IMPALA stacks' inputs at batch 1024, bf16 and fp32, both layouts):
``python benchmarks/max_pool_backward.py --device cuda --network 3x64x64`` (``--network``: also the whole IMPALA CNN's
forward + backward with either max-pool backward, and whether its parameter gradients are identical); a quick run on a
CPU:
``python benchmarks/max_pool_backward.py --device cpu --batch-size 2 --shapes 4x8x8 --repeats 3``
"""

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch as th
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from gymnasium import spaces

from sb3_ppg.common import torch_layers
from sb3_ppg.common.torch_layers import ImpalaCNN, max_pool_3x3_stride_2_backward_into

DTYPES = {"bf16": th.bfloat16, "fp16": th.float16, "fp32": th.float32, "fp64": th.float64}
LAYOUTS = {"channels_last": th.channels_last, "contiguous": th.contiguous_format}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """:param argv: Command-line arguments"""
    parser = argparse.ArgumentParser(description="ATen's max-pool backward against the gather-style backward")
    parser.add_argument("--device", default="cuda" if th.cuda.is_available() else "cpu")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument(
        "--shapes", default="16x64x64,32x32x32,32x16x16", help="Input shapes CxHxW, comma-separated (IMPALA stacks')"
    )
    parser.add_argument("--dtypes", default="bf16,fp32", help=f"Comma-separated, of {', '.join(DTYPES)}")
    parser.add_argument("--layouts", default="channels_last,contiguous", help=f"Comma-separated, of {', '.join(LAYOUTS)}")
    parser.add_argument("--repeats", type=int, default=50, help="Timed calls per measurement (the median is reported)")
    parser.add_argument("--warmup", type=int, default=5, help="Untimed calls before each measurement")
    parser.add_argument(
        "--network",
        default=None,
        help="Also time the IMPALA CNN's forward + backward on inputs CxHxW (e.g. 3x64x64) with each max-pool backward",
    )
    parser.add_argument("--json", default=None, help="Also write the rows to this JSON file")
    args = parser.parse_args(argv)
    for name, choices in (("dtypes", DTYPES), ("layouts", LAYOUTS)):
        unknown = [item for item in getattr(args, name).split(",") if item not in choices]
        if unknown:
            parser.error(f"unknown --{name} {unknown}: choose among {', '.join(choices)}")
    if args.repeats < 1 or args.batch_size < 1:
        parser.error("--repeats and --batch-size must be at least 1")
    try:
        args.shapes = [parse_shape(text) for text in args.shapes.split(",")]
        args.network = parse_shape(args.network) if args.network else None
    except ValueError as error:
        parser.error(str(error))
    return args


def parse_shape(text: str) -> tuple[int, int, int]:
    """:param text: ``CxHxW``"""
    parts = text.split("x")
    if len(parts) != 3 or not all(part.isdigit() and int(part) > 0 for part in parts):
        raise ValueError(f"--shapes and --network take CxHxW with positive integers (e.g. 16x64x64), got {text!r}")
    return int(parts[0]), int(parts[1]), int(parts[2])


def same_bits(a: th.Tensor, b: th.Tensor) -> bool:
    """:return: whether two floating-point tensors hold the same bits (-0.0 and +0.0 differ)"""
    integer_dtype = {8: th.int64, 4: th.int32, 2: th.int16}[a.element_size()]
    return a.dtype == b.dtype and th.equal(a.contiguous().view(integer_dtype), b.contiguous().view(integer_dtype))


def median_ms(function: Callable[[], object], device: th.device, repeats: int, warmup: int) -> float:
    """:return: the median time of one call of ``function``, in milliseconds"""
    for _ in range(warmup):
        function()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = th.cuda.Event(enable_timing=True), th.cuda.Event(enable_timing=True)
            start.record()
            function()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            start_s = time.perf_counter()
            function()
            times.append((time.perf_counter() - start_s) * 1000.0)
    return statistics.median(times)


def measure(
    shape: tuple[int, int, int], dtype_name: str, layout: str, args: argparse.Namespace, device: th.device
) -> dict[str, Any]:
    """:return: one row of the table"""
    generator = th.Generator(device=device).manual_seed(0)
    dtype, memory_format = DTYPES[dtype_name], LAYOUTS[layout]
    x = th.randn((args.batch_size, *shape), generator=generator, device=device).to(dtype)
    x = x.contiguous(memory_format=memory_format)
    output, indices = F.max_pool2d(x, kernel_size=3, stride=2, padding=1, return_indices=True)
    grad_output = th.randn(output.shape, generator=generator, device=device).to(dtype)
    grad_output = grad_output.contiguous(memory_format=memory_format)

    def aten_forward() -> object:
        return F.max_pool2d(x, kernel_size=3, stride=2, padding=1, return_indices=True)

    def aten_backward() -> th.Tensor:
        return th.ops.aten.max_pool2d_with_indices_backward(grad_output, x, [3, 3], [2, 2], [1, 1], [1, 1], False, indices)

    def gather_backward() -> th.Tensor:
        grad_input = th.empty(x.shape, dtype=dtype, device=device, memory_format=memory_format)
        max_pool_3x3_stride_2_backward_into(grad_input, grad_output, indices)
        return grad_input

    identical = same_bits(aten_backward(), gather_backward())
    forward_ms = median_ms(aten_forward, device, args.repeats, args.warmup)
    aten_ms = median_ms(aten_backward, device, args.repeats, args.warmup)
    gather_ms = median_ms(gather_backward, device, args.repeats, args.warmup)
    return {
        "input_shape": [args.batch_size, *shape],
        "dtype": dtype_name,
        "layout": layout,
        "aten_forward_ms": forward_ms,
        "aten_backward_ms": aten_ms,
        "gather_backward_ms": gather_ms,
        "speedup": aten_ms / gather_ms,
        "identical": identical,
    }


def measure_network(dtype_name: str, layout: str, args: argparse.Namespace, device: th.device) -> dict[str, Any]:
    """
    Forward and backward of the IMPALA CNN (bf16: under bf16 autocast with float32 parameters, as the package trains)
    with ATen's max-pool backward and with the gather one (which ImpalaDownStack uses on CUDA only).

    :return: one row of the network table
    """
    shape = args.network
    observation_space = spaces.Box(0, 255, shape, dtype="uint8")
    th.manual_seed(0)
    cnn = ImpalaCNN(observation_space, channels_last=layout == "channels_last").to(device)
    generator = th.Generator(device=device).manual_seed(1)
    observations = th.rand((args.batch_size, *shape), generator=generator, device=device)
    autocast_dtype = DTYPES[dtype_name] if dtype_name in ("bf16", "fp16") else None

    def forward_backward() -> list[th.Tensor]:
        cnn.zero_grad(set_to_none=True)
        with th.autocast(device.type, dtype=autocast_dtype or th.float32, enabled=autocast_dtype is not None):
            features = cnn(observations)
        features.float().square().mean().backward()
        return [parameter.grad for parameter in cnn.parameters()]

    times, gradients, default = {}, {}, torch_layers.CUDA_GATHER_MAX_POOL_BACKWARD
    for gather in (False, True):
        torch_layers.CUDA_GATHER_MAX_POOL_BACKWARD = gather
        try:
            gradients[gather] = [grad.clone() for grad in forward_backward()]
            times[gather] = median_ms(forward_backward, device, args.repeats, args.warmup)
        finally:
            torch_layers.CUDA_GATHER_MAX_POOL_BACKWARD = default
    return {
        "input_shape": [args.batch_size, *shape],
        "dtype": dtype_name,
        "layout": layout,
        "aten_ms": times[False],
        "gather_ms": times[True],
        "speedup": times[False] / times[True],
        "identical": all(same_bits(a, b) for a, b in zip(gradients[False], gradients[True], strict=True)),
    }


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    """
    Measure every (shape, dtype, layout) and print the table.

    :param argv: Command-line arguments
    :return: the rows
    """
    args = parse_args(argv)
    device = th.device(args.device)
    rows = [
        measure(shape, dtype_name, layout, args, device)
        for shape in args.shapes
        for dtype_name in args.dtypes.split(",")
        for layout in args.layouts.split(",")
    ]
    name = th.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {th.get_num_threads()} torch threads"
    print(f"max-pool 3x3/2 backward, {name}, torch {th.__version__}, median of {args.repeats} calls (ms)")
    print("| input | dtype | layout | ATen forward | ATen backward | gather backward | speed-up | identical to ATen's |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {'x'.join(map(str, row['input_shape']))} | {row['dtype']} | {row['layout']} | "
            f"{row['aten_forward_ms']:.3f} | {row['aten_backward_ms']:.3f} | {row['gather_backward_ms']:.3f} | "
            f"{row['speedup']:.2f}x | {'yes' if row['identical'] else 'no'} |"
        )
    if args.network:
        network_rows = [
            measure_network(dtype_name, layout, args, device)
            for dtype_name in args.dtypes.split(",")
            for layout in args.layouts.split(",")
        ]
        where = "the gather backward on CUDA only: on a CPU both columns run ATen's" if device.type != "cuda" else ""
        print(f"\nIMPALA CNN forward + backward, median of {args.repeats} calls (ms){'; ' + where if where else ''}")
        print("| input | dtype | layout | ATen's max-pool backward | gather backward | speed-up | same gradients |")
        print("|---|---|---|---|---|---|---|")
        for row in network_rows:
            print(
                f"| {'x'.join(map(str, row['input_shape']))} | {row['dtype']} | {row['layout']} | {row['aten_ms']:.3f} | "
                f"{row['gather_ms']:.3f} | {row['speedup']:.2f}x | {'yes' if row['identical'] else 'no'} |"
            )
        rows = rows + [{"network": True, **row} for row in network_rows]
    if args.json:
        with open(args.json, "w") as file:
            json.dump(rows, file, indent=2)
    return rows


if __name__ == "__main__":
    main()
