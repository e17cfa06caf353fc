"""
``python -m sb3_ppg.train`` under torchrun: two gloo ranks on CartPole share one run folder, rank 0 alone evaluates,
prints and saves, rank 1 logs its episodes into ``rank_1/``, both write their part of the checkpoints.
"""

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from stable_baselines3.common.env_util import make_vec_env
from test_cli_checkpoints import assert_same_run  # tests/ is on sys.path (pytest's rootdir-relative imports)

from sb3_ppg import PPG
from sb3_ppg.common import distributed

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parent.parent
CARTPOLE = [
    *("--env", "CartPole-v1", "-n", "256", "--eval-freq", "128", "--eval-episodes", "2", "--seed", "0"),
    *("--device", "cpu", "--save-freq", "128", "--global-n-envs", "-params", "n_steps:16", "batch_size:32"),
    *("n_epochs:1", "n_policy_iters:2", "n_aux_epochs:1", "aux_batch_rollouts:2"),
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun_train(*args: str) -> subprocess.CompletedProcess:
    environment = {name: value for name, value in os.environ.items() if name not in distributed.TORCHRUN_VARIABLES}
    environment.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), SB3_PPG_DIST_TIMEOUT="120")
    command = [
        *(sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2"),
        *("--master_addr=127.0.0.1", f"--master_port={free_port()}", "-m", "sb3_ppg.train", *args),
    ]
    return subprocess.run(command, env=environment, capture_output=True, text=True, timeout=180)


def episode_lengths(path: Path) -> list[int]:
    return [int(line.split(",")[1]) for line in path.read_text().splitlines()[2:]]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """The log folder (-f) of the CARTPOLE job on 4 envs in all (2 on each rank), run once to its end, and its output."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    completed = torchrun_train(*CARTPOLE, "n_envs:4", "-f", str(folder))
    assert completed.returncode == 0, completed.stderr[-3000:]
    return folder, completed


def test_train_cli_under_torchrun(tmp_path, uninterrupted):
    folder, completed = uninterrupted
    # A copy: the resume below runs in the same run folder
    shutil.copytree(folder, tmp_path, dirs_exist_ok=True)
    # Rank 0 alone prints the zoo's messages
    assert completed.stdout.count("========== CartPole-v1 ==========") == 1
    assert "--global-n-envs: 2 environments on each of the 2 ranks" in completed.stdout

    assert [path.name for path in (tmp_path / "ppg").iterdir()] == ["CartPole-v1_1"]
    run = tmp_path / "ppg" / "CartPole-v1_1"
    assert (run / "CartPole-v1" / "config.yml").is_file()
    assert sorted(path.name for path in (run / "rank_1").iterdir()) == ["0.monitor.csv", "1.monitor.csv"]
    assert not list((run / "rank_1").glob("*.npz"))
    # The ranks' envs are seeded differently: different episodes
    rank0 = [episode_lengths(run / f"{index}.monitor.csv") for index in range(2)]
    rank1 = [episode_lengths(run / "rank_1" / f"{index}.monitor.csv") for index in range(2)]
    assert all(rank0) and all(rank1) and rank0 != rank1

    # Evaluations every 128 env steps of both ranks, by rank 0
    evaluations = np.load(run / "evaluations.npz")
    assert evaluations["timesteps"].tolist() == [128, 256]
    assert evaluations["results"].shape == (2, 2)
    # Checkpoints every 128 env steps of both ranks, each with both ranks' parts
    checkpoints = sorted(path.name for path in (run / "checkpoints").glob("ppg_*_steps"))
    assert checkpoints == ["ppg_128_steps", "ppg_256_steps"]
    assert (run / "checkpoints" / "ppg_256_steps" / "rank_1" / "run_state.npz").is_file()

    model = PPG.load(run / "CartPole-v1.zip", env=make_vec_env("CartPole-v1", n_envs=2), device="cpu")
    assert model.num_timesteps == 256
    model.predict(model.env.reset())

    # Resumed with the same world size: nothing left to train, in the same run folder
    completed = torchrun_train(*CARTPOLE, "n_envs:4", "-f", str(tmp_path), "--resume")
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "continuing" in completed.stdout and "ppg_256_steps" in completed.stdout
    assert [path.name for path in (tmp_path / "ppg").iterdir()] == ["CartPole-v1_1"]
    assert episode_lengths(run / "rank_1" / "0.monitor.csv") == rank1[0]


def test_resume_mid_run_under_torchrun(tmp_path, uninterrupted):
    """
    A torchrun job stopped after its first checkpoint (its episode logs and evaluations already go further) and
    resumed with ``--resume CHECKPOINT`` ends exactly as the uninterrupted job: parameters, both ranks' episode logs,
    evaluations.
    """
    folder, _ = uninterrupted
    run_a = folder / "ppg" / "CartPole-v1_1"
    shutil.copytree(folder, tmp_path / "b")
    run_b = tmp_path / "b" / "ppg" / "CartPole-v1_1"
    shutil.rmtree(run_b / "checkpoints" / "ppg_256_steps")
    (run_b / "CartPole-v1.zip").unlink()

    checkpoint = run_b / "checkpoints" / "ppg_128_steps"
    completed = torchrun_train(*CARTPOLE, "n_envs:4", "-f", str(tmp_path / "b"), "--resume", str(checkpoint))
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "continuing" in completed.stdout and "ppg_128_steps" in completed.stdout
    assert [path.name for path in (tmp_path / "b" / "ppg").iterdir()] == ["CartPole-v1_1"]
    assert_same_run(run_a, run_b, "CartPole-v1")
    for name in ("0.monitor.csv", "1.monitor.csv"):
        assert episode_lengths(run_b / "rank_1" / name) == episode_lengths(run_a / "rank_1" / name)


def test_global_n_envs_under_torchrun(tmp_path):
    completed = torchrun_train(*CARTPOLE, "n_envs:3", "-f", str(tmp_path))
    assert completed.returncode != 0
    message = "error: ValueError: --global-n-envs: 3 envs cannot be split evenly over 2 ranks"
    assert completed.stderr.count(message) == 2  # one line from each rank
    assert not (tmp_path / "ppg").exists() or not list((tmp_path / "ppg").iterdir())


def test_optimize_refused_under_torchrun(monkeypatch, capsys):
    """-optimize is not data-parallel: under torchrun every rank stops at once with a clear error (no rendezvous)."""
    from sb3_ppg.cli import train

    variables = dict(RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="1")
    for name, value in dict(variables, SB3_PPG_DIST_TIMEOUT="5").items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit, match="-optimize does not run under torchrun"):
        train.main(["--env", "CartPole-v1", "-n", "64", "-optimize", "--n-trials", "2"])
    assert not distributed.is_active()
