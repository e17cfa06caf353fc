"""Tests of ``python -m sb3_ppg.plot`` and of the packaged paper curves."""

import json
import struct
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sb3_ppg.cli import curves as curves_module
from sb3_ppg.cli import plot
from sb3_ppg.procgen import PROCGEN_GAMES


def png_size(path: Path) -> tuple[int, int]:
    """
    :param path: A PNG file
    :return: (width, height) in pixels, read from the IHDR chunk
    """
    with open(path, "rb") as file_handler:
        header = file_handler.read(24)
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", header[16:24])
    return width, height


def write_monitor(path: Path, n_episodes: int, seed: int, t_start: float = 1000.0) -> None:
    """
    Write a monitor file like SB3's ``Monitor`` / ``VecMonitor``.

    :param path: File to write
    :param n_episodes: Number of episodes
    :param seed: Seed of the fake returns
    :param t_start: Start time in the header
    """
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as file_handler:
        file_handler.write("#" + json.dumps({"t_start": t_start, "env_id": "procgen/coinrun-v0"}) + "\n")
        file_handler.write("r,l,t\n")
        for episode in range(n_episodes):
            file_handler.write(f"{rng.uniform(0, 10) + episode / 10},{rng.integers(50, 500)},{episode * 0.5}\n")


@pytest.fixture
def zoo_logs(tmp_path: Path) -> Path:
    """
    A small zoo log folder: two seeds of procgen/coinrun-v0 (one with two per-env monitor files, one with a single
    VecMonitor file) and one seed of CartPole-v1, each with an ``evaluations.npz``.
    """
    root = tmp_path / "logs" / "ppg"
    write_monitor(root / "procgen-coinrun-v0_1" / "0.monitor.csv", 60, seed=0)
    write_monitor(root / "procgen-coinrun-v0_1" / "1.monitor.csv", 40, seed=1, t_start=1000.2)
    write_monitor(root / "procgen-coinrun-v0_2" / "0.monitor.csv", 120, seed=2)
    write_monitor(root / "CartPole-v1_1" / "0.monitor.csv", 30, seed=3)
    for run in ("procgen-coinrun-v0_1", "procgen-coinrun-v0_2", "CartPole-v1_1"):
        np.savez(
            root / run / "evaluations.npz",
            timesteps=np.array([1000, 2000, 3000]),
            results=np.arange(9, dtype=np.float64).reshape(3, 3),
            ep_lengths=np.ones((3, 3)),
        )
    # The zoo's config sub-folder holds no monitor file
    (root / "procgen-coinrun-v0_1" / "procgen-coinrun-v0").mkdir()
    return tmp_path / "logs"


def test_load_curves_groups_seeds(zoo_logs: Path):
    curves = plot.load_curves([str(zoo_logs)])
    names = sorted(curve.name for curve in curves)
    assert names == ["CartPole-v1", "procgen-coinrun-v0", "procgen-coinrun-v0"]
    first_seed = next(curve for curve in curves if curve.name == "procgen-coinrun-v0" and len(curve.steps) == 100)
    # Both monitor files of the run, x = cumulative episode lengths
    assert np.all(np.diff(first_seed.steps) > 0)
    eval_curves = plot.load_curves([str(zoo_logs / "ppg" / "CartPole-v1_1")], curve_type="eval")
    assert len(eval_curves) == 1
    np.testing.assert_allclose(eval_curves[0].returns, [1.0, 4.0, 7.0])
    np.testing.assert_allclose(eval_curves[0].steps, [1000, 2000, 3000])


def test_aggregate_bands():
    steps = np.array([0.0, 10.0])
    curves = [(steps, np.array([0.0, 2.0])), (steps, np.array([2.0, 4.0]))]
    grid, mean, low, high = plot.aggregate(curves, band="minmax", n_points=3)
    np.testing.assert_allclose(grid, [0, 5, 10])
    np.testing.assert_allclose(mean, [1, 2, 3])
    np.testing.assert_allclose(low, [0, 1, 2])
    np.testing.assert_allclose(high, [2, 3, 4])
    _, mean, low, high = plot.aggregate(curves, band="std", n_points=3)
    np.testing.assert_allclose(high - mean, [1, 1, 1])
    np.testing.assert_allclose(mean - low, [1, 1, 1])
    with pytest.raises(ValueError, match="band"):
        plot.aggregate(curves, band="iqr")


def test_smooth():
    values = np.array([0.0, 2.0, 4.0, 6.0])
    np.testing.assert_allclose(plot.smooth(values, 2), [0, 1, 3, 5])
    np.testing.assert_allclose(plot.smooth(values, 1), values)


def test_plot_png_size(zoo_logs: Path, tmp_path: Path, capsys):
    output = tmp_path / "out" / "curves.png"
    plot.main([str(zoo_logs), "-o", str(output), "--figsize", "4", "3", "--dpi", "50", "--smooth", "10", "--title", "test"])
    assert png_size(output) == (200, 150)
    assert str(output) in capsys.readouterr().out


def test_plot_paper_overlay(zoo_logs: Path, tmp_path: Path):
    output = tmp_path / "paper.png"
    # Game detected from the run folder name; short runs: the whole paper range is shown
    plot.main([str(zoo_logs / "ppg" / "procgen-coinrun-v0_1"), "--paper", "ppg", "ppo", "-o", str(output), "--band", "std"])
    assert png_size(output) == (800, 500)
    # Evaluation curve + explicit game and x range
    output = tmp_path / "paper_eval.png"
    plot.main(
        [str(zoo_logs), "--curve", "eval", "--paper", "ppg", "--game", "starpilot", "--x-max", "25e6", "-o", str(output)]
    )
    assert png_size(output) == (800, 500)
    # Paper curves alone
    output = tmp_path / "paper_only.png"
    plot.main(["--paper", "ppo", "--game", "bigfish", "-o", str(output), "--dpi", "80"])
    assert png_size(output) == (640, 400)
    # Two games: the game cannot be guessed
    write_monitor(tmp_path / "other" / "procgen-ninja-v0_1" / "0.monitor.csv", 10, seed=0)
    with pytest.raises(ValueError, match="--game"):
        plot.plot_learning_curves([str(zoo_logs), str(tmp_path / "other")], output=str(tmp_path / "x.png"), paper=["ppg"])


def test_plot_errors(tmp_path: Path):
    with pytest.raises(FileNotFoundError):
        plot.plot_learning_curves([str(tmp_path / "missing")], output=str(tmp_path / "x.png"))
    with pytest.raises(ValueError, match="Nothing to plot"):
        plot.plot_learning_curves([str(tmp_path)], output=str(tmp_path / "x.png"))
    with pytest.raises(ValueError, match="labels"):
        write_monitor(tmp_path / "run_1" / "0.monitor.csv", 5, seed=0)
        plot.plot_learning_curves([str(tmp_path)], output=str(tmp_path / "x.png"), labels=["a", "b"])


def test_detect_game():
    assert plot.detect_game(["procgen-starpilot-v0"]) == "starpilot"
    assert plot.detect_game(["procgen/coinrun-v0", "coinrun easy"]) == "coinrun"
    assert plot.detect_game(["CartPole-v1"]) is None
    assert plot.detect_game(["procgen-coinrun-v0", "procgen-ninja-v0"]) is None


def test_packaged_paper_data():
    data_dir = curves_module.PAPER_DATA_DIR
    # Shipped inside the package, with its attribution
    assert data_dir.is_relative_to(Path(plot.__file__).parent)
    assert (data_dir / "LICENSE").read_text().startswith("The MIT License")
    assert "openai/phasic-policy-gradient" in (data_dir / "README.md").read_text()
    for game in PROCGEN_GAMES:
        table = pd.read_csv(data_dir / f"{game}.csv", comment="#")
        assert list(table.columns) == ["steps"] + [f"{exp}_run{run}" for exp in ("ppg", "ppo") for run in range(3)]
        assert len(table) == 763
        assert table["steps"].iloc[0] == 131_072 and table["steps"].iloc[-1] == 100_007_936
        assert not table.isna().any().any()
    # The 25M numbers of the paper (ppg-reference 10.1): coinrun PPG 8.81, PPO 7.57; starpilot 100M PPG 23.85
    curves = plot.load_paper_curves("coinrun", "ppg")
    at_25m = [returns[steps == 25_034_752][0] for steps, returns in curves]
    assert np.mean(at_25m) == pytest.approx(8.81, abs=0.005)
    curves = plot.load_paper_curves("coinrun", "ppo")
    assert np.mean([returns[steps == 25_034_752][0] for steps, returns in curves]) == pytest.approx(7.57, abs=0.005)
    curves = plot.load_paper_curves("starpilot", "ppg")
    assert np.mean([returns[-1] for _, returns in curves]) == pytest.approx(23.85, abs=0.005)
    with pytest.raises(ValueError, match="Procgen game"):
        plot.load_paper_curves("pong", "ppg")


def test_procgen_is_imported_only_to_plot_procgen_games(capsys):
    """plot.py imports sb3_ppg.procgen inside the functions that need the game list, not at module level."""
    import ast

    tree = ast.parse(Path(plot.__file__).read_text())
    top_level_modules = [
        alias.name if isinstance(node, ast.Import) else node.module
        for node in tree.body
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    ]
    assert not any("procgen" in module for module in top_level_modules)
    # --game is still checked against the Procgen games
    assert plot.parse_args(["logs", "--game", "starpilot"]).game == "starpilot"
    with pytest.raises(SystemExit):
        plot.parse_args(["logs", "--game", "pong"])
    assert "invalid choice: 'pong' (choose from bigfish, bossfight," in capsys.readouterr().err


def test_eval_curve_of_a_run_without_evaluations(tmp_path: Path, capsys):
    """A run trained without --eval-freq: the message says it has no evaluations and how to get them."""
    run = tmp_path / "logs" / "ppg" / "CartPole-v1_1"
    write_monitor(run / "0.monitor.csv", 10, seed=0)
    with pytest.raises(SystemExit) as error:
        plot.main([str(run), "--curve", "eval", "-o", str(tmp_path / "x.png")])
    message = str(error.value)
    assert message.startswith(f"error: Nothing to plot: {run} has no evaluations (evaluations.npz), only training episodes")
    assert "--eval-freq N" in message and "--curve train" in message
    assert not (tmp_path / "x.png").exists()
    # The whole log folder: the runs are named
    with pytest.raises(ValueError, match=f"{run} has no evaluations"):
        plot.plot_learning_curves([str(tmp_path / "logs")], output=str(tmp_path / "x.png"), curve_type="eval")
    # An evaluation log without any evaluation yet
    np.savez(run / "evaluations.npz", timesteps=np.zeros(0), results=np.zeros((0, 5)), ep_lengths=np.zeros((0, 5)))
    with pytest.raises(ValueError, match="hold no evaluation yet"):
        plot.plot_learning_curves([str(run)], output=str(tmp_path / "x.png"), curve_type="eval")
    # No run at all
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no run found"):
        plot.plot_learning_curves([str(tmp_path / "empty")], output=str(tmp_path / "x.png"))


def test_seeds_of_different_lengths(tmp_path: Path, capsys):
    """Seeds that end far apart are averaged where all have data, the plot ends there, and a line says so."""
    steps_short, steps_long = np.linspace(100, 1000, 10), np.linspace(100, 4000, 40)
    groups = {
        "a": [(steps_short, np.ones(10)), (steps_long, np.ones(40))],
        "b": [(np.linspace(100, 2000, 20), np.ones(20))],
    }
    assert plot.last_drawn_step(groups) == 2000
    assert plot.report_unequal_seeds(groups)
    message = capsys.readouterr().err
    assert "a: its 2 runs, averaged as seeds, end at different steps (1,000 to 4,000); their mean is drawn up to 1,000" in (
        message
    )
    assert "b:" not in message
    # Within the range shown, the seeds are alike
    assert not plot.report_unequal_seeds(groups, x_max=1000)
    # Seeds that end close together (the last episodes of runs of the same length) are not reported
    assert not plot.report_unequal_seeds({"a": [(steps_long, np.ones(40)), (steps_long[:-1], np.ones(39))]})
    assert capsys.readouterr().err == ""
    # Through the command line
    root = tmp_path / "logs" / "ppg"
    write_monitor(root / "procgen-coinrun-v0_1" / "0.monitor.csv", 10, seed=0)
    write_monitor(root / "procgen-coinrun-v0_2" / "0.monitor.csv", 200, seed=1)
    plot.main([str(tmp_path / "logs"), "-o", str(tmp_path / "x.png"), "--smooth", "1"])
    assert "procgen-coinrun-v0: its 2 runs, averaged as seeds, end at different steps" in capsys.readouterr().err
    assert png_size(tmp_path / "x.png") == (800, 500)


@pytest.mark.parametrize(
    "text, line",
    [
        (b"garbage\nmore garbage\n", 1),  # pandas' KeyError: 't' (issue 29)
        (b'#{"t_start": 1.0}\nr,l,t\n1.5,10,0.5\n2.5,10,0.6,9\n3.5,10,0.7\n', 4),  # a line of 4 fields
        (b'#{"t_start": 1.0}\r\nr,l,t\r\n1.5,10,0.5\r\nnan?,10,0.6\r\n', 4),  # not a number
        (b'#{"t_start": 1.0}\nr,l,t\n1.5,10,0.5\n\n3.5,10,0.7\n', 4),  # an empty line
        (b'#{"t_start: 1.0}\nr,l,t\n1.5,10,0.5\n', 1),  # a broken header
        (b'#{"t_start": 1.0}\nr,l,t\n1.5,10,0.5\n\xff\xfe,10,0.6\n', 4),  # not UTF-8
    ],
)
def test_a_damaged_monitor_file_is_named(tmp_path: Path, text: bytes, line: int):
    """
    A damaged monitor file stops the plot with a one-line error naming the file and the line, even when the other
    runs are fine (a seed left out would change the mean over seeds): SB3's own load_results also refuses it.
    """
    write_monitor(tmp_path / "logs" / "CartPole-v1_1" / "0.monitor.csv", 20, seed=0)
    damaged = tmp_path / "logs" / "CartPole-v1_2" / "0.monitor.csv"
    damaged.parent.mkdir(parents=True)
    damaged.write_bytes(text)
    with pytest.raises(SystemExit) as error:
        plot.main([str(tmp_path / "logs"), "-o", str(tmp_path / "x.png")])
    message = str(error.value.code)
    assert message.startswith(f"error: {damaged} is not a readable SB3 monitor file: line {line} ")
    assert "\n" not in message and "Repair or remove that file, or plot the other runs." in message
    assert not (tmp_path / "x.png").exists()


def test_an_unfinished_last_line_of_a_monitor_file_is_left_out(tmp_path: Path):
    """A run still writing its monitor file (or killed mid-line): its unfinished last episode is not plotted."""
    path = tmp_path / "run_1" / "0.monitor.csv"
    write_monitor(path, 5, seed=0)
    lengths = pd.read_csv(path, skiprows=1)["l"].to_numpy()
    with open(path, "a") as file_handler:
        file_handler.write("7.5,12")
    (curve,) = plot.load_curves([str(path)])
    np.testing.assert_array_equal(curve.steps, np.cumsum(lengths))


def test_plot_writes_and_names_the_png(tmp_path: Path, monkeypatch, capsys):
    """``-o name`` writes name.png and says so (it said ``name``); ``~`` is the home folder (issue 29)."""
    write_monitor(tmp_path / "logs" / "run_1" / "0.monitor.csv", 10, seed=0)
    monkeypatch.chdir(tmp_path)
    plot.main(["logs", "-o", "curves"])
    assert capsys.readouterr().out == f"Learning curves written to {tmp_path / 'curves.png'}\n"
    assert png_size(tmp_path / "curves.png") == (800, 500) and not (tmp_path / "curves").exists()
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    plot.main(["~/../logs", "-o", "~/plots/curves.png"])
    assert capsys.readouterr().out == f"Learning curves written to {tmp_path / 'home' / 'plots' / 'curves.png'}\n"
    assert png_size(tmp_path / "home" / "plots" / "curves.png") == (800, 500) and not (tmp_path / "~").exists()


def test_plot_paper_over_an_easy_run_says_so(zoo_logs: Path, tmp_path: Path):
    """--paper draws the paper's hard-mode curves: over an easy-mode run (its config.yml) it warns, and the plot says
    so; over a hard-mode run (or one without a mode: procgen's default) it does not."""
    run = zoo_logs / "ppg" / "procgen-coinrun-v0_1"
    (run / "procgen-coinrun-v0").mkdir(exist_ok=True)
    config = run / "procgen-coinrun-v0" / "config.yml"
    config.write_text("- - env_kwargs\n    - distribution_mode: easy\n      num_levels: 0\n")
    assert plot.run_distribution_modes([str(run)]) == {str(run): "easy"}
    with pytest.warns(UserWarning, match="the paper's curves are Procgen's hard mode, these runs trained in easy mode"):
        plot.plot_learning_curves([str(run)], output=str(tmp_path / "easy.png"), paper=["ppg"])
    config.write_text("- - env_kwargs\n    - num_levels: 0\n")
    assert plot.run_distribution_modes([str(run / "0.monitor.csv")]) == {str(run): "hard"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plot.plot_learning_curves([str(run)], output=str(tmp_path / "hard.png"), paper=["ppg"])


def test_reference_lines_and_points(zoo_logs: Path, tmp_path: Path, monkeypatch):
    """The quick start's PNG: random actions as a horizontal line, evaluations as points with error bars."""
    from matplotlib.figure import Figure

    saved = []
    savefig = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda self, *args, **kwargs: (saved.append(self), savefig(self, *args, **kwargs)))
    plot.plot_learning_curves(
        [str(zoo_logs / "ppg" / "procgen-coinrun-v0_1")],
        output=str(tmp_path / "extras.png"),
        reference_lines={"random actions": 1.5},
        points={"evaluations": (np.array([1000, 2000]), np.array([2.0, 3.0]), np.array([0.5, 0.4]))},
    )
    (axis,) = saved[0].axes
    labels = [text.get_text() for text in axis.get_legend().get_texts()]
    assert "random actions" in labels and "evaluations" in labels
    random_line = next(line for line in axis.get_lines() if line.get_label() == "random actions")
    assert list(random_line.get_ydata()) == [1.5, 1.5]
    points = next(container for container in axis.containers if container.get_label() == "evaluations")
    np.testing.assert_array_equal(points.lines[0].get_xydata(), [[1000, 2.0], [2000, 3.0]])


def test_runs_of_other_folders_or_settings_are_not_seeds(tmp_path: Path):
    """
    Run folders named alike (both _1) in two log folders were drawn as one experiment's 2 seeds (issue 51): seeds share
    their folder and settings; the experiments are told apart by their folders, then by their settings.
    """
    write_monitor(tmp_path / "a" / "ppg" / "CartPole-v1_1" / "0.monitor.csv", 30, seed=0)
    write_monitor(tmp_path / "b" / "ppg" / "CartPole-v1_1" / "0.monitor.csv", 30, seed=1)
    names = [curve.name for curve in plot.load_curves([str(tmp_path / "a"), str(tmp_path / "b")])]
    assert names == ["a/ppg/CartPole-v1", "b/ppg/CartPole-v1"]
    # In one folder: _1 and _2 are seeds, unless their hyperparameters differ
    write_monitor(tmp_path / "a" / "ppg" / "CartPole-v1_2" / "0.monitor.csv", 30, seed=2)
    assert [curve.name for curve in plot.load_curves([str(tmp_path / "a")])] == ["CartPole-v1"] * 2
    for run, n_steps in (("CartPole-v1_1", 64), ("CartPole-v1_2", 128)):
        (tmp_path / "a" / "ppg" / run / "CartPole-v1").mkdir()
        (tmp_path / "a" / "ppg" / run / "CartPole-v1" / "config.yml").write_text(f"- - n_steps\n  - {n_steps}\n")
    names = [curve.name for curve in plot.load_curves([str(tmp_path / "a")])]
    assert names == ["CartPole-v1 (settings of CartPole-v1_1)", "CartPole-v1 (settings of CartPole-v1_2)"]


@pytest.mark.parametrize("figsize", [(8.0, 5.0), (5.0, 4.0)])
def test_the_paper_plots_subtitle_fits(zoo_logs: Path, tmp_path: Path, monkeypatch, figsize):
    """The --paper plot's subtitle (the notes) ran past both edges of the figure (issue 51): it is wrapped to fit."""
    from matplotlib.figure import Figure

    saved = []
    savefig = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda self, *args, **kwargs: (saved.append(self), savefig(self, *args, **kwargs)))
    run = zoo_logs / "ppg" / "procgen-coinrun-v0_1"
    (run / "procgen-coinrun-v0" / "config.yml").write_text("- - env_kwargs\n    - distribution_mode: easy\n")
    with pytest.warns(UserWarning, match="not comparable"):
        plot.plot_learning_curves(
            [str(zoo_logs / "ppg")], output=str(tmp_path / "paper.png"), paper=["ppg", "ppo"], game="coinrun", figsize=figsize
        )
    figure = saved[0]
    renderer = figure.canvas.get_renderer()
    (axis,) = [axis for axis in figure.axes if axis.get_title()]
    box = axis.title.get_window_extent(renderer)
    assert "400 episodes" in axis.get_title() and "easy mode" in axis.get_title()
    assert 0 <= box.x0 and box.x1 <= figure.bbox.width and box.y1 <= figure.bbox.height


def test_points_after_the_last_episode_are_drawn(tmp_path: Path, monkeypatch):
    """
    The quick start's PNG shows every evaluation it reports: its final evaluations come after the last finished
    training episode, and the x axis reaches them (regression: it ended at the last episode, hiding 2 of 3 points).
    """
    from matplotlib.figure import Figure

    saved = []
    savefig = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda self, *args, **kwargs: (saved.append(self), savefig(self, *args, **kwargs)))
    write_monitor(tmp_path / "run" / "0.monitor.csv", 40, seed=0)
    last_episode_end = float(pd.read_csv(tmp_path / "run" / "0.monitor.csv", skiprows=1)["l"].sum())
    steps = np.array([last_episode_end / 2, last_episode_end + 260, last_episode_end + 260])
    values, errors = np.array([1.0, 12.0, 30.0]), np.array([0.5, 0.4, 2.0])
    evaluations = {"evaluations": (steps, values, errors)}
    plot.plot_learning_curves([str(tmp_path / "run")], output=str(tmp_path / "curve.png"), smoothing=5, points=evaluations)
    (axis,) = saved[0].axes
    (left, right), (bottom, top) = axis.get_xlim(), axis.get_ylim()
    points = next(container for container in axis.containers if container.get_label() == "evaluations")
    for x, y in points.lines[0].get_xydata():
        assert left < x < right and bottom < y < top, (x, y, axis.get_xlim(), axis.get_ylim())
    assert right <= steps.max() * (1 + plot.POINTS_MARGIN)
    # The training curve's own end stays where it was without points
    plot.plot_learning_curves([str(tmp_path / "run")], output=str(tmp_path / "curve.png"), smoothing=5)
    assert saved[1].axes[0].get_xlim() == (0.0, last_episode_end)
