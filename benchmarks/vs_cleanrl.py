"""
Whole-process speed of sb3-ppg against CleanRL's own ``ppg_procgen.py`` at the same configuration, in one invocation.

Both run as separate processes, one after the other (``--order``), for the same env steps: CleanRL's script as it
is (its tyro options ``--env-id --total-timesteps --num-envs --num-steps --n-iteration --e-auxiliary
--num-aux-rollouts`` and ``--cuda`` / ``--no-cuda``, in a scratch folder for its ``runs/`` logs), and sb3-ppg with the
``"cleanrl"`` preset (the same updates; docs/fidelity.md) on ``make_procgen_env``. Each process is timed from its start
to its end (imports, env creation and any compilation included), and the report gives env steps/s of each and
sb3-ppg / CleanRL.

With ``--n-cycles 2`` or more it also gives each run's rate over its last whole N_pi cycle, which leaves start-up and
the first cycle out (what a long run sees): the time from one cycle's end of policy phases to the next's (one
auxiliary phase, then N_pi rollouts and policy phases), read from CleanRL's ``SPS:`` lines (printed after each policy
phase: ``update * n_envs * n_steps / SPS`` seconds since its start, with a relative error below ``1 / SPS`` as SPS is
an integer) and from sb3-ppg's ``on_aux_phase_start`` (a callback that prints the time, after waiting for the device as
CleanRL's ``.item()`` calls before its line do). A run whose output lacks a cycle end (one line per cycle expected)
gets no cycle rate.

Usage, from the repository root with sb3_ppg installed, and CleanRL's dependencies in this Python or in the one
``--cleanrl-python`` names (gym 0.23.1, procgen, tyro, tensorboard: docs/results.md):
``python benchmarks/vs_cleanrl.py --cleanrl-script ~/cleanrl/cleanrl/ppg_procgen.py --cleanrl-python
~/cleanrl-venv/bin/python --device cuda --n-envs 64 --n-steps 256 --n-policy-iters 8 --n-aux-epochs 6 --precision fp32
--n-cycles 3``
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Any

RUNNERS = ("cleanrl", "sb3-ppg")
#: What the sb3-ppg run prints at each auxiliary phase's start, before the seconds since it started
CYCLE_MARK = "vs_cleanrl: auxiliary phase starts at"
#: When this script started (the sb3-ppg run's clock)
STARTED = time.perf_counter()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """
    :param argv: Command-line arguments (``None``: ``sys.argv[1:]``)
    :return: The parsed arguments
    """
    parser = argparse.ArgumentParser(description="sb3-ppg vs CleanRL's ppg_procgen.py, whole processes")
    parser.add_argument("--cleanrl-script", required=True, help="Path of CleanRL's ppg_procgen.py")
    parser.add_argument("--cleanrl-python", default=sys.executable, help="The Python that runs CleanRL's script")
    parser.add_argument("--game", default="starpilot", help="Procgen game (easy mode, as CleanRL's script)")
    parser.add_argument("--n-envs", type=int, default=64)
    parser.add_argument("--n-steps", type=int, default=256)
    parser.add_argument("--n-policy-iters", type=int, default=8, help="N_pi (CleanRL's --n-iteration)")
    parser.add_argument("--n-aux-epochs", type=int, default=6, help="E_aux (CleanRL's --e-auxiliary)")
    parser.add_argument("--aux-batch-rollouts", type=int, default=4, help="CleanRL's --num-aux-rollouts")
    parser.add_argument(
        "--n-cycles", type=int, default=1, help="N_pi cycles: the budget of both runs (2 or more: the last cycle's rates too)"
    )
    parser.add_argument("--device", default="cuda", help="cuda or cpu (CleanRL: --cuda / --no-cuda)")
    parser.add_argument("--precision", default="fp32", help="sb3-ppg's precision (CleanRL runs fp32)")
    parser.add_argument("--arch", default="detach", help="sb3-ppg's arch (CleanRL's network is 'detach')")
    parser.add_argument("--aux-buffer-device", default="auto", help="sb3-ppg's aux_buffer_device")
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
        args.cleanrl_python,
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
    env = make_procgen_env(args.game, n_envs=args.n_envs, preset="cleanrl", seed=1)
    kwargs = preset.ppg_kwargs(args.n_envs)
    kwargs.update(
        n_steps=args.n_steps,
        n_policy_iters=args.n_policy_iters,
        n_aux_epochs=args.n_aux_epochs,
        aux_batch_rollouts=args.aux_batch_rollouts,
        precision=args.precision,
        aux_buffer_device=args.aux_buffer_device,
        device=args.device,
        seed=1,
    )
    kwargs["batch_size"] = args.n_envs * args.n_steps // 8
    kwargs["policy_kwargs"] = {**kwargs.get("policy_kwargs", {}), "arch": args.arch}
    PPG("ProcgenCnn", env, **kwargs).learn(total_timesteps(args), callback=make_cycle_clock())


def make_cycle_clock() -> Any:
    """
    A callback (``AuxPhaseCallback``) that prints the seconds since this script started at each auxiliary phase's
    start (the end of an N_pi cycle's policy phases), once the device has done the work queued before it.
    """
    import torch as th

    from sb3_ppg.common.progress_bar import AuxPhaseCallback

    class CycleClock(AuxPhaseCallback):
        def on_aux_phase_start(self, n_epochs: int, n_minibatches: int) -> None:
            if self.model.device.type == "cuda":
                th.cuda.synchronize(self.model.device)
            print(f"{CYCLE_MARK} {time.perf_counter() - STARTED:.6f} s", flush=True)

        def _on_step(self) -> bool:
            return True

    return CycleClock()


def cleanrl_cycle_ends(output: str, args: argparse.Namespace) -> list[float]:
    """
    The seconds since CleanRL's start at the end of each N_pi cycle's policy phases, from its ``SPS:`` lines.

    :param output: The run's standard output
    :return: One time per whole cycle (but for a cycle whose line reads ``SPS: 0``)
    """
    rates = [int(rate) for rate in re.findall(r"^SPS: (\d+)\s*$", output, re.MULTILINE)]
    steps_per_update = args.n_envs * args.n_steps
    updates = range(args.n_policy_iters, len(rates) + 1, args.n_policy_iters)
    return [update * steps_per_update / rates[update - 1] for update in updates if rates[update - 1] > 0]


def sb3_cycle_ends(output: str) -> list[float]:
    """
    The seconds since sb3-ppg's start at the end of each N_pi cycle's policy phases, from :func:`make_cycle_clock`'s
    lines.

    :param output: The run's standard output
    :return: One time per whole cycle
    """
    return [float(seconds) for seconds in re.findall(rf"^{re.escape(CYCLE_MARK)} ([0-9.]+) s$", output, re.MULTILINE)]


def last_cycle(cycle_ends: list[float], args: argparse.Namespace) -> dict[str, float | None]:
    """
    :param cycle_ends: The times at the end of each cycle's policy phases
    :return: The last whole cycle's seconds and env steps/s (``None`` unless there are two or more cycles and one end
        per cycle: a missing end would make the last interval span two cycles)
    """
    if len(cycle_ends) != args.n_cycles or args.n_cycles < 2:
        return {"cycle_seconds": None, "cycle_env_steps_per_s": None}
    seconds = cycle_ends[-1] - cycle_ends[-2]
    return {"cycle_seconds": seconds, "cycle_env_steps_per_s": args.n_policy_iters * args.n_envs * args.n_steps / seconds}


def run_timed(command: list[str]) -> tuple[float, str]:
    """
    Run a command in a scratch folder and time the whole process.

    :param command: the command
    :return: wall-clock seconds and the standard output
    :raises SystemExit: when it fails, with the end of its output
    """
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        process = subprocess.run(command, cwd=folder, env=environment, capture_output=True, text=True, check=False)
        seconds = time.perf_counter() - start
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{(process.stdout + process.stderr)[-4000:]}")
    return seconds, process.stdout


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
        seconds, output = run_timed(commands[name])
        results[name] = {"seconds": seconds, "env_steps_per_s": steps / seconds, "command": " ".join(commands[name])}
        cycle_ends = cleanrl_cycle_ends(output, args) if name == "cleanrl" else sb3_cycle_ends(output)
        results[name].update(last_cycle(cycle_ends, args), cycle_ends=cycle_ends)
    results["ratio"] = results["sb3-ppg"]["env_steps_per_s"] / results["cleanrl"]["env_steps_per_s"]
    cycle_rates = [results[name]["cycle_env_steps_per_s"] for name in ("sb3-ppg", "cleanrl")]
    results["cycle_ratio"] = cycle_rates[0] / cycle_rates[1] if None not in cycle_rates else None
    print(report(args, results))
    if args.json:
        with open(args.json, "w") as file:
            json.dump(results, file, indent=2)
    return results


def report(args: argparse.Namespace, results: dict[str, Any]) -> str:
    """The results in words: whole processes, then the last whole cycle of each (where there were two cycles)."""
    lines = [
        f"{args.game} easy, {args.n_envs} envs x {args.n_steps} steps, N_pi {args.n_policy_iters}, E_aux "
        f"{args.n_aux_epochs}, {results['env_steps']:,} env steps, device {args.device}, order {args.order}",
        "whole processes:",
    ]
    names = {"cleanrl": "CleanRL ppg_procgen.py", "sb3-ppg": f"sb3-ppg ({args.arch}, {args.precision})"}
    for name, title in names.items():
        lines.append(f"  {title}: {results[name]['seconds']:.1f} s, {results[name]['env_steps_per_s']:,.0f} env steps/s")
    lines.append(f"  sb3-ppg / CleanRL: {results['ratio']:.2f}x")
    if results["cycle_ratio"] is None:
        found = ", ".join(f"{names[name]} {len(results[name]['cycle_ends'])}" for name in names)
        lines.append(
            f"last whole N_pi cycle: not measured (it needs --n-cycles 2 or more and one cycle end per cycle in each "
            f"run's output; --n-cycles {args.n_cycles}, cycle ends found: {found})"
        )
        return "\n".join(lines)
    lines.append("last whole N_pi cycle (an auxiliary phase, then N_pi rollouts and policy phases):")
    for name, title in names.items():
        lines.append(
            f"  {title}: {results[name]['cycle_seconds']:.2f} s, {results[name]['cycle_env_steps_per_s']:,.0f} env steps/s"
        )
    lines.append(f"  sb3-ppg / CleanRL: {results['cycle_ratio']:.2f}x")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
