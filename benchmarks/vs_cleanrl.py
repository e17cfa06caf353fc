"""
Whole-process speed of sb3-ppg against CleanRL's own ``ppg_procgen.py`` at the same configuration, in one invocation.

Both run as separate processes, one after the other (``--order``), for the same env steps: CleanRL's script as it
is (its tyro options ``--env-id --total-timesteps --num-envs --num-steps --n-iteration --e-auxiliary
--num-aux-rollouts`` and ``--cuda`` / ``--no-cuda``, in a scratch folder for its ``runs/`` logs), and sb3-ppg with the
``"cleanrl"`` preset (the same updates; docs/fidelity.md) on ``make_procgen_env``. Each process is timed from its start
to its end (imports, env creation and any compilation included), and the report gives env steps/s of each and
sb3-ppg / CleanRL.

Usage, from the repository root with sb3_ppg and CleanRL's dependencies installed:
``python benchmarks/vs_cleanrl.py --cleanrl-script ~/cleanrl/cleanrl/ppg_procgen.py --device cuda --n-envs 64
--n-steps 256 --n-policy-iters 8 --n-aux-epochs 6 --precision fp32``
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

RUNNERS = ("cleanrl", "sb3-ppg")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """
    :param argv: Command-line arguments (``None``: ``sys.argv[1:]``)
    :return: The parsed arguments
    """
    parser = argparse.ArgumentParser(description="sb3-ppg vs CleanRL's ppg_procgen.py, whole processes")
    parser.add_argument("--cleanrl-script", required=True, help="Path of CleanRL's ppg_procgen.py")
    parser.add_argument("--game", default="starpilot", help="Procgen game (easy mode, as CleanRL's script)")
    parser.add_argument("--n-envs", type=int, default=64)
    parser.add_argument("--n-steps", type=int, default=256)
    parser.add_argument("--n-policy-iters", type=int, default=8, help="N_pi (CleanRL's --n-iteration)")
    parser.add_argument("--n-aux-epochs", type=int, default=6, help="E_aux (CleanRL's --e-auxiliary)")
    parser.add_argument("--aux-batch-rollouts", type=int, default=4, help="CleanRL's --num-aux-rollouts")
    parser.add_argument("--n-cycles", type=int, default=1, help="N_pi cycles: the budget of both runs")
    parser.add_argument("--device", default="cuda", help="cuda or cpu (CleanRL: --cuda / --no-cuda)")
    parser.add_argument("--precision", default="fp32", help="sb3-ppg's precision (CleanRL runs fp32)")
    parser.add_argument("--arch", default="detach", help="sb3-ppg's arch (CleanRL's network is 'detach')")
    parser.add_argument("--aux-buffer-device", default="auto", help="sb3-ppg's aux_buffer_device")
    parser.add_argument("--overlap-groups", type=int, default=1, help="sb3-ppg: N >= 2 groups with overlap_rollouts")
    parser.add_argument("--order", default="cleanrl,sb3-ppg", help="Comma-separated order of the runs")
    parser.add_argument("--json", default=None, help="Write the results as JSON to this file")
    parser.add_argument("--sb3-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    order = args.order.split(",")
    if sorted(order) != sorted(RUNNERS):
        parser.error(f"--order must name {RUNNERS[0]} and {RUNNERS[1]} once each, got {args.order!r}")
    return args


def total_timesteps(args: argparse.Namespace) -> int:
    """The budget of both runs: whole N_pi cycles (CleanRL runs ``total // (n_envs * n_steps)`` iterations)."""
    return args.n_cycles * args.n_policy_iters * args.n_envs * args.n_steps


def cleanrl_command(args: argparse.Namespace) -> list[str]:
    """The command line of CleanRL's script at the benchmark's configuration."""
    return [
        sys.executable,
        os.path.abspath(args.cleanrl_script),
        *("--env-id", args.game, "--total-timesteps", str(total_timesteps(args))),
        *("--num-envs", str(args.n_envs), "--num-steps", str(args.n_steps)),
        *("--n-iteration", str(args.n_policy_iters), "--e-auxiliary", str(args.n_aux_epochs)),
        *("--num-aux-rollouts", str(args.aux_batch_rollouts)),
        "--cuda" if args.device.startswith("cuda") else "--no-cuda",
    ]


def sb3_command(args: argparse.Namespace, argv: list[str]) -> list[str]:
    """The command line of the sb3-ppg run: this script in its child mode."""
    return [sys.executable, os.path.abspath(__file__), *argv, "--sb3-child"]


def train_sb3(args: argparse.Namespace) -> None:
    """The sb3-ppg run (child mode): the ``"cleanrl"`` preset on ``make_procgen_env``, for ``total_timesteps``."""
    from sb3_ppg import PPG, make_procgen_env
    from sb3_ppg.procgen import get_procgen_preset

    preset = get_procgen_preset("cleanrl")
    groups = {"n_groups": args.overlap_groups} if args.overlap_groups > 1 else {}
    env = make_procgen_env(args.game, n_envs=args.n_envs, preset="cleanrl", seed=1, **groups)
    kwargs = preset.ppg_kwargs(args.n_envs)
    kwargs.update(
        n_steps=args.n_steps,
        n_policy_iters=args.n_policy_iters,
        n_aux_epochs=args.n_aux_epochs,
        aux_batch_rollouts=args.aux_batch_rollouts,
        precision=args.precision,
        aux_buffer_device=args.aux_buffer_device,
        overlap_rollouts=args.overlap_groups > 1,
        device=args.device,
        seed=1,
    )
    kwargs["batch_size"] = args.n_envs * args.n_steps // 8
    kwargs["policy_kwargs"] = {**kwargs.get("policy_kwargs", {}), "arch": args.arch}
    PPG("ProcgenCnn", env, **kwargs).learn(total_timesteps(args))


def run_timed(command: list[str]) -> float:
    """
    Run a command in a scratch folder and time the whole process.

    :param command: the command
    :return: wall-clock seconds
    :raises SystemExit: when it fails, with the end of its output
    """
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        process = subprocess.run(command, cwd=folder, env=environment, capture_output=True, text=True, check=False)
        seconds = time.perf_counter() - start
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{(process.stdout + process.stderr)[-4000:]}")
    return seconds


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """
    Run both (or, in child mode, the sb3-ppg run) and print the report.

    :param argv: Command-line arguments
    :return: The results: seconds and env steps/s of each run, and the ratio sb3-ppg / CleanRL
    """
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.sb3_child:
        train_sb3(args)
        return {}
    commands = {"cleanrl": cleanrl_command(args), "sb3-ppg": sb3_command(args, argv)}
    steps = total_timesteps(args)
    results: dict[str, Any] = {"env_steps": steps, "order": args.order.split(",")}
    for name in results["order"]:
        seconds = run_timed(commands[name])
        results[name] = {"seconds": seconds, "env_steps_per_s": steps / seconds, "command": " ".join(commands[name])}
    results["ratio"] = results["sb3-ppg"]["env_steps_per_s"] / results["cleanrl"]["env_steps_per_s"]
    print(
        f"{args.game} easy, {args.n_envs} envs x {args.n_steps} steps, N_pi {args.n_policy_iters}, E_aux "
        f"{args.n_aux_epochs}, {steps:,} env steps, device {args.device}, order {args.order}\n"
        f"CleanRL ppg_procgen.py: {results['cleanrl']['seconds']:.1f} s, {results['cleanrl']['env_steps_per_s']:,.0f} "
        f"env steps/s\nsb3-ppg ({args.arch}, {args.precision}): {results['sb3-ppg']['seconds']:.1f} s, "
        f"{results['sb3-ppg']['env_steps_per_s']:,.0f} env steps/s\nsb3-ppg / CleanRL: {results['ratio']:.2f}x"
    )
    if args.json:
        with open(args.json, "w") as file:
            json.dump(results, file, indent=2)
    return results


if __name__ == "__main__":
    main()
