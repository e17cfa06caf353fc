"""
Learning benchmark on Procgen: PPG against the PPO baseline of the same class, at equal env steps, in resumable chunks.

Each run (algorithm x seed) trains in its own folder with a ``PPGCheckpointCallback`` at every rollout boundary.
One invocation of the script trains the runs in turn, each for at most ``--chunk-minutes`` (it stops at the first
rollout boundary that would overrun), and the whole invocation for at most ``--max-minutes``; the next invocation
resumes every unfinished run from its newest checkpoint (``PPG.load_checkpoint``). Run it again until it prints
that every run is complete. Each run appends its learning curve (mean return of the last 100 training episodes,
raw rewards, after each rollout) to ``curve.csv`` and every finished episode to ``episodes.csv``; when all runs are
complete the script writes a plot of the mean over seeds, next to the paper's published curves (hard mode, 100M steps:
different settings, shown for scale only), and a Markdown report.

- PPG: ``arch="detach"`` (the paper's single-network PPG, as CleanRL), E_pi 1, N_pi 32, E_aux 6.
- PPO baseline: the same class with ``arch="shared"``, ``n_aux_epochs=0`` and E_pi 3 (the paper's PPO).
- ``ppg-bf16``: PPG with its features extractor under bfloat16 autocast in every phase (rollouts, policy and auxiliary
  phases): ``precision="auto"`` on a CPU with AMX or AVX512-BF16 (``docs/throughput.md``); on the same seeds as
  ``ppg``, for learning parity.
- Both: CleanRL's Procgen settings otherwise (lr 5e-4, gamma 0.999, lambda 0.95, entropy 0.01, value clipping 0.2
  with weight 0.25, gradient clipping 0.5, reward normalization), ``n_envs`` x ``n_steps`` as given.

Usage: ``python benchmarks/procgen_learning.py --game starpilot --seeds 0,1 --total-timesteps 500000``
(``--algos ppg,ppg-bf16 --output docs/bf16_parity.md`` for the precision comparison)
"""

import argparse
import datetime
import glob
import os
import pathlib
import time
import warnings
from typing import Any

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback, CallbackList

from sb3_ppg.common.precision import AUTO_BF16

ALGOS = ("ppg", "ppo", "ppg-bf16")
#: The columns of the logs: steps, a return (6 significant digits), a count
LOG_FORMAT = ("%d", "%.6g", "%d")
#: Precision of each phase for ``ppg-bf16``: what ``precision="auto"`` resolves to for a CNN on a CPU with AMX or AVX512-BF16
BF16_PRECISION = dict(AUTO_BF16)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """
    :param argv: Command-line arguments (``None``: ``sys.argv[1:]``)
    :return: The parsed arguments
    """
    parser = argparse.ArgumentParser(description="PPG vs PPO learning curves on Procgen, in resumable chunks")
    parser.add_argument("--game", default="starpilot")
    parser.add_argument("--distribution-mode", default="easy")
    parser.add_argument("--algos", default="ppg,ppo")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--total-timesteps", type=int, default=500_000)
    parser.add_argument("--n-envs", type=int, default=16)
    parser.add_argument("--n-steps", type=int, default=256)
    parser.add_argument("--n-policy-iters", type=int, default=32, help="PPG's N_pi")
    parser.add_argument("--n-aux-epochs", type=int, default=6, help="PPG's E_aux")
    parser.add_argument("--channels", default="16,32,32", help="IMPALA channels (smaller for a quick test)")
    parser.add_argument("--chunk-minutes", type=float, default=9.0, help="Longest stretch of one run per invocation")
    parser.add_argument("--max-minutes", type=float, default=60.0, help="Longest invocation")
    parser.add_argument("--folder", default=os.path.join("benchmarks", "results", "procgen_learning"))
    parser.add_argument("--output", default=os.path.join("docs", "procgen_learning.md"), help="Markdown report")
    parser.add_argument("--device", default="cpu")
    return parser.parse_args(argv)


def hyperparameters(args: argparse.Namespace, algo: str) -> dict[str, Any]:
    """PPG's keyword arguments for one algorithm of the benchmark."""
    rollout_size = args.n_envs * args.n_steps
    common: dict[str, Any] = dict(
        n_steps=args.n_steps,
        batch_size=rollout_size // 8,
        learning_rate=5e-4,
        gamma=0.999,
        gae_lambda=0.95,
        ent_coef=0.01,
        clip_range=0.2,
        clip_range_vf=0.2,
        vf_coef=0.25,
        max_grad_norm=0.5,
        precision="fp32",  # not "auto" (the default): the same computation on every machine
    )
    channels = tuple(int(c) for c in args.channels.split(","))
    extractor = dict(channels=channels)
    if algo in ("ppg", "ppg-bf16"):
        return dict(
            common,
            precision=BF16_PRECISION if algo == "ppg-bf16" else common["precision"],
            n_epochs=1,
            n_policy_iters=args.n_policy_iters,
            n_aux_epochs=args.n_aux_epochs,
            aux_batch_rollouts=4,
            separate_aux_optimizer=False,
            policy_kwargs=dict(arch="detach", features_extractor_kwargs=extractor),
        )
    return dict(common, n_epochs=3, n_aux_epochs=0, policy_kwargs=dict(arch="shared", features_extractor_kwargs=extractor))


class CurveCallback(BaseCallback):
    """
    Append ``num_timesteps``, the mean return of the last 100 episodes and the episode count to a CSV file after
    every rollout; stop training at the first rollout start past the time limit. Optionally also log every finished
    episode: ``num_timesteps`` when it ended, its raw return and length (written at the end of each rollout).

    :param path: The CSV file
    :param deadline: ``time.monotonic()`` value after which no new rollout starts
    :param episodes_path: The CSV file of the episodes (``None``: no episode log)
    """

    def __init__(self, path: str, deadline: float, episodes_path: str | None = None) -> None:
        super().__init__()
        self.path = path
        self.deadline = deadline
        self.episodes_path = episodes_path
        self.episodes: list[tuple[int, float, int]] = []
        self.rollout_start = time.monotonic()
        self.last_rollout_s = 0.0
        self.step_in_rollout = 0
        self.n_rollouts = 0

    def _on_rollout_start(self) -> None:
        self.step_in_rollout = 0

    def _on_step(self) -> bool:
        # VecMonitor's "episode" infos, in env order: the order SB3 adds them to ep_info_buffer
        self.episodes += [
            (self.model.num_timesteps, float(info["episode"]["r"]), int(info["episode"]["l"]))
            for info in self.locals["infos"]
            if "episode" in info
        ]
        self.step_in_rollout += 1
        if self.step_in_rollout == 1:
            now = time.monotonic()
            # The rollout and the train() before it: stop if another one would end past the deadline (each chunk
            # trains at least one rollout)
            self.n_rollouts += 1
            if self.n_rollouts > 1:
                self.last_rollout_s = now - self.rollout_start
                if now + self.last_rollout_s > self.deadline:
                    return False
            self.rollout_start = now
        return True

    def _on_rollout_end(self) -> None:
        returns = [info["r"] for info in self.model.ep_info_buffer]
        mean = float(np.mean(returns)) if returns else float("nan")
        append_lines(self.path, [f"{self.model.num_timesteps},{mean},{len(returns)}"])
        if self.episodes_path is not None:
            append_lines(self.episodes_path, [f"{steps},{ret:.6g},{length}" for steps, ret, length in self.episodes])
        self.episodes = []


def append_lines(path: str, lines: list[str]) -> None:
    """
    Append whole lines to a log in one ``write`` (``O_APPEND``): a kill leaves the lines before them whole, and at
    worst the end of these cut short (an unfinished last line, which ``read_log_rows`` recognizes).

    :param path: The log
    :param lines: The lines, without their ends
    """
    if not lines:
        return
    data = "".join(f"{line}\n" for line in lines).encode()
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        while data:
            data = data[os.write(descriptor, data) :]
    finally:
        os.close(descriptor)


def write_log(path: str, rows: np.ndarray) -> None:
    """
    Replace a log by ``rows`` atomically (a temporary file, then ``os.replace``): a kill leaves the old log or the new
    one, never a part of it.

    :param path: The log
    :param rows: Its rows (steps, value, count)
    """
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w") as file:
        np.savetxt(file, rows, delimiter=",", fmt=LOG_FORMAT)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)


class DamagedLogError(ValueError):
    """A run's log has a line that is not three numbers in step order, and the rows it hides are needed."""


def read_log_rows(path: str) -> tuple[np.ndarray, str | None, bool]:
    """
    The rows of a run's log up to its first damaged line.

    :param path: ``curve.csv`` (steps, mean return, episodes), ``episodes.csv`` (steps, return, length) or
        ``chunks.csv``
    :return: The rows (steps, value, count) before the first damaged line; what is wrong with that line (``None``
        when the log is whole); whether the damage is only an unfinished last line (an append cut short: damaged even
        when it reads as numbers)
    """
    if not os.path.exists(path):
        return np.zeros((0, 3)), None, False
    with open(path, "rb") as file:
        *lines, last = file.read().split(b"\n")
    rows: list[list[float]] = []
    for number, line in enumerate(lines, 1):
        values = log_line_values(line.rstrip(b"\r"), rows[-1][0] if rows else 0.0)
        if isinstance(values, str):
            return np.array(rows).reshape(-1, 3), f"line {number} {values}", False
        rows.append(values)
    if last:
        return np.array(rows).reshape(-1, 3), f"line {len(lines) + 1} is unfinished ({last[:40]!r}, no line end)", True
    return np.array(rows).reshape(-1, 3), None, False


def log_line_values(line: bytes, previous_steps: float) -> list[float] | str:
    """
    :param line: A line of a log, without its end
    :param previous_steps: The steps of the line before (0 for the first)
    :return: The line's values, or what is wrong with it
    """
    fields = line.split(b",")
    if len(fields) != 3:
        return f"has {len(fields)} fields, not 3 ({line[:40]!r})"
    try:
        values = [float(field) for field in fields]
    except ValueError:
        return f"is not three numbers ({line[:40]!r})"
    steps, count = values[0], values[2]  # count: episodes, a length or seconds (chunks.csv)
    if not (np.isfinite(steps) and steps >= 0 and steps == int(steps) and np.isfinite(count) and count >= 0):
        return f"has negative or non-whole steps, or a negative count ({line[:40]!r})"
    if steps < previous_steps:
        return f"goes back to {steps:.0f} env steps after {previous_steps:.0f} ({line[:40]!r})"
    return values


def read_curve(path: str, max_steps: int | None = None, run: str | None = None) -> np.ndarray:
    """
    Rows (steps, mean return, episodes) of a curve file, or (steps, return, length) of an episode file, optionally
    only those up to ``max_steps``.

    :param path: The log
    :param max_steps: The last steps read (``None``: all)
    :param run: The run's name, for the error
    :raises DamagedLogError: When a line of the log is damaged
    """
    rows, damage, _ = read_log_rows(path)
    if damage is not None:
        raise DamagedLogError(damaged_log_message(path, damage, run))
    return rows if max_steps is None else rows[rows[:, 0] <= max_steps]


def damaged_log_message(path: str, damage: str, run: str | None, extra: str = "") -> str:
    """The one-line error of a damaged log: the file, the run, what is wrong, what to delete."""
    folder = os.path.dirname(os.path.abspath(path))
    name = f" of run {run}" if run else ""
    return (
        f"The log {path}{name} is damaged: {damage}{extra}. Repair that line, or delete the run's folder {folder} "
        "to train the run again from the start."
    )


def cut_logs(folder: str, steps: int, run: str) -> None:
    """
    Cut a resumed run's ``curve.csv`` and ``episodes.csv`` back to its checkpoint's ``steps`` (rows written after the
    checkpoint: a chunk killed between a checkpoint and its end), rewritten atomically. A damaged line is cut with
    them when it can only come after the checkpoint: after a row past ``steps`` (or the curve's row at ``steps``:
    one row per rollout, written before the rollout's checkpoint), in a run without a checkpoint, or as the
    unfinished last line of an episode log whose rows up to ``steps`` agree with the curve's row there (an append cut
    short by a kill: the logs of a rollout are written before its checkpoint).

    :param folder: The run's folder
    :param steps: The checkpoint's ``num_timesteps`` (0: a new run)
    :param run: The run's name, for the errors
    :raises DamagedLogError: When a damaged line may hide rows up to ``steps``
    """
    for stale in glob.glob(os.path.join(folder, "*.csv.*.tmp")):  # a cut-back killed before its os.replace
        os.remove(stale)
    curve_path = os.path.join(folder, "curve.csv")
    curve, damage, _ = read_log_rows(curve_path)
    if damage is not None and steps > 0 and not (len(curve) and curve[-1, 0] >= steps):
        raise DamagedLogError(damaged_log_message(curve_path, damage, run, f", before the checkpoint's row at {steps}"))
    curve = curve[curve[:, 0] <= steps]
    episodes_path = os.path.join(folder, "episodes.csv")
    episodes, damage, unfinished = read_log_rows(episodes_path)
    past = len(episodes) > 0 and episodes[-1, 0] > steps
    episodes = episodes[episodes[:, 0] <= steps]
    if damage is not None and steps > 0 and not past:
        if not (unfinished and episodes_agree_with_curve(episodes, curve, steps)):
            extra = f", and the episodes before it may not reach the checkpoint at {steps} env steps"
            raise DamagedLogError(damaged_log_message(episodes_path, damage, run, extra))
    write_log(curve_path, curve)
    write_log(episodes_path, episodes)


def episodes_agree_with_curve(episodes: np.ndarray, curve: np.ndarray, steps: int) -> bool:
    """
    Whether the episodes up to ``steps`` are those of the curve's row at ``steps``: its count (SB3's last 100
    episodes) and mean return, up to the logs' 6 significant digits.
    """
    row = curve[curve[:, 0] == steps]
    if len(row) != 1:
        return False
    _, mean, count = row[0]
    if len(episodes) < count or (count < 100 and len(episodes) != count):
        return False
    if count == 0:
        return True
    window = episodes[len(episodes) - int(count) :, 1]
    # Each return and the mean are rounded to 6 significant digits: relative errors of at most 5e-6
    tolerance = 5e-6 * (np.max(np.abs(window)) + abs(mean)) + 1e-12
    return bool(abs(np.mean(window) - mean) <= tolerance)


def train_chunk(
    args: argparse.Namespace,
    algo: str,
    seed: int,
    deadline: float,
    env_kwargs: dict[str, Any] | None = None,
    model_kwargs: dict[str, Any] | None = None,
) -> int:
    """
    Train one run until its budget, the chunk's deadline or the invocation's, from its newest checkpoint if any.
    Besides ``curve.csv``, the run logs every finished episode to ``episodes.csv`` (see ``CurveCallback``).

    :param args: The benchmark's arguments (``folder``, ``game``, ``n_envs``, ``n_steps``, ``total_timesteps``, ...)
    :param algo: The algorithm's name (the run's folder and checkpoint prefix)
    :param seed: The run's seed
    :param deadline: ``time.monotonic()`` value after which no new rollout starts
    :param env_kwargs: Arguments of ``make_procgen_env`` besides the game, ``n_envs`` and ``seed`` (``None``: this
        script's, ``distribution_mode=args.distribution_mode``)
    :param model_kwargs: Arguments of ``PPG`` for a new run (``None``: this script's ``hyperparameters(args, algo)``)
    :return: The run's ``num_timesteps`` at the end of the chunk
    """
    from sb3_ppg import PPG, PPGCheckpointCallback, make_procgen_env
    from sb3_ppg.common.checkpoints.manifest import complete_checkpoints

    folder = os.path.join(args.folder, f"{args.game}_{algo}_seed{seed}")
    checkpoints = os.path.join(folder, "checkpoints")
    curve_path = os.path.join(folder, "curve.csv")
    os.makedirs(folder, exist_ok=True)
    episodes_path = os.path.join(folder, "episodes.csv")
    env_kwargs = dict(distribution_mode=args.distribution_mode) if env_kwargs is None else env_kwargs
    env = make_procgen_env(args.game, n_envs=args.n_envs, seed=seed, **env_kwargs)
    if os.path.isdir(checkpoints) and complete_checkpoints(pathlib.Path(checkpoints)):
        model = PPG.load_checkpoint(checkpoints, env=env, device=args.device)
    else:
        model_kwargs = hyperparameters(args, algo) if model_kwargs is None else model_kwargs
        model = PPG("ProcgenCnn", env, seed=seed, device=args.device, **model_kwargs)
    cut_logs(folder, model.num_timesteps, f"{args.game} {algo} seed {seed}")
    remaining = args.total_timesteps - model.num_timesteps
    if remaining > 0:
        rollout_size = args.n_envs * args.n_steps
        callbacks = CallbackList(
            [
                CurveCallback(curve_path, deadline, episodes_path),
                PPGCheckpointCallback(max(rollout_size // args.n_envs, 1), checkpoints, name_prefix=algo, keep_last=2),
            ]
        )
        model.learn(remaining, callback=callbacks, reset_num_timesteps=False)
    env.close()
    return model.num_timesteps


def plot(args: argparse.Namespace, curves: dict[str, list[np.ndarray]], path: str) -> None:
    """Mean (and range) over seeds of each algorithm, with the paper's published curves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sb3_ppg.cli.curves import load_paper_curves

    figure, (ours, paper) = plt.subplots(1, 2, figsize=(12, 4.5))
    published_algos = []
    for algo, runs in curves.items():
        length = min(len(run) for run in runs)
        steps = runs[0][:length, 0]
        returns = np.stack([run[:length, 1] for run in runs])
        with warnings.catch_warnings():  # NaN before any episode ended: no line there
            warnings.simplefilter("ignore", RuntimeWarning)
            mean, low, high = (reduce(returns, axis=0) for reduce in (np.nanmean, np.nanmin, np.nanmax))
        ours.plot(steps, mean, label=f"{algo.upper()} ({len(runs)} seeds)")
        ours.fill_between(steps, low, high, alpha=0.2)
        published_algo = algo.split("-")[0]  # ppg-bf16: the paper's PPG
        if published_algo not in published_algos:
            published_algos.append(published_algo)
            published = load_paper_curves(args.game, published_algo)
            paper_steps = published[0][0]
            label = f"paper {published_algo.upper()} (hard)"
            paper.plot(paper_steps, np.mean([r for _, r in published], axis=0), label=label)
    ours.axvline(args.total_timesteps, color="grey", linewidth=0.5)
    ours.set(title=f"{args.game} ({args.distribution_mode}), this package", xlabel="env steps", ylabel="episode return")
    paper.set(title=f"{args.game} (hard), the paper's published curves", xlabel="env steps")
    for axis in (ours, paper):
        axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def report(args: argparse.Namespace, curves: dict[str, list[np.ndarray]], image: str, minutes: float) -> str:
    """The Markdown report of complete runs."""
    lines = [
        f"# Procgen learning benchmark: {args.game} ({args.distribution_mode})",
        "",
        "Written by `benchmarks/procgen_learning.py`; do not edit by hand.",
        "",
        f"- Date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d')}; {os.cpu_count()} CPU cores, "
        f"device {args.device}; last invocation {minutes:.0f} min",
        f"- {args.total_timesteps:,} env steps per run, {args.n_envs} envs x {args.n_steps} steps, IMPALA channels "
        f"{args.channels}; PPG N_pi {args.n_policy_iters}, E_aux {args.n_aux_epochs}",
        "- Early training only: the paper's curves run to 100M steps in hard mode (CleanRL's to 25M in easy mode); "
        "this budget shows at most the first "
        "few percent of them, where PPG's auxiliary phases have run only a few times.",
    ]
    if "ppg-bf16" in curves:
        lines.append(
            "- PPG-BF16: the same PPG with its features extractor under bfloat16 autocast in every phase (rollouts, "
            'policy and auxiliary phases: `precision="auto"` on an AMX or AVX512-BF16 CPU), on the same seeds'
        )
    lines += [
        "",
        "| algorithm | seeds | mean return over the last 10% of steps (per seed) | mean over the whole run (per seed) "
        "| episodes in the final window |",
        "|---|---|---|---|---|",
    ]
    for algo, runs in curves.items():
        finals, overall = [], []
        for run in runs:
            tail = run[run[:, 0] >= 0.9 * args.total_timesteps]
            finals.append(float(np.nanmean(tail[:, 1])) if len(tail) else float("nan"))
            overall.append(float(np.nanmean(run[:, 1])) if len(run) else float("nan"))
        episodes = int(sum(run[-1, 2] for run in runs if len(run)))
        lines.append(
            f"| {algo.upper()} | {len(runs)} | {np.mean(finals):.2f} ({', '.join(f'{f:.2f}' for f in finals)}) "
            f"| {np.mean(overall):.2f} ({', '.join(f'{f:.2f}' for f in overall)}) "
            f"| last-100 windows, {episodes} in the final windows |"
        )
    lines += ["", f"![learning curves]({os.path.basename(image)})", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> bool:
    """
    Train every unfinished run for one chunk (within the invocation's time), then report if all are complete.

    :return: Whether every run is complete
    """
    args = parse_args(argv)
    start = time.monotonic()
    end = start + 60 * args.max_minutes
    runs = [(algo, int(seed)) for algo in args.algos.split(",") for seed in args.seeds.split(",")]
    for algo in {algo for algo, _ in runs}:
        if algo not in ALGOS:
            raise SystemExit(f"Unknown algorithm {algo!r}: choose from {ALGOS}")
    if len(set(runs)) < len(runs):
        raise SystemExit(f"--algos {args.algos} and --seeds {args.seeds} name a run twice: give each once")
    done = {}
    curves: dict[str, list[np.ndarray]] = {}
    try:
        for algo, seed in runs:
            deadline = min(time.monotonic() + 60 * args.chunk_minutes, end)
            steps = train_chunk(args, algo, seed, deadline) if time.monotonic() < end else 0
            done[(algo, seed)] = steps >= args.total_timesteps
            print(f"{algo} seed {seed}: {steps:,} / {args.total_timesteps:,} env steps")
        if not all(done.values()):
            print("Not every run is complete: run the same command again to continue.")
            return False
        for algo, seed in runs:
            path = os.path.join(args.folder, f"{args.game}_{algo}_seed{seed}", "curve.csv")
            # At equal env steps: a run continued past the budget (by an earlier, larger --total-timesteps) is cut
            # there
            curves.setdefault(algo, []).append(read_curve(path, args.total_timesteps, f"{args.game} {algo} seed {seed}"))
    except DamagedLogError as error:
        raise SystemExit(str(error)) from None
    stem = os.path.splitext(os.path.basename(args.output))[0]
    image = os.path.join(os.path.dirname(os.path.abspath(args.output)), f"{stem}_{args.game}.png")
    plot(args, curves, image)
    text = report(args, curves, image, (time.monotonic() - start) / 60)
    with open(args.output, "w") as file:
        file.write(text)
    print(text)
    return True


if __name__ == "__main__":
    main()
