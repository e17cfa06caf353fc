"""benchmarks/procgen_paper.py: the paper's table in one command, end to end at a tiny budget, and its constants."""

import json
import re

import numpy as np
import pytest
from benchmark_scripts import load_script  # tests/ is on sys.path

from sb3_ppg import PROCGEN_GAMES


@pytest.fixture(scope="module")
def paper():
    return load_script("procgen_paper")


def read_rows(path) -> np.ndarray:
    """The rows of a run's CSV log, read here without the scripts' helpers."""
    text = path.read_text().strip()
    return np.array([[float(value) for value in line.split(",")] for line in text.splitlines()]).reshape(-1, 3)


def table_row(report: str, first_cells: str, n_cells: int) -> list[str]:
    """The cells of the report's table row of ``n_cells`` cells that starts with ``first_cells``."""
    rows = [line.strip("|").split("|") for line in report.splitlines() if line.startswith(f"| {first_cells} |")]
    rows = [[cell.strip() for cell in row] for row in rows if len(row) == n_cells]
    assert len(rows) == 1, (first_cells, rows)
    return rows[0]


def test_paper_constants(paper):
    """The copied per-game numbers give the paper's published means, and the shipped mean curves agree with them."""
    for mode in ("easy", "hard"):
        assert sorted(paper.NORMALIZATION[mode]) == sorted(PROCGEN_GAMES)
        assert all(low < high for low, high in paper.NORMALIZATION[mode].values())
    assert sorted(paper.PAPER_RESULTS) == sorted(PROCGEN_GAMES)
    for (algo, steps), published in paper.PAPER_MEAN_NORMALIZED.items():
        assert round(paper.paper_mean_normalized(list(PROCGEN_GAMES), algo, steps), 3) == published
    steps, curves = paper.read_mean_paper_curves()
    for point, row_steps in paper.PAPER_STEPS.items():
        (row,) = np.flatnonzero(steps == row_steps)
        for game in PROCGEN_GAMES:
            for algo in ("ppg", "ppo"):
                mean, low, high = paper.PAPER_RESULTS[game][algo][point]
                assert low <= mean <= high
                assert curves[f"{game}_{algo}"][row] == pytest.approx(mean, abs=1e-4)
    # At the paper preset's 256 envs x 256 steps a 25M budget ends on the paper's 25M row
    args = paper.parse_args(["--total-timesteps", "25M"])
    assert (args.n_envs, args.n_steps, args.distribution_mode) == (256, 256, "hard")
    assert paper.rollout_boundary(args, args.total_timesteps) == paper.PAPER_STEPS[25_000_000]
    assert paper.score_points(paper.parse_args(["--total-timesteps", "100M"])) == [25_000_000, 100_000_000]
    assert [paper.parse_steps(text) for text in ("25M", "500k", "1e6", "4096")] == [25_000_000, 500_000, 10**6, 4096]
    with pytest.raises(SystemExit):
        paper.parse_args(["--total-timesteps", "many"])
    with pytest.raises(SystemExit):
        paper.parse_args(["--games", "starpilot,pong"])


def test_read_curve_of_an_empty_log(tmp_path):
    """A run killed before its first rollout ended leaves empty logs: the next chunk reads and rewrites them."""
    learning = load_script("procgen_learning")
    path = tmp_path / "curve.csv"
    path.write_text("")
    rows = learning.read_curve(str(path), 128)
    assert rows.shape == (0, 3)
    np.savetxt(path, rows, delimiter=",", fmt=["%d", "%.6g", "%d"])  # what train_chunk does with it
    assert path.read_text() == ""


def test_run_score(paper):
    """A run's score: the last N episodes that ended at or before the rollout boundary."""
    episodes = np.array([[100, 1.0, 10], [200, 2.0, 10], [200, 4.0, 10], [300, 8.0, 10]])
    assert paper.run_score(episodes, 200, 2) == (3.0, 2)
    assert paper.run_score(episodes, 300, 10) == (3.75, 4)
    assert paper.run_score(episodes, 199, 5) == (1.0, 1)
    score, count = paper.run_score(episodes, 99, 5)
    assert np.isnan(score) and count == 0
    assert paper.normalized(35.0, "starpilot", "hard") == 1.0 and paper.normalized(2.5, "starpilot", "easy") == 0.0


@pytest.mark.parametrize("preset", ["paper", "cleanrl"])
def test_paper_table_algorithms(paper, preset):
    """PPG runs the preset; PPO is the paper's baseline (shared trunk, 3 epochs, no aux phase) and otherwise the same."""
    from sb3_ppg.procgen import get_procgen_preset

    args = paper.parse_args(["--preset", preset, "--channels", "2,4,4"])
    ppg, ppo = paper.model_kwargs(args, "ppg"), paper.model_kwargs(args, "ppo")
    expected = get_procgen_preset(preset).ppg_kwargs(args.n_envs)
    expected["policy_kwargs"]["features_extractor_kwargs"] = dict(channels=(2, 4, 4))
    assert ppg == dict(expected, precision="fp32", micro_batch_size="auto")
    assert ppo.pop("policy_kwargs") == dict(arch="shared", features_extractor_kwargs=dict(channels=(2, 4, 4)))
    assert (ppo.pop("n_epochs"), ppo.pop("n_aux_epochs"), ppo.pop("n_value_epochs")) == (3, 0, None)
    ppg.pop("policy_kwargs")
    assert (ppg.pop("n_epochs"), ppg.pop("n_aux_epochs")) == (1, 6)
    assert ppo == ppg
    assert (
        paper.env_kwargs(paper.parse_args(["--preset", preset, "--distribution-mode", "easy"]))["distribution_mode"] == "easy"
    )


def test_paper_table_end_to_end(paper, tmp_path, capsys):
    """
    2 games x PPG, PPO x 1 seed at 512 env steps: a first invocation trains one rollout of each run, a second skips the
    run another invocation holds, a third completes it; the report's numbers are those computed here from the logs.
    """
    folder = tmp_path / "runs"
    args = ["--games", "starpilot,fruitbot", "--seeds", "0", "--total-timesteps", "512", "--n-envs", "8"]
    args += ["--n-steps", "16", "--n-policy-iters", "2", "--n-aux-epochs", "1", "--channels", "2,2,2"]
    args += ["--score-episodes", "4", "--device", "cpu", "--folder", str(folder)]
    runs = [f"{game}_{algo}_seed0" for game in ("starpilot", "fruitbot") for algo in ("ppg", "ppo")]

    assert not paper.main([*args, "--chunk-minutes", "0"])
    for run in runs:
        assert read_rows(folder / run / "curve.csv")[:, 0].tolist() == [128]
        assert (folder / run / "checkpoints").is_dir() and not (folder / run / "complete.json").exists()
    assert not (folder / "report.md").exists()

    # Another invocation holds starpilot PPO: this one completes the other three and leaves it
    with paper.run_lock(str(folder / "starpilot_ppo_seed0")) as held:
        assert held
        assert not paper.main(args)
    assert "starpilot ppo seed 0: being trained by another invocation, skipped" in capsys.readouterr().out
    assert read_rows(folder / "starpilot_ppo_seed0" / "curve.csv")[:, 0].tolist() == [128]
    assert paper.main(args)
    assert "All runs are complete." in capsys.readouterr().out

    report = (folder / "report.md").read_text()
    ranges = {"starpilot": (1.5, 35.0), "fruitbot": (-0.5, 27.2)}  # hard mode, Cobbe et al. 2020
    normalized = {"ppg": [], "ppo": []}
    for run in runs:
        game, algo, _ = run.split("_")
        # The resumed chunk continued the run: one curve row per rollout, each the mean of SB3's last 100 episodes,
        # which are the last 100 of the episode log up to that step
        curve, episodes = read_rows(folder / run / "curve.csv"), read_rows(folder / run / "episodes.csv")
        assert curve[:, 0].tolist() == [128, 256, 384, 512]
        assert np.all(np.diff(episodes[:, 0]) >= 0) and episodes[-1, 0] <= 512 and len(episodes) > 0
        for steps, mean, count in curve:
            window = episodes[episodes[:, 0] <= steps, 1][-100:]
            assert count == len(window)
            assert (np.isnan(mean) and count == 0) or mean == pytest.approx(np.mean(window), abs=1e-5)
        chunks = np.loadtxt(folder / run / "chunks.csv", delimiter=",", ndmin=2)
        assert chunks[:, :2].tolist() == [[0, 128], [128, 512]]
        # Complete: the final model kept, the checkpoints deleted
        assert json.loads((folder / run / "complete.json").read_text())["num_timesteps"] == 512
        assert (folder / run / "final_model.zip").stat().st_size > 0 and not (folder / run / "checkpoints").exists()
        # The score: mean of the last 4 episodes that ended by step 512
        last = episodes[:, 1][-4:]
        low, high = ranges[game]
        normalized[algo].append((np.mean(last) - low) / (high - low))
        assert table_row(report, f"{game} | {algo.upper()} | 0", 4)[3] == f"{np.mean(last):.2f} ({len(last)})"
        row = table_row(report, game, 11)
        column = 0 if algo == "ppg" else 1
        assert row[1 + column] == f"{np.mean(last):.2f}"
        assert row[3 + column] == f"{normalized[algo][-1]:.3f}"
    assert table_row(report, "starpilot", 11)[5:] == ["17.98", "11.70", "0.492", "0.305", "34.82 +- 13.77", "32.47 +- 11.21"]
    means = table_row(report, "**mean normalized score (2 games)**", 11)
    assert means[3:5] == [f"**{np.mean(normalized['ppg']):.3f}**", f"**{np.mean(normalized['ppo']):.3f}**"]
    paper_ppg = np.mean([(17.9767 - 1.5) / 33.5, (21.4917 + 0.5) / 27.7])
    assert means[7] == f"**{paper_ppg:.3f}**"
    assert "is below the paper's 25M and 100M: these scores are not comparable" in report
    assert "The paper's mean normalized score over all 16 games at 25M: PPG 0.481, PPO 0.255." in report
    assert re.search(r"n_envs 8 \(preset: 256\)", report)
    for image in ("report_curves.png", "report_scores.png"):
        assert (folder / image).stat().st_size > 0

    # The folder's settings are fixed; a completed run without checkpoints cannot train on
    with pytest.raises(SystemExit, match=r"n_steps=16 there, 32 here"):
        paper.main([*args, "--n-steps", "32"])
    with pytest.raises(SystemExit, match=r"starpilot ppg seed 0 was completed at 512 env steps and its checkpoints"):
        paper.main([*args, "--total-timesteps", "1024"])


def test_paper_table_refuses_duplicate_runs(paper, capsys):
    """The same game, algorithm or seed twice is one run counted once: refused (it looped, never complete, issue 29)."""
    for option, value, repeated in (("--seeds", "0,1,0", "0"), ("--games", "starpilot,bigfish,starpilot", "starpilot")):
        with pytest.raises(SystemExit):
            paper.parse_args([option, value])
        assert f"error: {option} names {repeated} more than once" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        paper.parse_args(["--algos", "ppo,ppg,ppo,ppg"])
    assert "error: --algos names ppo, ppg more than once" in capsys.readouterr().err


#: A run's logs at a checkpoint after 256 env steps (rollouts of 128): the curve's rows agree with the episodes (the
#: mean return of the episodes so far, their count)
CURVE = "128,1.5,2\n256,2.5,4\n"
EPISODES = "100,1,10\n120,2,20\n200,3,30\n250,4,40\n"


@pytest.mark.parametrize(
    "curve, episodes, steps",
    [
        # A kill cut the appends of the rollout after the checkpoint short: unfinished last lines
        (CURVE + "384,3.5", EPISODES + "300,5", 256),
        (CURVE + "384,3.5,6\n512,", EPISODES + "300,5,50\n400,6", 256),
        # Garbled lines that can only come after the checkpoint: after its curve row, after an episode past it
        (CURVE + "384,3.5\n512,4.5,8\n", EPISODES + "300,5,50\n3x0,6,60\n", 256),
        (CURVE + "3,8,4,3.5,6\n", EPISODES + "300,5,50\n400,six,60\n", 256),
        ("128,1.5,2\n256,2.5\n", "100,1,10\n120,2,20\n200,3,30\n200,4\n", 128),
        # A new run (no checkpoint): every row goes
        ("12x,1.5,2\n", "100,1\n", 0),
    ],
)
def test_resume_cuts_a_damaged_log_back_to_the_checkpoint(tmp_path, curve, episodes, steps):
    """A damaged line after the checkpoint goes with the rows after it; the logs are then whole (issue 29)."""
    learning = load_script("procgen_learning")
    (tmp_path / "curve.csv").write_text(curve)
    (tmp_path / "episodes.csv").write_text(episodes)
    learning.cut_logs(str(tmp_path), steps, "starpilot ppg seed 0")
    expected_curve = read_rows_of(CURVE)
    expected_episodes = read_rows_of(EPISODES)
    assert read_rows(tmp_path / "curve.csv").tolist() == expected_curve[expected_curve[:, 0] <= steps].tolist()
    assert read_rows(tmp_path / "episodes.csv").tolist() == expected_episodes[expected_episodes[:, 0] <= steps].tolist()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["curve.csv", "episodes.csv"]


def read_rows_of(text: str) -> np.ndarray:
    """The rows of a log's text."""
    return np.array([[float(value) for value in line.split(",")] for line in text.splitlines()]).reshape(-1, 3)


@pytest.mark.parametrize(
    "name, text, steps, damage",
    [
        # A garbled line before the checkpoint's rows
        ("curve.csv", "12x,1.5,2\n256,2.5,4\n", 256, "line 1 is not three numbers"),
        ("curve.csv", "128,1.5\n256,2.5,4\n", 256, "line 1 has 2 fields, not 3"),
        ("episodes.csv", "100,1,10\n120,2\n200,3,30\n250,4,40\n", 256, "line 2 has 2 fields, not 3"),
        ("episodes.csv", "100,1,10\n120,2,20\n20,3,30\n250,4,40\n", 256, "line 3 goes back to 20 env steps after 120"),
        # An unfinished last line whose episodes before it are not the curve's at the checkpoint (a log cut short by
        # something else than an append: the curve's row at 256 counts 4 episodes)
        ("episodes.csv", "100,1,10\n120,2,20\n200,3", 256, "line 3 is unfinished"),
        # ... or their mean return differs (one episode too few of 100)
        ("episodes.csv", "".join(f"{i},{i % 3},1\n" for i in range(1, 101)) + "256,7", 256, "line 101 is unfinished"),
    ],
)
def test_resume_names_a_damaged_log_it_cannot_cut(tmp_path, name, text, steps, damage):
    """A damaged line that may hide rows up to the checkpoint: a one-line error naming the file, the run, what to delete."""
    learning = load_script("procgen_learning")
    logs = {"curve.csv": CURVE, "episodes.csv": EPISODES}
    if text.count("\n") >= 100:  # the curve's last 100 episodes: those of the log but the first, and one of return 2
        logs["curve.csv"] = f"128,1.5,2\n256,{np.mean([i % 3 for i in range(2, 101)] + [2])},100\n"
    logs[name] = text
    for log, content in logs.items():
        (tmp_path / log).write_text(content)
    with pytest.raises(learning.DamagedLogError) as error:
        learning.cut_logs(str(tmp_path), steps, "starpilot ppg seed 0")
    message = str(error.value)
    assert "\n" not in message and damage in message
    assert f"The log {tmp_path / name} of run starpilot ppg seed 0 is damaged" in message
    assert f"delete the run's folder {tmp_path} to train the run again" in message
    for log, content in logs.items():  # nothing rewritten
        assert (tmp_path / log).read_text() == content


def test_a_kill_while_logs_are_cut_back_leaves_them_whole(tmp_path, monkeypatch):
    """The cut-back rewrites each log through a temporary file: until it replaces the log, the log is untouched."""
    learning = load_script("procgen_learning")
    (tmp_path / "curve.csv").write_text(CURVE)
    (tmp_path / "episodes.csv").write_text(EPISODES)

    def killed(*_):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(learning.os, "replace", killed)
        with pytest.raises(KeyboardInterrupt):
            learning.cut_logs(str(tmp_path), 128, "starpilot ppg seed 0")
    assert (tmp_path / "curve.csv").read_text() == CURVE and (tmp_path / "episodes.csv").read_text() == EPISODES
    # The next resume cuts them, and removes the temporary file the kill left
    learning.cut_logs(str(tmp_path), 128, "starpilot ppg seed 0")
    assert (tmp_path / "curve.csv").read_text() == "128,1.5,2\n"
    assert (tmp_path / "episodes.csv").read_text() == "100,1,10\n120,2,20\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["curve.csv", "episodes.csv"]


def test_paper_table_damaged_logs(paper, tmp_path):
    """
    A garbled curve.csv or episodes.csv (issue 29): after the checkpoint, the next invocation cuts it back and goes on;
    before it, and in a complete run's logs (--report-only), a one-line error names the file, the run, what to delete.
    """
    folder = tmp_path / "runs"
    args = ["--games", "bossfight", "--algos", "ppo", "--seeds", "0", "--total-timesteps", "256", "--n-envs", "8"]
    args += ["--n-steps", "16", "--channels", "2,2,2", "--score-episodes", "4", "--device", "cpu"]
    args += ["--folder", str(folder)]
    run = folder / "bossfight_ppo_seed0"
    assert not paper.main([*args, "--chunk-minutes", "0"])
    curve = (run / "curve.csv").read_text()
    assert read_rows(run / "curve.csv")[:, 0].tolist() == [128]

    # A garbled line before the checkpoint's row: the run cannot go on
    (run / "curve.csv").write_text("1x8,0.5\n" + curve)
    with pytest.raises(SystemExit) as error:
        paper.main(args)
    message = str(error.value.code)
    assert f"The log {run / 'curve.csv'} of run bossfight ppo seed 0 is damaged: line 1 has 2 fields" in message
    assert f"delete the run's folder {run} to train the run again from the start" in message and "\n" not in message
    # In progress, the report shows the run's curve up to the damage
    assert not paper.main([*args, "--report-only"])

    # Garbled lines after it (a non-numeric line, an unfinished one): cut back, the run completes
    (run / "curve.csv").write_text(curve + "256,nope,3\n")
    with open(run / "episodes.csv", "a") as file:
        file.write("250,1.")
    assert paper.main(args)
    assert read_rows(run / "curve.csv")[:, 0].tolist() == [128, 256]
    episodes = read_rows(run / "episodes.csv")
    assert np.all(np.diff(episodes[:, 0]) >= 0) and episodes[-1, 0] <= 256

    # A complete run's damaged log: --report-only names it
    (run / "episodes.csv").write_text((run / "episodes.csv").read_text() + "256,3.5,120,7\n")
    with pytest.raises(SystemExit) as error:
        paper.main([*args, "--report-only"])
    message = str(error.value.code)
    assert f"The log {run / 'episodes.csv'} of run bossfight ppo seed 0 is damaged: line {len(episodes) + 1} has 4" in message
    assert f"delete the run's folder {run}" in message
