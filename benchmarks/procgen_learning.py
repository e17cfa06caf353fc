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
- ``ppg-bf16``: PPG with the policy and auxiliary phases under bfloat16 autocast (rollouts in fp32), the fast setting of
  ``docs/throughput.md``; on the same seeds as ``ppg``, for learning parity.
- Both: CleanRL's Procgen settings otherwise (lr 5e-4, gamma 0.999, lambda 0.95, entropy 0.01, value clipping 0.2
  with weight 0.25, gradient clipping 0.5, reward normalization), ``n_envs`` x ``n_steps`` as given.

Usage: ``python benchmarks/procgen_learning.py --game starpilot --seeds 0,1 --total-timesteps 500000``
(``--algos ppg,ppg-bf16 --output docs/bf16_parity.md`` for the precision comparison)
"""

import argparse
import csv
import datetime
import os
import pathlib
import time
from typing import Any

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback, CallbackList

ALGOS = ("ppg", "ppo", "ppg-bf16")
#: Precision of each phase for ``ppg-bf16``
BF16_PRECISION = dict(rollout="fp32", policy="bf16", aux="bf16")


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
        with open(self.path, "a", newline="") as file:
            mean = float(np.mean(returns)) if returns else float("nan")
            csv.writer(file).writerow([self.model.num_timesteps, mean, len(returns)])
        if self.episodes_path is not None:
            with open(self.episodes_path, "a", newline="") as file:
                csv.writer(file).writerows((steps, f"{ret:.6g}", length) for steps, ret, length in self.episodes)
        self.episodes = []


def read_curve(path: str, max_steps: int | None = None) -> np.ndarray:
    """
    Rows (steps, mean return, episodes) of a curve file, or (steps, return, length) of an episode file, optionally
    only those up to ``max_steps``.
    """
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return np.zeros((0, 3))
    rows = np.loadtxt(path, delimiter=",", ndmin=2)
    return rows if max_steps is None else rows[rows[:, 0] <= max_steps]


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
    # Drop curve and episode rows written after the checkpoint (a chunk killed between a checkpoint and its end)
    rows = read_curve(curve_path, model.num_timesteps)
    np.savetxt(curve_path, rows, delimiter=",", fmt=["%d", "%.6g", "%d"])
    episodes = read_curve(episodes_path, model.num_timesteps)
    np.savetxt(episodes_path, episodes, delimiter=",", fmt=["%d", "%.6g", "%d"])
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
        ours.plot(steps, np.nanmean(returns, axis=0), label=f"{algo.upper()} ({len(runs)} seeds)")
        ours.fill_between(steps, np.nanmin(returns, axis=0), np.nanmax(returns, axis=0), alpha=0.2)
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
            "- PPG-BF16: the same PPG with its policy and auxiliary phases under bfloat16 autocast (rollouts in fp32), "
            "on the same seeds"
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
    done = {}
    for algo, seed in runs:
        deadline = min(time.monotonic() + 60 * args.chunk_minutes, end)
        steps = train_chunk(args, algo, seed, deadline) if time.monotonic() < end else 0
        done[(algo, seed)] = steps >= args.total_timesteps
        print(f"{algo} seed {seed}: {steps:,} / {args.total_timesteps:,} env steps")
    if not all(done.values()):
        print("Not every run is complete: run the same command again to continue.")
        return False
    curves: dict[str, list[np.ndarray]] = {}
    for algo, seed in runs:
        path = os.path.join(args.folder, f"{args.game}_{algo}_seed{seed}", "curve.csv")
        # At equal env steps: a run continued past the budget (by an earlier, larger --total-timesteps) is cut there
        curves.setdefault(algo, []).append(read_curve(path, args.total_timesteps))
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
