"""The scripts in examples/ run (with tiny budgets) and do what they print."""

import os
import socket
import subprocess
import sys

import pytest

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "examples")


def run_example(name: str, *args: str, cwd: str) -> str:
    result = subprocess.run(
        [sys.executable, os.path.join(EXAMPLES, name), *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_cartpole_example(tmp_path):
    stdout = run_example("train_cartpole.py", "--timesteps", "512", "--output", "model", cwd=str(tmp_path))
    assert (tmp_path / "model.zip").exists()
    assert "mean evaluation return:" in stdout


def test_resume_example(tmp_path):
    stdout = run_example("resume_training.py", "--timesteps", "2048", "--output", "model", cwd=str(tmp_path))
    # 1024 steps = 4 iterations of 4 x 64 -> one full phase, then 0 in the buffer; check the buffer survives the reload
    assert "resuming with" in stdout and "done: 2048 steps, 2 auxiliary phases" in stdout
    assert (tmp_path / "model_aux_buffer.npz").exists()


@pytest.mark.slow
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
        env=dict(os.environ, PYTHONPATH=os.path.dirname(EXAMPLES), OMP_NUM_THREADS="1"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "world size 2: 1024 env steps" in result.stdout and "mean evaluation return:" in result.stdout
    assert result.stdout.count("total_timesteps") == 4  # 4 iterations of 2 x 4 envs x 32 steps, logged by rank 0 only
    assert (tmp_path / "model.zip").exists()


@pytest.mark.slow
def test_procgen_example(tmp_path):
    run_example(
        "train_procgen.py",
        *("--game", "coinrun", "--timesteps", "64", "--n-envs", "2", "--n-steps", "16", "--n-policy-iters", "2"),
        cwd=str(tmp_path),
    )
    assert (tmp_path / "ppg_coinrun.zip").exists() and (tmp_path / "ppg_coinrun_vecnormalize.pkl").exists()
