"""
Env-only throughput of Procgen with random actions: how much the SB3 layers cost.

Four configurations of the same game and settings, measured in one run:

- raw: procgen's ``ProcgenGym3Env`` (procgen-gym's vectorized env on Python 3.13) driven with its own ``act``/``observe``
  loop (not usable by SB3, the reference);
- ``ProcgenVecEnv`` alone (to tell its cost from the wrappers');
- chain: :func:`sb3_ppg.procgen.make_procgen_env`, i.e. a channel-first ``ProcgenVecEnv`` in SB3's ``VecMonitor``
  and ``VecNormalize`` (what PPG trains on);
- dummy: ``make_vec_env("procgen/<game>-v0", n_envs)``: one gymnasium env per game in a ``DummyVecEnv`` (each in
  ``Monitor``), the path of ``gymnasium.make`` / the RL Zoo without sb3_ppg's native env.

The envs are built once and timed in turn, in short blocks, round after round (in a new random order every round), so
that the frequent load changes of a shared machine hit every configuration alike. The headline ratio is paired: the
median over the rounds of (configuration SPS / raw SPS in the same round), with a 95% bootstrap interval over the
rounds. Actions are sampled before timing; raw, bare and chain get the same seed and the same actions, so they play
the same games. "Steps" are env transitions (``n_envs`` per vector step). The script prints a markdown table and
writes it, with the command and the machine, to ``--output``.

Usage, from the repository root with sb3_ppg installed (``pip install -e .``, or ``PYTHONPATH=.``):
``python benchmarks/env_throughput.py --game starpilot --n-envs 64 --steps 100 --repeats 120``
"""

import argparse
import datetime
import importlib.metadata
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
    parser = argparse.ArgumentParser(description="Procgen env throughput: raw procgen vs sb3_ppg's VecEnv and wrapper chain")
    parser.add_argument("--game", default="starpilot", help="Procgen game")
    parser.add_argument("--n-envs", type=int, default=64, help="Number of parallel games")
    parser.add_argument("--steps", type=int, default=100, help="Vector steps per timed block (all but the DummyVecEnv)")
    parser.add_argument(
        "--dummy-steps", type=int, default=None, help="Vector steps per timed block of the DummyVecEnv (default: steps / 2)"
    )
    parser.add_argument("--repeats", type=int, default=120, help="Rounds: timed blocks of each configuration")
    parser.add_argument("--warmup-steps", type=int, default=50, help="Untimed vector steps before the first round")
    parser.add_argument("--num-threads", type=int, default=2, help="Procgen worker threads (all but the DummyVecEnv)")
    parser.add_argument("--distribution-mode", default="easy", help="Procgen distribution mode")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the envs and of the random actions")
    parser.add_argument("--output", default=os.path.join("docs", "env_throughput.md"), help="Markdown file to write")
    args = parser.parse_args(argv)
    if args.dummy_steps is None:
        args.dummy_steps = max(args.steps // 2, 1)
    return args


class Runner:
    """
    One configuration: an env, built once, and a function that takes one vector step with given actions.

    All configurations stay alive for the whole run and are timed in short blocks, in turn, so that a change of load on
    the machine hits every configuration alike; the raw, bare and chain configurations get the same seed and the same
    actions, so they play the same games.

    :param name: Row label
    :param make: Builds the env and returns ``(step, close)``
    :param n_steps: Vector steps timed per block
    """

    def __init__(self, name: str, make: Callable[[], tuple[Callable[[np.ndarray], None], Callable[[], None]]], n_steps: int):
        self.name = name
        self.n_steps = n_steps
        self.step, self.close = make()
        self.wall_s: list[float] = []
        self.cpu_s: list[float] = []
        self.thread_cpu_s: list[float] = []

    def warm_up(self, actions: np.ndarray) -> None:
        """
        Take untimed steps.

        :param actions: One row of actions per step
        """
        for action in actions:
            self.step(action)

    def run_block(self, actions: np.ndarray) -> None:
        """
        Time ``n_steps`` vector steps and record wall, process CPU and calling-thread CPU time.

        :param actions: At least ``n_steps`` rows of actions
        """
        wall_start, cpu_start, thread_start = time.perf_counter(), time.process_time(), time.thread_time()
        for action in actions[: self.n_steps]:
            self.step(action)
        self.thread_cpu_s.append(time.thread_time() - thread_start)
        self.cpu_s.append(time.process_time() - cpu_start)
        self.wall_s.append(time.perf_counter() - wall_start)

    def block_sps(self, n_envs: int) -> np.ndarray:
        """
        :param n_envs: Number of parallel games
        :return: Wall-clock transitions per second of each block
        """
        return self.n_steps * n_envs / np.array(self.wall_s)


def make_runners(args: argparse.Namespace) -> list[Runner]:
    """
    :param args: Command-line arguments
    :return: The raw, bare ``ProcgenVecEnv``, chain (``make_procgen_env``) and dummy configurations
    """
    from stable_baselines3.common.env_util import make_vec_env

    from sb3_ppg.procgen import ProcgenVecEnv, make_procgen_env, register_procgen_envs
    from sb3_ppg.procgen.backend import BACKEND, make_native_env

    register_procgen_envs()

    def make_raw() -> tuple[Callable[[np.ndarray], None], Callable[[], None]]:
        env = make_native_env(  # procgen's ProcgenGym3Env, or its procgen-gym equivalent
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

    def make_chain() -> tuple[Callable[[np.ndarray], None], Callable[[], None]]:
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
    raw_name = "ProcgenGym3Env" if BACKEND == "procgen" else "procgen_gym.ProcgenVecEnv"
    return [
        Runner(f"raw `{raw_name}` act/observe loop ({threads})", make_raw, args.steps),
        Runner(f"`ProcgenVecEnv` alone ({threads})", make_bare, args.steps),
        Runner(
            f"chain: `make_procgen_env` (channel-first `ProcgenVecEnv` + SB3's `VecMonitor` + `VecNormalize`, {threads})",
            make_chain,
            args.steps,
        ),
        Runner(
            f'`make_vec_env("procgen/{args.game}-v0", n_envs={args.n_envs})`: '
            "`DummyVecEnv` of `ProcgenGymnasiumEnv` + `Monitor`",
            make_dummy,
            args.dummy_steps,
        ),
    ]


def procgen_distribution() -> str:
    """
    :return: The installed Procgen package and its version (procgen-gym, procgen-mirror or procgen)
    """
    for name in ("procgen-gym", "procgen-mirror", "procgen"):
        try:
            return f"{name} {importlib.metadata.version(name)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return "no procgen package"


def machine_description() -> str:
    """
    :return: OS, CPU, core count and the versions that matter
    """
    import gymnasium
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
        f"numpy {np.__version__}, {procgen_distribution()}, stable-baselines3 {stable_baselines3.__version__}, "
        f"gymnasium {gymnasium.__version__}"
    )


def paired_ratio(runner: Runner, reference: Runner, n_envs: int) -> float:
    """
    :param runner: A configuration
    :param reference: The raw configuration
    :param n_envs: Number of parallel games
    :return: Median over the repeats of the configuration's wall-clock SPS divided by raw's in the same repeat
    """
    return float(np.median(runner.block_sps(n_envs) / reference.block_sps(n_envs)))


def paired_ratio_interval(
    runner: Runner, reference: Runner, n_envs: int, n_resamples: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """
    :param runner: A configuration
    :param reference: The raw configuration
    :param n_envs: Number of parallel games
    :param n_resamples: Bootstrap resamples of the rounds
    :param seed: Seed of the resampling
    :return: 95% bootstrap interval of :func:`paired_ratio` (resampling the rounds)
    """
    ratios = runner.block_sps(n_envs) / reference.block_sps(n_envs)
    rng = np.random.default_rng(seed)
    medians = np.median(rng.choice(ratios, size=(n_resamples, len(ratios))), axis=1)
    low, high = np.percentile(medians, [2.5, 97.5])
    return float(low), float(high)


def format_report(args: argparse.Namespace, runners: list[Runner], command: str, load_before: str) -> str:
    """
    :param args: Command-line arguments
    :param runners: Measured configurations (the first one is the raw reference, the third the chain)
    :param command: The command that was run
    :param load_before: Load average when the run started
    :return: The markdown report
    """
    raw = runners[0]
    n_envs = args.n_envs
    raw_total = raw.n_steps * n_envs * len(raw.wall_s) / sum(raw.wall_s)
    raw_cpu = float(np.median(raw.n_steps * n_envs / np.array(raw.cpu_s)))
    lines = [
        "# Procgen env throughput",
        "",
        f"Random actions (pre-sampled), {args.game}, `distribution_mode={args.distribution_mode!r}`, {n_envs} envs. "
        f"All configurations are built once, warmed up for {args.warmup_steps} steps, then timed in turn in "
        f"{args.repeats} rounds (in a new random order each round) of one block of {args.steps} vector steps each "
        f"({args.dummy_steps} for the DummyVecEnv). Raw, bare and chain play the same levels with the same actions.",
        "",
        f"- SPS: env transitions per second ({n_envs} per vector step).",
        "- \"vs raw (paired)\": median over the rounds of the block's SPS divided by raw's SPS in the same round "
        "(load changes on a shared machine cancel out).",
        '- "vs raw (total)": all transitions over all wall time, divided by the same for raw.',
        "- CPU SPS: transitions per second of process CPU time (procgen's worker threads included).",
        "- Calling thread: CPU time of the Python thread per vector step (the wrappers' cost shows here; procgen's "
        "workers step the games on other threads while it waits).",
        "",
        "| Configuration | Median wall SPS | Total wall SPS | vs raw (paired) | vs raw (total) | Median CPU SPS "
        "| vs raw (CPU) | Calling thread, µs per step |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for runner in runners:
        wall = float(np.median(runner.block_sps(n_envs)))
        total = runner.n_steps * n_envs * len(runner.wall_s) / sum(runner.wall_s)
        cpu = float(np.median(runner.n_steps * n_envs / np.array(runner.cpu_s)))
        thread_us = float(np.median(np.array(runner.thread_cpu_s) / runner.n_steps)) * 1e6
        lines.append(
            f"| {runner.name} | {wall:,.0f} | {total:,.0f} | {paired_ratio(runner, raw, n_envs):.1%} | "
            f"{total / raw_total:.1%} | {cpu:,.0f} | {cpu / raw_cpu:.1%} | {thread_us:,.0f} |"
        )
    summaries = []
    for runner, label in ((runners[1], "`ProcgenVecEnv` alone"), (runners[2], "the `make_procgen_env` chain")):
        low, high = paired_ratio_interval(runner, raw, n_envs)
        summaries.append(f"{label} keeps **{paired_ratio(runner, raw, n_envs):.1%}** ({low:.1%}-{high:.1%})")
    lines += [
        "",
        f"Of raw procgen's throughput (paired; 95% bootstrap interval over the rounds), {summaries[0]} and {summaries[1]}. "
        "Training time is another matter: the network's passes dominate it (see docs/procgen.md, end-to-end timing).",
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


def main(argv: list[str] | None = None) -> float:
    """
    Run the benchmark, print the table and write it to ``--output``.

    :param argv: Command-line arguments (``None``: ``sys.argv[1:]``)
    :return: The ``make_procgen_env`` chain's throughput as a fraction of raw procgen's (paired)
    """
    args = parse_args(argv)
    command = "python benchmarks/env_throughput.py " + " ".join(sys.argv[1:] if argv is None else argv)
    load_before = ", ".join(f"{load:.2f}" for load in os.getloadavg())
    rng = np.random.default_rng(args.seed)
    n_actions = args.warmup_steps + args.repeats * max(args.steps, args.dummy_steps)
    actions = rng.integers(0, 15, size=(n_actions, args.n_envs), dtype=np.int64)
    runners = make_runners(args)
    order_rng = np.random.default_rng(args.seed)
    try:
        for runner in runners:
            runner.warm_up(actions[: args.warmup_steps])
        position = args.warmup_steps
        for repeat in range(args.repeats):
            block_actions = actions[position : position + max(args.steps, args.dummy_steps)]
            # A new random order every round, so that no configuration always runs first or right after another one
            for index in order_rng.permutation(len(runners)):
                runners[index].run_block(block_actions)
            position += max(args.steps, args.dummy_steps)
            sps = ", ".join(f"{runner.block_sps(args.n_envs)[-1]:,.0f}" for runner in runners)
            print(f"round {repeat + 1}/{args.repeats}: SPS {sps}", flush=True)
    finally:
        for runner in runners:
            runner.close()
    report = format_report(args, runners, command.strip(), load_before)
    print(report)
    directory = os.path.dirname(args.output)
    if directory:
        os.makedirs(directory, exist_ok=True)
    with open(args.output, "w") as file_handler:
        file_handler.write(report)
    return paired_ratio(runners[2], runners[0], args.n_envs)


if __name__ == "__main__":
    main()
