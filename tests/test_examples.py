"""The scripts in examples/ run (with tiny budgets) and do what they print."""

import json
import os
import re
import socket
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # each test runs an example script in a new interpreter

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
EXAMPLES = os.path.join(ROOT, "examples")
# The examples import sb3_ppg from this checkout, whichever copy is installed
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (ROOT, os.environ.get("PYTHONPATH")))))


def run_example(name: str, *args: str, cwd: str) -> str:
    result = subprocess.run(
        [sys.executable, os.path.join(EXAMPLES, name), *args], cwd=cwd, capture_output=True, text=True, timeout=300, env=ENV
    )
    assert result.returncode == 0, result.stderr[-3000:]
    # The examples import SB3 before sb3_ppg: gym's maintenance notice must not show (gym-notices pin, setup.py)
    assert "Gym has been unmaintained" not in result.stderr, result.stderr[-3000:]
    return result.stdout


def test_cartpole_example(tmp_path):
    stdout = run_example("train_cartpole.py", "--timesteps", "512", "--output", "model", cwd=str(tmp_path))
    assert (tmp_path / "model.zip").exists()
    assert "mean evaluation return:" in stdout


def test_resume_example(tmp_path):
    stdout = run_example("resume_training.py", "--timesteps", "2048", "--output", "model", cwd=str(tmp_path))
    # 1024 steps = 4 iterations of 4 x 64, 4 of the 6 of a phase: the reload keeps them, the phase ends 2 rollouts later
    assert "stopping with 4 of 6 iterations in the aux buffer" in stdout
    assert "resuming with 4 iterations in the aux buffer" in stdout
    assert "done: 2048 steps, 1 auxiliary phases" in stdout
    assert (tmp_path / "model_aux_buffer.npz").exists()


def test_torchrun_example(tmp_path):
    """The data-parallel example under torchrun with two CPU processes: one table, one model, evaluated by rank 0."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    torchrun = ("-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2", "--master_addr=127.0.0.1")
    result = subprocess.run(
        [sys.executable, *torchrun, f"--master_port={port}", os.path.join(EXAMPLES, "torchrun_cartpole.py"),
         *("--timesteps", "1024", "--output", "model")],
        cwd=str(tmp_path), capture_output=True, text=True, timeout=300,
        env=dict(ENV, OMP_NUM_THREADS="1"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "world size 2: 1024 env steps" in result.stdout and "mean evaluation return:" in result.stdout
    # 4 iterations of 2 x 4 envs x 32 steps and the last train() written when learn() returns, logged by rank 0 only
    assert result.stdout.count("total_timesteps") == 5
    assert (tmp_path / "model.zip").exists()


def test_procgen_example(tmp_path):
    """Training on 200 levels, evaluation on training and unseen levels (bossfight: short random episodes)."""
    stdout = run_example(
        "train_procgen.py",
        *("--game", "bossfight", "--timesteps", "64", "--n-envs", "2", "--n-steps", "16", "--n-policy-iters", "2"),
        *("--eval-episodes", "2", "--eval-envs", "2"),
        cwd=str(tmp_path),
    )
    assert (tmp_path / "ppg_bossfight.zip").exists() and (tmp_path / "ppg_bossfight_reward_statistics.npz").exists()
    assert "training levels: mean return" in stdout and "unseen levels: mean return" in stdout


def test_callbacks_example(tmp_path):
    """EvalCallback stops training at the reward threshold; PPGCheckpointCallback keeps the last checkpoints."""
    stdout = run_example(
        "cartpole_callbacks.py",
        *("--timesteps", "8192", "--eval-freq", "512", "--checkpoint-freq", "256", "--reward-threshold", "50"),
        *("--output", "run"),
        cwd=str(tmp_path),
    )  # fmt: skip
    steps = int(re.search(r"stopped after (\d+) steps", stdout).group(1))
    assert steps < 8192, stdout  # stopped early, by the threshold
    assert (tmp_path / "run" / "best_model.zip").exists()
    checkpoints = list((tmp_path / "run" / "checkpoints").glob("rl_model_*_steps"))
    assert 1 <= len(checkpoints) <= 2  # keep_last=2


def test_continuous_control_example(tmp_path):
    stdout = run_example(
        "continuous_control.py", "--timesteps", "512", "--n-steps", "64", "--output", "model", cwd=str(tmp_path)
    )
    assert (tmp_path / "model.zip").exists()
    assert "mean evaluation return:" in stdout


def test_dict_observations_example(tmp_path):
    stdout = run_example("dict_observations.py", "--timesteps", "512", "--output", "model", cwd=str(tmp_path))
    assert (tmp_path / "model.zip").exists()
    assert "mean evaluation return:" in stdout


def test_export_example(tmp_path):
    """The exported policy matches model.predict, and runs in a process where SB3 and sb3_ppg cannot be imported."""
    stdout = run_example("export_policy.py", "--timesteps", "512", "--output", "actor.pt2", cwd=str(tmp_path))
    assert "same actions as model.predict(deterministic=True) on 800 observations" in stdout
    without_sb3 = (
        "import sys; sys.modules.update(stable_baselines3=None, sb3_ppg=None, gymnasium=None)\n"
        "import torch\n"
        "actor = torch.export.load('actor.pt2').module()\n"
        "print(actor(torch.zeros((3, 4))).tolist())"
    )
    result = subprocess.run(
        [sys.executable, "-c", without_sb3], cwd=str(tmp_path), capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    actions = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(actions) == 3 and set(actions) <= {0, 1}


def python_code_blocks(path: str) -> list[str]:
    """The ``.. code-block:: python`` blocks of an .rst file, dedented."""
    blocks, lines = [], open(os.path.join(ROOT, path)).read().splitlines()
    for index, line in enumerate(lines):
        if line.strip() == ".. code-block:: python":
            block = []
            for body in lines[index + 1 :]:
                if body.strip() and not body.startswith("   "):
                    break
                block.append(body[3:])
            blocks.append("\n".join(block).strip("\n"))
    return blocks


@pytest.mark.parametrize("path", ["docs/index.rst", "docs/guide/quickstart.rst"])
def test_documented_cartpole_examples_have_sensible_minibatches(path, tmp_path, monkeypatch):
    """
    The docs' CartPole examples, run with ``learn()`` recorded instead of training: policy minibatches of at least 32
    samples (the front page had 4: ``n_steps=32`` on one env) and at least 10 auxiliary phases in their training budget.
    """
    from sb3_ppg import PPG

    learned = []
    monkeypatch.setattr(PPG, "learn", lambda self, total_timesteps, **_: learned.append((self, total_timesteps)) or self)
    monkeypatch.chdir(tmp_path)
    blocks = [block for block in python_code_blocks(path) if "CartPole" in block]
    assert blocks
    for block in blocks:
        exec(compile(block, path, "exec"), {})
    assert len(learned) == len(blocks)
    for model, total_timesteps in learned:
        assert model.batch_size >= 32
        first_aux_phase = model.n_policy_iters * model.n_steps * model.n_envs
        assert first_aux_phase * 10 <= total_timesteps
