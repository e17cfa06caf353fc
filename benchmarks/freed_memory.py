"""
What a fresh mapping of freed memory costs on this machine: the reason why the command line keeps freed memory.

One elementwise operation (a ReLU) on a tensor of the IMPALA CNN's largest activation (its first stack at a
micro-batch of 256 samples: 256 x 16 x 64 x 64, 64 MiB in fp32, 32 MiB in bf16), timed three ways in turn, in this
script's own process (fresh, as a training script starts):

- default: glibc's own settings: the output, a block above glibc's mmap threshold, is mapped anew at every call and
  unmapped when it is freed, so the kernel maps its pages again (a minor page fault per 4 KiB);
- kept: inside :func:`sb3_ppg.cli.host_memory.freed_memory_kept` (what the command line does on a CPU): the freed block
  stays in the heap and the next call reuses its pages;
- preallocated: into an output tensor allocated once beforehand (``out=``): no allocation at all, the floor.

It prints the median milliseconds per call and the minor page faults per call of each, and kept / default, and
writes them to ``--json``.

Usage, from the repository root with sb3_ppg installed:
``python benchmarks/freed_memory.py --dtype fp32 --calls 30``
"""

import argparse
import json
import os
import platform
import resource
import time

VARIANTS = ("default", "kept", "preallocated")
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """
    :param argv: Command-line arguments (``None``: ``sys.argv[1:]``)
    :return: The parsed arguments
    """
    parser = argparse.ArgumentParser(description="Cost of mapping freed memory again: glibc's defaults vs kept")
    parser.add_argument("--shape", default="256,16,64,64", help="Tensor shape (default: the IMPALA CNN's first stack)")
    parser.add_argument("--dtype", default="fp32", choices=tuple(DTYPES), help="Tensor dtype")
    parser.add_argument("--calls", type=int, default=30, help="Timed calls per variant (after 3 untimed ones)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--json", help="Write the results as JSON to this file")
    args = parser.parse_args(argv)
    if args.calls < 1:
        parser.error(f"--calls must be at least 1, got {args.calls}")
    try:
        args.shape = tuple(int(size) for size in args.shape.split(","))
    except ValueError:
        parser.error(f"--shape must be comma-separated integers, got {args.shape!r}")
    return args


def measure(variant: str, args: argparse.Namespace) -> dict[str, float]:
    """
    Time one variant in this process.

    :param variant: one of ``VARIANTS``
    :param args: The parsed arguments
    :return: median milliseconds per call and minor page faults per timed call
    """
    import torch as th

    from sb3_ppg.cli.host_memory import freed_memory_kept

    th.set_num_threads(args.threads)
    source = th.randn(args.shape).to(getattr(th, DTYPES[args.dtype]))
    output = th.empty_like(source) if variant == "preallocated" else None

    def call() -> None:
        if output is None:
            result = th.relu(source)
            del result  # freed here: with glibc's defaults, unmapped
        else:
            th.clamp_min(source, 0, out=output)  # the ReLU, written into ``output`` (relu takes no out=)

    with freed_memory_kept(variant == "kept") as kept:
        for _ in range(3):
            call()
        faults_before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        times = []
        for _ in range(args.calls):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults_before
    return {
        "ms": sorted(times)[len(times) // 2] * 1e3,
        "faults_per_call": faults / args.calls,
        "kept": kept,
        "mib": source.numel() * source.element_size() / 2**20,
    }


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else the machine's architecture."""
    try:
        with open("/proc/cpuinfo") as file:
            return next(line.split(":", 1)[1].strip() for line in file if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.machine()


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    """
    :param argv: Command-line arguments (``None``: ``sys.argv[1:]``)
    :return: each variant's result
    """
    args = parse_args(argv)
    results = {variant: measure(variant, args) for variant in VARIANTS}
    mib = results["default"]["mib"]
    libc = platform.libc_ver()[0] or "no glibc"
    print(f"Machine: {cpu_name()}, {os.cpu_count()} CPUs, {libc}; {args.threads} torch threads")
    print(f"ReLU of a {'x'.join(map(str, args.shape))} {args.dtype} tensor ({mib:.0f} MiB), median of {args.calls} calls")
    print("| variant | ms per call | minor page faults per call |")
    print("|---|---|---|")
    for variant, result in results.items():
        print(f"| {variant} | {result['ms']:.2f} | {result['faults_per_call']:.0f} |")
    if not results["kept"]["kept"]:
        print("Freed memory could not be kept here (no glibc, or MALLOC_*_ / GLIBC_TUNABLES set): kept = default.")
    print(f"kept / default: {results['kept']['ms'] / results['default']['ms']:.2f}")
    if args.json:
        with open(args.json, "w") as file:
            json.dump(results, file, indent=2)
    return results


if __name__ == "__main__":
    main()
