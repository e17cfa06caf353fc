"""
sb3-ppg against CleanRL's ``ppg_procgen.py`` on the same Procgen config, side by side (issue 28).

For each seed, sb3-ppg trains ``PPG`` with the ``"cleanrl"`` preset (``make_procgen_env(preset="cleanrl")``,
``get_procgen_preset("cleanrl").ppg_kwargs(n_envs)``) in resumable chunks (``procgen_learning.train_chunk``), and
CleanRL's own script runs unmodified (``--cleanrl-script``) in its own Python (``--cleanrl-python``, the environment
with gym 0.23.1 it needs) through ``benchmarks/cleanrl_episodes.py``, which logs every episode it finishes. Both sides
log ``env steps, raw return, length`` per episode; the script then writes, for each window of ``--window`` env steps,
the mean return (and length) of the episodes that ended in it, per seed and over seeds, with 95% bootstrap intervals
(seeds resampled, then episodes within each), as a Markdown report and a plot with the bootstrap bands.

Usage (rerun until it reports every run complete; a CleanRL run that was cut is rerun from its start):

    python benchmarks/procgen_vs_cleanrl.py --cleanrl-script /path/to/cleanrl/cleanrl/ppg_procgen.py \
        --cleanrl-python /path/to/fidelity-venv/bin/python --game starpilot --seeds 1,2,3 \
        --total-timesteps 2000000 --device cuda

Without ``--cleanrl-script`` only sb3-ppg's side runs (and is reported). ``--cleanrl-parallel`` starts every CleanRL
run at once, in the background, while sb3-ppg's runs train one after the other (a GPU machine with cores to spare).
"""

import argparse
import csv
import datetime
import os
import subprocess
import sys
import time
import warnings
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

SIDES = ("sb3-ppg", "CleanRL")
COMPLETE = "# complete"  # cleanrl_episodes.COMPLETE


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """
    :param argv: Command-line arguments (``None``: ``sys.argv[1:]``)
    :return: The parsed arguments
    """
    parser = argparse.ArgumentParser(description="sb3-ppg against CleanRL's ppg_procgen.py on Procgen")
    parser.add_argument("--game", default="starpilot")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--total-timesteps", type=int, default=2_000_000)
    parser.add_argument("--n-envs", type=int, default=64, help="CleanRL's --num-envs")
    parser.add_argument("--n-steps", type=int, default=256, help="CleanRL's --num-steps")
    parser.add_argument("--window", type=int, default=250_000, help="env steps per window of the table")
    parser.add_argument("--cleanrl-script", default=None, help="path of CleanRL's cleanrl/ppg_procgen.py")
    parser.add_argument("--cleanrl-python", default=sys.executable, help="the Python that runs CleanRL's script")
    parser.add_argument("--cleanrl-args", default="", help="more arguments of CleanRL's script (one string)")
    parser.add_argument(
        "--cleanrl-parallel", action="store_true", help="start every CleanRL run at once, while sb3-ppg's runs train"
    )
    parser.add_argument("--device", default="cpu", help="sb3-ppg's device (CleanRL uses CUDA when it is there)")
    parser.add_argument("--channels", default="16,32,32", help="sb3-ppg's IMPALA channels (CleanRL's are fixed)")
    parser.add_argument("--chunk-minutes", type=float, default=60.0, help="longest stretch of one sb3-ppg run")
    parser.add_argument("--max-minutes", type=float, default=600.0, help="longest invocation")
    parser.add_argument("--folder", default=os.path.join("benchmarks", "results", "procgen_vs_cleanrl"))
    parser.add_argument("--output", default=os.path.join("benchmarks", "results", "procgen_vs_cleanrl.md"))
    parser.add_argument("--bootstrap", type=int, default=2000, help="bootstrap resamples")
    args = parser.parse_args(argv)
    if args.window <= 0 or args.total_timesteps < args.window:
        parser.error("--window must be positive and at most --total-timesteps")
    return args


def sb3_ppg_run(args: argparse.Namespace, seed: int, deadline: float) -> bool:
    """Train (or continue) sb3-ppg's run of one seed with the cleanrl preset; return whether it is complete."""
    from procgen_learning import train_chunk

    from sb3_ppg.procgen import get_procgen_preset

    preset = get_procgen_preset("cleanrl")
    chunk_args = argparse.Namespace(
        folder=os.path.join(args.folder, "sb3-ppg"),
        game=args.game,
        n_envs=args.n_envs,
        n_steps=args.n_steps,
        total_timesteps=args.total_timesteps,
        device=args.device,
    )
    model_kwargs = dict(preset.ppg_kwargs(args.n_envs), n_steps=args.n_steps, precision="fp32")
    channels = tuple(int(channel) for channel in args.channels.split(","))
    model_kwargs["policy_kwargs"] = dict(model_kwargs["policy_kwargs"], features_extractor_kwargs=dict(channels=channels))
    steps = train_chunk(chunk_args, "ppg", seed, deadline, env_kwargs=dict(preset="cleanrl"), model_kwargs=model_kwargs)
    return steps >= args.total_timesteps


def episodes_path(args: argparse.Namespace, side: str, seed: int) -> str:
    """Where a run's episode log is."""
    if side == "sb3-ppg":
        return os.path.join(args.folder, "sb3-ppg", f"{args.game}_ppg_seed{seed}", "episodes.csv")
    return os.path.join(args.folder, "cleanrl", f"{args.game}_seed{seed}", "episodes.csv")


def cleanrl_complete(path: str) -> bool:
    """Whether a CleanRL episode log was written by a run that returned."""
    if not os.path.exists(path):
        return False
    with open(path) as file:
        return any(line.strip() == COMPLETE for line in file)


def start_cleanrl(args: argparse.Namespace, seed: int) -> subprocess.Popen | None:
    """Start CleanRL's script for one seed (``None`` when its log is already complete); its output goes to stdout.txt."""
    path = episodes_path(args, "CleanRL", seed)
    if cleanrl_complete(path):
        return None
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    script_args = [
        f"--env-id={args.game}",
        f"--seed={seed}",
        f"--total-timesteps={args.total_timesteps}",
        f"--num-envs={args.n_envs}",
        f"--num-steps={args.n_steps}",
        *args.cleanrl_args.split(),
    ]
    command = [
        args.cleanrl_python,
        os.path.join(HERE, "cleanrl_episodes.py"),
        os.path.abspath(args.cleanrl_script),
        "--episodes",
        os.path.abspath(path),
        "--",
        *script_args,
    ]
    with open(os.path.join(folder, "stdout.txt"), "w") as log:
        # The child holds its own copy of the file descriptor
        return subprocess.Popen(command, cwd=folder, stdout=log, stderr=subprocess.STDOUT)


def finish_cleanrl(args: argparse.Namespace, seed: int, process: subprocess.Popen | None) -> bool:
    """Wait for a run started by :func:`start_cleanrl`; return whether its log is complete."""
    path = episodes_path(args, "CleanRL", seed)
    if process is not None and process.wait() != 0:
        stdout = os.path.join(os.path.dirname(path), "stdout.txt")
        print(f"CleanRL seed {seed} failed (exit {process.returncode}): see {stdout}")
    return cleanrl_complete(path)


def read_episodes(path: str, max_steps: int) -> np.ndarray:
    """Rows ``(env steps, return, length)`` of an episode log, up to ``max_steps`` (comment lines skipped)."""
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return np.zeros((0, 3))
    rows = np.loadtxt(path, delimiter=",", comments="#", ndmin=2)
    rows = rows.reshape(-1, 3)
    return rows[rows[:, 0] <= max_steps]


def window_edges(total_timesteps: int, window: int) -> np.ndarray:
    """Edges of the windows ``[0, w), [w, 2w), ...`` up to the budget (the last one inclusive)."""
    return np.arange(0, total_timesteps + window, window)[: total_timesteps // window + 1]


def window_means(episodes: np.ndarray, edges: np.ndarray, column: int = 1) -> np.ndarray:
    """Mean of a column (1: return, 2: length) of the episodes ending in each window (NaN where none ended)."""
    index = np.clip(np.searchsorted(edges, episodes[:, 0], side="right") - 1, 0, len(edges) - 2)
    means = np.full(len(edges) - 1, np.nan)
    for window in range(len(edges) - 1):
        values = episodes[index == window, column]
        if len(values):
            means[window] = values.mean()
    return means


def bootstrap_interval(
    runs: list[np.ndarray], edges: np.ndarray, n_resamples: int, column: int = 1, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """
    95% bootstrap interval of the mean over seeds of each window's mean: seeds resampled with replacement, then the
    episodes of each drawn seed within each window.

    :param runs: one episode array per seed
    :return: the lower and upper bounds per window
    """
    rng = np.random.default_rng(seed)
    index = [np.clip(np.searchsorted(edges, run[:, 0], side="right") - 1, 0, len(edges) - 2) for run in runs]
    n_windows = len(edges) - 1
    samples = np.full((n_resamples, n_windows), np.nan)
    for window in range(n_windows):
        values = [run[idx == window, column] for run, idx in zip(runs, index, strict=True)]
        values = [v for v in values if len(v)]
        if not values:
            continue
        for resample in range(n_resamples):
            chosen = rng.integers(len(values), size=len(values))
            samples[resample, window] = np.mean([rng.choice(values[c], size=len(values[c])).mean() for c in chosen])
    low = np.full(n_windows, np.nan)
    high = np.full(n_windows, np.nan)
    valid = ~np.isnan(samples[0])
    if valid.any():
        low[valid], high[valid] = np.percentile(samples[:, valid], [2.5, 97.5], axis=0)
    return low, high


def mean_over_seeds(values: np.ndarray) -> np.ndarray:
    """The mean over seeds (axis 0) of each window, ignoring seeds without episodes there (NaN where none had any)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(values, axis=0)


def summarize(args: argparse.Namespace, runs: dict[str, list[np.ndarray]]) -> dict[str, Any]:
    """Per side: window means per seed and over seeds, and bootstrap intervals, of returns and lengths."""
    edges = window_edges(args.total_timesteps, args.window)
    summary: dict[str, Any] = {"edges": edges}
    for side, side_runs in runs.items():
        per_seed = np.array([window_means(run, edges) for run in side_runs])
        lengths = np.array([window_means(run, edges, column=2) for run in side_runs])
        low, high = bootstrap_interval(side_runs, edges, args.bootstrap)
        summary[side] = dict(
            per_seed=per_seed,
            mean=mean_over_seeds(per_seed),
            low=low,
            high=high,
            lengths=mean_over_seeds(lengths),
            episodes=[len(run) for run in side_runs],
        )
    return summary


def format_window(start: float, end: float) -> str:
    """``0.25-0.50M`` for windows of whole 10k steps, ``0-128`` for smaller ones."""
    if (end - start) % 10_000:
        return f"{start:,.0f}-{end:,.0f}"
    return f"{start / 1e6:.2f}-{end / 1e6:.2f}M"


def number(value: float, form: str = "{:.2f}") -> str:
    """A table number, ``-`` for NaN (a seed without episodes in the window)."""
    return "-" if np.isnan(value) else form.format(value)


def report(args: argparse.Namespace, summary: dict[str, Any], seeds: list[int], image: str) -> str:
    """The Markdown report: one row per window, per side the mean return over seeds [95% CI] (per seed), length."""
    sides = [side for side in SIDES if side in summary]
    lines = [
        f"# sb3-ppg against CleanRL's ppg_procgen.py: {args.game} (easy)",
        "",
        "Written by `benchmarks/procgen_vs_cleanrl.py`; do not edit by hand.",
        "",
        f"- Date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d')}; {os.cpu_count()} CPU cores, "
        f"sb3-ppg on {args.device}; seeds {', '.join(map(str, seeds))}",
        f"- {args.total_timesteps:,} env steps per run, {args.n_envs} envs x {args.n_steps} steps; sb3-ppg: "
        '`preset="cleanrl"`; CleanRL: its script\'s defaults with these sizes',
        "- Mean return (and length) of the episodes that ended in each window of env steps; the mean over seeds with "
        f"its 95% bootstrap interval ({args.bootstrap} resamples of the seeds, then of the episodes within each), "
        "the seeds' own means in parentheses",
        "",
        "| window | " + " | ".join(f"{side} return | {side} length" for side in sides) + " |",
        "|---|" + "---|---|" * len(sides),
    ]
    edges = summary["edges"]
    for window in range(len(edges) - 1):
        cells = []
        for side in sides:
            entry = summary[side]
            if np.isnan(entry["mean"][window]):
                cells += ["- (no episode ended)", "-"]
                continue
            seeds_text = " / ".join(number(value) for value in entry["per_seed"][:, window])
            interval = f"[{number(entry['low'][window])}, {number(entry['high'][window])}]"
            cells.append(f"{number(entry['mean'][window])} {interval} ({seeds_text})")
            cells.append(number(entry["lengths"][window], "{:.0f}"))
        lines.append(f"| {format_window(edges[window], edges[window + 1])} | " + " | ".join(cells) + " |")
    lines += ["", "Episodes per seed: " + "; ".join(f"{side} {summary[side]['episodes']}" for side in sides), ""]
    lines += [f"![returns per window]({os.path.basename(image)})", ""]
    return "\n".join(lines)


def plot(args: argparse.Namespace, summary: dict[str, Any], path: str) -> None:
    """Mean return per window over seeds with the bootstrap band, one line per side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    edges = summary["edges"]
    centers = (edges[:-1] + edges[1:]) / 2
    figure, axis = plt.subplots(figsize=(7, 4.5))
    for side in SIDES:
        if side not in summary:
            continue
        entry = summary[side]
        line = axis.plot(centers, entry["mean"], marker="o", label=f"{side} ({len(entry['per_seed'])} seeds)")[0]
        axis.fill_between(centers, entry["low"], entry["high"], color=line.get_color(), alpha=0.2)
    axis.set(
        title=f"{args.game} (easy): mean return of the episodes ending in each {args.window:,}-step window",
        xlabel="env steps",
        ylabel="episode return",
    )
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def write_table_csv(summary: dict[str, Any], path: str) -> None:
    """The window table as CSV: window start, end, side, mean, low, high, mean length, then the per-seed means."""
    edges = summary["edges"]
    with open(path, "w", newline="") as file:
        writer = csv.writer(file)
        for side in SIDES:
            if side not in summary:
                continue
            entry = summary[side]
            for window in range(len(edges) - 1):
                values = [entry[key][window] for key in ("mean", "low", "high", "lengths")]
                writer.writerow([edges[window], edges[window + 1], side, *values, *entry["per_seed"][:, window]])


def main(argv: list[str] | None = None) -> bool:
    """
    Run (or continue) every run, then report when all are complete.

    :return: Whether every run is complete
    """
    args = parse_args(argv)
    seeds = [int(seed) for seed in args.seeds.split(",")]
    end = time.monotonic() + 60 * args.max_minutes
    complete = {}
    cleanrl = args.cleanrl_script is not None
    started = {seed: start_cleanrl(args, seed) for seed in seeds} if cleanrl and args.cleanrl_parallel else {}
    for seed in seeds:
        deadline = min(time.monotonic() + 60 * args.chunk_minutes, end)
        complete[("sb3-ppg", seed)] = sb3_ppg_run(args, seed, deadline) if time.monotonic() < end else False
        if cleanrl and not args.cleanrl_parallel:
            started[seed] = start_cleanrl(args, seed) if time.monotonic() < end else None
            complete[("CleanRL", seed)] = finish_cleanrl(args, seed, started[seed])
    if cleanrl and args.cleanrl_parallel:
        for seed in seeds:
            complete[("CleanRL", seed)] = finish_cleanrl(args, seed, started[seed])
    for (side, seed), done in complete.items():
        print(f"{side} seed {seed}: {'complete' if done else 'not complete'}")
    if not all(complete.values()):
        print("Not every run is complete: run the same command again to continue.")
        return False
    runs: dict[str, list[np.ndarray]] = {}
    for side, seed in complete:
        runs.setdefault(side, []).append(read_episodes(episodes_path(args, side, seed), args.total_timesteps))
    summary = summarize(args, runs)
    stem = os.path.splitext(os.path.abspath(args.output))[0]
    image = f"{stem}_{args.game}.png"
    os.makedirs(os.path.dirname(image), exist_ok=True)
    plot(args, summary, image)
    write_table_csv(summary, f"{stem}_{args.game}.csv")
    text = report(args, summary, seeds, image)
    with open(args.output, "w") as file:
        file.write(text)
    print(text)
    return True


if __name__ == "__main__":
    main()
