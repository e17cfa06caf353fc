"""PPGCheckpointCallback and PPG.load_checkpoint: a run cut anywhere and resumed ends bit-identical to an uninterrupted one."""

import json
import os
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest
import torch as th
from helpers import assert_identical, parameters
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import SubprocVecEnv, VecNormalize

from sb3_ppg import PPG, PPGCheckpointCallback
from sb3_ppg.common.checkpoints import read_torch_threads
from sb3_ppg.common.precision import cpu_has_native_bf16

# Many tests here train less than one auxiliary phase on purpose (the state they check comes before it): the warning
# that learn() then trains as plain PPO is meant
pytestmark = pytest.mark.filterwarnings(r"ignore:learn\(total_timesteps=.*this learn\(\) trains as plain PPO")

N_ENVS, N_STEPS = 2, 16
ITERATION = N_ENVS * N_STEPS  # env steps per iteration
TOTAL = 8 * ITERATION  # aux phases after iterations 3 and 6
RUN = dict(n_policy_iters=3, n_steps=N_STEPS)


def make_env(seed: int = 0, normalize: bool = False):
    env = make_vec_env("CartPole-v1", n_envs=N_ENVS, seed=seed)
    return VecNormalize(env, gamma=0.99) if normalize else env


def checkpoint_dir(folder: pathlib.Path, steps: int) -> pathlib.Path:
    return folder / f"ppg_{steps}_steps"


@pytest.fixture(scope="module")
def reference(tmp_path_factory, make_model):
    """The uninterrupted run (a checkpoint every iteration), and the same run without callback."""
    folder = tmp_path_factory.mktemp("reference")
    runs = {}
    for normalize in (False, True):
        model = make_model(make_env(normalize=normalize), **RUN)
        callback = PPGCheckpointCallback(N_STEPS, str(folder / str(normalize)), name_prefix="ppg")
        model.learn(TOTAL, callback=callback)
        plain = make_model(make_env(normalize=normalize), **RUN).learn(TOTAL)
        runs[normalize] = (folder / str(normalize), parameters(model), parameters(plain), model)
    return runs


@pytest.mark.parametrize("normalize", [False, True])
def test_checkpoints_do_not_change_training(reference, normalize):
    folder, params, plain_params, model = reference[normalize]
    assert_identical(params, plain_params)
    assert model.n_aux_phases == 2
    steps = sorted(int(path.name.split("_")[1]) for path in folder.glob("ppg_*_steps"))
    assert steps == list(range(ITERATION, TOTAL + 1, ITERATION))
    manifest = json.loads((checkpoint_dir(folder, 4 * ITERATION) / "manifest.json").read_text())
    assert set(manifest["files"]) == {"model.zip", "run_state.npz", "env_states.pkl"}
    assert len(manifest["aux_rollout_files"]) == 1


# 2 * ITERATION: just before an aux phase (2 of 3 iterations stored); 3 *: just after one; 4 *, 5 *: inside a cycle
@pytest.mark.parametrize("cut", [1, 2, 3, 4, 5, 7])
@pytest.mark.parametrize("normalize", [False, True])
def test_resume_bit_identical(reference, tmp_path, cut, normalize):
    folder, params, _, _ = reference[normalize]
    # A fresh env, seeded otherwise: its envs' states come from the checkpoint
    resumed = PPG.load_checkpoint(checkpoint_dir(folder, cut * ITERATION), env=make_env(seed=123, normalize=normalize))
    assert resumed.num_timesteps == cut * ITERATION
    assert resumed.aux_buffer.n_iterations == cut % 3
    callback = PPGCheckpointCallback(N_STEPS, str(tmp_path), name_prefix="ppg")
    resumed.learn(TOTAL - resumed.num_timesteps, reset_num_timesteps=False, callback=callback)
    assert resumed.num_timesteps == TOTAL and resumed.n_aux_phases == 2
    assert_identical(params, parameters(resumed))
    # The resumed run writes its checkpoints at the same steps, with the same rollouts
    assert checkpoint_dir(tmp_path, TOTAL).is_dir()
    manifest = json.loads((checkpoint_dir(tmp_path, TOTAL) / "manifest.json").read_text())
    reference_manifest = json.loads((checkpoint_dir(folder, TOTAL) / "manifest.json").read_text())
    assert manifest["aux_rollout_files"] == reference_manifest["aux_rollout_files"]


def test_resumed_run_warns_only_when_it_ends_before_its_first_aux_phase(reference):
    """The checkpoint after iteration 1 holds 1 of the 3 rollouts of the first auxiliary phase (at step 3 * ITERATION)."""
    folder = reference[False][0]
    resumed = PPG.load_checkpoint(checkpoint_dir(folder, ITERATION), env=make_env())
    with pytest.warns(UserWarning) as warned:
        resumed.learn(ITERATION, reset_num_timesteps=False)
    assert [str(warning.message) for warning in warned] == [
        f"learn(total_timesteps={ITERATION}) stops at step {2 * ITERATION}, before PPG's first auxiliary phase at step "
        f"{3 * ITERATION} (after n_policy_iters=3 rollouts of {N_STEPS} steps x {N_ENVS} envs; the auxiliary buffer holds "
        f"1 of them): this learn() trains as plain PPO. Raise total_timesteps to at least {2 * ITERATION}."
    ]
    resumed = PPG.load_checkpoint(checkpoint_dir(folder, ITERATION), env=make_env())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resumed.learn(2 * ITERATION, reset_num_timesteps=False)
    assert resumed.n_aux_phases == 1


def damage(path: pathlib.Path) -> None:
    """Flip one bit in the middle of a file."""
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 1
    path.write_bytes(bytes(raw))


def rollout_files(directory: pathlib.Path) -> list[str]:
    return json.loads((directory / "manifest.json").read_text())["aux_rollout_files"]


def test_load_newest_in_folder_and_damage(reference, tmp_path):
    folder = tmp_path / "run"
    shutil.copytree(reference[False][0], folder)
    model = PPG.load_checkpoint(folder, env=make_env())
    assert model.num_timesteps == TOTAL
    # An incomplete checkpoint (no manifest) is ignored
    (checkpoint_dir(folder, TOTAL) / "manifest.json").unlink()
    assert PPG.load_checkpoint(folder, env=make_env()).num_timesteps == TOTAL - ITERATION
    # A damaged one: loaded by name, an error naming the newest older one that verifies; the folder falls back to it
    newest = checkpoint_dir(folder, TOTAL - ITERATION)
    damage(newest / "run_state.npz")
    with pytest.raises(
        ValueError, match=r"ppg_224_steps' is damaged \(run_state.npz does not match.*verifies is '.*ppg_192_steps'"
    ):
        PPG.load_checkpoint(newest, env=make_env())
    with pytest.warns(UserWarning, match=r"Loaded checkpoint '.*ppg_192_steps': .* skipped: '.*ppg_224_steps' \(run_state"):
        assert PPG.load_checkpoint(folder, env=make_env()).num_timesteps == 6 * ITERATION
    # Nothing to load
    with pytest.raises(FileNotFoundError):
        PPG.load_checkpoint(tmp_path / "empty")
    # Another number of envs
    with pytest.raises(ValueError, match="2 envs"):
        PPG.load_checkpoint(checkpoint_dir(folder, 4 * ITERATION), env=make_vec_env("CartPole-v1", n_envs=3))


def test_damaged_rollout_shared_by_two_checkpoints(reference, tmp_path):
    """The manifests hold the rollouts' checksums: a fallback is verified first, skipping those sharing a damaged rollout."""
    folder = tmp_path / "run"
    shutil.copytree(reference[False][0], folder)
    for steps in (6 * ITERATION, 7 * ITERATION, TOTAL):
        shutil.rmtree(checkpoint_dir(folder, steps))
    manifest = json.loads((checkpoint_dir(folder, 5 * ITERATION) / "manifest.json").read_text())
    assert list(manifest["aux_rollout_digests"]) == manifest["aux_rollout_files"]
    # Iteration 4's rollout (after the aux phase of iteration 3), in the checkpoints of iterations 4 and 5, truncated
    shared = rollout_files(checkpoint_dir(folder, 4 * ITERATION))
    assert len(shared) == 1 and rollout_files(checkpoint_dir(folder, 5 * ITERATION))[0] == shared[0]
    rollout = folder / "ppg_rollouts" / shared[0]
    rollout.write_bytes(rollout.read_bytes()[:-10])
    with pytest.raises(ValueError, match=r"ppg_160_steps' is damaged \(the stored rollout .* verifies is '.*ppg_96_steps'"):
        PPG.load_checkpoint(checkpoint_dir(folder, 5 * ITERATION), env=make_env())
    with pytest.warns(UserWarning, match=r"ppg_96_steps'.*skipped: '.*ppg_160_steps' .*; '.*ppg_128_steps'"):
        assert PPG.load_checkpoint(folder, env=make_env()).num_timesteps == 3 * ITERATION
    # Another valid rollout file in its place (its checksum is another): damaged too
    shutil.copy(folder / "ppg_rollouts" / rollout_files(checkpoint_dir(folder, 2 * ITERATION))[1], rollout)
    with pytest.raises(ValueError, match=r"ppg_128_steps' is damaged \(the stored rollout .* does not match its checksum"):
        PPG.load_checkpoint(checkpoint_dir(folder, 4 * ITERATION), env=make_env())
    # A manifest written before the sequence numbers and rollout checksums (sb3_ppg 0.x) still loads
    old = checkpoint_dir(folder, 2 * ITERATION) / "manifest.json"
    manifest = json.loads(old.read_text())
    del manifest["sequence"], manifest["aux_rollout_digests"]
    old.write_text(json.dumps(manifest))
    assert PPG.load_checkpoint(old.parent, env=make_env()).aux_buffer.n_iterations == 2


def test_keep_last_prunes_checkpoints_and_rollouts(tmp_path, make_model):
    model = make_model(make_env(), **RUN)
    callback = PPGCheckpointCallback(N_STEPS, str(tmp_path), name_prefix="ppg", keep_last=2)
    model.learn(TOTAL, callback=callback)
    assert sorted(path.name for path in tmp_path.glob("ppg_*_steps")) == ["ppg_224_steps", "ppg_256_steps"]
    # Iteration 7 and 8 are in the buffer: one file each, nothing else
    assert len(list((tmp_path / "ppg_rollouts").iterdir())) == 2
    assert not list(tmp_path.rglob(".*tmp*"))
    # The rollouts of the checkpoint a pruning deletes go with it: after an aux phase, nothing is left
    model = make_model(make_env(), **RUN)
    model.learn(6 * ITERATION, callback=PPGCheckpointCallback(N_STEPS, str(tmp_path / "one"), name_prefix="ppg", keep_last=1))
    assert sorted(path.name for path in (tmp_path / "one").glob("ppg_*_steps")) == ["ppg_192_steps"]
    assert list((tmp_path / "one" / "ppg_rollouts").iterdir()) == []


def test_resumed_run_tidies_what_a_kill_left(tmp_path, make_model):
    """A kill between a checkpoint's manifest and the pruning leaves one checkpoint too many: the resume prunes it."""
    model = make_model(make_env(), **RUN)
    model.learn(TOTAL, callback=PPGCheckpointCallback(N_STEPS, str(tmp_path), name_prefix="ppg", keep_last=2))
    shutil.copytree(tmp_path / "ppg_224_steps", tmp_path / "ppg_208_steps")  # a complete one the pruning missed
    (tmp_path / "ppg_240_steps").mkdir()  # an incomplete one (no manifest)
    (tmp_path / "ppg_rollouts" / f"rollout_{'0' * 32}.npz").write_bytes(b"")  # a stored rollout no checkpoint uses
    resumed = PPG.load_checkpoint(tmp_path, env=make_env())
    resumed.learn(0, reset_num_timesteps=False, callback=PPGCheckpointCallback(N_STEPS, str(tmp_path), "ppg", keep_last=2))
    assert sorted(path.name for path in tmp_path.glob("ppg_*_steps")) == ["ppg_224_steps", "ppg_256_steps"]
    assert len(list((tmp_path / "ppg_rollouts").iterdir())) == 2


def test_save_freq_counts_env_steps(tmp_path, make_model):
    model = make_model(make_env(), **RUN)
    # Every 3 iterations' worth of steps (48 calls): written at the boundary after the 48th, 96th call
    model.learn(TOTAL, callback=PPGCheckpointCallback(3 * N_STEPS, str(tmp_path), name_prefix="ppg"))
    assert sorted(int(path.name.split("_")[1]) for path in tmp_path.glob("ppg_*_steps")) == [96, 192]
    with pytest.raises(ValueError, match="keep_last"):
        PPGCheckpointCallback(1, str(tmp_path), keep_last=0)


def test_unsaveable_env_states_warn(tmp_path, make_model):
    env = make_vec_env(
        "CartPole-v1", n_envs=N_ENVS, seed=0, vec_env_cls=SubprocVecEnv, vec_env_kwargs=dict(start_method="fork")
    )
    model = make_model(env, **RUN)
    with pytest.warns(UserWarning, match="restarts its episodes"):
        model.learn(2 * ITERATION, callback=PPGCheckpointCallback(N_STEPS, str(tmp_path), name_prefix="ppg"))
    with pytest.warns(UserWarning, match="episodes restart"):
        resumed = PPG.load_checkpoint(tmp_path, env=env)
    assert resumed._last_obs is None
    resumed.learn(ITERATION, reset_num_timesteps=False)
    assert resumed.num_timesteps == 3 * ITERATION and resumed.n_aux_phases == 1
    env.close()


def test_checkpoint_records_torch_threads(tmp_path, make_model):
    """torch's CPU kernels round differently with another number of threads: a checkpoint records its count, and
    load_checkpoint warns (changing nothing) when torch now uses another."""
    previous = th.get_num_threads()
    try:
        th.set_num_threads(2)
        model = make_model(make_env(), **RUN)
        model.learn(ITERATION, callback=PPGCheckpointCallback(N_STEPS, str(tmp_path), name_prefix="ppg"))
        assert read_torch_threads(checkpoint_dir(tmp_path, ITERATION)) == 2
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message=".*torch threads")
            PPG.load_checkpoint(tmp_path, env=make_env(), device="cpu")
        th.set_num_threads(1)
        message = r"written with 2 torch threads and torch now uses 1: .*torch.set_num_threads\(2\)"
        with pytest.warns(UserWarning, match=message):
            PPG.load_checkpoint(tmp_path, env=make_env(), device="cpu")
        assert th.get_num_threads() == 1
    finally:
        th.set_num_threads(previous)


def run_child(folder: pathlib.Path, kill_at: str = "", kill_after: float | None = None, algo: str = "ppg") -> int:
    """
    Run tests/checkpoint_child.py (``algo``: ``"ppg"`` or ``"recurrent"``); kill it with SIGKILL ``kill_after`` seconds
    after it starts training.
    """
    env = {**os.environ, "KILL_AT": kill_at, "ALGO": algo, "PYTHONPATH": str(pathlib.Path(__file__).parents[1])}
    child = subprocess.Popen(
        [sys.executable, str(pathlib.Path(__file__).with_name("checkpoint_child.py")), str(folder), str(KILL_TOTAL)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    if kill_after is not None:
        assert child.stdout is not None
        child.stdout.readline()  # "started" / "resumed at ..."
        time.sleep(kill_after)
        child.send_signal(signal.SIGKILL)
    return child.wait(timeout=600)  # generous: a loaded 2-core machine runs the child several times slower


KILL_TOTAL = 24 * ITERATION


@pytest.mark.slow
def test_sigkill_anywhere_then_resume(tmp_path):
    """Killed with SIGKILL during a checkpoint write, during an aux phase and at random moments, resumed each time."""
    assert run_child(tmp_path / "reference") == 0
    reference = dict(np.load(tmp_path / "reference" / "final_params.npz"))

    folder = tmp_path / "killed"
    rng = random.Random(0)
    # Inside the 6th file write (the second checkpoint's), inside the 5th aux minibatch, then 3 random moments
    kills = [("write:6", None), ("aux:5", None)] + [("", rng.uniform(0.05, 1.0)) for _ in range(3)]
    for kill_at, kill_after in kills:
        returncode = run_child(folder, kill_at, kill_after)
        # The planned kills happen; a random one may come after the end of training (then nothing is left to do)
        assert returncode == -signal.SIGKILL or (kill_after is not None and returncode == 0)
        if kill_at == "write:6":
            # The second checkpoint is incomplete (no manifest), a temporary file is left: the first one is loaded
            assert not (folder / "checkpoints" / f"ppg_{2 * ITERATION}_steps" / "manifest.json").exists()
            assert list((folder / "checkpoints").rglob(".*tmp*"))
    (folder / "final_params.npz").unlink(missing_ok=True)
    assert run_child(folder) == 0
    final = dict(np.load(folder / "final_params.npz"))
    assert final.keys() == reference.keys()
    for name in final:
        assert np.array_equal(final[name], reference[name]), name

    # Every checkpoint left is readable, and nothing half-written is left
    checkpoints = sorted((folder / "checkpoints").glob("ppg_*_steps"))
    assert len(checkpoints) == 3
    for directory in checkpoints:
        PPG.load_checkpoint(directory, env=make_env())
    assert not list((folder / "checkpoints").rglob(".*tmp*"))


@pytest.mark.parametrize("error", [KeyboardInterrupt, FloatingPointError])
def test_interrupted_aux_phase_leaves_model_usable(tmp_path, make_model, monkeypatch, error):
    model = make_model(make_env(), **RUN)
    callback = PPGCheckpointCallback(N_STEPS, str(tmp_path), name_prefix="ppg")
    calls = []
    original = PPG._aux_loss

    def failing_aux_loss(self, batch):
        calls.append(1)
        if len(calls) == 2:
            raise error("interrupted")
        return original(self, batch)

    monkeypatch.setattr(PPG, "_aux_loss", failing_aux_loss)
    with pytest.raises(error) as info:
        model.learn(TOTAL, callback=callback)
    assert "learn() again reruns that phase" in "".join(getattr(info.value, "__notes__", []))
    assert model.aux_buffer.full() and model.n_aux_phases == 0
    # The last checkpoint (before the interrupted iteration) is intact
    assert PPG.load_checkpoint(tmp_path, env=make_env()).num_timesteps == 2 * ITERATION
    # The buffer can be saved and loaded while full; learn() again reruns the phase
    model.save_aux_buffer(tmp_path / "buffer.npz")
    other = make_model(make_env(), **RUN)
    other.load_aux_buffer(tmp_path / "buffer.npz")
    for agent in (model, other):
        with pytest.warns(UserWarning, match="interrupted"):
            agent.learn(ITERATION, reset_num_timesteps=False)
        assert agent.n_aux_phases == 1 and agent.aux_buffer.n_iterations == 1


@pytest.mark.parametrize("precision", ["auto", "bf16"])
def test_procgen_resume_bit_identical(tmp_path, make_model, precision):
    """
    make_procgen_env at a tiny size: the games' native states travel in the checkpoint; resuming is exact, with bf16
    rollouts too (``"auto"`` on an AMX or AVX512-BF16 CPU; ``"bf16"`` on any).
    """
    from sb3_ppg import make_procgen_env

    def make(seed: int = 5):
        return make_procgen_env("starpilot", n_envs=2, seed=seed, num_threads=1)

    policy_kwargs = dict(arch="detach", features_extractor_kwargs=dict(channels=(4, 4, 4), features_dim=16))
    total = 5 * 16
    model = make_model(make(), "ProcgenCnn", policy_kwargs, n_steps=8, batch_size=8, seed=3, device="cpu", precision=precision)
    # bf16 rollouts: asked for, or "auto" on an AMX or AVX512-BF16 CPU (fp32 on others)
    assert model.policy.compute_dtype == (th.bfloat16 if precision == "bf16" or cpu_has_native_bf16() else th.float32)
    model.learn(total, callback=PPGCheckpointCallback(8, str(tmp_path / "run"), name_prefix="ppg"))
    params = parameters(model)
    # Cut inside an N_pi cycle (3 iterations: one stored) and resume on an env built with another seed
    resumed = PPG.load_checkpoint(checkpoint_dir(tmp_path / "run", 3 * 16), env=make(seed=999))
    resumed.learn(total - resumed.num_timesteps, reset_num_timesteps=False)
    assert resumed.n_aux_phases == model.n_aux_phases == 2
    assert_identical(params, parameters(resumed))


def test_stored_rollouts_are_read_once_until_the_buffer_is_reset(tmp_path, make_model, monkeypatch):
    """
    A policy iteration already stored is not read again by the next checkpoint: the checkpoints remember what they
    stored (the buffer holds no bookkeeping of theirs), until the buffer is reset and its rows hold other rollouts.
    """
    from sb3_ppg.common.aux_buffer import AuxiliaryBuffer
    from sb3_ppg.common.checkpoints import write_checkpoint

    model = make_model(make_env(), **RUN)
    model.learn(2 * ITERATION)
    read = []
    original = AuxiliaryBuffer.iteration_arrays
    monkeypatch.setattr(AuxiliaryBuffer, "iteration_arrays", lambda self, i, *a: read.append(i) or original(self, i, *a))
    rollouts = tmp_path / "rollouts"
    write_checkpoint(model, tmp_path / "first", rollouts)
    assert read == [0, 1] and not hasattr(model.aux_buffer, "saved_rollout_files")
    write_checkpoint(model, tmp_path / "second", rollouts)
    assert read == [0, 1]
    first = json.loads((tmp_path / "first" / "manifest.json").read_text())["aux_rollout_files"]
    model.aux_buffer.reset()
    model.aux_buffer.add(model.rollout_buffer)
    write_checkpoint(model, tmp_path / "third", rollouts)
    assert read == [0, 1, 0]
    third = json.loads((tmp_path / "third" / "manifest.json").read_text())["aux_rollout_files"]
    # Row 0 now holds the last rollout (the second stored before): its file, not the stale name of the old row 0
    assert third == [first[1]]
