"""
The README's Quick start, first command: ``python -m sb3_ppg.train`` (the quick start, run here with a tiny budget)
and what its install gives (video recording).
"""

import contextlib
import importlib
import importlib.util
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch as th
import yaml
from helpers import setup_arguments
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.vec_env import VecMonitor

from sb3_ppg import PPG
from sb3_ppg.cli import quickstart
from sb3_ppg.procgen import ProcgenVecEnv

ROOT = Path(__file__).resolve().parent.parent
# Tiny PPG settings with an auxiliary phase (zoo -params syntax), merged with the quick start's own
TINY_PARAMS = ["n_envs:2", "n_steps:16", "batch_size:16", "n_policy_iters:2", "n_aux_epochs:1", "aux_batch_rollouts:2"]
TINY_TIMESTEPS = 64
# Every evaluation of the tiny run: 2 episodes on 2 envs
TINY_EVAL_EPISODES = 2


@pytest.fixture(scope="module")
def quickstart_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str, Path]:
    """One tiny quick start: its results, everything it printed, its log folder."""
    log_folder = tmp_path_factory.mktemp("quickstart") / "logs"
    output = io.StringIO()
    with pytest.MonkeyPatch.context() as monkeypatch, contextlib.redirect_stdout(output):
        monkeypatch.setattr(quickstart, "QUICKSTART_EVAL_EPISODES", TINY_EVAL_EPISODES)
        monkeypatch.setattr(quickstart, "QUICKSTART_EVAL_ENVS", 2)
        results = quickstart.quickstart(
            ["--quickstart", "-f", str(log_folder), "-n", str(TINY_TIMESTEPS), "-params", *TINY_PARAMS]
        )
    return results, output.getvalue(), log_folder


def test_quickstart_writes_the_run(quickstart_run):
    results, output, log_folder = quickstart_run
    run_folder = log_folder / "ppg" / "procgen-starpilot-v0_1"
    for name in ("procgen-starpilot-v0.zip", "best_model.zip", "evaluations.npz", "0.monitor.csv"):
        assert (run_folder / name).is_file()
        assert str(run_folder / name) in output
    assert (log_folder.parent / "learning_curve.png").is_file()
    assert results["learning_curve"] == str(log_folder.parent / "learning_curve.png")


def test_quickstart_evaluations_are_alike_and_beside_random_actions(quickstart_run):
    """
    The evaluations during training play the quick start's evaluation env (easy mode: the zoo gives its evaluation
    env only the command line's env kwargs, not those of the hyperparameter file), with as many episodes as the
    final evaluation, and random actions are measured on the same levels as the saved model.
    """
    results, output, log_folder = quickstart_run
    run_folder = log_folder / "ppg" / "procgen-starpilot-v0_1"
    with open(run_folder / "procgen-starpilot-v0" / "args.yml") as file_handler:
        args = dict(yaml.load(file_handler, Loader=yaml.UnsafeLoader))
    assert args["eval_env_kwargs"] == {"distribution_mode": "easy", "num_levels": 0, "start_level": 0}
    assert (args["eval_episodes"], args["n_eval_envs"]) == (TINY_EVAL_EPISODES, 2)
    with np.load(run_folder / "evaluations.npz") as evaluations:
        assert list(evaluations["timesteps"]) == [TINY_TIMESTEPS // 2, TINY_TIMESTEPS]
        assert evaluations["results"].shape == (2, TINY_EVAL_EPISODES)
        for step, returns in zip(evaluations["timesteps"], evaluations["results"], strict=True):
            assert quickstart.evaluation_line(f"during training, at step {step:,}", returns) in output
    # Random actions: measured, on the levels of the saved model's evaluation
    eval_env = VecMonitor(
        ProcgenVecEnv(
            2, "starpilot", distribution_mode="easy", num_levels=0, start_level=0, rand_seed=quickstart.QUICKSTART_EVAL_SEED
        )
    )
    policy = quickstart.UniformRandomPolicy(eval_env.action_space, seed=quickstart.QUICKSTART_EVAL_SEED)
    random_returns, _ = evaluate_policy(policy, eval_env, n_eval_episodes=TINY_EVAL_EPISODES, return_episode_rewards=True)
    eval_env.close()
    assert results["random_mean_reward"] == pytest.approx(np.mean(random_returns))
    assert (
        quickstart.evaluation_line("random actions, the same levels", np.asarray(random_returns, dtype=np.float64)) in output
    )
    assert "trained model, saved and loaded:" in output
    assert "Mean return per episode (sampled actions, levels from the full distribution as in training" in output
    assert re.search(r"The trained model (beats|is not clearly better than) random actions", output)


def test_final_evaluation_runs_with_one_torch_thread(quickstart_run, monkeypatch):
    """
    Two torch threads made the final evaluation 30 to 50 times slower on a busy 2-core CPU: it runs with one, and
    gives the caller's thread count back.
    """
    results, _, _ = quickstart_run
    model = PPG.load(results["model"], device="cpu")
    monkeypatch.setattr(quickstart, "QUICKSTART_EVAL_EPISODES", TINY_EVAL_EPISODES)
    monkeypatch.setattr(quickstart, "QUICKSTART_EVAL_ENVS", 2)
    evaluate = quickstart.evaluate_with_progress
    threads_seen = []

    def evaluate_and_record_threads(*args, **kwargs):
        threads_seen.append(th.get_num_threads())
        return evaluate(*args, **kwargs)

    monkeypatch.setattr(quickstart, "evaluate_with_progress", evaluate_and_record_threads)
    threads = th.get_num_threads()
    th.set_num_threads(2)
    try:
        returns = quickstart.evaluate_against_random_actions(model, "starpilot")
        assert th.get_num_threads() == 2
    finally:
        th.set_num_threads(threads)
    assert threads_seen == [1, 1]
    assert {name: len(episode_returns) for name, episode_returns in returns.items()} == {"model": 2, "random": 2}
    # Random actions are seeded: the quick start's own numbers again
    assert np.mean(returns["random"]) == pytest.approx(results["random_mean_reward"])


def test_quickstart_output(quickstart_run):
    """What the quick start prints says what it does: how long, the settings trained, progress, no misleading line."""
    _, output, _ = quickstart_run
    # Said beforehand, before the zoo's first line
    assert output.index(quickstart.QUICKSTART_DURATION) < output.index("==========")
    # No "Same as: <a command that is not the same>" line
    assert "Same as" not in output
    # The hyperparameters shown are the ones trained: the total steps and the -params given, merged with the quick start's
    assert f"('n_timesteps', {TINY_TIMESTEPS})" in output and "25000000" not in output
    assert "('n_envs', 2)" in output and "('aux_batch_rollouts', 2)" in output
    assert "Overwriting n_timesteps" not in output
    # The progress bar, given to the zoo by its import path
    callback_path = re.search(r"\('callback', '([\w.]+)'\)", output).group(1)
    module_name, class_name = callback_path.rsplit(".", 1)
    assert getattr(importlib.import_module(module_name), class_name) is quickstart.QuickstartProgressBar
    # The zoo's env messages are printed once per env: not at all in the quick start
    assert "Normalization activated" not in output and "VecTransposeImage" not in output
    # Progress of the training phases and of the evaluations (the last state of each bar)
    assert "policy + auxiliary phase" in output
    for label in ("Evaluating the trained model", "Evaluating random actions"):
        assert re.search(rf"{label}: 100%\|[^|]*\| {TINY_EVAL_EPISODES}/{TINY_EVAL_EPISODES} ", output), label


def test_quickstart_duration_in_docs():
    for path in ("README.md", "docs/guide/quickstart.rst"):
        text = " ".join((ROOT / path).read_text().split())
        assert quickstart.QUICKSTART_DURATION.split(",")[0] in text, path


def test_progress_bar_estimates_from_the_average_rate(make_model, monkeypatch, capsys):
    """
    At phase boundaries (a train() of a minute after a rollout of a fraction of a second, on the progress bar's clock)
    the remaining time comes from the average rate since the start, not from the last updates' rate (which after a
    pause predicts hours), and the bar says which phase runs.
    """
    import tqdm.std

    clock = {"now": 0.0}

    def fake_time() -> float:
        clock["now"] += 0.001
        return clock["now"]

    monkeypatch.setattr(tqdm.std, "time", fake_time)
    model = make_model(n_envs=2)
    policy_phase = model.train

    def slow_train() -> None:
        clock["now"] += 60.0
        policy_phase()

    monkeypatch.setattr(model, "train", slow_train)
    model.learn(128, callback=quickstart.QuickstartProgressBar())
    output = capsys.readouterr().out
    states = re.findall(r"(\d+)/128 \[(\d\d):(\d\d)<(\d\d):(\d\d)", output)
    assert len(states) >= 4
    for done, elapsed_minutes, elapsed_seconds, left_minutes, left_seconds in states:
        done, elapsed = int(done), 60 * int(elapsed_minutes) + int(elapsed_seconds)
        left = 60 * int(left_minutes) + int(left_seconds)
        # tqdm shows whole seconds: 1 s of rounding on each time
        assert (elapsed - 1) * (128 - done) / done - 1 <= left <= (elapsed + 1) * (128 - done) / done + 1, output
    assert "policy phase" in output and "policy + auxiliary phase" in output and "trained" in output


def test_split_quickstart_params():
    params, rest = quickstart.split_quickstart_params(["-n", "10", "-params", "n_envs:2", "gamma:0.9", "--seed", "1"])
    assert params == {"n_envs": "n_envs:2", "gamma": "gamma:0.9"}
    assert rest == ["-n", "10", "--seed", "1"]
    params, rest = quickstart.split_quickstart_params(["--hyperparams", "ent_coef:-0.0", "-f", "logs"])
    assert params == {"ent_coef": "ent_coef:-0.0"} and rest == ["-f", "logs"]


def test_learning_verdict():
    rng = np.random.default_rng(0)
    random_returns = rng.normal(1.5, 2.0, size=32)
    assert quickstart.learning_verdict(random_returns + 5.0, random_returns, 16_384).startswith("The trained model beats")
    verdict = quickstart.learning_verdict(random_returns + 0.1, random_returns, 16_384)
    assert verdict.startswith("The trained model is not clearly better than random actions yet (+0.10 +/- ")
    assert "16,384 steps" in verdict


def test_video_recording(tmp_path):
    """The recording CI checks after the README's first install command alone, here in the test environment."""
    spec = importlib.util.spec_from_file_location("record_video", ROOT / ".ci" / "record_video.py")
    assert spec is not None and spec.loader is not None
    record_video = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(record_video)
    path = record_video.record_video(str(tmp_path / "video"))
    assert Path(path).parent == tmp_path / "video" and Path(path).stat().st_size > 0


VIDEO_SNIPPET = """
from stable_baselines3.common.vec_env import VecVideoRecorder

from sb3_ppg import make_procgen_env

env = make_procgen_env("starpilot", n_envs=1, distribution_mode="easy", training=False, render_mode="rgb_array")
env = VecVideoRecorder(env, "videos", record_video_trigger=lambda step: step == 0, video_length=5)
env.reset()
for _ in range(7):
    env.step([0])
env.close()
"""


@pytest.mark.slow
def test_video_snippet_prints_no_pkg_resources_notice(tmp_path):
    """The docs' video snippet (docs/guide/quickstart.rst) in a new interpreter: a video, and no setuptools notice about
    pkg_resources (imported by the imageio-ffmpeg that gym3 pins), which the user cannot act on."""
    pytest.importorskip("moviepy")
    env = {key: value for key, value in os.environ.items() if key != "PYTHONWARNINGS"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))
    result = subprocess.run(
        [sys.executable, "-c", VIDEO_SNIPPET], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert list((tmp_path / "videos").glob("*.mp4"))
    assert "pkg_resources" not in result.stderr, result.stderr[-3000:]


def test_zoo_extra_installs_the_video_path():
    """
    The README's first command installs the zoo extra: it must bring what recording a video imports (moviepy), and
    setuptools < 81 where gym3 pins imageio-ffmpeg 0.3, which imports pkg_resources.
    """
    requirements = setup_arguments()["extras_require"]["zoo"]
    assert any(requirement.startswith("moviepy") for requirement in requirements)
    assert "setuptools<81; python_version<'3.13'" in requirements
