"""
The host's time around the network, per rollout: PPG's rollout buffer (``PPGRolloutBuffer``, the default: written
while the envs step) against SB3's ``RolloutBuffer`` (``rollout_buffer_class``), in alternating rounds on the same
envs.

The model is ``arch="dual"`` on Procgen (``make_procgen_env``) with a features extractor that returns zeros, so that
what is timed is what the host does on any device: env stepping, action sampling, the rollout buffer's writes
(``collect_rollouts``; the buffer's ``reset()`` and ``add()`` calls also timed alone), one epoch of the policy
phase's minibatches gathered (``_rollout_minibatches``, SB3's flattening included, the rollout copied to the device
as ``train()`` does) and the rollout stored in the auxiliary buffer (``AuxiliaryBuffer.add``). On a GPU these are the
costs that the network's kernels do not hide (docs/throughput.md).

Usage, from the repository root: ``python benchmarks/rollout_host_time.py --n-envs 64 --n-steps 256 --rounds 5``
"""

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Iterator
from typing import Any

import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import BaseBuffer, RolloutBuffer
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor

from sb3_ppg import PPG, make_procgen_env
from sb3_ppg.common.cuda import gathers_on_device, rollout_to_device

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import throughput

#: The variants compared, by the name the report gives them: the rollout buffer class (None: PPG's default)
VARIANTS = {"PPGRolloutBuffer": None, "SB3 RolloutBuffer": RolloutBuffer}


class ZeroFeatures(BaseFeaturesExtractor):
    """A features extractor without work: zeros of ``features_dim`` for every observation."""

    def __init__(self, observation_space: spaces.Space, features_dim: int = 256) -> None:
        super().__init__(observation_space, features_dim)

    def forward(self, observations: th.Tensor) -> th.Tensor:
        return th.zeros(observations.shape[0], self.features_dim, device=observations.device)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """:param argv: Command-line arguments (``None``: ``sys.argv[1:]``)"""
    parser = argparse.ArgumentParser(description="Host time per rollout: PPG's rollout buffer vs SB3's")
    parser.add_argument("--game", default="starpilot", help="Procgen game (easy mode)")
    parser.add_argument("--n-envs", type=int, default=64)
    parser.add_argument("--n-steps", type=int, default=256)
    parser.add_argument("--n-minibatches", type=int, default=8, help="Policy-phase minibatches per epoch")
    parser.add_argument("--rounds", type=int, default=5, help="Timed rollouts per buffer, alternated")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--num-threads", type=int, default=None, help="Procgen's threads (default: make_procgen_env's)")
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--json", default=None, help="Write the results as JSON to this file")
    return parser.parse_args(argv)


def make_model(args: argparse.Namespace, rollout_buffer_class: type[RolloutBuffer] | None) -> PPG:
    """The dual model without network work, with the given rollout buffer class (``None``: PPG's default)."""
    env = make_procgen_env(args.game, n_envs=args.n_envs, num_threads=args.num_threads, seed=0)
    return PPG(
        "CnnPolicy",
        env,
        n_steps=args.n_steps,
        batch_size=args.n_envs * args.n_steps // args.n_minibatches,
        n_policy_iters=2,
        rollout_buffer_class=rollout_buffer_class,
        policy_kwargs=dict(arch="dual", features_extractor_class=ZeroFeatures),
        device=args.device,
        seed=0,
    )


def synchronize(device: th.device) -> None:
    """Wait for the device's queued work (nothing to wait for on a CPU)."""
    if device.type == "cuda":
        th.cuda.synchronize(device)


def time_one_rollout(model: PPG) -> dict[str, float]:
    """
    Seconds of one rollout's collection (and of the rollout buffer's ``reset()`` and ``add()`` calls in it, or its
    two parts), one epoch of its minibatches, and its store in the auxiliary buffer.
    """
    assert model.aux_buffer is not None
    if model.aux_buffer.full():
        model.aux_buffer.reset()
    timings = {}
    with timed_buffer_writes(model.rollout_buffer) as writes:
        start = time.perf_counter()
        model.collect_rollouts(model.env, model._callback, model.rollout_buffer, model.n_steps)
        timings["rollout_s"] = time.perf_counter() - start
    timings["buffer_writes_s"] = writes[0]
    start = time.perf_counter()
    # As train() does: the rollout copied to the device once (where the minibatches are gathered there)
    on_device = gathers_on_device(model.rollout_buffer, model.device)
    model._device_rollout = rollout_to_device(model.rollout_buffer, model.device) if on_device else None
    try:
        for _ in model._rollout_minibatches():
            pass
        synchronize(model.device)  # until the minibatches are where the device can use them
        timings["minibatches_s"] = time.perf_counter() - start
        start = time.perf_counter()
        model.aux_buffer.add(model.rollout_buffer, model._device_rollout)
    finally:
        model._device_rollout = None
    synchronize(model.device)
    timings["aux_add_s"] = time.perf_counter() - start
    return timings


@contextlib.contextmanager
def timed_buffer_writes(buffer: BaseBuffer) -> Iterator[list[float]]:
    """
    Within the context, the seconds spent in the buffer's ``reset()`` and ``add()`` (or its two parts, in PPG's
    buffers) add up in the list's item.
    """
    seconds = [0.0]
    depth = [0]  # PPG's add() calls its two parts: only the outermost call counts

    def timed(method: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            depth[0] += 1
            try:
                return method(*args, **kwargs)
            finally:
                depth[0] -= 1
                if depth[0] == 0:
                    seconds[0] += time.perf_counter() - start

        return call

    names = [name for name in ("reset", "add", "add_before_step", "add_after_step") if hasattr(buffer, name)]
    for name in names:
        setattr(buffer, name, timed(getattr(buffer, name)))
    try:
        yield seconds
    finally:
        for name in names:
            delattr(buffer, name)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Alternate the buffers for ``rounds`` timed rollouts each (after one untimed); the medians per buffer."""
    th.set_num_threads(args.torch_threads)
    models = {name: make_model(args, rollout_buffer_class) for name, rollout_buffer_class in VARIANTS.items()}
    for model in models.values():
        model._setup_learn(10**9, callback=None)
        model._callback = model._init_callback(None)
        time_one_rollout(model)
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in models}
    for _ in range(args.rounds):
        for name, model in models.items():
            samples[name].append(time_one_rollout(model))
    results = {}
    for name, rounds in samples.items():
        medians = {key: statistics.median(sample[key] for sample in rounds) for key in rounds[0]}
        medians["rollout_ms_per_step"] = 1000 * medians["rollout_s"] / args.n_steps
        medians["buffer_writes_us_per_step"] = 1e6 * medians["buffer_writes_s"] / args.n_steps
        medians["total_s"] = medians["rollout_s"] + medians["minibatches_s"] + medians["aux_add_s"]
        results[name] = medians
    for model in models.values():
        model.env.close()
    return results


def report(args: argparse.Namespace, results: dict[str, dict[str, float]]) -> str:
    """The results as a Markdown table, with the machine and the configuration."""
    lines = [
        f"{throughput.machine()}; {args.game} x {args.n_envs} envs x {args.n_steps} steps, {args.n_minibatches} "
        f"minibatches, device {args.device}, medians of {args.rounds} rounds",
        "",
        "| variant | rollout (ms per step) | of which buffer writes (us per step) | minibatches of one epoch (ms) "
        "| aux buffer add (ms) | total per rollout (s) |",
        "|---|---|---|---|---|---|",
    ]
    for name, medians in results.items():
        lines.append(
            f"| {name} | {medians['rollout_ms_per_step']:.3f} | {medians['buffer_writes_us_per_step']:.0f} | "
            f"{1000 * medians['minibatches_s']:.1f} | "
            f"{1000 * medians['aux_add_s']:.1f} | {medians['total_s']:.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    args = parse_args(argv)
    results = run(args)
    print(report(args, results))
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"args": vars(args), "results": results}, file, indent=2)
    return results


if __name__ == "__main__":
    main()
