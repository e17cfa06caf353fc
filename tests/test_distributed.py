"""
Data-parallel PPG (sb3_ppg.common.distributed): two gloo processes on the CPU, started by hand (with torchrun's environment
variables) or by torchrun; the runs themselves are in distributed_worker.py.
"""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch as th
from gymnasium.envs.classic_control import CartPoleEnv
from helpers import assert_identical
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.running_mean_std import RunningMeanStd
from stable_baselines3.common.vec_env import DummyVecEnv

from sb3_ppg import PPG
from sb3_ppg.common import data_parallel, distributed

TESTS = Path(__file__).parent
WORKER = str(TESTS / "distributed_worker.py")
sys.path.insert(0, str(TESTS))
import distributed_worker  # noqa: E402

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def worker_environment(**extra: str) -> dict[str, str]:
    environment = {name: value for name, value in os.environ.items() if name not in distributed.TORCHRUN_VARIABLES}
    return dict(environment, OMP_NUM_THREADS="1", PYTHONPATH=str(TESTS.parent), **extra)


def start_ranks(scenario: str, out_dir: Path, timeout_s: float = 60, worker: str = WORKER) -> list[subprocess.Popen]:
    """
    Two processes of the ``worker`` script with the variables torchrun would set (PPG initializes the process group
    itself).
    """
    port = str(free_port())
    processes = []
    for rank in range(2):
        environment = worker_environment(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
            SB3_PPG_DIST_TIMEOUT=str(timeout_s),
        )
        log = open(out_dir / f"log{rank}.txt", "w")
        processes.append(
            subprocess.Popen([sys.executable, worker, scenario, str(out_dir)], env=environment, stdout=log, stderr=log)
        )
    return processes


def wait_all(processes: list[subprocess.Popen], out_dir: Path, timeout: float = 120) -> None:
    for rank, process in enumerate(processes):
        try:
            returncode = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            for other in processes:
                other.kill()
            raise
        assert returncode == 0, (out_dir / f"log{rank}.txt").read_text()[-3000:]


def results(out_dir: Path) -> list[dict[str, Any]]:
    return [th.load(out_dir / f"rank{rank}.pt", weights_only=False) for rank in range(2)]


# ---------------------------------------------------------------------------------------------------------------------
# Without processes
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(), (3,)])
def test_merge_running_stats(shape):
    """Ranks that update the same base with their own data merge into one RunningMeanStd that saw all of it."""
    rng = np.random.default_rng(0)
    base = RunningMeanStd(shape=shape)
    base.update(rng.normal(2.0, 3.0, size=(50, *shape)))
    batches = [rng.normal(mean, 1.0, size=(n, *shape)) for mean, n in ((5.0, 7), (-1.0, 30), (2.0, 1))]
    states, everything = [], RunningMeanStd(shape=shape)
    everything.mean, everything.var, everything.count = base.mean.copy(), base.var.copy(), base.count
    for batch in batches:
        rank = RunningMeanStd(shape=shape)
        rank.mean, rank.var, rank.count = base.mean.copy(), base.var.copy(), base.count
        for start in range(0, len(batch), 3):  # several updates per rank, as VecNormalize does per step
            rank.update(batch[start : start + 3])
        states.append((rank.mean, rank.var, rank.count))
        everything.update(batch)
    mean, var, count = distributed.merge_running_stats((base.mean, base.var, base.count), states)
    assert count == pytest.approx(everything.count)
    np.testing.assert_allclose(mean, everything.mean, rtol=1e-12)
    np.testing.assert_allclose(var, everything.var, rtol=1e-10)


def test_single_process(monkeypatch):
    """Without torchrun nothing is distributed; with torchrun's variables, the env count is split before init."""
    assert not distributed.is_active() and distributed.get_rank() == 0 and distributed.get_world_size() == 1
    assert distributed.auto_init("auto") == "auto"
    assert distributed.local_n_envs(6) == 6
    for name, value in dict(RANK="1", LOCAL_RANK="1", WORLD_SIZE="4", MASTER_ADDR="127.0.0.1", MASTER_PORT="1").items():
        monkeypatch.setenv(name, value)
    assert distributed.local_n_envs(8) == 2
    with pytest.raises(ValueError, match="6 envs cannot be split evenly over 4 ranks"):
        distributed.local_n_envs(6)
    monkeypatch.setenv(distributed.AUTO_INIT_VARIABLE, "0")  # opted out: one independent process
    assert distributed.local_n_envs(6) == 6
    assert distributed.auto_init("cpu") == "cpu" and not distributed.is_active()


def test_fingerprint_holds_value_clipping_and_policy_minibatches(make_model):
    """Ranks built with other value_clipping or policy_minibatches differ in their fingerprint: learn() refuses them."""
    fingerprints = [
        data_parallel.fingerprint(model, model._optimizers(), 0, 16, True)
        for model in (make_model(), make_model(value_clipping="max", policy_minibatches="envs"))
    ]
    assert [fingerprint["value_clipping"] for fingerprint in fingerprints] == ["'sb3'", "'max'"]
    assert [fingerprint["policy_minibatches"] for fingerprint in fingerprints] == ["'transitions'", "'envs'"]


def test_gloo_exit_handler_registered_once(monkeypatch):
    """init_from_torchrun registers the gloo exit handler once per process, however often the group is re-created."""
    registered = []

    def unregister(function) -> None:  # as atexit.unregister: every registration of the function
        registered[:] = [other for other in registered if other is not function]

    monkeypatch.setattr(distributed.atexit, "register", registered.append)
    monkeypatch.setattr(distributed.atexit, "unregister", unregister)
    variables = dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    try:
        for _ in range(2):
            distributed.init_from_torchrun(backend="gloo", timeout=30)
            th.distributed.destroy_process_group()
    finally:
        distributed._destroy_at_exit()  # what the handler (not registered here) does, before pytest's own exit
    assert registered == [distributed._destroy_at_exit]


# ---------------------------------------------------------------------------------------------------------------------
# Two processes
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def equality_runs(tmp_path_factory) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The equality scenarios in two ranks (2 envs each), and in this process (4 envs), on the same rollouts."""
    out_dir = tmp_path_factory.mktemp("equality")
    processes = start_ranks("equality", out_dir)
    reference = {name: distributed_worker.equality(name) for name in distributed_worker.EQUALITY_CONFIGS}
    # (the ranks then run the mismatch and resync scenarios)
    wait_all(processes, out_dir)
    return results(out_dir), reference


@pytest.mark.parametrize("config", list(distributed_worker.EQUALITY_CONFIGS))
def test_two_ranks_equal_one_process(equality_runs, config):
    """
    Two iterations (policy phases, then an aux phase) with the rollout split in two give the parameters of one process
    trained on the whole rollout: gradients averaged, advantages normalized globally, same early stopping. The
    networks run in float64 and the advantages normalize exactly in float32 (see distributed_worker.SyntheticRollout),
    so the runs differ only by the order of float64 sums (~1e-16, which Adam amplifies by at most lr / eps = 5e4 per
    step): they agree to 1e-8 on any CPU, where a real difference is a fraction of a learning rate (5e-4).
    """
    (rank0, rank1), reference = equality_runs
    rank0, rank1, reference = rank0[config], rank1[config], reference[config]
    assert_identical(rank0["initial"], reference["initial"])
    assert_identical(rank0["final"], rank1["final"])
    for name, value in reference["final"].items():
        moved = (value - reference["initial"][name]).abs().max().item()
        assert moved > 1e-5, name
        assert value.dtype == th.float64
        assert (rank0["final"][name] - value).abs().max().item() < 1e-8, name
    for key in ("num_timesteps", "n_aux_phases", "n_updates"):
        assert rank0[key] == rank1[key] == reference[key], key
    assert reference["n_aux_phases"] == 1
    if config == "target_kl":
        assert reference["n_updates"] < 8  # early stopping happened


def test_a_non_finite_loss_on_one_rank_skips_the_step_on_every_rank(equality_runs):
    """
    The finite checks on the device (forced on the CPU's fused Adam): rank 1's first auxiliary loss is NaN with a finite
    gradient. Both ranks skip that step (their weights and Adam state stay equal, the second step taken: step count 1
    in the aux optimizer) and raise at the end of the phase, rank 0 saying it was another rank's.
    """
    rank0, rank1 = (result["nan_loss_on_one_rank"] for result in equality_runs[0])
    assert rank1["error"].startswith("PPG's auxiliary-phase loss is nan at timestep 64 (optimizer step 1 of the phase)")
    assert rank0["error"].startswith("PPG's auxiliary-phase loss or gradients were not finite on another rank")
    for error in (rank0["error"], rank1["error"]):
        assert "1 of the phase's 2 optimizer steps" in error
    assert rank0["n_aux_calls"] == rank1["n_aux_calls"] == 2
    assert_identical(rank0["final"], rank1["final"])
    assert all(th.isfinite(value).all() for value in rank0["final"].values())
    assert all(th.equal(a, b) for a, b in zip(rank0["adam"], rank1["adam"], strict=True))
    assert {state.item() for state in rank0["adam"][2::3]} == {1.0}


def test_mismatched_hyperparameters(equality_runs):
    """Every rank raises the same clear error at the start of learn() (no hang)."""
    errors = [result["mismatch"]["error"] for result in equality_runs[0]]
    assert errors[0] == errors[1]
    assert "the ranks disagree" in errors[0] and "n_epochs: rank 0 has 1, rank 1 has 2" in errors[0]


def test_ranks_on_other_envs(equality_runs):
    """Ranks on CartPole-v1 and CartPole-v0 (same spaces) stop at learn() with the same error naming both ids."""
    errors = [result["env_mismatch"]["error"] for result in equality_runs[0]]
    assert errors[0] is not None and errors[0] == errors[1]
    assert "the ranks disagree" in errors[0]
    assert "env_ids: rank 0 has ['CartPole-v1', 'CartPole-v1'], rank 1 has ['CartPole-v0', 'CartPole-v0']" in errors[0]


def test_env_ids(make_model):
    """The ids the ranks compare: gymnasium's spec id, or the class of an env made without gymnasium.make."""
    assert data_parallel.env_ids(make_model(n_envs=2).env) == ["CartPole-v1", "CartPole-v1"]
    assert data_parallel.env_ids(DummyVecEnv([CartPoleEnv])) == ["CartPoleEnv"]


def test_learn_starts_from_rank_0(equality_runs):
    """Parameters, Adam moments and VecNormalize statistics changed on rank 1 are rank 0's again at learn()."""
    rank0, rank1 = (result["resync"] for result in equality_runs[0])
    assert_identical(rank0["final"], rank1["final"])
    assert all(th.equal(first, second) for first, second in zip(rank0["adam"], rank1["adam"], strict=True))
    assert rank0["ret_rms"] == rank1["ret_rms"]


@pytest.mark.parametrize("how", ["dies", "stuck"])
def test_lost_rank(tmp_path, how):
    """When rank 1 dies or stops answering, rank 0 stops with a DistributedError (at most the collective timeout)."""
    timeout_s = 5
    processes = start_ranks(how, tmp_path, timeout_s=timeout_s)
    try:
        assert processes[0].wait(timeout=120) == 0, (tmp_path / "log0.txt").read_text()[-3000:]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    result = th.load(tmp_path / "rank0.pt", weights_only=False)
    assert "Data-parallel PPG" in result["error"] and "rank 0 of 2" in result["error"]
    assert result["seconds"] < timeout_s + 20


@pytest.mark.parametrize("n_nodes", [1, 2])
def test_torchrun_end_to_end(tmp_path, n_nodes):
    """
    torchrun, two ranks, CartPole with reward normalization through two aux phases: identical parameters and merged
    statistics on both ranks, global step count, rank 0 alone saves, and the model loads in this process.
    With ``n_nodes=2``: two torchrun launchers with the multi-node flags (``--nnodes=2 --node_rank=N``), one process
    each, as on two machines (both have ``LOCAL_RANK=0``).
    """
    port = free_port()
    launchers = []
    for node_rank in range(n_nodes):
        command = [
            *(sys.executable, "-m", "torch.distributed.run", f"--nnodes={n_nodes}", f"--node_rank={node_rank}"),
            *(f"--nproc_per_node={2 // n_nodes}", "--master_addr=127.0.0.1", f"--master_port={port}"),
            *(WORKER, "end_to_end", str(tmp_path)),
        ]
        launchers.append(
            subprocess.Popen(command, env=worker_environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    try:
        for launcher in launchers:
            _, stderr = launcher.communicate(timeout=180)
            assert launcher.returncode == 0, stderr[-3000:]
    finally:
        for launcher in launchers:
            if launcher.poll() is None:
                launcher.kill()
    rank0, rank1 = results(tmp_path)
    assert [rank0["local_rank"], rank1["local_rank"]] == ([0, 1] if n_nodes == 1 else [0, 0])
    assert_identical(rank0["final"], rank1["final"])
    assert rank0["num_timesteps"] == rank1["num_timesteps"] == 4 * 16 * 4
    assert rank0["n_aux_phases"] == rank1["n_aux_phases"] == 2
    # One running return statistic fed by both ranks' 4 x 16 x 2 returns (count starts at 1e-4)
    assert rank0["ret_rms"] == rank1["ret_rms"]
    assert rank0["ret_rms"][2] == pytest.approx(1e-4 + 4 * 16 * 4)
    assert rank0["episodes"] == rank1["episodes"] > 0
    assert (tmp_path / "model_rank0.zip").exists() and not (tmp_path / "model_rank1.zip").exists()
    assert [path.name for path in (tmp_path / "tensorboard").iterdir()] == ["PPG_1"]  # rank 0's run only
    assert len(list((tmp_path / "tensorboard" / "PPG_1").iterdir())) == 1
    model = PPG.load(tmp_path / "model_rank0", env=make_vec_env("CartPole-v1", n_envs=1))
    assert model.num_timesteps == 4 * 16 * 4
    assert_identical({name: value.cpu() for name, value in model.policy.state_dict().items()}, rank0["final"])
    model.predict(model.env.reset())


def test_torchrun_killed_rank(tmp_path):
    """Killing one rank of a torchrun job ends the whole job with an error within a bounded time."""
    command = [
        *(sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2"),
        *("--master_addr=127.0.0.1", f"--master_port={free_port()}", WORKER, "stuck", str(tmp_path)),
    ]
    process = subprocess.Popen(
        command,
        env=worker_environment(SB3_PPG_DIST_TIMEOUT="120"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob("pid1")) and time.monotonic() < deadline:
            time.sleep(0.2)
        pid = int((tmp_path / "pid1").read_text())
        os.kill(pid, signal.SIGKILL)
        start = time.monotonic()
        returncode = process.wait(timeout=60)
        assert returncode != 0
        assert time.monotonic() - start < 30
    finally:
        if process.poll() is None:
            process.kill()
