"""
Where one PPG cycle's time goes on a device: for each phase (rollout, policy phase, old-policy pass, auxiliary
epochs), the wall time, the time the device was busy running kernels, the kernels and host syncs it made, and its
costliest operations (torch.profiler, after a warm-up iteration).

A phase whose device is busy for a small share of its wall time is bound by Python, kernel launches or host syncs
(the levers of docs/throughput.md's GPU section); one whose device is busy most of the time is bound by the network.

Usage, from the repository root (the model is :mod:`throughput`'s, with the same options):
``python benchmarks/profile_phases.py --device cuda --arch dual --n-envs 64 --n-steps 256 --n-policy-iters 2
--n-aux-epochs 1 --precision bf16``
"""

import argparse
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import throughput

#: The model's methods timed as phases, with their names in the report
PHASES = {
    "collect_rollouts": "rollout",
    "_policy_phase": "policy phase",
    "_compute_old_distributions": "old-policy pass",
    "_train_aux_phase": "aux epochs",
}

#: Host calls that wait for the device (a device-to-host copy to pageable memory waits too)
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy ")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """:param argv: Command-line arguments: throughput.py's, plus ``--rows`` and ``--trace``"""
    parser = argparse.ArgumentParser(description="Where a PPG cycle's time goes, per phase")
    parser.add_argument("--rows", type=int, default=12, help="Costliest operations listed per phase")
    parser.add_argument("--trace", default=None, help="Also keep the Chrome trace at this path")
    own, rest = parser.parse_known_args(argv)
    args = throughput.parse_args(rest)
    args.rows, args.trace = own.rows, own.trace
    return args


def busy_seconds(intervals: list[tuple[float, float]]) -> float:
    """The length of the union of ``(start, end)`` intervals (microseconds in, seconds out)."""
    total, current_start, current_end = 0.0, None, None
    for start, end in sorted(intervals):
        if current_end is None or start > current_end:
            if current_end is not None:
                total += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None:
        total += current_end - current_start
    return total / 1e6


def summarize(trace: dict[str, Any], rows: int) -> list[dict[str, Any]]:
    """
    Per phase window of a Chrome trace: wall, device-busy seconds, kernels, launches, syncs, top operations.

    :param trace: The Chrome trace (``traceEvents``) with one ``user_annotation`` per phase call
    :param rows: The costliest CPU operations and kernels to list
    :return: One summary per phase name
    """
    events = trace["traceEvents"]
    windows = defaultdict(list)
    for event in events:
        if event.get("cat") == "user_annotation" and event.get("name") in PHASES.values():
            windows[event["name"]].append((event["ts"], event["ts"] + event["dur"]))
    summaries = []
    for phase, spans in windows.items():

        def inside(event: dict[str, Any], spans: list[tuple[float, float]] = spans) -> bool:
            return any(start <= event["ts"] < end for start, end in spans)

        kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e and inside(e)]
        runtime = [e for e in events if e.get("cat") == "cuda_runtime" and inside(e)]
        cpu_ops = [e for e in events if e.get("cat") == "cpu_op" and inside(e)]
        wall = sum(end - start for start, end in spans) / 1e6
        kernel_time: dict[str, float] = defaultdict(float)
        for kernel in kernels:
            kernel_time[kernel["name"][:90]] += kernel["dur"] / 1e6
        # Top-level CPU operations only (their children's time is inside theirs)
        cpu_time: dict[str, float] = defaultdict(float)
        for op in cpu_ops:
            cpu_time[op["name"][:60]] += op["dur"] / 1e6
        syncs = [e for e in runtime if e["name"].startswith(SYNC_CALLS) or "DtoH" in e["name"]]
        copies = [e for e in kernels if e.get("cat") == "gpu_memcpy"]
        summaries.append(
            {
                "phase": phase,
                "calls": len(spans),
                "wall_s": wall,
                "device_busy_s": busy_seconds([(e["ts"], e["ts"] + e["dur"]) for e in kernels]),
                "kernels": sum(1 for e in kernels if e.get("cat") == "kernel"),
                "launch_calls": sum(1 for e in runtime if "Launch" in e["name"]),
                "sync_calls": len(syncs),
                "sync_s": sum(e["dur"] for e in syncs) / 1e6,
                "copies": {name: sum(1 for e in copies if e["name"] == name) for name in {e["name"] for e in copies}},
                "top_kernels": sorted(kernel_time.items(), key=lambda item: -item[1])[:rows],
                "top_cpu_ops": sorted(cpu_time.items(), key=lambda item: -item[1])[:rows],
            }
        )
    return summaries


def annotated(method: Any, phase: str, record_function: Any) -> Any:
    """``method`` run inside the profiler's ``record_function(phase)``."""

    def run(*args: Any, **kwargs: Any) -> Any:
        with record_function(phase):
            return method(*args, **kwargs)

    return run


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    """Profile one N_pi cycle after a warm-up iteration; print and return the per-phase summaries."""
    import torch as th
    from torch.profiler import ProfilerActivity, profile, record_function

    args = parse_args(argv)
    cuda = args.device.startswith("cuda")
    model = throughput.build_model(args, "optimized")
    rollout_size = args.n_steps * args.n_envs
    model.learn(rollout_size)
    model.aux_buffer.reset()
    for method, phase in PHASES.items():
        setattr(model, method, annotated(getattr(model, method), phase, record_function))
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    start = time.perf_counter()
    with profile(activities=activities) as prof:
        model.learn(args.n_policy_iters * rollout_size, reset_num_timesteps=False)
        if cuda:
            th.cuda.synchronize()
    wall = time.perf_counter() - start
    path = args.trace or os.path.join(tempfile.mkdtemp(), "trace.json")
    prof.export_chrome_trace(path)
    with open(path) as file:
        trace = json.load(file)
    summaries = summarize(trace, args.rows)
    steps = args.n_policy_iters * rollout_size
    print(f"profiled cycle: {steps} env steps in {wall:.2f} s under the profiler ({steps / wall:.0f} env steps/s)")
    for summary in summaries:
        busy = summary["device_busy_s"] / summary["wall_s"] if summary["wall_s"] else 0.0
        print(
            f"\n== {summary['phase']}: {summary['calls']} call(s), wall {summary['wall_s']:.3f} s, device busy "
            f"{summary['device_busy_s']:.3f} s ({busy:.0%}), {summary['kernels']} kernels, {summary['launch_calls']} "
            f"launches, {summary['sync_calls']} syncs ({summary['sync_s']:.3f} s), copies {summary['copies']}"
        )
        print("  top kernels (s):")
        for name, seconds in summary["top_kernels"]:
            print(f"    {seconds:8.4f}  {name}")
        print("  top CPU ops (s, inclusive):")
        for name, seconds in summary["top_cpu_ops"]:
            print(f"    {seconds:8.4f}  {name}")
    return summaries


if __name__ == "__main__":
    main()
