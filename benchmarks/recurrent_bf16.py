"""
RecurrentPPG in bf16 against fp32 on a Procgen game, in one process: training env steps/s with the paper's IMPALA CNN
and an LSTM (``"ProcgenCnnLstm"``: the features extractors run in bfloat16 under ``precision="bf16"``, the LSTMs in
float32).

    nice python benchmarks/recurrent_bf16.py --game starpilot --n-envs 4 --n-steps 32 --rounds 3 --out bf16.json

One model per precision (same seed, same settings) trains one untimed ``n_policy_iters`` cycle, then the two train in
turns, fp32 bf16 fp32 bf16..., one cycle each per round (``n_policy_iters`` rollouts, their policy phases and one
auxiliary phase), so that the load of other processes on a shared machine hits both. One torch thread and one Procgen
thread by default. The report prints the env steps/s of every run, the median of each precision and bf16 / fp32, with
the CPU's name and bfloat16 flags. Results go to docs/results.md.
"""

import argparse
import json
import platform
import statistics
import sys
import time
from typing import Any

import torch as th

from sb3_ppg import RecurrentPPG
from sb3_ppg.common.precision import NATIVE_BF16_FLAGS, cpu_flags
from sb3_ppg.procgen import make_procgen_env

PRECISIONS = ("fp32", "bf16")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """
    :param argv: Command-line arguments (``None``: ``sys.argv[1:]``)
    :return: The parsed arguments
    """
    parser = argparse.ArgumentParser(description="RecurrentPPG's env steps/s in bf16 and fp32, in turns")
    parser.add_argument("--game", default="starpilot", help="Procgen game (easy mode)")
    parser.add_argument("--policy", default="ProcgenCnnLstm", help="RecurrentPPG policy (a CNN one)")
    parser.add_argument("--n-envs", type=int, default=4)
    parser.add_argument("--n-steps", type=int, default=32)
    parser.add_argument("--n-policy-iters", type=int, default=2, help="N_pi: rollouts per timed cycle")
    parser.add_argument("--n-aux-epochs", type=int, default=2, help="E_aux")
    parser.add_argument("--aux-batch-rollouts", type=int, default=2, help="whole rollouts per aux minibatch")
    parser.add_argument("--lstm-hidden-size", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of one cycle per precision (A B, A B, ...)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--env-threads", type=int, default=1, help="Procgen threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="write the runs as JSON")
    args = parser.parse_args(argv)
    for name in ("n_envs", "n_steps", "n_policy_iters", "rounds", "threads", "env_threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    return args


def make_model(args: argparse.Namespace, precision: str) -> RecurrentPPG:
    """A RecurrentPPG model in ``precision`` on ``args``' settings (whole-rollout minibatches of 2 envs)."""
    env = make_procgen_env(args.game, n_envs=args.n_envs, seed=args.seed, num_threads=args.env_threads)
    return RecurrentPPG(
        args.policy,
        env,
        n_steps=args.n_steps,
        batch_size=args.n_steps * min(2, args.n_envs),
        n_epochs=1,
        n_policy_iters=args.n_policy_iters,
        n_aux_epochs=args.n_aux_epochs,
        aux_batch_rollouts=args.aux_batch_rollouts,
        precision=precision,
        policy_kwargs=dict(lstm_hidden_size=args.lstm_hidden_size),
        device="cpu",
        seed=args.seed,
    )


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``) and its bfloat16 flags."""
    name = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            name = next(line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    flags = sorted(cpu_flags() & set(NATIVE_BF16_FLAGS))
    return f"{name} ({', '.join(flags) if flags else 'no native bfloat16 flags'})"


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The timed cycles, in turns: one dict per run (precision, round, env steps, seconds, env steps/s)."""
    th.set_num_threads(args.threads)
    cycle = args.n_policy_iters * args.n_envs * args.n_steps
    models = {precision: make_model(args, precision) for precision in PRECISIONS}
    for model in models.values():
        model.learn(cycle)  # warm-up: every pass of the cycle once, not timed
    runs = []
    for round_index in range(args.rounds):
        for precision, model in models.items():
            aux_phases = model.n_aux_phases
            start = time.perf_counter()
            model.learn(cycle, reset_num_timesteps=False)
            seconds = time.perf_counter() - start
            assert model.n_aux_phases == aux_phases + 1, "a timed cycle ends with one auxiliary phase"
            run = dict(precision=precision, round=round_index, steps=cycle, seconds=seconds, steps_per_s=cycle / seconds)
            runs.append(run)
    return runs


def report(runs: list[dict[str, Any]], command: str) -> str:
    """The runs, the median env steps/s of each precision and bf16 / fp32, as text."""
    lines = [f"CPU: {cpu_name()}; torch {th.__version__}, {th.get_num_threads()} thread(s)", f"command: {command}"]
    lines += [f"round {r['round']} {r['precision']}: {r['steps_per_s']:.1f} env steps/s ({r['seconds']:.1f} s)" for r in runs]
    medians = {p: statistics.median(r["steps_per_s"] for r in runs if r["precision"] == p) for p in PRECISIONS}
    lines.append(
        f"median: fp32 {medians['fp32']:.1f}, bf16 {medians['bf16']:.1f} env steps/s; "
        f"bf16 / fp32 = {medians['bf16'] / medians['fp32']:.2f}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    runs = run(args)
    command = "python benchmarks/recurrent_bf16.py " + " ".join(sys.argv[1:] if argv is None else argv)
    print(report(runs, command))
    if args.out:
        with open(args.out, "w") as file:
            json.dump(dict(cpu=cpu_name(), args=vars(args), runs=runs), file, indent=1)


if __name__ == "__main__":
    main()
