"""
Peak resident memory of PPG at a Procgen scale, against the auxiliary buffer's raw bytes.

A full N_pi cycle at the paper's scale (64 envs x 256 steps x N_pi 32 = 524,288 env steps) takes most of an hour on a
small CPU, but its memory does not depend on what the rollouts hold. So the script:

1. builds PPG with a Procgen preset's settings on ``make_procgen_env(game, n_envs, preset=...)``;
2. trains one real policy iteration (a rollout and a policy phase);
3. fills the auxiliary buffer's other slots but one with copies of that rollout;
4. trains the cycle's last policy iteration for real: its policy phase runs beside ``N_pi - 1`` buffered rollouts
   (training's largest footprint when the policy minibatch is the larger one), then its rollout fills the buffer and
   the auxiliary phase starts: the old-policy pass over the whole buffer, then the auxiliary epochs, for at most
   ``--aux-seconds`` in all (it stops there: the memory of the next minibatches is the same; the old-policy pass
   must end within that time).

The peak resident memory (``VmHWM``) is read after each stage; the report gives it against the auxiliary buffer's
raw bytes (``AuxiliaryBuffer.nbytes``). Linux only (``/proc/self/status``).

Usage: ``python benchmarks/memory.py --n-envs 64 --n-steps 256 --n-policy-iters 32 --preset cleanrl``
"""

import argparse
import datetime
import json
import platform
import signal
import time
from typing import Any


class TimeUp(Exception):
    """Raised by the alarm that ends the auxiliary phase after ``--aux-seconds``."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """
    :param argv: Command-line arguments (``None``: ``sys.argv[1:]``)
    :return: The parsed arguments
    """
    parser = argparse.ArgumentParser(description="PPG's peak memory against the auxiliary buffer's raw bytes")
    parser.add_argument("--game", default="starpilot")
    parser.add_argument("--preset", default="cleanrl", choices=("cleanrl", "paper"), help="Procgen preset")
    parser.add_argument("--n-envs", type=int, default=64)
    parser.add_argument("--n-steps", type=int, default=256)
    parser.add_argument("--n-policy-iters", type=int, default=32, help="N_pi")
    parser.add_argument("--aux-seconds", type=int, default=300, help="Longest time spent in the auxiliary phase")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="fp32", help="PPG's precision: fp32, bf16, or JSON per phase")
    parser.add_argument("--micro-batch-size", default="auto", help="PPG's micro_batch_size: auto (default), none or N")
    parser.add_argument("--json", default=None, help="Write the results as JSON to this file")
    return parser.parse_args(argv)


def precision(text: str) -> str | dict[str, str]:
    """PPG's ``precision`` argument from the command line (a name, or a JSON dict per phase)."""
    return json.loads(text) if text.strip().startswith("{") else text


def memory_mib() -> dict[str, float]:
    """The process's current (``VmRSS``) and peak (``VmHWM``) resident memory, in MiB."""
    values = {}
    with open("/proc/self/status") as file:
        for line in file:
            if line.startswith(("VmRSS:", "VmHWM:")):
                name, kilobytes, _ = line.split()
                values[name[:-1]] = int(kilobytes) / 1024
    return {"rss_mib": values["VmRSS"], "peak_mib": values["VmHWM"]}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """
    Build, train one iteration, fill the buffer and run the auxiliary phase, reading the memory after each stage.

    :param args: The benchmark's arguments
    :return: The measurements
    """
    from sb3_ppg import PPG, make_procgen_env
    from sb3_ppg.procgen import get_procgen_preset

    stages: dict[str, dict[str, float]] = {"start": memory_mib()}
    env = make_procgen_env(args.game, n_envs=args.n_envs, preset=args.preset, seed=0)
    kwargs = get_procgen_preset(args.preset).ppg_kwargs(args.n_envs)
    kwargs.update(n_steps=args.n_steps, n_policy_iters=args.n_policy_iters, precision=precision(args.precision))
    # "none" is None and digits a number; anything else goes to PPG as it is, whose check names the valid values
    text = args.micro_batch_size
    kwargs.update(micro_batch_size=None if text == "none" else int(text) if text.isdigit() else text)
    model = PPG("ProcgenCnn", env, device=args.device, seed=0, **kwargs)
    stages["model built"] = memory_mib()
    buffer = model.aux_buffer
    assert buffer is not None
    rollout_size = args.n_envs * args.n_steps
    start = time.perf_counter()
    model.learn(rollout_size)  # one rollout and policy phase; the rollout goes to the auxiliary buffer
    stages["one policy iteration"] = {**memory_mib(), "seconds": time.perf_counter() - start}
    while buffer.n_iterations < buffer.n_policy_iters - 1:
        buffer.add(model.rollout_buffer)
    stages["auxiliary buffer full but one rollout"] = memory_mib()

    run_aux_phase = model._aux_phase
    aux_phase: dict[str, Any] = {}

    def time_up(signum: int, frame: Any) -> None:
        raise TimeUp

    def timed_aux_phase() -> None:
        # Called by train() once the last rollout has filled the buffer
        stages["last policy iteration"] = {**memory_mib(), "seconds": time.perf_counter() - start}
        stages["last policy iteration"]["buffered_iterations_in_policy_phase"] = buffer.n_iterations - 1
        aux_phase["start"] = time.perf_counter()
        signal.alarm(args.aux_seconds)
        run_aux_phase()

    compute_old_distributions = model._compute_old_distributions

    def recorded_old_distributions() -> None:
        compute_old_distributions()
        stages["old-policy pass"] = {**memory_mib(), "seconds": time.perf_counter() - aux_phase["start"]}

    model._aux_phase = timed_aux_phase  # type: ignore[method-assign]
    model._compute_old_distributions = recorded_old_distributions  # type: ignore[method-assign]
    previous = signal.signal(signal.SIGALRM, time_up)
    start = time.perf_counter()
    try:
        model.learn(rollout_size, reset_num_timesteps=False)
        finished = True
    except TimeUp:
        finished = False
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    seconds = time.perf_counter() - aux_phase["start"]
    stages["auxiliary phase"] = {**memory_mib(), "seconds": seconds, "finished": finished}
    if "old-policy pass" not in stages:
        raise RuntimeError(f"The old-policy pass did not end within --aux-seconds {args.aux_seconds}: raise it.")
    env.close()
    aux_mib = buffer.nbytes / 2**20
    peak = max(stage["peak_mib"] for stage in stages.values())
    return {
        "config": vars(args),
        "batch_size": model.batch_size,
        "micro_batch_size": model._micro_batch_size,
        "aux_minibatch_samples": model.aux_batch_rollouts * args.n_steps,
        "aux_buffer_mib": aux_mib,
        "stages": stages,
        "peak_mib": peak,
        "peak_over_aux_buffer_mib": peak - aux_mib,
    }


def markdown(result: dict[str, Any], command: str) -> str:
    """The report as Markdown."""
    import torch as th

    config = result["config"]
    lines = [
        f"- Date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}; "
        f"{platform.processor() or platform.machine()}, Python {platform.python_version()}, torch {th.__version__}",
        f"- Command: `{command}`",
        f"- {config['game']} ({config['preset']} preset), {config['n_envs']} envs x {config['n_steps']} steps, "
        f"N_pi {config['n_policy_iters']}, policy minibatch {result['batch_size']}, auxiliary minibatch "
        f"{result['aux_minibatch_samples']} samples, micro-batches {result['micro_batch_size'] or 'none'} "
        f"(micro_batch_size {config['micro_batch_size']}), "
        f"device {config['device']}, precision {config['precision']}",
        "",
        "| stage | resident MiB | peak so far MiB |",
        "|---|---|---|",
    ]
    for name, stage in result["stages"].items():
        note = ""
        if "seconds" in stage:
            note = f" ({stage['seconds']:.0f} s"
            note += ", stopped there)" if stage.get("finished") is False else ")"
        lines.append(f"| {name}{note} | {stage['rss_mib']:.0f} | {stage['peak_mib']:.0f} |")
    lines += [
        "",
        f"Auxiliary buffer: {result['aux_buffer_mib']:.0f} MiB raw. Peak: {result['peak_mib']:.0f} MiB, that is the "
        f"buffer + {result['peak_over_aux_buffer_mib'] / 1024:.2f} GiB.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """
    Run the measurement and print the report.

    :param argv: Command-line arguments
    :return: The measurements
    """
    import sys

    args = parse_args(argv)
    result = run(args)
    if args.json:
        with open(args.json, "w") as file:
            json.dump(result, file, indent=2)
    command = "python benchmarks/memory.py " + " ".join(sys.argv[1:] if argv is None else argv)
    print(markdown(result, command))
    return result


if __name__ == "__main__":
    main()
