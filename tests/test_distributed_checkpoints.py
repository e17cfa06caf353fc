"""
Checkpoints under torchrun: two gloo processes (tests/distributed_worker.py) write a checkpoint every iteration; a run
resumed from one in two processes ends bit-identical to the uninterrupted one, and another world size or a damaged
rank part gives a clear error on every rank, without waiting for the collective timeout.
"""

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from stable_baselines3.common.env_util import make_vec_env

from sb3_ppg import PPG, PPGCheckpointCallback

sys.path.insert(0, str(Path(__file__).parent))
from distributed_worker import CHECKPOINT_CUT, CHECKPOINT_ITERATION, CHECKPOINT_TOTAL
from test_distributed import assert_identical, results, start_ranks, wait_all

pytestmark = pytest.mark.slow

TIMEOUT_S = 30  # the collective timeout of the ranks: an error that waited for it would take this long


def manifest(directory: Path) -> dict[str, Any]:
    return json.loads((directory / "manifest.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, list[dict[str, Any]], list[dict[str, Any]]]:
    """The uninterrupted two-rank run, then the two-rank resume (and the failing loads) in two new processes."""
    out_dir = tmp_path_factory.mktemp("distributed_checkpoints")
    processes = start_ranks("checkpoint_train", out_dir, timeout_s=TIMEOUT_S)
    # Meanwhile, a checkpoint written by a single process
    model = PPG(
        "MlpPolicy", make_vec_env("CartPole-v1", n_envs=2), n_steps=16, n_aux_epochs=0, policy_kwargs=dict(net_arch=[8])
    )
    model.learn(16 * 2, callback=PPGCheckpointCallback(16, str(out_dir / "single_process"), name_prefix="ppg"))
    wait_all(processes, out_dir)
    trained = results(out_dir)
    # A copy of the checkpoints whose newest has its rank-1 run state damaged
    shutil.copytree(out_dir / "checkpoints", out_dir / "damaged")
    damaged = out_dir / "damaged" / f"ppg_{CHECKPOINT_TOTAL}_steps" / "rank_1" / "run_state.npz"
    raw = bytearray(damaged.read_bytes())
    raw[len(raw) // 2] ^= 1
    damaged.write_bytes(bytes(raw))
    # A checkpoint folder where rank 1 cannot write its part
    (out_dir / "blocked" / "ppg_0_steps").mkdir(parents=True)
    (out_dir / "blocked" / "ppg_0_steps" / "rank_1").write_text("not a folder")
    wait_all(start_ranks("checkpoint_resume", out_dir, timeout_s=TIMEOUT_S), out_dir)
    return out_dir, trained, results(out_dir)


def test_checkpoint_holds_every_rank(runs):
    """rank 0 writes model.zip, each rank its run state and rollouts; the manifest lists them all; pruning is safe."""
    out_dir, _, _ = runs
    folder = out_dir / "checkpoints"
    steps = sorted(int(path.name.split("_")[1]) for path in folder.glob("ppg_*_steps"))
    assert steps == list(range(CHECKPOINT_ITERATION, CHECKPOINT_TOTAL + 1, CHECKPOINT_ITERATION))
    cut = manifest(folder / f"ppg_{CHECKPOINT_CUT}_steps")
    assert cut["world_size"] == 2 and cut["num_timesteps"] == CHECKPOINT_CUT
    parts = [f"rank_{rank}/{name}" for rank in range(2) for name in ("run_state.npz", "env_states.pkl")]
    assert sorted(cut["files"]) == sorted(["model.zip", *parts])
    rank0, rank1 = cut["rank_aux_rollout_files"]
    assert len(rank0) == len(rank1) == 1 and rank0 != rank1  # each rank's own stored iteration
    assert cut["aux_rollout_files"] == rank0 + rank1
    # keep_last=2: the last two checkpoints, the rollouts they use and nothing else
    pruned = out_dir / "pruned"
    kept = sorted(pruned.glob("ppg_*_steps"))
    assert [path.name for path in kept] == [
        f"ppg_{CHECKPOINT_TOTAL - CHECKPOINT_ITERATION}_steps",
        f"ppg_{CHECKPOINT_TOTAL}_steps",
    ]
    used = {name for directory in kept for name in manifest(directory)["aux_rollout_files"]}
    assert {path.name for path in (pruned / "ppg_rollouts").iterdir()} == used
    assert not list(pruned.rglob(".*tmp*"))


def test_callback_on_every_rank(runs):
    """A checkpoint callback given to rank 0 only: every rank raises the same ValueError at the start of learn()."""
    _, trained, _ = runs
    assert trained[0]["mismatch"] == trained[1]["mismatch"]
    assert "boundary_callbacks: rank 0 has [('PPGCheckpointCallback', 16" in trained[0]["mismatch"]
    assert "rank 1 has []" in trained[0]["mismatch"]


def test_resume_bit_identical(runs):
    """Resumed in two processes from a mid-run checkpoint: both ranks end with the uninterrupted run's parameters."""
    out_dir, trained, resumed = runs
    assert_identical(trained[0]["final"], trained[1]["final"])
    for rank in range(2):
        assert resumed[rank]["resumed_at"] == CHECKPOINT_CUT and resumed[rank]["aux_iterations"] == 1
        assert resumed[rank]["num_timesteps"] == trained[rank]["num_timesteps"] == CHECKPOINT_TOTAL
        assert resumed[rank]["n_aux_phases"] == trained[rank]["n_aux_phases"] == 2
        assert_identical(resumed[rank]["final"], trained[rank]["final"])
    # The resumed run writes its checkpoints at the same steps, with the same rollouts
    final = f"ppg_{CHECKPOINT_TOTAL}_steps"
    reference = manifest(out_dir / "checkpoints" / final)
    assert manifest(out_dir / "resumed" / final)["rank_aux_rollout_files"] == reference["rank_aux_rollout_files"]
    assert sorted(path.name for path in (out_dir / "resumed").glob("ppg_*_steps")) == [
        f"ppg_{steps}_steps" for steps in (4 * CHECKPOINT_ITERATION, CHECKPOINT_TOTAL)
    ]


def test_failed_write_reaches_every_rank(runs):
    """A rank that cannot write its part: every rank raises, and the checkpoint stays incomplete."""
    out_dir, _, resumed = runs
    assert resumed[0]["write_error"] == resumed[1]["write_error"]
    assert "could not be written (rank 1: FileExistsError" in resumed[0]["write_error"]
    assert not (out_dir / "blocked" / "ppg_0_steps" / "manifest.json").exists()


def test_other_world_size(runs):
    """A two-rank checkpoint in one process, and a one-process checkpoint in two ranks: a clear ValueError."""
    out_dir, _, resumed = runs
    directory = out_dir / "checkpoints" / f"ppg_{CHECKPOINT_CUT}_steps"
    with pytest.raises(ValueError) as error:
        PPG.load_checkpoint(directory, env=make_vec_env("CartPole-v1", n_envs=2))
    message = str(error.value)
    assert "written with world size 2 and this run has world size 1" in message
    assert "torchrun --nproc_per_node=2" in message and str(directory / "model.zip") in message
    for rank in range(2):
        failure = resumed[rank]["single_process"]
        assert failure["type"] == "ValueError"
        assert "written with world size 1 and this run has world size 2" in failure["message"]
        assert "in a single process" in failure["message"]


def test_damaged_rank_part(runs):
    """rank 1's part damaged: both ranks raise the same ValueError at once (not after the collective timeout); given
    the folder, both ranks skip that checkpoint and load the previous one, with a warning naming it."""
    out_dir, _, resumed = runs
    failures = [resumed[rank]["damaged"] for rank in range(2)]
    assert failures[0]["message"] == failures[1]["message"]
    previous = f"ppg_{CHECKPOINT_TOTAL - CHECKPOINT_ITERATION}_steps"
    for failure in failures:
        assert failure["type"] == "CheckpointDamagedError"  # a ValueError
        assert "rank 1: CheckpointDamagedError: rank_1/run_state.npz does not match its checksum" in failure["message"]
        assert f"the newest older checkpoint that verifies is '{out_dir / 'damaged' / previous}'" in failure["message"]
        assert failure["seconds"] < TIMEOUT_S / 2
    for rank in range(2):
        loaded = resumed[rank]["damaged_folder"]
        assert loaded["num_timesteps"] == CHECKPOINT_TOTAL - CHECKPOINT_ITERATION
        assert any(previous in message and "skipped" in message for message in loaded["warnings"])
