"""
The PPG paper's Procgen table in one command: PPG and the paper's PPO baseline on the 16 games (or some of them),
N seeds, easy or hard mode, at a budget (25M, 100M, or a tiny one for tests), with the paper's settings
(``--preset paper``) or CleanRL's (``--preset cleanrl``); then the normalized scores per game and over games, next
to the paper's and CleanRL's published numbers, as a Markdown table and plots.

Training reuses ``benchmarks/procgen_learning.py``'s resumable chunks (``train_chunk``): each run (game x algorithm
x seed) trains in its own folder with a ``PPGCheckpointCallback`` at every rollout boundary, logs its curve
(``curve.csv``) and every finished episode (``episodes.csv``: step, raw return, length), and resumes from its newest
checkpoint at the next invocation. Run the same command again until it prints that every run is complete; it then
writes the report. Several invocations of the same command may run at once (on one GPU or several): each run is
locked by the invocation that trains it (``run.lock``), and the others skip it.

- PPG: the preset's ``PPG`` arguments (``get_procgen_preset(name).ppg_kwargs(n_envs)``): for ``paper`` the original
  code's (``arch="dual"``, no gradient or value clipping, separate auxiliary Adam), for ``cleanrl`` CleanRL's.
- PPO: the paper's PPO baseline (original code ``--arch shared --n_epoch_pi 3 --n_epoch_vf 3 --n_aux_epochs 0``):
  the same class and the preset's other arguments, with ``arch="shared"``, 3 epochs and no auxiliary phase. With
  ``--preset cleanrl`` this is not CleanRL's ``ppo_procgen.py`` (other initialization, Adam eps, advantage
  normalization).
- Score of a run at ``B`` env steps: the mean raw training return of the last ``--score-episodes`` (100) episodes
  that ended by the first rollout boundary at or after ``B`` (the paper's "25M" is its row at 25,034,752 steps).
  Normalized: ``(score - min) / (max - min)`` with the per-game constants of the mode; per game, the mean over seeds;
  overall, the mean over games.
- When a run is complete, its checkpoints (for a PPG run of the paper preset, up to 24 GiB of stored rollouts) are
  deleted and its final model kept as ``final_model.zip``; ``--keep-checkpoints`` keeps them (to raise the budget
  later).

Usage: ``python benchmarks/procgen_paper.py --preset paper --seeds 0,1,2 --total-timesteps 25M`` (rerun until complete)
"""

import argparse
import contextlib
import datetime
import json
import math
import os
import shutil
import sys
import time
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import procgen_learning  # benchmarks/ is not a package: the sibling script, found through sys.path

from sb3_ppg.cli.threads import choose_torch_threads

try:
    import fcntl
except ImportError:  # Windows: no run lock, run one invocation at a time
    fcntl = None  # type: ignore[assignment]

ALGOS = ("ppg", "ppo")
#: The paper's rows (first logged row at or after 25M and 100M env steps: 382 and 1,526 rows of 65,536 steps)
PAPER_STEPS = {25_000_000: 25_034_752, 100_000_000: 100_007_936}

#: Per-game score ranges ``(min, max)`` of Cobbe et al. 2020, "Leveraging Procedural Generation to Benchmark
#: Reinforcement Learning" (arXiv:1912.01588, appendix, the R_min / R_max table): its hard-mode columns (which the
#: PPG paper normalizes with) and its easy-mode columns.
NORMALIZATION = {
    "hard": {
        "bigfish": (0.0, 40.0),
        "bossfight": (0.5, 13.0),
        "caveflyer": (2.0, 13.4),
        "chaser": (0.5, 14.2),
        "climber": (1.0, 12.6),
        "coinrun": (5.0, 10.0),
        "dodgeball": (1.5, 19.0),
        "fruitbot": (-0.5, 27.2),
        "heist": (2.0, 10.0),
        "jumper": (1.0, 10.0),
        "leaper": (1.5, 10.0),
        "maze": (4.0, 10.0),
        "miner": (1.5, 20.0),
        "ninja": (2.0, 10.0),
        "plunder": (3.0, 30.0),
        "starpilot": (1.5, 35.0),
    },
    "easy": {
        "bigfish": (1.0, 40.0),
        "bossfight": (0.5, 13.0),
        "caveflyer": (3.5, 12.0),
        "chaser": (0.5, 13.0),
        "climber": (2.0, 12.6),
        "coinrun": (5.0, 10.0),
        "dodgeball": (1.5, 19.0),
        "fruitbot": (-1.5, 32.4),
        "heist": (3.5, 10.0),
        "jumper": (3.0, 10.0),
        "leaper": (3.0, 10.0),
        "maze": (5.0, 10.0),
        "miner": (1.5, 13.0),
        "ninja": (3.5, 10.0),
        "plunder": (4.5, 30.0),
        "starpilot": (2.5, 64.0),
    },
}

#: The paper's per-game results, hard mode: ``(mean, min, max)`` over its 3 seeds of the published ``EpRewMean``
#: (openai/phasic-policy-gradient ``results/{ppg,ppo}-run{0,1,2}/progress-<game>.csv``, MIT License, Copyright (c)
#: 2019 OpenAI) at 25,034,752 and 100,007,936 env steps. PPG is the paper's default (``arch="dual"``), PPO its
#: baseline. Their mean normalized scores are ``PAPER_MEAN_NORMALIZED``.
PAPER_RESULTS: dict[str, dict[str, dict[int, tuple[float, float, float]]]] = {
    "bigfish": {
        "ppg": {25_000_000: (22.8667, 21.455, 24.97), 100_000_000: (34.5233, 34.3875, 34.5925)},
        "ppo": {25_000_000: (5.7692, 4.135, 6.62), 100_000_000: (17.8108, 15.19, 19.7275)},
    },
    "bossfight": {
        "ppg": {25_000_000: (11.0117, 10.5275, 11.4975), 100_000_000: (10.905, 8.6575, 12.055)},
        "ppo": {25_000_000: (9.2583, 8.8, 9.5675), 100_000_000: (10.2025, 7.5525, 11.5625)},
    },
    "caveflyer": {
        "ppg": {25_000_000: (6.3992, 5.45, 7.5425), 100_000_000: (11.2733, 10.95, 11.7075)},
        "ppo": {25_000_000: (4.3075, 3.9675, 4.4775), 100_000_000: (8.7017, 8.54, 9.02)},
    },
    "chaser": {
        "ppg": {25_000_000: (6.5906, 5.7803, 8.1761), 100_000_000: (9.2248, 8.9773, 9.3636)},
        "ppo": {25_000_000: (3.0481, 2.5918, 3.8919), 100_000_000: (6.3218, 5.6942, 7.1239)},
    },
    "climber": {
        "ppg": {25_000_000: (9.0708, 8.82, 9.24), 100_000_000: (10.8442, 10.625, 11.0575)},
        "ppo": {25_000_000: (5.1233, 4.095, 6.0575), 100_000_000: (8.7425, 8.3475, 9.145)},
    },
    "coinrun": {
        "ppg": {25_000_000: (8.8083, 8.7, 8.975), 100_000_000: (9.3167, 8.975, 9.55)},
        "ppo": {25_000_000: (7.5667, 6.675, 8.075), 100_000_000: (8.75, 8.625, 8.85)},
    },
    "dodgeball": {
        "ppg": {25_000_000: (4.6117, 4.15, 5.045), 100_000_000: (12.6133, 12.365, 12.79)},
        "ppo": {25_000_000: (3.1417, 2.795, 3.37), 100_000_000: (7.4233, 7.045, 7.77)},
    },
    "fruitbot": {
        "ppg": {25_000_000: (21.4917, 21.15, 21.9275), 100_000_000: (25.2125, 24.695, 25.6675)},
        "ppo": {25_000_000: (15.59, 14.9375, 16.0525), 100_000_000: (22.105, 21.4425, 22.67)},
    },
    "heist": {
        "ppg": {25_000_000: (2.275, 1.825, 2.65), 100_000_000: (6.2417, 5.575, 6.975)},
        "ppo": {25_000_000: (2.0, 1.85, 2.15), 100_000_000: (4.1167, 3.65, 4.375)},
    },
    "jumper": {
        "ppg": {25_000_000: (4.7833, 4.525, 4.925), 100_000_000: (6.775, 6.45, 7.025)},
        "ppo": {25_000_000: (4.4917, 4.125, 4.725), 100_000_000: (6.125, 5.7, 6.4)},
    },
    "leaper": {
        "ppg": {25_000_000: (7.4083, 5.775, 8.625), 100_000_000: (9.3167, 9.175, 9.45)},
        "ppo": {25_000_000: (3.3167, 2.875, 3.65), 100_000_000: (8.1333, 8.1, 8.175)},
    },
    "maze": {
        "ppg": {25_000_000: (4.925, 4.65, 5.275), 100_000_000: (9.125, 8.75, 9.525)},
        "ppo": {25_000_000: (3.775, 3.725, 3.825), 100_000_000: (7.3417, 7.15, 7.625)},
    },
    "miner": {
        "ppg": {25_000_000: (5.8333, 5.475, 6.345), 100_000_000: (12.7342, 12.585, 12.89)},
        "ppo": {25_000_000: (4.6317, 4.3225, 5.0675), 100_000_000: (10.34, 10.2175, 10.5825)},
    },
    "ninja": {
        "ppg": {25_000_000: (7.9167, 7.025, 8.45), 100_000_000: (9.5333, 9.475, 9.575)},
        "ppo": {25_000_000: (3.325, 3.025, 3.825), 100_000_000: (9.4167, 9.275, 9.575)},
    },
    "plunder": {
        "ppg": {25_000_000: (9.7758, 6.7725, 13.3475), 100_000_000: (17.2942, 16.36, 17.9375)},
        "ppo": {25_000_000: (5.87, 5.52, 6.1975), 100_000_000: (14.9592, 12.6725, 16.285)},
    },
    "starpilot": {
        "ppg": {25_000_000: (17.9767, 17.4175, 18.4525), 100_000_000: (23.8483, 22.4825, 25.2025)},
        "ppo": {25_000_000: (11.7033, 10.8675, 13.12), 100_000_000: (21.3958, 20.0525, 22.865)},
    },
}

#: The paper's mean normalized scores over the 16 games (hard mode), as published with its results
PAPER_MEAN_NORMALIZED = {("ppg", 25_000_000): 0.481, ("ppo", 25_000_000): 0.255}
PAPER_MEAN_NORMALIZED.update({("ppg", 100_000_000): 0.757, ("ppo", 100_000_000): 0.589})

#: CleanRL's documented results (docs/rl-algorithms/ppg.md: easy mode, 25M steps, 3 seeds): ``(mean, +-)`` of
#: ``ppg_procgen.py`` and ``ppo_procgen.py``
CLEANRL_EASY_25M = {
    "starpilot": {"ppg": (34.82, 13.77), "ppo": (32.47, 11.21)},
    "bossfight": {"ppg": (10.78, 1.90), "ppo": (9.63, 2.35)},
    "bigfish": {"ppg": (24.23, 10.73), "ppo": (16.80, 9.49)},
}

#: The mean over seeds of the paper's published curves (a subset of the rows; see the file's header)
PAPER_CURVES_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "openai_ppg_mean_curves.csv")

#: Settings that must stay the same across the invocations of one experiment folder
SETTINGS_FILE = "settings.json"
#: Written in a run's folder once it reached the budget
COMPLETE_FILE = "complete.json"
#: Held (flock) by the invocation that trains a run
RUN_LOCK = "run.lock"


def parse_steps(text: str) -> int:
    """
    :param text: A number of env steps: ``25M``, ``100M``, ``500k``, ``1e6`` or ``4096``
    :return: The number
    """
    scale = {"k": 1_000, "m": 1_000_000}.get(text[-1:].lower(), 1)
    try:
        value = float(text[:-1] if scale > 1 else text) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of env steps: {text!r} (e.g. 25M, 500k, 4096)") from None
    if value < 1 or value != int(value):
        raise argparse.ArgumentTypeError(f"the number of env steps must be a positive integer, got {text!r}")
    return int(value)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """
    :param argv: Command-line arguments (``None``: ``sys.argv[1:]``)
    :return: The parsed arguments, with the preset's values where none was given
    """
    from sb3_ppg import PROCGEN_GAMES
    from sb3_ppg.procgen import get_procgen_preset

    parser = argparse.ArgumentParser(description="The PPG paper's Procgen table: PPG vs PPO, in resumable chunks")
    parser.add_argument("--preset", default="paper", choices=["paper", "cleanrl"], help="The settings of the runs")
    parser.add_argument("--games", default="all", help="Comma-separated Procgen games, or 'all' (the 16)")
    parser.add_argument("--algos", default="ppg,ppo")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--total-timesteps", type=parse_steps, help="Budget per run (default: the preset's, 100M / 25M)")
    parser.add_argument("--distribution-mode", choices=["easy", "hard"], help="Default: the preset's (hard / easy)")
    parser.add_argument("--n-envs", type=int, help="Envs per run (default: the preset's, 256 / 64)")
    parser.add_argument("--n-steps", type=int, help="Rollout length (default: the preset's, 256)")
    parser.add_argument("--n-policy-iters", type=int, help="PPG's N_pi (default: the preset's, 32)")
    parser.add_argument("--n-aux-epochs", type=int, help="PPG's E_aux (default: the preset's, 6)")
    parser.add_argument("--channels", default="16,32,32", help="IMPALA channels (smaller for a quick test)")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "auto"], help="fp32 is the paper's")
    parser.add_argument("--micro-batch-size", default="auto", help="PPG's micro_batch_size: auto, none or a number")
    parser.add_argument("--score-episodes", type=int, default=100, help="Episodes in a run's score")
    parser.add_argument("--chunk-minutes", type=float, default=math.inf, help="Longest stretch of one run")
    parser.add_argument("--max-minutes", type=float, default=math.inf, help="Longest invocation")
    parser.add_argument("--keep-checkpoints", action="store_true", help="Keep a complete run's checkpoints")
    parser.add_argument("--report-only", action="store_true", help="Train nothing: report the complete runs")
    parser.add_argument("--folder", default=os.path.join("benchmarks", "results", "procgen_paper"))
    parser.add_argument("--output", help="Markdown report (default: report.md in --folder)")
    parser.add_argument("--device", default="auto")
    parser.add_argument(
        "--torch-threads", type=int, default=0, help="torch's CPU threads (0: OMP_NUM_THREADS, else the idle CPUs' share)"
    )
    args = parser.parse_args(argv)
    preset = get_procgen_preset(args.preset)
    kwargs = preset.algorithm_kwargs
    defaults = dict(
        total_timesteps=preset.total_timesteps,
        distribution_mode=preset.env_kwargs["distribution_mode"],
        n_envs=preset.n_envs,
        n_steps=kwargs["n_steps"],
        n_policy_iters=kwargs["n_policy_iters"],
        n_aux_epochs=kwargs["n_aux_epochs"],
    )
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.games = list(PROCGEN_GAMES) if args.games == "all" else args.games.split(",")
    args.algos = args.algos.split(",")
    unknown = [game for game in args.games if game not in PROCGEN_GAMES] + [a for a in args.algos if a not in ALGOS]
    if unknown:
        parser.error(f"unknown game or algorithm {unknown}: games are {', '.join(PROCGEN_GAMES)}; algorithms {ALGOS}")
    try:
        args.seeds = [int(seed) for seed in args.seeds.split(",")]
    except ValueError:
        parser.error(f"--seeds must be comma-separated integers, got {args.seeds!r}")
    for name, values in (("--games", args.games), ("--algos", args.algos), ("--seeds", args.seeds)):
        repeated = sorted({value for value in values if values.count(value) > 1}, key=values.index)
        if repeated:
            # The same run twice: it would count once among the complete runs, and the report would never come
            parser.error(f"{name} names {', '.join(map(str, repeated))} more than once: give each once")
    for name in ("n_envs", "n_steps", "n_policy_iters", "score_episodes"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    text = args.micro_batch_size.lower()
    if text not in ("auto", "none") and not (text.isdigit() and int(text) > 0):
        parser.error(f"--micro-batch-size must be auto, none or a positive integer, got {args.micro_batch_size!r}")
    args.micro_batch_size = None if text == "none" else text if text == "auto" else int(text)
    args.output = args.output or os.path.join(args.folder, "report.md")
    return args


def settings_of(args: argparse.Namespace) -> dict[str, Any]:
    """The settings that define the experiment of ``args.folder`` (everything but which runs, budget and timing)."""
    names = ("preset", "distribution_mode", "n_envs", "n_steps", "n_policy_iters", "n_aux_epochs", "channels")
    return {name: getattr(args, name) for name in (*names, "precision", "micro_batch_size")}


def check_settings(args: argparse.Namespace) -> None:
    """
    Record the experiment's settings in its folder at the first invocation; refuse other settings later.

    :raises SystemExit: When the folder holds runs made with other settings
    """
    os.makedirs(args.folder, exist_ok=True)
    path = os.path.join(args.folder, SETTINGS_FILE)
    settings = settings_of(args)
    if not os.path.exists(path):
        # Written whole under a temporary name, then linked into place: of invocations starting together, one wins
        temporary = f"{path}.{os.getpid()}.tmp"
        with open(temporary, "w") as file:
            json.dump(settings, file, indent=2)
        with contextlib.suppress(FileExistsError):
            os.link(temporary, path)
        os.remove(temporary)
    try:
        with open(path) as file:
            recorded = json.load(file)
    except (OSError, ValueError) as error:
        raise SystemExit(f"Cannot read {path} ({error}): remove it only if the folder holds no runs yet.") from None
    changed = [
        f"{name}={recorded.get(name)!r} there, {value!r} here"
        for name, value in settings.items()
        if recorded.get(name) != value
    ]
    if changed:
        raise SystemExit(
            f"The runs in {args.folder!r} were made with other settings ({'; '.join(changed)}; see {path}). Give the "
            "same settings to continue them, or another --folder for a new experiment."
        )


def run_folder(args: argparse.Namespace, game: str, algo: str, seed: int) -> str:
    """The folder of one run (``procgen_learning.train_chunk``'s naming)."""
    return os.path.join(args.folder, f"{game}_{algo}_seed{seed}")


def rollout_boundary(args: argparse.Namespace, steps: int) -> int:
    """The first rollout boundary at or after ``steps`` env steps: where a run that trains ``steps`` stops."""
    rollout = args.n_envs * args.n_steps
    return -(-steps // rollout) * rollout


def read_run_log(args: argparse.Namespace, game: str, algo: str, seed: int, name: str) -> np.ndarray:
    """
    The rows of a run's log (``curve.csv``, ``episodes.csv`` or ``chunks.csv``). Those of a run in progress are read
    up to a damaged line, which its next chunk cuts back to its checkpoint (or names in an error).

    :raises procgen_learning.DamagedLogError: When a line of a complete run's log is damaged
    """
    folder = run_folder(args, game, algo, seed)
    path, run = os.path.join(folder, name), f"{game} {algo} seed {seed}"
    steps = completed_steps(folder)
    if steps is not None and steps >= args.total_timesteps:
        return procgen_learning.read_curve(path, run=run)
    return procgen_learning.read_log_rows(path)[0]


def completed_steps(folder: str) -> int | None:
    """The env steps a run had when it was completed, ``None`` when it never was."""
    path = os.path.join(folder, COMPLETE_FILE)
    if not os.path.exists(path):
        return None
    with open(path) as file:
        return int(json.load(file)["num_timesteps"])


@contextlib.contextmanager
def run_lock(folder: str) -> Iterator[bool]:
    """
    Hold the run's lock (an exclusive ``flock`` on ``run.lock``, freed when the process ends) while training it.

    :param folder: The run's folder
    :return: (yields) Whether this invocation holds the lock; ``False``: another one is training the run
    """
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, RUN_LOCK), "a") as file:
        if fcntl is None:
            yield True
            return
        try:
            fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(file.fileno(), fcntl.LOCK_UN)


def model_kwargs(args: argparse.Namespace, algo: str) -> dict[str, Any]:
    """``PPG``'s arguments for a new run: the preset's, with this command's sizes; the paper's PPO for ``"ppo"``."""
    from sb3_ppg.procgen import get_procgen_preset

    kwargs = get_procgen_preset(args.preset).ppg_kwargs(args.n_envs)
    kwargs.update(
        n_steps=args.n_steps,
        n_policy_iters=args.n_policy_iters,
        n_aux_epochs=args.n_aux_epochs,
        precision=args.precision,
        micro_batch_size=args.micro_batch_size,
    )
    policy_kwargs = dict(kwargs.get("policy_kwargs") or {})
    policy_kwargs["features_extractor_kwargs"] = dict(channels=tuple(int(c) for c in args.channels.split(",")))
    if algo == "ppo":
        # The original code's PPO: --arch shared --n_epoch_pi 3 --n_epoch_vf 3 --n_aux_epochs 0
        policy_kwargs = {key: value for key, value in policy_kwargs.items() if key not in ("arch", "detach_value_in_aux")}
        policy_kwargs["arch"] = "shared"
        kwargs.update(n_epochs=3, n_value_epochs=None, n_aux_epochs=0)
    kwargs["policy_kwargs"] = policy_kwargs
    return kwargs


def env_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """``make_procgen_env``'s arguments besides the game, ``n_envs`` and ``seed``: the preset's, in the chosen mode."""
    from sb3_ppg.procgen import get_procgen_preset

    return dict(get_procgen_preset(args.preset).env_kwargs, distribution_mode=args.distribution_mode)


def finish_run(args: argparse.Namespace, folder: str, algo: str, steps: int) -> None:
    """
    Mark a run complete; unless ``--keep-checkpoints``, keep its final model and delete its checkpoints.

    :param folder: The run's folder
    :param algo: The run's algorithm (its checkpoints' prefix)
    :param steps: The run's env steps
    """
    checkpoints = os.path.join(folder, "checkpoints")
    final = os.path.join(checkpoints, f"{algo}_{steps}_steps", "model.zip")
    keep = args.keep_checkpoints or not os.path.exists(final)
    if os.path.exists(final):
        shutil.copyfile(final, os.path.join(folder, "final_model.zip"))
    else:
        print(f"Warning: no checkpoint at {steps:,} steps in {checkpoints}: the checkpoints are kept")
    with open(os.path.join(folder, COMPLETE_FILE), "w") as file:
        json.dump(dict(num_timesteps=steps, checkpoints_kept=keep), file)
    if not keep:
        shutil.rmtree(checkpoints)


def train(args: argparse.Namespace) -> None:
    """Train every unfinished run that no other invocation is training, in turn, within the time limits."""
    end = time.monotonic() + 60 * args.max_minutes
    for game in args.games:
        for algo in args.algos:
            for seed in args.seeds:
                name, folder = f"{game} {algo} seed {seed}", run_folder(args, game, algo, seed)
                if time.monotonic() >= end:
                    return
                with run_lock(folder) as held:
                    if not held:
                        print(f"{name}: being trained by another invocation, skipped")
                        continue
                    steps = completed_steps(folder)
                    if steps is not None and steps >= args.total_timesteps:
                        continue
                    if steps is not None and not os.path.isdir(os.path.join(folder, "checkpoints")):
                        raise SystemExit(
                            f"{name} was completed at {steps:,} env steps and its checkpoints deleted, so it cannot "
                            f"train on to {args.total_timesteps:,}. Use another --folder (and --keep-checkpoints to "
                            "raise a budget later), or this budget."
                        )
                    start_steps = read_run_log(args, game, algo, seed, "curve.csv")[-1:, 0].sum()
                    chunk_args = argparse.Namespace(**vars(args), game=game)
                    deadline = min(time.monotonic() + 60 * args.chunk_minutes, end)
                    start = time.monotonic()
                    procgen_learning.train_chunk(
                        chunk_args, algo, seed, deadline, env_kwargs=env_kwargs(args), model_kwargs=model_kwargs(args, algo)
                    )
                    seconds = time.monotonic() - start
                    # The steps of the last complete rollout (train_chunk's count includes those of a rollout that the
                    # chunk's deadline cut short, which the next chunk redoes from the checkpoint)
                    curve = procgen_learning.read_curve(os.path.join(folder, "curve.csv"), run=name)
                    steps = int(curve[-1:, 0].sum())
                    procgen_learning.append_lines(
                        os.path.join(folder, "chunks.csv"), [f"{int(start_steps)},{steps},{seconds:.1f}"]
                    )
                    rate = (steps - start_steps) / max(seconds, 1e-9)
                    print(f"{name}: {steps:,} / {args.total_timesteps:,} env steps ({rate:.0f} env steps/s with setup)")
                    if steps >= args.total_timesteps:
                        finish_run(args, folder, algo, steps)


def run_score(episodes: np.ndarray, boundary: int, n_episodes: int) -> tuple[float, int]:
    """
    A run's score: the mean raw return of the last ``n_episodes`` episodes that ended by ``boundary`` env steps.

    :param episodes: Rows (env steps at the episode's end, return, length) of ``episodes.csv``, in order
    :param boundary: The rollout boundary
    :param n_episodes: The number of episodes averaged
    :return: The score (NaN without episodes) and the number of episodes in it
    """
    returns = episodes[episodes[:, 0] <= boundary, 1][-n_episodes:]
    return (float(np.mean(returns)) if len(returns) else float("nan")), len(returns)


def normalized(score: float, game: str, mode: str) -> float:
    """``(score - min) / (max - min)`` with the game's constants for the mode."""
    low, high = NORMALIZATION[mode][game]
    return (score - low) / (high - low)


def paper_mean_normalized(games: list[str], algo: str, steps: int) -> float:
    """The mean over ``games`` of the paper's normalized scores (hard mode) at 25M or 100M steps."""
    return float(np.mean([normalized(PAPER_RESULTS[game][algo][steps][0], game, "hard") for game in games]))


def score_points(args: argparse.Namespace) -> list[int]:
    """The step counts the report scores at: the paper's 25M and 100M within the budget, and the budget."""
    points = [steps for steps in PAPER_STEPS if steps <= args.total_timesteps]
    return points if args.total_timesteps in points else [*points, args.total_timesteps]


def collect_scores(args: argparse.Namespace) -> dict[tuple[str, str, int], dict[int, tuple[float, int]]]:
    """
    The score (and its number of episodes) at each of ``score_points`` of every complete run.

    :return: ``{(game, algo, seed): {steps: (score, episodes)}}``
    """
    scores = {}
    for game in args.games:
        for algo in args.algos:
            for seed in args.seeds:
                folder = run_folder(args, game, algo, seed)
                steps = completed_steps(folder)
                if steps is None or steps < args.total_timesteps:
                    continue
                episodes = read_run_log(args, game, algo, seed, "episodes.csv")
                scores[(game, algo, seed)] = {
                    point: run_score(episodes, rollout_boundary(args, point), args.score_episodes)
                    for point in score_points(args)
                }
    return scores


def mean_over_seeds(scores: dict, game: str, algo: str, point: int, seeds: list[int]) -> float | None:
    """The mean over seeds of a game's scores (``None`` when a run is missing)."""
    values = [scores[(game, algo, seed)][point][0] for seed in seeds if (game, algo, seed) in scores]
    return float(np.mean(values)) if values and len(values) == len(seeds) else None


def cell(value: float | None, digits: int) -> str:
    """A table cell: the value, ``n/a`` for NaN, ``-`` when missing."""
    if value is None:
        return "-"
    return "n/a" if math.isnan(value) else f"{value:.{digits}f}"


def steps_label(steps: int) -> str:
    """``25M``, ``100M`` or the number."""
    return f"{steps // 1_000_000}M" if steps % 1_000_000 == 0 else f"{steps:,}"


def score_table(args: argparse.Namespace, scores: dict, point: int) -> list[str]:
    """The Markdown table of one step count: ours, the paper's (at 25M or 100M) and CleanRL's per game, and means."""
    paper_point = point if point in PAPER_STEPS else min(PAPER_STEPS)
    mode = args.distribution_mode
    paper_note = "" if point == paper_point else f", at {steps_label(paper_point)}"
    lines = [
        f"### At {steps_label(point)} env steps (rollout boundary {rollout_boundary(args, point):,})",
        "",
        f"| game | PPG | PPO | PPG normalized | PPO normalized | paper PPG (hard{paper_note}) | paper PPO | "
        "paper PPG normalized | paper PPO normalized | CleanRL PPG (easy, 25M) | CleanRL PPO (easy, 25M) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    ours_normalized: dict[str, list[float]] = {algo: [] for algo in ALGOS}
    for game in args.games:
        row = [game]
        raw = {algo: mean_over_seeds(scores, game, algo, point, args.seeds) if algo in args.algos else None for algo in ALGOS}
        row += [cell(raw[algo], 2) for algo in ALGOS]
        for algo in ALGOS:
            value = None if raw[algo] is None else normalized(raw[algo], game, mode)
            if value is not None:
                ours_normalized[algo].append(value)
            row.append(cell(value, 3))
        row += [cell(PAPER_RESULTS[game][algo][paper_point][0], 2) for algo in ALGOS]
        row += [cell(normalized(PAPER_RESULTS[game][algo][paper_point][0], game, "hard"), 3) for algo in ALGOS]
        for algo in ALGOS:
            published = CLEANRL_EASY_25M.get(game, {}).get(algo)
            row.append("-" if published is None else f"{published[0]:.2f} +- {published[1]:.2f}")
        lines.append("| " + " | ".join(row) + " |")
    means = [
        cell(float(np.mean(ours_normalized[algo])) if len(ours_normalized[algo]) == len(args.games) else None, 3)
        for algo in ALGOS
    ]
    paper_means = [cell(paper_mean_normalized(args.games, algo, paper_point), 3) for algo in ALGOS]
    lines.append(
        f"| **mean normalized score ({len(args.games)} games)** | | | **{means[0]}** | **{means[1]}** | | | "
        f"**{paper_means[0]}** | **{paper_means[1]}** | | |"
    )
    published = ", ".join(f"{algo.upper()} {PAPER_MEAN_NORMALIZED[(algo, paper_point)]:.3f}" for algo in ALGOS)
    lines += ["", f"The paper's mean normalized score over all 16 games at {steps_label(paper_point)}: {published}.", ""]
    return lines


def read_mean_paper_curves() -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The mean over seeds of the paper's curves: ``(steps, {"<game>_<algo>": returns})``."""
    with open(PAPER_CURVES_FILE) as file:
        rows = [line.strip().split(",") for line in file if not line.startswith("#")]
    values = np.array(rows[1:], dtype=np.float64)
    return values[:, 0], {name: values[:, index] for index, name in enumerate(rows[0]) if name != "steps"}


def plot(args: argparse.Namespace, scores: dict, curves_path: str, scores_path: str) -> None:
    """
    Per-game learning curves (mean over seeds) with the paper's, and the normalized scores at the budget with the
    paper's.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paper_steps, paper_curves = read_mean_paper_curves()
    end = rollout_boundary(args, args.total_timesteps)
    n_columns = min(4, len(args.games))
    n_rows = -(-len(args.games) // n_columns)
    figure, axes = plt.subplots(n_rows, n_columns, figsize=(4 * n_columns, 3 * n_rows), squeeze=False)
    for axis, game in zip(axes.flat, args.games, strict=False):
        for algo, color in zip(ALGOS, ("C0", "C1"), strict=True):
            if algo in args.algos:
                runs = [read_run_log(args, game, algo, seed, "curve.csv") for seed in args.seeds]
                runs = [run[run[:, 0] <= end] for run in runs]
                length = min(len(run) for run in runs)
                if length:
                    with warnings.catch_warnings():  # NaN before any episode ended: no line there
                        warnings.simplefilter("ignore", RuntimeWarning)
                        mean = np.nanmean(np.stack([run[:length, 1] for run in runs]), axis=0)
                    axis.plot(runs[0][:length, 0], mean, color=color, label=f"{algo.upper()} ({len(runs)} seeds)")
            shown = paper_steps <= end  # nothing below the paper's first row (1M steps)
            if shown.any():
                axis.plot(
                    paper_steps[shown],
                    paper_curves[f"{game}_{algo}"][shown],
                    color=color,
                    linestyle="--",
                    label=f"paper {algo.upper()} (hard)",
                )
        axis.set(title=f"{game} ({args.distribution_mode})", xlabel="env steps", ylabel="episode return")
    for axis in axes.flat[len(args.games) :]:
        axis.axis("off")
    if axes.flat[0].get_legend_handles_labels()[0]:  # no line before any run logged a rollout
        axes.flat[0].legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(curves_path, dpi=80)
    plt.close(figure)

    point = score_points(args)[-1]
    paper_point = point if point in PAPER_STEPS else min(PAPER_STEPS)
    figure, axis = plt.subplots(figsize=(max(6, 0.8 * len(args.games) + 2), 4))
    positions = np.arange(len(args.games) + 1)
    bars = []
    for algo in args.algos:
        ours = [mean_over_seeds(scores, game, algo, point, args.seeds) for game in args.games]
        ours_normalized = [
            np.nan if v is None else normalized(v, game, args.distribution_mode)
            for v, game in zip(ours, args.games, strict=True)
        ]
        paper = [normalized(PAPER_RESULTS[game][algo][paper_point][0], game, "hard") for game in args.games]
        finite = [value for value in ours_normalized if np.isfinite(value)]
        ours_mean = float(np.mean(finite)) if finite else np.nan
        color = "C0" if algo == "ppg" else "C1"
        label = f"{algo.upper()} ({args.distribution_mode}, {steps_label(point)})"
        bars.append((label, [*ours_normalized, ours_mean], color, 1.0, ""))
        bars.append((f"paper {algo.upper()} (hard, {steps_label(paper_point)})", [*paper, np.mean(paper)], color, 0.4, "//"))
    width = 0.8 / len(bars)
    for index, (label, values, color, alpha, hatch) in enumerate(bars):
        offsets = positions + (index - (len(bars) - 1) / 2) * width
        axis.bar(offsets, values, width, label=label, color=color, alpha=alpha, hatch=hatch)
    axis.set_xticks(positions, [*args.games, "mean"], rotation=45, ha="right")
    axis.set(ylabel="normalized score", title="Normalized score per game")
    axis.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(scores_path, dpi=80)
    plt.close(figure)


def throughput_lines(args: argparse.Namespace) -> list[str]:
    """The measured wall-clock throughput of the runs' chunks (``chunks.csv``), per algorithm."""
    lines = []
    for algo in args.algos:
        steps, seconds = 0.0, 0.0
        for game in args.games:
            for seed in args.seeds:
                chunks = read_run_log(args, game, algo, seed, "chunks.csv")
                steps += float(np.sum(chunks[:, 1] - chunks[:, 0])) if len(chunks) else 0.0
                seconds += float(np.sum(chunks[:, 2])) if len(chunks) else 0.0
        if seconds > 0:
            lines.append(
                f"- {algo.upper()}: {steps:,.0f} env steps in {seconds / 3600:.2f} h of training chunks "
                f"({steps / seconds:.0f} env steps/s per run, setup included)"
            )
    return lines


def report(args: argparse.Namespace, scores: dict, images: tuple[str, str], argv: list[str]) -> str:
    """The Markdown report."""
    from sb3_ppg.procgen import get_procgen_preset

    preset = get_procgen_preset(args.preset)
    defaults = dict(
        distribution_mode=preset.env_kwargs["distribution_mode"],
        n_envs=preset.n_envs,
        n_steps=preset.algorithm_kwargs["n_steps"],
        n_policy_iters=preset.algorithm_kwargs["n_policy_iters"],
        n_aux_epochs=preset.algorithm_kwargs["n_aux_epochs"],
        channels="16,32,32",
    )
    changed = [
        f"{name} {getattr(args, name)} (preset: {value})" for name, value in defaults.items() if getattr(args, name) != value
    ]
    n_runs = len(args.games) * len(args.algos) * len(args.seeds)
    lines = [
        f"# The PPG paper's Procgen table: {args.preset} settings, {args.distribution_mode} mode",
        "",
        "Written by `benchmarks/procgen_paper.py`; do not edit by hand.",
        "",
        f"- Command: `python benchmarks/procgen_paper.py {' '.join(argv)}`",
        f"- Date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d')}; {os.cpu_count()} CPU cores, "
        f"device {args.device}",
        f"- Runs complete: {len(scores)} of {n_runs} ({len(args.games)} games x {', '.join(a.upper() for a in args.algos)} "
        f"x seeds {', '.join(map(str, args.seeds))}), {args.total_timesteps:,} env steps each",
        f"- {args.n_envs} envs x {args.n_steps} steps, IMPALA channels {args.channels}, precision {args.precision}; PPG: "
        f"the '{args.preset}' preset, N_pi {args.n_policy_iters}, E_aux {args.n_aux_epochs}; PPO: the paper's baseline "
        "(arch shared, 3 epochs, no auxiliary phase) with the preset's other settings",
        f"- Score: the mean raw training return of the last {args.score_episodes} episodes that ended by the first rollout "
        "boundary at or after the step count (the paper: the last 100 episodes of each of its 4 workers, at 25,034,752 "
        "and 100,007,936 steps); normalized: (score - min) / (max - min) with the per-game "
        f"{args.distribution_mode}-mode constants of Cobbe et al. (2020); per game the mean over seeds",
    ]
    if changed:
        lines.append(f"- **Settings differ from the '{args.preset}' preset**: {'; '.join(changed)}")
    if args.total_timesteps < min(PAPER_STEPS):
        lines.append(
            f"- **The budget ({args.total_timesteps:,} env steps) is below the paper's 25M and 100M: these scores are "
            "not comparable with the published ones**, shown next to them for scale only."
        )
    if args.distribution_mode == "hard":
        lines.append("- CleanRL's numbers are easy mode: not comparable with hard-mode runs.")
    else:
        lines.append("- **Easy mode: the paper's numbers are hard mode, not comparable**; CleanRL's are easy mode, 25M steps.")
    if len(scores) < n_runs:
        lines.append(f"- **Incomplete: {n_runs - len(scores)} runs have not reached the budget** (their cells are '-').")
    lines += [*throughput_lines(args), "", "## Normalized scores", ""]
    for point in score_points(args):
        lines += score_table(args, scores, point)
    lines += [
        "## Per run",
        "",
        "| game | algorithm | seed | "
        + " | ".join(f"score at {steps_label(p)} (episodes)" for p in score_points(args))
        + " |",
        "|---|---|---|" + "---|" * len(score_points(args)),
    ]
    for (game, algo, seed), values in scores.items():
        cells = [f"{cell(score, 2)} ({count})" for score, count in values.values()]
        lines.append(f"| {game} | {algo.upper()} | {seed} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"![learning curves]({os.path.basename(images[0])})",
        "",
        f"![normalized scores]({os.path.basename(images[1])})",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> bool:
    """
    Train every unfinished run (within the invocation's time), then report when all are complete (or always with
    ``--report-only``).

    :param argv: Command-line arguments (``None``: ``sys.argv[1:]``)
    :return: Whether every run is complete
    """
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    check_settings(args)
    # torch's threads: --torch-threads, else OMP_NUM_THREADS, else this process's share of the idle CPUs
    choose_torch_threads(args.torch_threads)
    try:
        if not args.report_only:
            train(args)
        scores = collect_scores(args)
        n_runs = len(args.games) * len(args.algos) * len(args.seeds)
        if len(scores) < n_runs and not args.report_only:
            print(f"{len(scores)} of {n_runs} runs complete: run the same command again to continue.")
            return False
        stem = os.path.splitext(os.path.abspath(args.output))[0]
        images = (f"{stem}_curves.png", f"{stem}_scores.png")
        os.makedirs(os.path.dirname(stem), exist_ok=True)
        plot(args, scores, *images)
        text = report(args, scores, images, argv)
    except procgen_learning.DamagedLogError as error:
        raise SystemExit(str(error)) from None
    with open(args.output, "w") as file:
        file.write(text)
    print(text)
    if len(scores) == n_runs:
        print("All runs are complete.")
    return len(scores) == n_runs


if __name__ == "__main__":
    main()
