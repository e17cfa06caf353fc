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

The figure is drawn with matplotlib's Agg canvas (no display needed, pyplot's global backend is left alone). The
curves themselves (reading, smoothing, aggregating, the paper's data) are in :mod:`sb3_ppg.cli.curves`.
"""

import argparse
import os
import sys
import textwrap
import warnings
from typing import TYPE_CHECKING

import numpy as np

from sb3_ppg.cli.curves import (
    PAPER_EXPERIMENTS,
    aggregate,
    detect_game,
    load_curves,
    load_paper_curves,
    nothing_to_plot_message,
    run_distribution_modes,
    smooth,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

#: Seeds of one experiment whose curves end before this fraction of the longest one's end are reported: their mean is
#: drawn only up to the shortest seed's end (the range where every seed has data)
SEED_END_TOLERANCE = 0.9


def report_unequal_seeds(groups: dict[str, list[tuple[np.ndarray, np.ndarray]]], x_max: float | None = None) -> bool:
    """
    The mean over the seeds of an experiment is drawn where every seed has data (see :func:`aggregate`): print a line
    (to stderr) for each experiment whose seeds end far apart (the shortest before ``SEED_END_TOLERANCE`` of the
    longest, within ``x_max``), which is then drawn only up to its shortest seed's end.

    :param groups: The ``(steps, returns)`` curves of the seeds of each experiment
    :param x_max: The last step shown (None: no limit)
    :return: Whether some experiment is cut short
    """
    cut = False
    for name, seeds in sorted(groups.items()):
        ends = [float(steps[-1]) for steps, _ in seeds]
        shown_end = max(ends) if x_max is None else min(max(ends), x_max)
        if min(ends) < SEED_END_TOLERANCE * shown_end:
            cut = True
            print(
                f"{name}: its {len(seeds)} runs, averaged as seeds, end at different steps ({min(ends):,.0f} to "
                f"{max(ends):,.0f}); their mean is drawn up to {min(ends):,.0f}, where every run has data "
                "(--separate draws each run in full).",
                file=sys.stderr,
            )
    return cut


def last_drawn_step(groups: dict[str, list[tuple[np.ndarray, np.ndarray]]]) -> float:
    """
    The default right end of the plot: the end of the longest experiment, each drawn up to its shortest seed's end
    (the x axis would otherwise run past the mean curves, empty).

    :param groups: The ``(steps, returns)`` curves of the seeds of each experiment
    :return: The step
    """
    return max(min(float(steps[-1]) for steps, _ in seeds) for seeds in groups.values())


def fit_title(figure: "Figure", axis: "Axes", text: str) -> None:
    """
    Set the axis title (the plot's notes, small), wrapped onto as many lines as it takes to fit within the figure
    (one line ran past both edges of the --paper plot).

    :param figure: The figure
    :param axis: Its axis
    :param text: The title on one line
    """
    axis.set_title(text, fontsize="small")
    width = len(text)
    while width > 20:
        figure.draw_without_rendering()  # the layout, then the title's extent
        box, center = axis.title.get_window_extent(), axis.bbox.x0 + axis.bbox.width / 2
        allowed = 2 * min(center, figure.bbox.width - center) * 0.96
        if box.width <= allowed:
            return
        width = max(20, min(width - 1, int(width * allowed / box.width)))
        axis.title.set_text("\n".join(textwrap.wrap(text, width)))


#: Room beyond the last point drawn when the points set the right end of the x axis (a fraction of the axis)
POINTS_MARGIN = 0.03


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
    reference_lines: dict[str, float] | None = None,
    points: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None,
) -> str:
    """
    Draw learning curves to a PNG file.

    :param paths: Run folders, folders to search recursively, monitor files or ``evaluations.npz`` files
        (may be empty when only paper curves are wanted)
    :param output: Path of the PNG file to write (parent folders are created; ``.png`` is added to a name without
        an extension)
    :param curve_type: ``"train"`` (training episodes, from monitor files) or ``"eval"`` (``evaluations.npz``)
    :param paper: Paper curves to overlay: any of ``"ppg"``, ``"ppo"`` (Procgen hard mode, 3 seeds each)
    :param game: Procgen game of the paper curves; None: detected from the run names
    :param labels: Legend labels, one per experiment (sorted by name); None: the experiment names
    :param smoothing: Moving-average window, in episodes (``"train"``) or evaluations (``"eval"``), applied to each seed
        before aggregation; None: 100 for ``"train"``, 1 (none) for ``"eval"``. Paper curves are not smoothed
        (they already are 400-episode means).
    :param band: Shaded band over seeds: ``"minmax"`` or ``"std"``
    :param separate: Draw every run on its own instead of aggregating seeds
    :param x_max: Last environment step shown; None: the end of the longest run, or the last of ``points`` where they
        go further (paper curves are cut there, unless the runs end before the second paper point, then the whole
        paper range is shown)
    :param figsize: Figure size in inches (width, height); the PNG is ``figsize * dpi`` pixels
    :param dpi: Dots per inch
    :param title: Figure title
    :param reference_lines: Horizontal lines to draw, by label (e.g. the return of random actions)
    :param points: Points with error bars to draw, by label: ``(steps, values, errors)`` (e.g. evaluations)
    :return: The path of the written PNG
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import EngFormatter

    if smoothing is None:
        smoothing = 100 if curve_type == "train" else 1
    curves = load_curves(paths, curve_type)
    if len(curves) == 0 and not paper:
        raise ValueError(nothing_to_plot_message(paths, curve_type))

    # Group seeds by experiment name
    groups: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    for index, curve in enumerate(curves):
        key = f"{curve.name} [{index}]" if separate else curve.name
        groups.setdefault(key, []).append((curve.steps, smooth(curve.returns, smoothing)))
    if labels is not None and len(labels) != len(groups):
        raise ValueError(f"Got {len(labels)} labels for {len(groups)} experiments: {sorted(groups)}")
    cut_seeds = report_unequal_seeds(groups, x_max)

    paper_groups: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    mode_note = None
    if paper:
        if game is None:
            game = detect_game([curve.name for curve in curves])
            if game is None:
                raise ValueError("Cannot tell the Procgen game from the run names: pass --game")
        other_modes = sorted({mode for mode in run_distribution_modes(paths).values() if mode != "hard"})
        if other_modes:
            mode_note = f"paper curves: hard mode; these runs: {', '.join(other_modes)} mode (not comparable)"
            warnings.warn(
                f"--paper: the paper's curves are Procgen's hard mode, these runs trained in {', '.join(other_modes)} "
                "mode: the curves are not comparable (the plot says so)."
            )
        for experiment in paper:
            n_seeds = len(load_paper_curves(game, experiment))
            paper_groups[f"{PAPER_EXPERIMENTS[experiment]} (hard, {game}, {n_seeds} seeds)"] = load_paper_curves(
                game, experiment
            )

    right = x_max
    if x_max is None and len(curves) > 0:
        x_max = last_drawn_step(groups)
        first_paper_steps = [group[0][0] for group in paper_groups.values()]
        if any(len(steps) < 2 or steps[1] > x_max for steps in first_paper_steps):
            # The runs are too short to show anything of the paper curves: show their whole range
            x_max = None
        right = x_max
        last_point = max((float(np.max(steps)) for steps, _, _ in (points or {}).values() if len(steps) > 0), default=None)
        if x_max is not None and last_point is not None and last_point >= x_max:
            # Evaluations after the last finished episode (the quick start's final ones): up to them, with a margin
            # that shows their markers whole
            right = last_point * (1 + POINTS_MARGIN)

    figure = Figure(figsize=figsize, dpi=dpi, layout="constrained")  # the (wrapped) titles fit
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

    for name, value in (reference_lines or {}).items():
        axis.axhline(value, linestyle=":", color="gray", label=name)
    for name, (steps, values, errors) in (points or {}).items():
        axis.errorbar(steps, values, yerr=errors, fmt="o", capsize=3, label=name)

    axis.set_xlabel("environment steps")
    axis.set_ylabel("episode return" if curve_type == "train" else "mean evaluation return")
    axis.xaxis.set_major_formatter(EngFormatter(sep=""))
    if right is not None:
        axis.set_xlim(left=0, right=right)
    axis.grid(True, alpha=0.3)
    if len(all_groups) > 0 or reference_lines or points:
        axis.legend(loc="best", fontsize="small")
    notes = []
    if any(len(seeds) > 1 for _, seeds, _ in all_groups):
        notes.append("mean over seeds, shaded: " + ("min-max" if band == "minmax" else "+/- 1 std"))
    if cut_seeds:
        notes.append("up to the shortest seed")
    if len(curves) > 0 and smoothing > 1:
        unit = "episode" if curve_type == "train" else "evaluation"
        notes.append(f"{smoothing}-{unit} moving average" + (" (paper curves: 400 episodes)" if paper_groups else ""))
    if mode_note is not None:
        notes.append(mode_note)
    if title:
        figure.suptitle(title)
    fit_title(figure, axis, ", ".join(notes))

    output = os.path.expanduser(output)
    if not os.path.splitext(output)[1]:
        output += ".png"  # what savefig would add: the path returned is the file written
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
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
    try:
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
    except (ValueError, FileNotFoundError) as error:
        sys.exit(f"error: {error}")
    print(f"Learning curves written to {os.path.abspath(output)}")


if __name__ == "__main__":
    main()
