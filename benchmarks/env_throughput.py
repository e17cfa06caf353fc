"""
Env-only throughput of Procgen with random actions: how much the SB3 layers cost.

Four configurations of the same game and settings, measured in one run, interleaved so that load changes on the
machine hit all of them alike:

- raw: procgen's ``ProcgenGym3Env`` driven with its own ``act``/``observe`` loop (not usable by SB3, the reference);
- ``ProcgenVecEnv`` alone (to tell its cost from the SB3 wrappers');
- native: :func:`sb3_ppg.procgen.make_procgen_env`, i.e. ``ProcgenVecEnv`` + ``VecMonitor`` + ``VecNormalize`` +
  ``VecTransposeImage`` (what PPG trains on);
- dummy: ``make_vec_env("procgen/<game>-v0", n_envs)``: one gymnasium env per game in a ``DummyVecEnv`` (each in
  ``Monitor``), the path of ``gymnasium.make`` / the RL Zoo without sb3_ppg's native env.

Actions are sampled before timing. "Steps" are env transitions (``n_envs`` per vector step). Wall-clock steps per
second are noisy on a shared machine; transitions per CPU-second (process CPU time, procgen's worker threads included)
are steadier. The script prints a markdown table and writes it, with the command and the machine, to ``--output``.

Usage, from the repository root with sb3_ppg installed (``pip install -e .``, or ``PYTHONPATH=.``):
``python benchmarks/env_throughput.py --game starpilot --n-envs 64 --steps 500 --repeats 5``
"""

import argparse
import datetime
import os
import platform
import sys
import time
from collections.abc import Callable

import numpy as np


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """
    :param argv: Command-line arguments (``None``: ``sys.argv[1:]``)
    :return: The parsed arguments
    """
    parser = argparse.ArgumentParser(description="Procgen env throughput: raw procgen vs sb3_ppg's wrapped VecEnv")
    parser.add_argument("--game", default="starpilot", help="Procgen game")
    parser.add_argument("--n-envs", type=int, default=64, help="Number of parallel games")
    parser.add_argument("--steps", type=int, default=500, help="Vector steps timed per repeat (raw and native)")
    parser.add_argument(
        "--dummy-steps", type=int, default=None, help="Vector steps timed per repeat for the DummyVecEnv (default: steps / 2)"
    )
    parser.add_argument("--repeats", type=int, default=5, help="Timed repeats of each configuration (median reported)")
    parser.add_argument("--warmup-steps", type=int, default=20, help="Untimed vector steps before each repeat")
    parser.add_argument("--num-threads", type=int, default=2, help="Procgen worker threads (raw and native)")
    parser.add_argument("--distribution-mode", default="easy", help="Procgen distribution mode")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the envs and of the random actions")
    parser.add_argument("--output", default=os.path.join("docs", "env_throughput.md"), help="Markdown file to write")
    args = parser.parse_args(argv)
    if args.dummy_steps is None:
        args.dummy_steps = max(args.steps // 2, 1)
    return args


class Runner:
    """
    One configuration: an env and a function that takes one vector step with given actions.

    :param name: Row label
    :param make: Builds the env and returns ``(step, close)``
    :param n_steps: Vector steps timed per repeat
    """

    def __init__(self, name: str, make: Callable[[], tuple[Callable[[np.ndarray], None], Callable[[], None]]], n_steps: int):
        self.name = name
        self.make = make
        self.n_steps = n_steps
        self.wall_sps: list[float] = []
        self.cpu_sps: list[float] = []

    def run(self, actions: np.ndarray, n_envs: int, warmup_steps: int) -> None:
        """
        Build the env, take ``warmup_steps`` untimed steps, then time ``n_steps`` steps and record the rates.

        :param actions: Pre-sampled actions, shape ``(n_steps_max + warmup_steps, n_envs)``
        :param n_envs: Number of parallel games
        :param warmup_steps: Untimed steps first
        """
        step, close = self.make()
        for idx in range(warmup_steps):
            step(actions[idx])
        timed_actions = actions[warmup_steps : warmup_steps + self.n_steps]
        wall_start, cpu_start = time.perf_counter(), time.process_time()
        for action in timed_actions:
            step(action)
        wall, cpu = time.perf_counter() - wall_start, time.process_time() - cpu_start
        close()
        transitions = self.n_steps * n_envs
        self.wall_sps.append(transitions / wall)
        self.cpu_sps.append(transitions / cpu)


def make_runners(args: argparse.Namespace) -> list[Runner]:
    """
    :param args: Command-line arguments
    :return: The raw, bare ``ProcgenVecEnv``, native (wrapped) and dummy configurations
    """
    from procgen import ProcgenGym3Env
    from stable_baselines3.common.env_util import make_vec_env

    from sb3_ppg.procgen import ProcgenVecEnv, make_procgen_env, register_procgen_envs

    register_procgen_envs()

    def make_raw() -> tuple[Callable[[np.ndarray], None], Callable[[], None]]:
        env = ProcgenGym3Env(
            num=args.n_envs,
            env_name=args.game,
            distribution_mode=args.distribution_mode,
            num_threads=args.num_threads,
            rand_seed=args.seed,
        )

        def step(actions: np.ndarray) -> None:
            env.act(actions)
            env.observe()

        env.observe()
        return step, env.close

    def make_bare() -> tuple[Callable[[np.ndarray], None], Callable[[], None]]:
        env = ProcgenVecEnv(
            args.n_envs,
            args.game,
            distribution_mode=args.distribution_mode,
            rand_seed=args.seed,
            num_threads=args.num_threads,
        )
        env.reset()
        return env.step, env.close

    def make_native() -> tuple[Callable[[np.ndarray], None], Callable[[], None]]:
        env = make_procgen_env(
            args.game,
            n_envs=args.n_envs,
            distribution_mode=args.distribution_mode,
            seed=args.seed,
            num_threads=args.num_threads,
        )
        env.reset()
        return env.step, env.close

    def make_dummy() -> tuple[Callable[[np.ndarray], None], Callable[[], None]]:
        env = make_vec_env(
            f"procgen/{args.game}-v0",
            n_envs=args.n_envs,
            seed=args.seed,
            env_kwargs=dict(distribution_mode=args.distribution_mode),
        )
        env.reset()
        return env.step, env.close

    threads = f"num_threads={args.num_threads}"
    return [
        Runner(f"raw `ProcgenGym3Env` act/observe loop ({threads})", make_raw, args.steps),
        Runner(f"`ProcgenVecEnv` alone ({threads})", make_bare, args.steps),
        Runner(
            f"native: `make_procgen_env` (`ProcgenVecEnv` + `VecMonitor` + `VecNormalize` + `VecTransposeImage`, {threads})",
            make_native,
            args.steps,
        ),
        Runner(
            f'`make_vec_env("procgen/{args.game}-v0", n_envs={args.n_envs})`: '
            "`DummyVecEnv` of `ProcgenGymnasiumEnv` + `Monitor`",
            make_dummy,
            args.dummy_steps,
        ),
    ]


def machine_description() -> str:
    """
    :return: OS, CPU, core count and the versions that matter
    """
    import gymnasium
    import procgen
    import stable_baselines3

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as file_handler:
            for line in file_handler:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return (
        f"{platform.platform()}, {cpu}, os.cpu_count()={os.cpu_count()}, Python {platform.python_version()}, "
        f"numpy {np.__version__}, procgen {procgen.__version__.strip()}, stable-baselines3 {stable_baselines3.__version__}, "
        f"gymnasium {gymnasium.__version__}"
    )


def format_report(args: argparse.Namespace, runners: list[Runner], command: str, load_before: str) -> str:
    """
    :param args: Command-line arguments
    :param runners: Measured configurations (the first one is the raw reference)
    :param command: The command that was run
    :param load_before: Load average when the run started
    :return: The markdown report
    """
    raw = runners[0]
    raw_wall, raw_cpu = float(np.median(raw.wall_sps)), float(np.median(raw.cpu_sps))
    lines = [
        "# Procgen env throughput",
        "",
        f"Random actions (pre-sampled), {args.game}, `distribution_mode={args.distribution_mode!r}`, {args.n_envs} envs, "
        f"{args.repeats} interleaved repeats (order rotated) of {args.steps} vector steps "
        f"({args.dummy_steps} for the DummyVecEnv) after "
        f"{args.warmup_steps} warm-up steps. SPS = env transitions per second ({args.n_envs} per vector step); "
        "CPU SPS = transitions per second of process CPU time (procgen's threads included), steadier than wall time on a "
        'shared machine. "vs raw" = median of the configuration / median of raw procgen.',
        "",
        "| Configuration | Wall SPS per repeat | Median wall SPS | vs raw (wall) | Median CPU SPS | vs raw (CPU) |",
        "|---|---|---|---|---|---|",
    ]
    for runner in runners:
        wall, cpu = float(np.median(runner.wall_sps)), float(np.median(runner.cpu_sps))
        runs = ", ".join(f"{sps / 1000:.1f}k" for sps in runner.wall_sps)
        lines.append(f"| {runner.name} | {runs} | {wall:,.0f} | {wall / raw_wall:.0%} | {cpu:,.0f} | {cpu / raw_cpu:.0%} |")
    lines += [
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {machine_description()}",
        "",
        f"Load average at start (1, 5, 15 min): {load_before}",
        "",
        f"Date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """
    Run the benchmark, print the table and write it to ``--output``.

    :param argv: Command-line arguments (``None``: ``sys.argv[1:]``)
    """
    args = parse_args(argv)
    command = "python benchmarks/env_throughput.py " + " ".join(sys.argv[1:] if argv is None else argv)
    load_before = ", ".join(f"{load:.2f}" for load in os.getloadavg())
    runners = make_runners(args)
    rng = np.random.default_rng(args.seed)
    n_actions = args.warmup_steps + max(args.steps, args.dummy_steps)
    actions = rng.integers(0, 15, size=(n_actions, args.n_envs), dtype=np.int64)
    for repeat in range(args.repeats):
        # Rotate the order, so that no configuration always runs first (or right after another one)
        for offset in range(len(runners)):
            runner = runners[(repeat + offset) % len(runners)]
            runner.run(actions, args.n_envs, args.warmup_steps)
            print(f"repeat {repeat + 1}/{args.repeats}: {runner.name[:40]}... {runner.wall_sps[-1]:,.0f} SPS", flush=True)
    report = format_report(args, runners, command.strip(), load_before)
    print(report)
    directory = os.path.dirname(args.output)
    if directory:
        os.makedirs(directory, exist_ok=True)
    with open(args.output, "w") as file_handler:
        file_handler.write(report)


if __name__ == "__main__":
    main()
