"""The command line's checkpoints: ``python -m sb3_ppg.train --save-freq N`` then ``--resume`` continues a run exactly
(parameters, episode log, evaluations), and bad command lines end in one line."""

import multiprocessing
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch as th
from helpers import default_sigint, hold_lock, sigint_raises_keyboard_interrupt

from sb3_ppg import PPG
from sb3_ppg.cli import arguments, train, zoo
from sb3_ppg.cli.curves import read_monitor_file
from sb3_ppg.cli.run_folders import read_run_file
from sb3_ppg.common.checkpoints import read_monitor_log_sizes

CARTPOLE = [
    "--env",
    "CartPole-v1",
    "-n",
    "2048",
    "--eval-freq",
    "512",
    "--eval-episodes",
    "2",
    "--seed",
    "0",
    "--device",
    "cpu",
    "--verbose",
    "0",
    "--save-freq",
    "256",
    "-params",
    "n_envs:2",
    "n_steps:64",
    "batch_size:64",
    "n_policy_iters:2",
    "n_aux_epochs:1",
    "aux_batch_rollouts:2",
    "normalize:True",
]
PROCGEN = [
    "--env",
    "procgen/starpilot-v0",
    "--preset",
    "easy",
    "-n",
    "256",
    "--eval-freq",
    "64",
    "--eval-episodes",
    "1",
    "--seed",
    "0",
    "--device",
    "cpu",
    "--verbose",
    "0",
    "--save-freq",
    "32",
    "--env-kwargs",
    "num_levels:10",
    "-params",
    "n_envs:2",
    "n_steps:16",
    "batch_size:16",
    "n_policy_iters:2",
    "n_aux_epochs:1",
    "aux_batch_rollouts:2",
]


# Some runs here end before their first auxiliary phase on purpose: the warning that learn() then trains as plain PPO
# is meant
pytestmark = [
    pytest.mark.slow,  # command-line runs through the zoo, some in new interpreters
    pytest.mark.usefixtures("registered_zoo"),
    pytest.mark.filterwarnings(r"ignore:learn\(total_timesteps=.*this learn\(\) trains as plain PPO"),
]


def assert_same_run(folder_a: Path, folder_b: Path, env_name: str) -> None:
    """Same final parameters (bit for bit), same episodes logged, same evaluations."""
    model_a = PPG.load(folder_a / f"{env_name}.zip", device="cpu")
    model_b = PPG.load(folder_b / f"{env_name}.zip", device="cpu")
    assert model_a.num_timesteps == model_b.num_timesteps
    for (name, a), b in zip(model_a.policy.state_dict().items(), model_b.policy.state_dict().values(), strict=True):
        assert th.equal(a, b), name
    logs = sorted(path.name for path in folder_a.glob("*.monitor.csv"))
    assert logs == sorted(path.name for path in folder_b.glob("*.monitor.csv")) and logs
    for name in logs:
        log_a, log_b = (pd.read_csv(folder / name, skiprows=1) for folder in (folder_a, folder_b))
        assert len(log_a) > 0
        np.testing.assert_array_equal(log_a[["r", "l"]].to_numpy(), log_b[["r", "l"]].to_numpy())
        # The time column continues from the run's start
        assert (np.diff(log_b["t"].to_numpy()) >= 0).all()
    with np.load(folder_a / "evaluations.npz") as eval_a, np.load(folder_b / "evaluations.npz") as eval_b:
        for key in ("timesteps", "results", "ep_lengths"):
            np.testing.assert_array_equal(eval_a[key], eval_b[key])


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    """The log folder (-f) of the CARTPOLE command run without interruption."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    train.main([*CARTPOLE, "-f", str(folder)])
    return folder


def complete_checkpoints(run: Path) -> list[str]:
    return sorted(path.parent.name for path in (run / "checkpoints").glob("ppg_*_steps/manifest.json"))


def interrupt_train(monkeypatch, call: int) -> None:
    """
    Send this process SIGINT (Ctrl-C) inside its ``call``-th train(), after the policy phase (raising KeyboardInterrupt
    also when the suite runs with SIGINT ignored).
    """
    original = PPG._policy_phase
    calls = []

    def interrupted(self):
        original(self)
        calls.append(1)
        if len(calls) == call:
            with sigint_raises_keyboard_interrupt():
                signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(PPG, "_policy_phase", interrupted)


def test_resume_after_sigkill_is_exact(uninterrupted: Path, tmp_path: Path):
    run_a = uninterrupted / "ppg" / "CartPole-v1_1"
    assert (run_a / "checkpoints" / "ppg_2048_steps" / "manifest.json").is_file()

    # The same command, killed once its third checkpoint is complete
    run_b = tmp_path / "b" / "ppg" / "CartPole-v1_1"
    process = subprocess.Popen(
        [sys.executable, "-m", "sb3_ppg.train", *CARTPOLE, "-f", str(tmp_path / "b")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 240
    while not (run_b / "checkpoints" / "ppg_768_steps" / "manifest.json").is_file():
        assert process.poll() is None and time.monotonic() < deadline, "the run ended before its third checkpoint"
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (run_b / "CartPole-v1.zip").exists()

    # Rerunning the command with --resume continues the latest run, in its folder
    train.main([*CARTPOLE, "-f", str(tmp_path / "b"), "--resume"])
    assert not (tmp_path / "b" / "ppg" / "CartPole-v1_2").exists()
    assert_same_run(run_a, run_b, "CartPole-v1")


def test_ctrl_c_during_train_then_resume_is_exact(uninterrupted: Path, tmp_path: Path, monkeypatch, capsys):
    """Ctrl-C inside the train() of step 768, a checkpoint step: no checkpoint of the half-trained model is written (the
    RL Zoo calls on_training_end() after it), the model is saved as interrupted (not as the final model), the command
    exits 130 naming the newest checkpoint, and --resume continues from step 512 exactly."""
    interrupt_train(monkeypatch, call=6)
    with pytest.raises(SystemExit) as exit_info:
        train.main([*CARTPOLE, "-f", str(tmp_path)])
    monkeypatch.undo()
    assert exit_info.value.code == 130
    run = tmp_path / "ppg" / "CartPole-v1_1"
    assert complete_checkpoints(run) == ["ppg_256_steps", "ppg_512_steps"]
    assert not (run / "CartPole-v1.zip").exists()
    assert PPG.load(run / "CartPole-v1_interrupted.zip").num_timesteps == 768
    captured = capsys.readouterr()
    assert "Saving to" not in captured.out
    assert "Interrupted (Ctrl-C) at step 768 of 2,048." in captured.err
    assert f"Newest checkpoint: {run / 'checkpoints' / 'ppg_512_steps'}." in captured.err
    train.main([*CARTPOLE, "-f", str(tmp_path), "--resume"])
    assert_same_run(uninterrupted / "ppg" / "CartPole-v1_1", run, "CartPole-v1")
    # The final model supersedes the interrupted one
    assert not (run / "CartPole-v1_interrupted.zip").exists()


def test_ctrl_c_in_a_subprocess_exits_130_with_the_resume_command(uninterrupted: Path, tmp_path: Path):
    """SIGINT to `python -m sb3_ppg.train`: exit status 130, the step, the newest checkpoint and the exact command that
    continues the run, which then finishes it as the uninterrupted run."""
    run = tmp_path / "ppg" / "CartPole-v1_1"
    process = subprocess.Popen(
        [sys.executable, "-m", "sb3_ppg.train", *CARTPOLE, "-f", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        preexec_fn=default_sigint,
    )
    deadline = time.monotonic() + 240
    while not (run / "checkpoints" / "ppg_512_steps" / "manifest.json").is_file():
        assert process.poll() is None and time.monotonic() < deadline, "the run ended before its second checkpoint"
        time.sleep(0.02)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr[-3000:]
    assert "Saving to" not in stdout and "Traceback" not in stderr
    assert not (run / "CartPole-v1.zip").exists()
    steps = PPG.load(run / "CartPole-v1_interrupted.zip").num_timesteps
    assert f"Interrupted (Ctrl-C) at step {steps:,} of 2,048." in stderr
    newest = complete_checkpoints(run)[-1]
    assert f"Newest checkpoint: {run / 'checkpoints' / newest}." in stderr
    command = stderr.strip().splitlines()[-1].strip()
    assert command == shlex.join(["python", "-m", "sb3_ppg.train", *CARTPOLE, "-f", str(tmp_path), "--resume", str(run)])
    # The printed command continues the run exactly
    resumed = subprocess.run([sys.executable, *shlex.split(command)[1:]], capture_output=True, text=True, check=False)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_run(uninterrupted / "ppg" / "CartPole-v1_1", run, "CartPole-v1")


def test_ctrl_c_tests_do_not_depend_on_the_suites_sigint(tmp_path: Path):
    """
    With SIGINT ignored, as in a suite started with ``nohup ... &``, the Ctrl-C tests failed (issue 51): what they use
    still turns SIGINT into KeyboardInterrupt, in this process and in the child they interrupt.
    """
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with pytest.raises(KeyboardInterrupt), sigint_raises_keyboard_interrupt():
            signal.raise_signal(signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        ready = tmp_path / "ready"
        child_code = f"import pathlib, time; pathlib.Path({str(ready)!r}).touch(); time.sleep(60)"
        child = subprocess.Popen(
            [sys.executable, "-c", child_code], stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint
        )
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert child.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        child.send_signal(signal.SIGINT)
        _, stderr = child.communicate(timeout=30)
        assert "KeyboardInterrupt" in stderr
    finally:
        signal.signal(signal.SIGINT, previous)


def test_resume_skips_a_damaged_checkpoint_and_keeps_the_one_it_continues(uninterrupted: Path, tmp_path: Path, monkeypatch):
    """The newest checkpoint damaged: --resume continues from the newest one that verifies, with a warning naming the
    one skipped; with --keep-checkpoints 1 and a Ctrl-C before the next checkpoint, the one resumed from is still there."""
    shutil.copytree(uninterrupted, tmp_path, dirs_exist_ok=True)
    run = tmp_path / "ppg" / "CartPole-v1_1"
    for checkpoint in (run / "checkpoints").glob("ppg_*_steps"):
        if int(checkpoint.name.split("_")[1]) > 1024:
            shutil.rmtree(checkpoint)
    (run / "CartPole-v1.zip").unlink()
    damaged = run / "checkpoints" / "ppg_1024_steps" / "run_state.npz"
    damaged.write_bytes(damaged.read_bytes()[:-10])
    resume = [*CARTPOLE, "-f", str(tmp_path), "--resume", "--keep-checkpoints", "1"]
    interrupt_train(monkeypatch, call=1)
    with (
        pytest.warns(UserWarning, match=r"continuing from ppg_768_steps, .* skipped .*ppg_1024_steps' \(run_state.npz"),
        pytest.raises(SystemExit) as exit_info,
    ):
        train.main(resume)
    monkeypatch.undo()
    assert exit_info.value.code == 130  # Ctrl-C
    assert complete_checkpoints(run) == ["ppg_1024_steps", "ppg_768_steps"]
    with pytest.warns(UserWarning, match=r"continuing from ppg_768_steps"):
        train.main(resume)
    assert complete_checkpoints(run) == ["ppg_2048_steps"]
    assert_same_run(uninterrupted / "ppg" / "CartPole-v1_1", run, "CartPole-v1")


def test_resume_while_another_run_writes_there(tmp_path: Path):
    """A job started twice: the second one stops before touching the run, naming the first one's process."""
    checkpoints = tmp_path / "ppg" / "CartPole-v1_1" / "checkpoints"
    checkpoints.mkdir(parents=True)
    context = multiprocessing.get_context("fork")
    ready, release = context.Event(), context.Event()
    holder = context.Process(target=hold_lock, args=(str(checkpoints), ready, release))
    holder.start()
    try:
        assert ready.wait(30)
        with pytest.raises(SystemExit) as error:
            train.main(["--env", "CartPole-v1", "-f", str(tmp_path), "--verbose", "0", "--resume"])
    finally:
        release.set()
        holder.join(30)
    assert str(error.value.code).startswith(f"error: RuntimeError: Another run is writing here (pid {holder.pid} on ")


def test_procgen_resume_from_an_older_checkpoint_is_exact(tmp_path: Path, capsys):
    train.main([*PROCGEN, "-f", str(tmp_path / "a")])
    run_a = tmp_path / "a" / "ppg" / "procgen-starpilot-v0_1"
    # A run stopped after its checkpoint at step 96: what is on disk is the uninterrupted run's, minus the newer
    # checkpoints and the final model; its episode log and evaluations go further than the checkpoint
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    run_b = tmp_path / "b" / "ppg" / "procgen-starpilot-v0_1"
    for checkpoint in (run_b / "checkpoints").glob("ppg_*_steps"):
        if int(checkpoint.name.split("_")[1]) > 96:
            shutil.rmtree(checkpoint)
    (run_b / "procgen-starpilot-v0.zip").unlink()
    assert len(pd.read_csv(run_b / "0.monitor.csv", skiprows=1)) > 0

    capsys.readouterr()
    train.main([*PROCGEN, "-f", str(tmp_path / "b"), "--resume", str(run_b / "checkpoints" / "ppg_96_steps")])
    assert "continuing" in capsys.readouterr().out
    assert_same_run(run_a, run_b, "procgen-starpilot-v0")

    # Once complete, resuming again changes nothing
    train.main([*PROCGEN, "-f", str(tmp_path / "b"), "--resume"])
    output = capsys.readouterr().out
    # Nothing was trained, and nothing is saved
    assert "already complete" in output and "Saving to" not in output
    assert_same_run(run_a, run_b, "procgen-starpilot-v0")


def test_resume_without_checkpoint_starts_over(tmp_path: Path, capsys):
    tiny = [*CARTPOLE[: CARTPOLE.index("-n")], "-n", "128", *CARTPOLE[CARTPOLE.index("-n") + 2 :]]
    # No run yet: a new one
    train.main([*tiny, "-f", str(tmp_path), "--resume"])
    assert "starting a new one" in capsys.readouterr().out
    run = tmp_path / "ppg" / "CartPole-v1_1"
    assert PPG.load(run / "CartPole-v1.zip").num_timesteps == 128
    # A finished run without a checkpoint (--save-freq larger than the run, or none): --resume would start it over
    # and overwrite its model; it refuses and leaves the run as it is
    shutil.rmtree(run / "checkpoints")
    model_bytes, log_bytes = (run / "CartPole-v1.zip").read_bytes(), (run / "0.monitor.csv").read_bytes()
    with pytest.raises(SystemExit) as error:
        train.main([*tiny, "-f", str(tmp_path), "--resume"])
    message = str(error.value.code)
    assert "is finished" in message and "would start it over and overwrite it" in message and "\n" not in message.strip()
    assert (run / "CartPole-v1.zip").read_bytes() == model_bytes and (run / "0.monitor.csv").read_bytes() == log_bytes
    # A run stopped before its first checkpoint (no final model either): it starts over in its folder
    (run / "CartPole-v1.zip").unlink()
    train.main([*tiny, "-f", str(tmp_path), "--resume"])
    assert "no complete checkpoint yet" in capsys.readouterr().out
    assert not (tmp_path / "ppg" / "CartPole-v1_2").exists()
    assert PPG.load(run / "CartPole-v1.zip").num_timesteps == 128


def test_resume_reports_the_runs_seed_and_continues_the_progress_bar(tmp_path: Path, capsys):
    """--resume printed a new random seed and restarted the progress bar at 0 of the steps left (issue 51)."""
    unseeded = [arg for index, arg in enumerate(CARTPOLE) if "--seed" not in CARTPOLE[max(index - 1, 0) : index + 1]]
    unseeded = [*unseeded[: unseeded.index("-n")], "-n", "512", *unseeded[unseeded.index("-n") + 2 :]]
    train.main([*unseeded, "-f", str(tmp_path)])
    run = tmp_path / "ppg" / "CartPole-v1_1"
    seed = read_run_file(run / "CartPole-v1" / "args.yml")["seed"]
    assert f"Seed: {seed}\n" in capsys.readouterr().out
    (run / "CartPole-v1.zip").unlink()
    shutil.rmtree(run / "checkpoints" / "ppg_512_steps")
    train.main([*unseeded, "-f", str(tmp_path), "-P", "--resume"])
    output = capsys.readouterr().out
    assert f"Seed: {seed}\n" in output
    bar = output.replace("\r", "\n")
    assert "256/512" in bar and "512/512" in bar and "/256" not in bar
    # Another seed would seed the evaluations otherwise: refused as another -params value is
    with pytest.raises(SystemExit) as error:
        train.main([*unseeded, "-f", str(tmp_path), "--seed", str(seed + 1), "--resume"])
    assert f"--seed (run: {seed}, command: {seed + 1})" in str(error.value.code)


def test_resume_checks_and_cuts_a_damaged_episode_log(tmp_path: Path, capsys):
    """
    --resume with a damaged *.monitor.csv appended after a garbage line and glued its first episode onto a cut line
    (issue 51): damage after the checkpoint is cut, damage before it is a one-line error naming the file and the line,
    and a log that lost lines continues after its last complete one, with a warning.
    """
    tiny = [*CARTPOLE[: CARTPOLE.index("-n")], "-n", "512", *CARTPOLE[CARTPOLE.index("-n") + 2 :], "-f"]
    train.main([*tiny, str(tmp_path / "first")])
    first = tmp_path / "first" / "ppg" / "CartPole-v1_1"
    sizes = read_monitor_log_sizes(first / "checkpoints" / "ppg_256_steps")
    sizes = {os.path.basename(name): size for name, size in sizes.items()}
    size = sizes["0.monitor.csv"]  # one log per env: the first env's is damaged
    complete = (first / "0.monitor.csv").read_bytes()
    assert complete[size - 1 : size] == b"\n" and len(complete) > size

    def resume(log: bytes) -> tuple[Path, str]:
        """Resume a copy of the run at its 256-step checkpoint with ``log`` as its episode log: (the log, the error)."""
        folder = tmp_path / f"copy_{len(list(tmp_path.iterdir()))}"
        run = folder / "ppg" / "CartPole-v1_1"
        shutil.copytree(first, run)
        shutil.rmtree(run / "checkpoints" / "ppg_512_steps")
        (run / "CartPole-v1.zip").unlink()
        (run / "0.monitor.csv").write_bytes(log)
        try:
            train.main([*tiny, str(folder), "--resume"])
        except SystemExit as error:
            return run / "0.monitor.csv", str(error.code)
        return run / "0.monitor.csv", ""

    lines = complete[:size].split(b"\n")
    # After the checkpoint: garbage, and a line cut in the middle, are cut with the episodes played again
    log, error = resume(complete + b"garbage\n18.0,18,1.7")
    assert error == "" and log.read_bytes()[:size] == complete[:size]
    assert (read_monitor_file(log)["l"] > 0).all()
    # Before it: an error naming the file and the line, the log left as it was
    garbled = b"\n".join([*lines[:3], b"garbage", *lines[4:]]) + complete[size:]
    log, error = resume(garbled)
    assert f"--resume: {log}, line 4, is not an episode" in error and "\n" not in error, error
    assert log.read_bytes() == garbled
    # Shorter than at the checkpoint, its last line cut: an error naming it; once that line is deleted, a warning
    log, error = resume(complete[: size - 5])
    assert f"--resume: {log}, line {len(lines) - 1}, is cut in the middle" in error
    with pytest.warns(UserWarning, match=r"bytes shorter than when ppg_256_steps was written"):
        log, error = resume(b"\n".join(lines[:-2]) + b"\n")
    assert error == ""
    assert len(read_monitor_file(log)) == len(read_monitor_file(first / "0.monitor.csv")) - 1  # one episode missing


def test_resume_takes_the_runs_torch_threads(tmp_path: Path, monkeypatch, capsys):
    """torch's CPU kernels round differently with another number of threads: --resume without --num-threads (nor
    OMP_NUM_THREADS) uses the count the checkpoint was written with; an explicit other count warns."""
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    tiny = [*CARTPOLE[: CARTPOLE.index("-n")], "-n", "512", *CARTPOLE[CARTPOLE.index("-n") + 2 :]]
    previous = th.get_num_threads()
    train.main([*tiny, "-f", str(tmp_path / "a"), "--num-threads", "2"])
    run_a = tmp_path / "a" / "ppg" / "CartPole-v1_1"
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    run_b = tmp_path / "b" / "ppg" / "CartPole-v1_1"
    shutil.rmtree(run_b / "checkpoints" / "ppg_512_steps")
    (run_b / "CartPole-v1.zip").unlink()
    capsys.readouterr()
    # The rule's count at resume time (its first line) differs: the second line says which one it replaces
    monkeypatch.setattr(zoo, "choose_torch_threads", lambda num_threads: (1, "the rule"))
    train.main([*tiny, "-f", str(tmp_path / "b"), "--resume"])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("torch and procgen threads")]
    assert lines == [
        "torch and procgen threads: 1 (the rule; --num-threads N to choose)",
        "torch and procgen threads: 2 instead of 1 (the run's own, for an exact resume)",
    ]
    assert th.get_num_threads() == previous
    assert_same_run(run_a, run_b, "CartPole-v1")
    # An explicit choice wins, and the warning says what it costs
    (run_b / "CartPole-v1.zip").unlink()
    shutil.rmtree(run_b / "checkpoints" / "ppg_512_steps")
    with pytest.warns(UserWarning, match="written with 2 torch threads and torch now uses 1"):
        train.main([*tiny, "-f", str(tmp_path / "b"), "--resume", "--num-threads", "1"])
    assert "the run's own" not in capsys.readouterr().out


def test_keep_checkpoints(tmp_path: Path):
    train.main([*CARTPOLE, "-f", str(tmp_path), "--keep-checkpoints", "2"])
    names = sorted(path.name for path in (tmp_path / "ppg" / "CartPole-v1_1" / "checkpoints").iterdir())
    assert names == [".sb3_ppg.lock", "ppg_1792_steps", "ppg_2048_steps", "ppg_rollouts"]


def test_split_argv():
    known, rest = arguments.split_argv(["--resume", "--env", "x", "--keep-checkpoints", "3", "--traceback", "-n", "5"])
    assert (known.resume, known.keep_checkpoints, known.traceback, known.n_timesteps) == ("latest", 3, True, 5)
    assert rest == ["--env", "x", "-n", "5"]
    known, rest = arguments.split_argv(["--resume", "runs/x", "--seed", "1", "--resume=y"])
    assert known.resume == "y" and rest == ["--seed", "1"]
    assert "--resume" not in arguments.build_zoo_argv(["--env", "CartPole-v1", "--resume", "some/run"])


@pytest.mark.parametrize(
    "argv, message",
    [
        (["-n", "-5"], r"-n/--n-timesteps must be a positive number of timesteps, got -5"),
        (["-n", "0"], r"got 0 \(leave it out"),
        (["--keep-checkpoints", "0"], "--keep-checkpoints must be at least 1"),
        (["-params", "n_steps:-4"], r"(Value|Hyperparameter)Error: .*n_steps must be >= 1"),
        (["--env", "procgen/notagame-v0"], r"error: .*notagame"),
        (["--resume", "no/such/run"], r"FileNotFoundError: --resume no/such/run: no such run"),
        (["--algo", "ppo", "--resume"], r"--resume continues PPG runs"),
    ],
)
def test_bad_command_lines_end_in_one_line(tmp_path: Path, argv: list[str], message: str):
    base = ["--env", "CartPole-v1", "-f", str(tmp_path), "--verbose", "0", "--device", "cpu"]
    with pytest.raises(SystemExit) as error:
        train.main([*base, *argv])
    text = str(error.value.code)
    assert text.startswith("error: ") and "\n" not in text.strip()
    assert __import__("re").search(message, text), text


def test_traceback_option_shows_the_error(tmp_path: Path):
    with pytest.raises(ValueError, match="n_steps"):
        train.main(["--env", "CartPole-v1", "-f", str(tmp_path), "-params", "n_steps:-4", "--traceback"])


def test_resume_in_a_subprocess_exits_with_one_line(tmp_path: Path):
    process = subprocess.run(
        [sys.executable, "-m", "sb3_ppg.train", "--env", "CartPole-v1", "-f", str(tmp_path), "--resume", "nowhere"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        check=False,
    )
    assert process.returncode == 1
    assert process.stderr.strip().splitlines()[-1].startswith("error: FileNotFoundError: --resume nowhere")
    assert "Traceback" not in process.stderr
