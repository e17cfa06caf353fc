"""
``benchmarks/procgen_vs_cleanrl.py`` (issue 28): sb3-ppg and CleanRL's script side by side, the window table and the
plot with bootstrap bands, end to end at a tiny budget. CleanRL's checkout is not needed: a stand-in script with its
command line and env (``tests/data/scripts/fake_ppg_procgen.py``) runs through ``benchmarks/cleanrl_episodes.py``.
"""

import importlib.util
import os
import sys

import numpy as np
import pytest
from benchmark_scripts import load_script  # tests/ is on sys.path

FAKE_CLEANRL = os.path.join(os.path.dirname(__file__), "data", "scripts", "fake_ppg_procgen.py")
comparison = load_script("procgen_vs_cleanrl")
episodes_runner = load_script("cleanrl_episodes")


def test_window_means_and_bootstrap():
    """Episodes are counted in the window where they end; the bootstrap interval holds the mean, and is a point when
    every episode has the same return."""
    edges = comparison.window_edges(1000, 250)
    assert list(edges) == [0, 250, 500, 750, 1000]
    episodes = np.array([[10, 1.0, 5], [249, 3.0, 7], [250, 5.0, 9], [1000, 7.0, 11]])
    means = comparison.window_means(episodes, edges)
    assert means[0] == 2.0 and means[1] == 5.0 and np.isnan(means[2]) and means[3] == 7.0
    assert list(comparison.window_means(episodes, edges, column=2)[[0, 1, 3]]) == [6.0, 9.0, 11.0]
    rng = np.random.default_rng(0)
    runs = [np.column_stack([rng.integers(0, 1000, 200), rng.normal(seed, 1.0, 200), np.ones(200)]) for seed in range(3)]
    low, high = comparison.bootstrap_interval(runs, edges, 300)
    mean = np.mean([comparison.window_means(run, edges) for run in runs], axis=0)
    assert np.all(low < mean) and np.all(mean < high) and np.all(high - low < 3.0)
    constant = [np.column_stack([np.arange(0, 1000, 10), np.full(100, 2.5), np.ones(100)])] * 3
    low, high = comparison.bootstrap_interval(constant, edges, 50)
    assert np.allclose(low, 2.5) and np.allclose(high, 2.5)


#: CleanRL's script and its stand-in build procgen's gym3 ``ProcgenEnv``: the package ``procgen`` (procgen-mirror, Python <
#: 3.13), which procgen-gym (Python 3.13) does not provide
needs_gym3_procgen = pytest.mark.skipif(
    importlib.util.find_spec("procgen") is None, reason="needs procgen's ProcgenEnv (procgen-mirror, Python < 3.13)"
)


@needs_gym3_procgen
def test_episode_runner_logs_every_episode(tmp_path):
    """The runner logs each episode's raw return and length at the env step where it ends, and marks the log complete."""
    path = tmp_path / "episodes.csv"
    argv = [FAKE_CLEANRL, "--episodes", str(path), "--", "--seed", "3", "--total-timesteps", "600", "--num-envs", "4"]
    saved_argv = sys.argv
    try:
        episodes_runner.main(argv)
    finally:
        sys.argv = saved_argv
    lines = path.read_text().splitlines()
    assert lines[-1] == episodes_runner.COMPLETE
    rows = np.loadtxt(path, delimiter=",", comments="#", ndmin=2)
    assert len(rows) > 0 and np.all(rows[:, 0] % 4 == 0) and np.all(rows[:, 0] <= 600)
    # An env's episodes tile its steps: the lengths of the episodes that ended add up to at most 150 steps per env
    assert rows[:, 2].sum() <= 600 and np.all(rows[:, 2] >= 1)


@pytest.mark.slow
@needs_gym3_procgen
def test_side_by_side_at_a_tiny_budget(tmp_path):
    """Three seeds per side, a few hundred env steps each: the report's window table is the logs' window means."""
    output = tmp_path / "report.md"
    argv = [
        "--cleanrl-script",
        FAKE_CLEANRL,
        "--cleanrl-python",
        sys.executable,
        "--game",
        "starpilot",
        "--seeds",
        "1,2,3",
        "--total-timesteps",
        "384",
        "--window",
        "128",
        "--n-envs",
        "4",
        "--n-steps",
        "16",
        "--bootstrap",
        "50",
        "--channels",
        "4,8,8",
        "--folder",
        str(tmp_path / "runs"),
        "--output",
        str(output),
        "--cleanrl-parallel",
    ]
    with pytest.warns(UserWarning, match="auxiliary"):  # 6 rollouts, no auxiliary phase at N_pi 32
        assert comparison.main(argv)
    args = comparison.parse_args(argv)
    text = output.read_text()
    rows = [line.split(" | ")[0] for line in text.splitlines() if line.startswith("| ") and "window" not in line]
    assert rows == ["| 0-128", "| 128-256", "| 256-384"]
    for side in comparison.SIDES:
        runs = [comparison.read_episodes(comparison.episodes_path(args, side, seed), 384) for seed in (1, 2, 3)]
        assert all(len(run) for run in runs), side  # starpilot ends episodes within 96 steps of random play
        expected = comparison.mean_over_seeds(
            [comparison.window_means(run, comparison.window_edges(384, 128)) for run in runs]
        )
        table = np.loadtxt(f"{os.path.splitext(output)[0]}_starpilot.csv", delimiter=",", dtype=str)
        means = np.array([float(row[3]) for row in table if row[2] == side])
        assert np.allclose(means, expected, equal_nan=True), (side, means, expected)
    assert (tmp_path / "report_starpilot.png").read_bytes()[:4] == b"\x89PNG"
    # A second invocation finds every run complete and trains nothing more
    assert comparison.main(argv)
