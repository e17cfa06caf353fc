"""
Learning curves from RL Zoo log folders or SB3 monitor files, optionally with the published PPG / PPO curves
of the original paper (Procgen, hard mode) overlaid.

Usage::

    python -m sb3_ppg.plot logs/ppg/procgen-coinrun-v0_1 -o coinrun.png
    python -m sb3_ppg.plot logs/ppg --paper ppg ppo --game coinrun --smooth 100 --title "coinrun (hard)"

Every positional argument is a run folder (one holding ``*monitor.csv`` files, or ``evaluations.npz`` with
``--curve eval``), a folder searched recursively for such run folders, a ``*.monitor.csv`` file or an
``evaluations.npz`` file. Runs whose folder names only differ by the RL Zoo's ``_<run id>`` suffix are seeds
of the same experiment: they are drawn as one curve, the mean over seeds, with a shaded band (min-max over seeds by
default, or mean +/- one standard deviation with ``--band std``).

The figure is drawn with matplotlib's Agg canvas (no display needed, pyplot's global backend is left alone).
"""

import argparse
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

# Location of the packaged paper curves (see sb3_ppg/data/openai_ppg/README.md)
PAPER_DATA_DIR = Path(__file__).parent / "data" / "openai_ppg"
PAPER_EXPERIMENTS = {"ppg": "paper PPG", "ppo": "paper PPO"}
MONITOR_SUFFIX = "monitor.csv"
EVALUATIONS_FILE = "evaluations.npz"


@dataclass
class Curve:
    """
    One learning curve of one seed.

    :param name: Name of the experiment the seed belongs to (seeds with the same name are aggregated)
    :param steps: Environment steps, increasing
    :param returns: Episode return (or mean evaluation return) at each entry of ``steps``
    """

    name: str
    steps: np.ndarray
    returns: np.ndarray


def _experiment_name(run_dir: Path) -> str:
    """
    Name of the experiment a run folder belongs to: its folder name without the RL Zoo run id suffix
    (``procgen-coinrun-v0_3`` -> ``procgen-coinrun-v0``).

    :param run_dir: Run folder
    :return: Experiment name
    """
    name = run_dir.resolve().name
    return re.sub(r"_\d+$", "", name)


def read_monitor_file(path: str | Path) -> pd.DataFrame:
    """
    Read one SB3 monitor file (``Monitor`` or ``VecMonitor`` output).

    :param path: Path of a ``*monitor.csv`` file
    :return: Data frame with columns ``r`` (return), ``l`` (length) and ``t`` (wall time since the epoch, in seconds)
    """
    with open(path) as file_handler:
        first_line = file_handler.readline()
        header = json.loads(first_line[1:]) if first_line.startswith("#") else {}
        data_frame = pd.read_csv(file_handler, index_col=None)
    data_frame["t"] = data_frame["t"] + float(header.get("t_start", 0.0))
    return data_frame


def monitor_curve(files: list[Path], name: str) -> Curve | None:
    """
    Build a training curve from the monitor files of one run: episodes are ordered by wall time and the x value
    of an episode is the total number of environment steps of all episodes finished so far
    (as ``stable_baselines3.common.results_plotter`` does).

    :param files: Monitor files of one run (one per env with ``Monitor``, one per vec env with ``VecMonitor``)
    :param name: Experiment name
    :return: The curve, or None when no episode was completed
    """
    frames = [read_monitor_file(path) for path in files]
    frames = [frame for frame in frames if len(frame) > 0]
    if len(frames) == 0:
        return None
    data_frame = pd.concat(frames).sort_values("t", kind="stable")
    steps = np.cumsum(data_frame["l"].to_numpy(dtype=np.float64))
    return Curve(name, steps, data_frame["r"].to_numpy(dtype=np.float64))


def evaluation_curve(path: Path, name: str) -> Curve | None:
    """
    Build an evaluation curve from an ``EvalCallback`` log (``evaluations.npz``).

    :param path: Path of the ``evaluations.npz`` file
    :param name: Experiment name
    :return: The curve (mean return over the evaluation episodes), or None when it holds no evaluation
    """
    with np.load(path) as data:
        timesteps = np.asarray(data["timesteps"], dtype=np.float64)
        results = np.asarray(data["results"], dtype=np.float64)
    if len(timesteps) == 0:
        return None
    return Curve(name, timesteps, results.reshape(len(timesteps), -1).mean(axis=1))


def _run_dirs(root: Path, curve_type: str) -> list[Path]:
    """
    Folders under ``root`` (``root`` included) that hold the files of one run.

    :param root: Folder to search
    :param curve_type: ``"train"`` (monitor files) or ``"eval"`` (``evaluations.npz``)
    :return: Sorted list of run folders
    """
    found = []
    for dir_path, _, file_names in os.walk(root):
        if curve_type == "train" and any(file_name.endswith(MONITOR_SUFFIX) for file_name in file_names):
            found.append(Path(dir_path))
        elif curve_type == "eval" and EVALUATIONS_FILE in file_names:
            found.append(Path(dir_path))
    return sorted(found)


def load_curves(paths: list[str], curve_type: str = "train") -> list[Curve]:
    """
    Load one curve per run found in ``paths``.

    :param paths: Run folders, folders to search recursively, monitor files or ``evaluations.npz`` files
    :param curve_type: ``"train"``: training episodes from the monitor files;
        ``"eval"``: evaluation returns from ``evaluations.npz``
    :return: The curves (runs without any finished episode / evaluation are skipped with a message)
    """
    if curve_type not in ("train", "eval"):
        raise ValueError(f"Unknown curve type {curve_type!r}, expected 'train' or 'eval'")
    curves = []
    for path_str in paths:
        path = Path(path_str)
        if not path.exists():
            raise FileNotFoundError(f"{path} does not exist")
        if path.is_file():
            if path.name.endswith(".npz"):
                maybe_curve = evaluation_curve(path, _experiment_name(path.parent))
            elif path.name.endswith(MONITOR_SUFFIX):
                maybe_curve = monitor_curve([path], _experiment_name(path.parent))
            else:
                raise ValueError(f"{path}: expected a folder, a '*{MONITOR_SUFFIX}' file or an '{EVALUATIONS_FILE}' file")
            if maybe_curve is None:
                print(f"Skipping {path}: no finished episode or evaluation", file=sys.stderr)
            else:
                curves.append(maybe_curve)
            continue
        run_dirs = _run_dirs(path, curve_type)
        if len(run_dirs) == 0:
            wanted = f"'*{MONITOR_SUFFIX}'" if curve_type == "train" else f"'{EVALUATIONS_FILE}'"
            print(f"Skipping {path}: no {wanted} file found", file=sys.stderr)
        for run_dir in run_dirs:
            name = _experiment_name(run_dir)
            if curve_type == "train":
                maybe_curve = monitor_curve(sorted(run_dir.glob(f"*{MONITOR_SUFFIX}")), name)
            else:
                maybe_curve = evaluation_curve(run_dir / EVALUATIONS_FILE, name)
            if maybe_curve is None:
                print(f"Skipping {run_dir}: no finished episode or evaluation", file=sys.stderr)
            else:
                curves.append(maybe_curve)
    return curves


def smooth(values: np.ndarray, window: int) -> np.ndarray:
    """
    Trailing moving average (the first entries average over the values available so far).

    :param values: 1D array
    :param window: Number of entries to average; 0 or 1 leaves the values unchanged
    :return: Smoothed values, same shape
    """
    if window <= 1 or len(values) == 0:
        return values
    return pd.Series(values).rolling(window, min_periods=1).mean().to_numpy()


def aggregate(
    curves: list[tuple[np.ndarray, np.ndarray]], band: str = "minmax", n_points: int = 300
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """
    Aggregate the curves of several seeds on a common grid (linear interpolation over the range all seeds cover).

    :param curves: ``(steps, returns)`` pairs, one per seed
    :param band: ``"minmax"``: band from the minimum to the maximum over seeds;
        ``"std"``: mean minus / plus one (population) standard deviation over seeds
    :param n_points: Number of grid points (a single seed keeps its own x values)
    :return: ``(steps, mean, low, high)``
    """
    if band not in ("minmax", "std"):
        raise ValueError(f"Unknown band {band!r}, expected 'minmax' or 'std'")
    if len(curves) == 1:
        steps, returns = curves[0]
        return steps, returns, returns, returns
    start = max(steps[0] for steps, _ in curves)
    end = min(steps[-1] for steps, _ in curves)
    if end < start:
        # No common range: fall back to the union of the ranges (np.interp holds the end values)
        start, end = min(steps[0] for steps, _ in curves), max(steps[-1] for steps, _ in curves)
    grid = np.linspace(start, end, n_points)
    values = np.stack([np.interp(grid, steps, returns) for steps, returns in curves])
    mean = values.mean(axis=0)
    if band == "minmax":
        return grid, mean, values.min(axis=0), values.max(axis=0)
    std = values.std(axis=0)
    return grid, mean, mean - std, mean + std


def detect_game(names: list[str]) -> str | None:
    """
    Find the Procgen game in experiment names such as ``procgen-coinrun-v0`` (RL Zoo folder of ``procgen/coinrun-v0``).

    :param names: Experiment names
    :return: The game name, or None if no name (or more than one game) matches
    """
    from sb3_ppg.procgen import PROCGEN_GAMES

    games = set()
    for name in names:
        for game in PROCGEN_GAMES:
            if re.search(rf"(^|[^a-z]){game}([^a-z]|$)", name.lower()):
                games.add(game)
    return games.pop() if len(games) == 1 else None


def load_paper_curves(game: str, experiment: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """
    Published learning curves of the original PPG code for one Procgen game (hard mode, 3 seeds),
    shipped in ``sb3_ppg/data/openai_ppg``.

    :param game: Procgen game name, e.g. ``"coinrun"``
    :param experiment: ``"ppg"`` (PPG, dual networks) or ``"ppo"`` (the paper's PPO baseline)
    :return: One ``(steps, returns)`` pair per seed
    """
    from sb3_ppg.procgen import PROCGEN_GAMES

    if game not in PROCGEN_GAMES:
        raise ValueError(f"Unknown Procgen game {game!r}, expected one of {', '.join(PROCGEN_GAMES)}")
    if experiment not in PAPER_EXPERIMENTS:
        raise ValueError(f"Unknown paper experiment {experiment!r}, expected one of {', '.join(PAPER_EXPERIMENTS)}")
    table = pd.read_csv(PAPER_DATA_DIR / f"{game}.csv", comment="#")
    steps = table["steps"].to_numpy(dtype=np.float64)
    columns = [column for column in table.columns if column.startswith(f"{experiment}_run")]
    return [(steps, table[column].to_numpy(dtype=np.float64)) for column in columns]


def plot_learning_curves(  # noqa: C901
    paths: list[str],
    output: str = "learning_curves.png",
    curve_type: str = "train",
    paper: list[str] | None = None,
    game: str | None = None,
    labels: list[str] | None = None,
    smoothing: int | None = None,
    band: str = "minmax",
    separate: bool = False,
    x_max: float | None = None,
    figsize: tuple[float, float] = (8.0, 5.0),
    dpi: int = 100,
    title: str | None = None,
) -> str:
    """
    Draw learning curves to a PNG file.

    :param paths: Run folders, folders to search recursively, monitor files or ``evaluations.npz`` files
        (may be empty when only paper curves are wanted)
    :param output: Path of the PNG file to write (parent folders are created)
    :param curve_type: ``"train"`` (training episodes, from monitor files) or ``"eval"`` (``evaluations.npz``)
    :param paper: Paper curves to overlay: any of ``"ppg"``, ``"ppo"`` (Procgen hard mode, 3 seeds each)
    :param game: Procgen game of the paper curves; None: detected from the run names
    :param labels: Legend labels, one per experiment (sorted by name); None: the experiment names
    :param smoothing: Moving-average window, in episodes (``"train"``) or evaluations (``"eval"``), applied to each seed
        before aggregation; None: 100 for ``"train"``, 1 (none) for ``"eval"``. Paper curves are not smoothed
        (they already are 400-episode means).
    :param band: Shaded band over seeds: ``"minmax"`` or ``"std"``
    :param separate: Draw every run on its own instead of aggregating seeds
    :param x_max: Last environment step shown; None: the end of the longest run (paper curves are cut there,
        unless the runs end before the second paper point, then the whole paper range is shown)
    :param figsize: Figure size in inches (width, height); the PNG is ``figsize * dpi`` pixels
    :param dpi: Dots per inch
    :param title: Figure title
    :return: The path of the written PNG
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import EngFormatter

    if smoothing is None:
        smoothing = 100 if curve_type == "train" else 1
    curves = load_curves(paths, curve_type)
    if len(curves) == 0 and not paper:
        raise ValueError(f"Nothing to plot: no run found in {paths}")

    # Group seeds by experiment name
    groups: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    for index, curve in enumerate(curves):
        key = f"{curve.name} [{index}]" if separate else curve.name
        groups.setdefault(key, []).append((curve.steps, smooth(curve.returns, smoothing)))
    if labels is not None and len(labels) != len(groups):
        raise ValueError(f"Got {len(labels)} labels for {len(groups)} experiments: {sorted(groups)}")

    paper_groups: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    if paper:
        if game is None:
            game = detect_game([curve.name for curve in curves])
            if game is None:
                raise ValueError("Cannot tell the Procgen game from the run names: pass --game")
        for experiment in paper:
            n_seeds = len(load_paper_curves(game, experiment))
            paper_groups[f"{PAPER_EXPERIMENTS[experiment]} (hard, {game}, {n_seeds} seeds)"] = load_paper_curves(
                game, experiment
            )

    if x_max is None and len(curves) > 0:
        x_max = max(float(curve.steps[-1]) for curve in curves)
        first_paper_steps = [group[0][0] for group in paper_groups.values()]
        if any(len(steps) < 2 or steps[1] > x_max for steps in first_paper_steps):
            # The runs are too short to show anything of the paper curves: show their whole range
            x_max = None

    figure = Figure(figsize=figsize, dpi=dpi)
    FigureCanvasAgg(figure)
    axis = figure.add_subplot(1, 1, 1)
    all_groups = [(name, seeds, False) for name, seeds in sorted(groups.items())]
    all_groups += [(name, seeds, True) for name, seeds in paper_groups.items()]
    for index, (name, seeds, is_paper) in enumerate(all_groups):
        if x_max is not None:
            seeds = [(steps[steps <= x_max], returns[steps <= x_max]) for steps, returns in seeds]
            seeds = [(steps, returns) for steps, returns in seeds if len(steps) > 0]
            if len(seeds) == 0:
                continue
        steps, mean, low, high = aggregate(seeds, band=band)
        label = name if (is_paper or labels is None) else labels[index]
        if not is_paper and len(seeds) > 1:
            label = f"{label} ({len(seeds)} seeds)"
        line_style = "--" if is_paper else "-"
        (line,) = axis.plot(steps, mean, line_style, label=label, linewidth=1.5)
        if len(seeds) > 1:
            axis.fill_between(steps, low, high, color=line.get_color(), alpha=0.2, linewidth=0)

    axis.set_xlabel("environment steps")
    axis.set_ylabel("episode return" if curve_type == "train" else "mean evaluation return")
    axis.xaxis.set_major_formatter(EngFormatter(sep=""))
    if x_max is not None:
        axis.set_xlim(left=0, right=x_max)
    axis.grid(True, alpha=0.3)
    if len(all_groups) > 0:
        axis.legend(loc="best", fontsize="small")
    notes = []
    if any(len(seeds) > 1 for _, seeds, _ in all_groups):
        notes.append("mean over seeds, shaded: " + ("min-max" if band == "minmax" else "+/- 1 std"))
    if len(curves) > 0 and smoothing > 1:
        unit = "episode" if curve_type == "train" else "evaluation"
        notes.append(f"{smoothing}-{unit} moving average" + (" (paper curves: 400 episodes)" if paper_groups else ""))
    axis.set_title(", ".join(notes), fontsize="small")
    if title:
        figure.suptitle(title)

    output_dir = os.path.dirname(os.path.abspath(output))
    os.makedirs(output_dir, exist_ok=True)
    figure.savefig(output, dpi=dpi)
    return output


def _procgen_game(name: str) -> str:
    """
    Check a ``--game`` argument.

    :param name: The argument
    :return: The game name
    """
    from sb3_ppg.procgen import PROCGEN_GAMES

    if name not in PROCGEN_GAMES:
        raise argparse.ArgumentTypeError(f"invalid choice: {name!r} (choose from {', '.join(PROCGEN_GAMES)})")
    return name


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """
    :param argv: Command line arguments (None: ``sys.argv[1:]``)
    :return: Parsed arguments
    """
    parser = argparse.ArgumentParser(
        prog="python -m sb3_ppg.plot",
        description="Learning curves (PNG) from RL Zoo log folders or SB3 monitor files, "
        "with the original paper's Procgen curves (hard mode) overlaid on request.",
    )
    parser.add_argument(
        "paths",
        nargs="*",
        help="Run folders (e.g. logs/ppg/procgen-coinrun-v0_1), folders searched recursively (e.g. logs/ppg), "
        "*monitor.csv files or evaluations.npz files. Runs named <name>_<id> are seeds of <name>.",
    )
    parser.add_argument("-o", "--output", default="learning_curves.png", help="PNG file to write")
    parser.add_argument(
        "--curve",
        choices=["train", "eval"],
        default="train",
        help="train: training episode returns (monitor files); eval: EvalCallback results (evaluations.npz)",
    )
    parser.add_argument(
        "--paper",
        nargs="+",
        choices=sorted(PAPER_EXPERIMENTS),
        default=None,
        help="Overlay the published curves of the original code (Procgen distribution_mode=hard, 3 seeds)",
    )
    parser.add_argument(
        "--game", type=_procgen_game, default=None, help="Procgen game for --paper (default: detected from the run names)"
    )
    parser.add_argument("--labels", nargs="+", default=None, help="Legend labels, one per experiment (sorted by name)")
    parser.add_argument(
        "--smooth",
        type=int,
        default=None,
        help="Moving-average window per seed, in episodes (train, default 100) or evaluations (eval, default 1 = none)",
    )
    parser.add_argument("--band", choices=["minmax", "std"], default="minmax", help="Shaded band over seeds")
    parser.add_argument("--separate", action="store_true", default=False, help="Do not aggregate seeds")
    parser.add_argument("--x-max", type=float, default=None, help="Last environment step shown (e.g. 25e6)")
    parser.add_argument(
        "--figsize", type=float, nargs=2, default=(8.0, 5.0), metavar=("WIDTH", "HEIGHT"), help="Figure size in inches"
    )
    parser.add_argument("--dpi", type=int, default=100, help="Resolution: the PNG is figsize * dpi pixels")
    parser.add_argument("--title", type=str, default=None, help="Figure title")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """
    Command line entry point (``python -m sb3_ppg.plot`` / ``sb3_ppg_plot``).

    :param argv: Command line arguments (None: ``sys.argv[1:]``)
    """
    args = parse_args(argv)
    output = plot_learning_curves(
        args.paths,
        output=args.output,
        curve_type=args.curve,
        paper=args.paper,
        game=args.game,
        labels=args.labels,
        smoothing=args.smooth,
        band=args.band,
        separate=args.separate,
        x_max=args.x_max,
        figsize=(args.figsize[0], args.figsize[1]),
        dpi=args.dpi,
        title=args.title,
    )
    print(f"Learning curves written to {os.path.abspath(output)}")


if __name__ == "__main__":
    main()
