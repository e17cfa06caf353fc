"""
Data-parallel RecurrentPPG: two gloo processes on the CPU (tests/distributed_recurrent_worker.py) against one process
that holds both ranks' envs; checkpoints under torchrun with each rank's LSTM states; the command line under torchrun.
"""

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch as th
from stable_baselines3.common.env_util import make_vec_env

from sb3_ppg import PPG, RecurrentPPG
from sb3_ppg.common import data_parallel, distributed

TESTS = Path(__file__).parent
WORKER = str(TESTS / "distributed_recurrent_worker.py")
sys.path.insert(0, str(TESTS))
import distributed_recurrent_worker as worker  # noqa: E402
from test_distributed import assert_identical, results, wait_all  # noqa: E402
from test_distributed import start_ranks as start_worker_ranks  # noqa: E402
from test_distributed_cli import episode_lengths, torchrun_train  # noqa: E402

pytestmark = pytest.mark.slow


def start_ranks(scenario: str, out_dir: Path) -> list[subprocess.Popen]:
    """Two processes of this file's worker script, as torchrun would start them."""
    return start_worker_ranks(scenario, out_dir, worker=WORKER)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, list[dict[str, Any]], dict[str, Any]]:
    """
    The equality scenarios in two ranks (2 envs each) and in this process (4 envs), on the same sequences; then, in
    the same two ranks, the checkpointed CartPole run.
    """
    out_dir = tmp_path_factory.mktemp("recurrent_distributed")
    processes = start_ranks("train", out_dir)
    reference = {name: worker.equality(name) for name in worker.EQUALITY_CONFIGS}
    wait_all(processes, out_dir)
    return out_dir, results(out_dir), reference


@pytest.mark.parametrize("config", list(worker.EQUALITY_CONFIGS))
def test_two_ranks_equal_one_process(trained, config):
    """
    Two iterations (policy phases on whole env sequences, then an aux phase over the stored rollouts from their start
    states, stored or recomputed) with the envs split over two ranks give the parameters of one process that holds
    all the envs: gradients averaged (a rank that kept its own gradient would end elsewhere than the other rank and
    the reference), advantages normalized globally. In float64 the runs differ only by the order of sums (~1e-16,
    which Adam amplifies by at most lr / eps = 5e4 per step): they agree to 1e-8, where a real difference is a
    fraction of a learning rate (5e-4 or more).
    """
    _, (rank0, rank1), reference = trained
    rank0, rank1, reference = rank0[config], rank1[config], reference[config]
    assert_identical(rank0["initial"], reference["initial"])
    assert_identical(rank0["final"], rank1["final"])
    for name, value in reference["final"].items():
        assert (value - reference["initial"][name]).abs().max().item() > 1e-5, name
        assert value.dtype == th.float64
        assert (rank0["final"][name] - value).abs().max().item() < 1e-8, name
    for key in ("num_timesteps", "n_aux_phases", "n_updates"):
        assert rank0[key] == rank1[key] == reference[key], key
    assert reference["n_aux_phases"] == 1
    if config == "target_kl":
        assert reference["n_updates"] < 8  # early stopping happened
    # Each rank's aux buffer holds the start states of its own envs' rollouts: the single process's, split by env
    # (recomputed ones after the first iteration agree to float32 rounding of the same float64 networks' states)
    states = np.concatenate([rank0["aux_start_states"], rank1["aux_start_states"]], axis=1)
    np.testing.assert_allclose(states, reference["aux_start_states"], rtol=0, atol=1e-6)
    assert not np.array_equal(rank0["aux_start_states"], rank1["aux_start_states"])


def test_fingerprint_holds_ppg_and_recurrent_arguments():
    """
    RecurrentPPG passes PPG's arguments on in ``**kwargs``: the ranks still compare them (n_epochs) and its own
    (aux_start_states), so that ranks built otherwise stop at learn() instead of running different updates.
    """
    models = [
        RecurrentPPG("MlpLstmPolicy", "CartPole-v1", n_steps=8, policy_kwargs=worker.LSTM, **settings)
        for settings in (dict(n_epochs=1), dict(n_epochs=2, aux_start_states="recomputed"))
    ]
    fingerprints = [data_parallel.fingerprint(model, model._optimizers(), 0, 16, True) for model in models]
    assert [fingerprint["n_epochs"] for fingerprint in fingerprints] == ["1", "2"]
    assert [fingerprint["aux_start_states"] for fingerprint in fingerprints] == ["'stored'", "'recomputed'"]
    assert data_parallel.constructor_arguments(PPG) == [
        name for name in data_parallel.inspect.signature(PPG.__init__).parameters if name != "kwargs"
    ]


@pytest.fixture(scope="module")
def resumed(trained) -> list[dict[str, Any]]:
    """The checkpointed run resumed from its mid-run checkpoint in two new processes."""
    out_dir = trained[0]
    wait_all(start_ranks("checkpoint_resume", out_dir), out_dir)
    return results(out_dir)


def test_resume_under_torchrun_bit_identical(trained, resumed):
    """
    Each rank's part of a checkpoint holds the live LSTM states of its own envs; resumed in two processes from a
    mid-run checkpoint, both ranks end bit-identical to the uninterrupted run, LSTM states included.
    """
    out_dir, ranks, _ = trained
    uninterrupted = [result["checkpoint_train"] for result in ranks]
    checkpoint = out_dir / "checkpoints" / f"rppg_{worker.CHECKPOINT_CUT}_steps"
    saved = [np.load(checkpoint / f"rank_{rank}" / "run_state.npz")["last_lstm_states"] for rank in range(2)]
    assert saved[0].shape == saved[1].shape == (4, 1, 2, worker.LSTM["lstm_hidden_size"])
    assert not np.array_equal(saved[0], saved[1])  # each rank's envs
    assert_identical(uninterrupted[0]["final"], uninterrupted[1]["final"])
    for rank in range(2):
        assert resumed[rank]["resumed_at"] == worker.CHECKPOINT_CUT
        np.testing.assert_array_equal(th.stack(resumed[rank]["resumed_lstm_states"]).numpy(), saved[rank])
        assert resumed[rank]["num_timesteps"] == uninterrupted[rank]["num_timesteps"] == worker.CHECKPOINT_TOTAL
        assert resumed[rank]["n_aux_phases"] == uninterrupted[rank]["n_aux_phases"] == 2
        assert_identical(resumed[rank]["final"], uninterrupted[rank]["final"])
        assert all(
            th.equal(a, b) for a, b in zip(resumed[rank]["lstm_states"], uninterrupted[rank]["lstm_states"], strict=True)
        )
    # The saved model is an ordinary RecurrentPPG model: it loads and predicts with states in one process
    model = RecurrentPPG.load(checkpoint / "model.zip", env=make_vec_env("CartPole-v1", n_envs=1), device="cpu")
    assert model.num_timesteps == worker.CHECKPOINT_CUT
    _, states = model.predict(model.env.reset(), state=None, episode_start=np.ones(1, dtype=bool))
    assert states[0].shape == (1, 1, worker.LSTM["lstm_hidden_size"])
    assert not distributed.is_active()


NOVEL = [
    *("--algo", "recurrent_ppg", "--env", "CartPoleNoVel-v1", "-n", "256", "--eval-freq", "128"),
    *("--eval-episodes", "2", "--seed", "0", "--device", "cpu", "--save-freq", "128", "--global-n-envs", "-params"),
    *("n_envs:4", "n_steps:16", "batch_size:32", "n_epochs:1", "n_policy_iters:2", "aux_batch_rollouts:2"),
]


@pytest.fixture(scope="module")
def novel_job(tmp_path_factory) -> Path:
    """The log folder (-f) of the NOVEL job on two ranks, run once to its end."""
    folder = tmp_path_factory.mktemp("novel")
    completed = torchrun_train(*NOVEL, "-f", str(folder))
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "--global-n-envs: 2 environments on each of the 2 ranks" in completed.stdout
    return folder


def numbered_checkpoints(run: Path) -> list[Path]:
    return sorted((run / "checkpoints").glob("*_steps"), key=lambda path: int(path.name.split("_")[-2]))


def test_train_cli_under_torchrun(novel_job):
    """
    ``torchrun -m sb3_ppg.train --algo recurrent_ppg``: two ranks share one run folder (rank 1 logs its episodes into
    ``rank_1/`` and writes its part of each checkpoint, the LSTM states of its own envs included); the model loads in
    one process.
    """
    run = novel_job / "recurrent_ppg" / "CartPoleNoVel-v1_1"
    assert any(episode_lengths(run / "rank_1" / name) for name in ("0.monitor.csv", "1.monitor.csv"))
    checkpoints = numbered_checkpoints(run)
    assert [path.name.split("_")[-2] for path in checkpoints] == ["128", "256"]
    lstm_states = [np.load(checkpoints[0] / f"rank_{rank}" / "run_state.npz")["last_lstm_states"] for rank in range(2)]
    assert lstm_states[0].shape == (4, 1, 2, 64) and not np.array_equal(*lstm_states)
    with np.load(run / "evaluations.npz") as evaluations:
        assert evaluations["timesteps"].tolist() == [128, 256]
    model = RecurrentPPG.load(run / "CartPoleNoVel-v1.zip", device="cpu")
    assert model.num_timesteps == 256 and model.n_aux_phases == 2


def test_resume_mid_run_under_torchrun(tmp_path, novel_job):
    """
    The torchrun job stopped after its first checkpoint and resumed with ``--resume CHECKPOINT`` ends exactly as the
    uninterrupted one: parameters bit for bit, both ranks' episode logs (each rank's LSTM states resumed), evaluations.
    """
    run_a = novel_job / "recurrent_ppg" / "CartPoleNoVel-v1_1"
    shutil.copytree(novel_job, tmp_path / "b")
    run_b = tmp_path / "b" / "recurrent_ppg" / "CartPoleNoVel-v1_1"
    first, last = numbered_checkpoints(run_b)
    shutil.rmtree(last)
    (run_b / "CartPoleNoVel-v1.zip").unlink()
    completed = torchrun_train(*NOVEL, "-f", str(tmp_path / "b"), "--resume", str(first))
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "continuing" in completed.stdout and first.name in completed.stdout
    model_a, model_b = (RecurrentPPG.load(run / "CartPoleNoVel-v1.zip", device="cpu") for run in (run_a, run_b))
    assert model_a.num_timesteps == model_b.num_timesteps == 256
    for (name, a), b in zip(model_a.policy.state_dict().items(), model_b.policy.state_dict().values(), strict=True):
        assert th.equal(a, b), name
    for log in ("0.monitor.csv", "1.monitor.csv", "rank_1/0.monitor.csv", "rank_1/1.monitor.csv"):
        assert episode_lengths(run_b / log) == episode_lengths(run_a / log), log
    with np.load(run_a / "evaluations.npz") as eval_a, np.load(run_b / "evaluations.npz") as eval_b:
        for key in ("timesteps", "results", "ep_lengths"):
            np.testing.assert_array_equal(eval_a[key], eval_b[key])
