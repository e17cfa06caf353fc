"""
Learning curves as data: reading RL Zoo / SB3 monitor and evaluation files, smoothing and aggregating seeds, and the
published Procgen curves of the original PPG code (shipped in ``sb3_ppg/cli/data/openai_ppg``). Drawn by :mod:`sb3_ppg.plot`.
"""

import csv
import json
import os
import re
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

# Location of the packaged paper curves (see sb3_ppg/cli/data/openai_ppg/README.md)
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
    """A run folder's name without the RL Zoo run id suffix (``procgen-coinrun-v0_3`` -> ``procgen-coinrun-v0``)."""
    name = run_dir.resolve().name
    return re.sub(r"_\d+$", "", name)


class MonitorLineError(ValueError):
    """A line of a monitor file that is not what SB3's ``Monitor`` writes: its number (from 1) and what is wrong."""

    def __init__(self, line: int, reason: str) -> None:
        super().__init__(f"line {line} {reason}")
        self.line = line
        self.reason = reason


def parse_monitor_lines(lines: list[str]) -> tuple[float, np.ndarray]:
    """
    Parse the complete lines of a monitor file (line ends removed).

    :param lines: The lines
    :return: The header's ``t_start`` and the episodes' ``r``, ``l`` and ``t`` (one row each)
    :raises MonitorLineError: For the first line that is not what SB3's ``Monitor`` writes
    """
    t_start, first = 0.0, 0
    if lines and lines[0].startswith("#"):
        try:
            t_start = float(json.loads(lines[0][1:]).get("t_start", 0.0))
        except (ValueError, TypeError, AttributeError):
            raise MonitorLineError(1, "is not the header of a monitor file (a JSON object with t_start)") from None
        first = 1
    rows = list(csv.reader(lines[first:]))
    if not rows:
        raise MonitorLineError(first + 1, "is missing: a monitor file's columns (r, l, t)")
    if not {"r", "l", "t"} <= set(rows[0]):
        raise MonitorLineError(first + 1, f"holds the columns {rows[0]}, not those of a monitor file (r, l, t)")
    columns = [rows[0].index(name) for name in ("r", "l", "t")]
    values = np.zeros((len(rows) - 1, 3))
    for index, row in enumerate(rows[1:]):
        try:
            if len(row) != len(rows[0]):
                raise ValueError
            values[index] = [float(row[column]) for column in columns]
        except ValueError:
            reason = f"is not an episode ({len(rows[0])} fields, r, l and t numbers)"
            raise MonitorLineError(first + index + 2, reason) from None
    return t_start, values


def read_monitor_file(path: str | Path) -> pd.DataFrame:
    """
    Read one SB3 monitor file into columns ``r``, ``l`` and ``t``, an unfinished last line left out (a ``ValueError``
    names a line that is not an episode).
    """

    def damaged(line: int, reason: str) -> ValueError:
        return ValueError(
            f"{path} is not a readable SB3 monitor file: line {line} {reason}. Repair or remove that file, or plot the "
            "other runs."
        )

    try:
        with open(path, encoding="utf-8", newline="") as file_handler:
            text = file_handler.read()
    except UnicodeDecodeError as error:
        raise damaged(1 + text_lines_before(path, error.start), "is not UTF-8 text") from None
    lines = text.split("\n")[:-1]  # the text after the last line end: an unfinished line, left out
    try:
        t_start, values = parse_monitor_lines([line.rstrip("\r") for line in lines])
    except MonitorLineError as error:
        raise damaged(error.line, error.reason) from None
    return pd.DataFrame({"r": values[:, 0], "l": values[:, 1], "t": values[:, 2] + t_start})


def text_lines_before(path: str | Path, offset: int) -> int:
    """
    :param path: A file
    :param offset: A byte offset in it
    :return: The number of line ends before ``offset``
    """
    with open(path, "rb") as file_handler:
        return file_handler.read(offset).count(b"\n")


def monitor_curve(files: list[Path], name: str) -> Curve | None:
    """
    A run's training curve from its monitor files: episodes in wall-time order, x the total steps of the episodes
    finished so far (as SB3's ``results_plotter``); None without episodes.
    """
    frames = [read_monitor_file(path) for path in files]
    frames = [frame for frame in frames if len(frame) > 0]
    if len(frames) == 0:
        return None
    data_frame = pd.concat(frames).sort_values("t", kind="stable")
    steps = np.cumsum(data_frame["l"].to_numpy(dtype=np.float64))
    return Curve(name, steps, data_frame["r"].to_numpy(dtype=np.float64))


def evaluation_curve(path: Path, name: str) -> Curve | None:
    """A run's evaluation curve (mean return) from its ``evaluations.npz``; None without evaluations."""
    with np.load(path) as data:
        timesteps = np.asarray(data["timesteps"], dtype=np.float64)
        results = np.asarray(data["results"], dtype=np.float64)
    if len(timesteps) == 0:
        return None
    return Curve(name, timesteps, results.reshape(len(timesteps), -1).mean(axis=1))


def _run_dirs(root: Path, curve_type: str) -> list[Path]:
    """Sorted folders under ``root`` (included) that hold a run's files (monitor files, or evaluations)."""
    found = []
    for dir_path, _, file_names in os.walk(root):
        if curve_type == "train" and any(file_name.endswith(MONITOR_SUFFIX) for file_name in file_names):
            found.append(Path(dir_path))
        elif curve_type == "eval" and EVALUATIONS_FILE in file_names:
            found.append(Path(dir_path))
    return sorted(found)


def load_curves(paths: list[str], curve_type: str = "train") -> list[Curve]:
    """
    Load one curve per run found in ``paths`` (runs without data are skipped with a message).

    :param curve_type: ``"train"`` (monitor files) or ``"eval"`` (``evaluations.npz``)
    """
    if curve_type not in ("train", "eval"):
        raise ValueError(f"Unknown curve type {curve_type!r}, expected 'train' or 'eval'")
    found: list[tuple[Path, Curve]] = []
    for path_str in paths:
        path = Path(path_str).expanduser()
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
                found.append((path.parent, maybe_curve))
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
                found.append((run_dir, maybe_curve))
    _name_experiments(found)
    return [curve for _, curve in found]


def _run_settings(run_dir: Path) -> str:
    """A run's hyperparameters as the command line saved them (its ``<env>/config.yml``; "" without one)."""
    configs = sorted(run_dir.glob("*/config.yml"))
    return configs[0].read_text(errors="replace") if configs else ""


def _name_experiments(found: list[tuple[Path, Curve]]) -> None:
    """
    Name each run's experiment: runs are seeds of one experiment when they lie in the same folder, share their name
    without the ``_<run id>`` suffix and their settings (``config.yml``). Experiments that would share a name are told
    apart by their folders (``a/ppg/CartPole-v1``, ``b/ppg/CartPole-v1``), then by the first run of each settings
    (``CartPole-v1 (settings of CartPole-v1_2)``).

    :param found: Each run's folder and curve (named by :func:`_experiment_name`), renamed in place
    """
    experiments: dict[str, dict[tuple[Path, str], list[tuple[Path, Curve]]]] = {}
    for run_dir, curve in found:
        identity = (run_dir.resolve().parent, _run_settings(run_dir))
        experiments.setdefault(curve.name, {}).setdefault(identity, []).append((run_dir, curve))
    for name, by_identity in experiments.items():
        if len(by_identity) == 1:
            continue
        parents = sorted({parent for parent, _ in by_identity})
        common = Path(os.path.commonpath([str(parent) for parent in parents])) if len(parents) > 1 else None
        for (parent, _), runs in by_identity.items():
            label = name
            if common is not None:
                label = str(parent.relative_to(common) / name)
            if sum(1 for other, _ in by_identity if other == parent) > 1:
                label += f" (settings of {min(run_dir.resolve().name for run_dir, _ in runs)})"
            for _, curve in runs:
                curve.name = label


def nothing_to_plot_message(paths: list[str], curve_type: str) -> str:
    """Why ``paths`` hold no curve of the requested type, and what to do about it."""
    folders = [Path(path) for path in paths if Path(path).is_dir()]
    if curve_type == "eval":
        if any(_run_dirs(folder, "eval") for folder in folders):
            return (
                f"Nothing to plot: the {EVALUATIONS_FILE} files in {paths} hold no evaluation yet (the first one is "
                "made after --eval-freq steps)"
            )
        runs = [str(run_dir) for folder in folders for run_dir in _run_dirs(folder, "train")]
        if runs:
            return (
                f"Nothing to plot: {', '.join(runs)} {'has' if len(runs) == 1 else 'have'} no evaluations "
                f"({EVALUATIONS_FILE}), only training episodes. Runs are evaluated when trained with --eval-freq N "
                "(every N steps, e.g. python -m sb3_ppg.train --env CartPole-v1 --eval-freq 10000); "
                "--curve train (the default) plots the training episodes."
            )
        return f"Nothing to plot: no run with evaluations ({EVALUATIONS_FILE}) found in {paths}"
    if any(_run_dirs(folder, "train") for folder in folders):
        return f"Nothing to plot: no training episode has finished yet in the runs of {paths}"
    return f"Nothing to plot: no run found in {paths} (no '*{MONITOR_SUFFIX}' file)"


def smooth(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing moving average over ``window`` entries (fewer at the start; 0 or 1: unchanged)."""
    if window <= 1 or len(values) == 0:
        return values
    return pd.Series(values).rolling(window, min_periods=1).mean().to_numpy()


def aggregate(
    curves: list[tuple[np.ndarray, np.ndarray]], band: str = "minmax", n_points: int = 300
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """
    Aggregate the curves of several seeds on a common grid over the range all cover: ``(steps, mean, low, high)``.

    :param band: ``"minmax"`` (minimum to maximum over seeds) or ``"std"`` (mean -/+ one population std)
    :param n_points: Number of grid points (a single seed keeps its own x values)
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
    """The Procgen game of experiment names such as ``procgen-coinrun-v0``, or None (none, or several)."""
    from sb3_ppg.procgen import PROCGEN_GAMES

    games = set()
    for name in names:
        for game in PROCGEN_GAMES:
            if re.search(rf"(^|[^a-z]){game}([^a-z]|$)", name.lower()):
                games.add(game)
    return games.pop() if len(games) == 1 else None


def load_paper_curves(game: str, experiment: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """
    Published learning curves of the original PPG code for one Procgen game (hard mode, 3 seeds), one ``(steps,
    returns)`` pair per seed; ``experiment``: ``"ppg"`` or ``"ppo"``.
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


def run_distribution_modes(paths: list[str]) -> dict[str, str]:
    """The Procgen ``distribution_mode`` each command line run under ``paths`` trained in (from its ``config.yml``)."""
    modes = {}
    for path_str in paths:
        path = Path(path_str)
        # A file (monitor, evaluations.npz) lies in its run folder; a folder holds runs
        folder = path.parent if path.is_file() else path
        for config in sorted(folder.rglob("config.yml")):
            match = re.search(r"distribution_mode:\s*['\"]?(\w+)", config.read_text(errors="replace"))
            modes[str(config.parent.parent)] = match.group(1) if match else "hard"
    return modes


def cut_monitor_log(log: Path, size: int, checkpoint: Path) -> None:
    """
    Cut a resumed run's episode log (``*.monitor.csv``) back to its size when ``checkpoint`` was written, the episodes
    after it (played again) and anything damaged there with them. The part kept must be complete episodes: a damaged
    line in it (or a log now shorter and cut in the middle of a line) is a ``ValueError`` naming the file and the line,
    since the resumed run would append after it (gluing its first episode onto a cut line). A log shorter than at the
    checkpoint but made of complete lines is continued, with a warning.

    :param log: The episode log
    :param size: Its size in bytes when the checkpoint was written
    :param checkpoint: The checkpoint the run resumes from
    """
    data = log.read_bytes()
    kept = data[:size]
    fix = (
        "Repair that line, or delete it (its episode then stays missing from the log), then run the command again: "
        "the resumed run appends its episodes to this file."
    )
    try:
        text = kept.decode("utf-8")
    except UnicodeDecodeError as error:
        line = kept[: error.start].count(b"\n") + 1
        raise ValueError(
            f"--resume: {log}, line {line}, is not UTF-8 text ({checkpoint.name} needs the log up to byte {size:,}). {fix}"
        ) from None
    lines = text.split("\n")
    try:
        parse_monitor_lines([line.rstrip("\r") for line in lines[:-1]])
    except MonitorLineError as error:
        where = f"--resume: {log}, line {error.line}, {error.reason}"
        raise ValueError(f"{where} (written before {checkpoint.name}). {fix}") from None
    if lines[-1]:  # the part kept ends inside a line
        where = "cut in the middle" if len(data) <= size else f"not a complete line where {checkpoint.name} left the log"
        raise ValueError(
            f"--resume: {log}, line {len(lines)}, is {where} ({len(data):,} bytes; {size:,} when {checkpoint.name} was "
            f"written). {fix}"
        )
    if len(data) > size:
        with open(log, "r+b") as file:
            file.truncate(size)
    elif len(data) < size:
        warnings.warn(
            f"--resume: {log} is {size - len(data):,} bytes shorter than when {checkpoint.name} was written: episodes "
            f"logged before it are missing from the log. The run appends its episodes after line {len(lines) - 1}.",
            stacklevel=2,
        )
