"""
PPGCheckpointCallback's rules around the checkpoints it writes: which one is the newest, what pruning keeps after a
resume, what it never deletes, the folder's lock, and the errors for manifests and arguments it cannot use.
"""

import json
import multiprocessing
import os
import pathlib
import shutil

import pytest
import torch as th
from helpers import assert_identical, hold_lock, parameters
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env

from sb3_ppg import PPG, PPGCheckpointCallback

# Many tests here train less than one auxiliary phase on purpose (the state they check comes before it): the warning
# that learn() then trains as plain PPO is meant
pytestmark = pytest.mark.filterwarnings(r"ignore:learn\(total_timesteps=.*this learn\(\) trains as plain PPO")

N_ENVS, N_STEPS = 2, 16
ITERATION = N_ENVS * N_STEPS  # env steps per iteration
TOTAL = 8 * ITERATION
RUN = dict(n_policy_iters=3, n_steps=N_STEPS)


def make_env():
    return make_vec_env("CartPole-v1", n_envs=N_ENVS, seed=0)


def callback(folder: pathlib.Path, keep_last: int | None = None) -> PPGCheckpointCallback:
    return PPGCheckpointCallback(N_STEPS, str(folder), name_prefix="ppg", keep_last=keep_last)


def checkpoint_names(folder: pathlib.Path) -> list[str]:
    return sorted(path.name for path in folder.glob("ppg_*_steps"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory, make_model) -> tuple[pathlib.Path, dict[str, th.Tensor]]:
    """An uninterrupted run with a checkpoint every iteration (all kept), and its final parameters."""
    folder = tmp_path_factory.mktemp("reference") / "run"
    model = make_model(make_env(), **RUN)
    model.learn(TOTAL, callback=callback(folder))
    return folder, parameters(model)


@pytest.fixture
def run(reference, tmp_path) -> pathlib.Path:
    """A copy of the reference run's checkpoints."""
    shutil.copytree(reference[0], tmp_path / "run")
    return tmp_path / "run"


def test_resume_from_the_previous_checkpoint_keeps_it(reference, run):
    """The newest checkpoint damaged, the previous one loaded, keep_last=1: the one resumed from stays until the run
    has written a newer one (it used to be deleted at the start of learn())."""
    damaged = run / f"ppg_{TOTAL}_steps" / "run_state.npz"
    damaged.write_bytes(damaged.read_bytes()[:-10])
    model = PPG.load_checkpoint(run / f"ppg_{TOTAL - ITERATION}_steps", env=make_env())
    model.learn(0, reset_num_timesteps=False, callback=callback(run, keep_last=1))  # a kill before the next checkpoint
    assert checkpoint_names(run) == [f"ppg_{TOTAL - ITERATION}_steps", f"ppg_{TOTAL}_steps"]
    with pytest.warns(UserWarning, match="skipped"):
        model = PPG.load_checkpoint(run, env=make_env())
    model.learn(ITERATION, reset_num_timesteps=False, callback=callback(run, keep_last=1))
    assert checkpoint_names(run) == [f"ppg_{TOTAL}_steps"]  # written again, complete
    assert_identical(parameters(PPG.load_checkpoint(run, env=make_env())), reference[1])


def test_rollback_to_the_oldest_of_three(reference, run):
    """keep_last=2, resumed from the oldest of three: it is kept; the abandoned branch goes once the new one has a
    checkpoint; the newest is the one written last."""
    for steps in range(ITERATION, TOTAL - 2 * ITERATION, ITERATION):
        shutil.rmtree(run / f"ppg_{steps}_steps")
    oldest = run / f"ppg_{TOTAL - 2 * ITERATION}_steps"
    model = PPG.load_checkpoint(oldest, env=make_env())
    model.learn(0, reset_num_timesteps=False, callback=callback(run, keep_last=2))
    assert checkpoint_names(run) == [f"ppg_{steps}_steps" for steps in (192, 224, 256)]
    model.learn(ITERATION, reset_num_timesteps=False, callback=callback(run, keep_last=2))
    assert checkpoint_names(run) == ["ppg_192_steps", "ppg_224_steps"]  # ppg_256_steps was the abandoned branch's
    model = PPG.load_checkpoint(run, env=make_env())
    assert model.num_timesteps == TOTAL - ITERATION
    model.learn(ITERATION, reset_num_timesteps=False, callback=callback(run, keep_last=2))
    assert checkpoint_names(run) == ["ppg_224_steps", "ppg_256_steps"]
    assert_identical(parameters(model), reference[1])


def test_second_learn_counting_from_zero(tmp_path, make_model):
    """A second learn() that counts its steps from 0 again: its checkpoints are the newest ones (not pruned as the
    oldest), and the folder loads its last one."""
    model = make_model(make_env(), **RUN)
    model.learn(TOTAL, callback=callback(tmp_path, keep_last=2))
    model.learn(3 * ITERATION, callback=callback(tmp_path, keep_last=2))
    assert checkpoint_names(tmp_path) == [f"ppg_{2 * ITERATION}_steps", f"ppg_{3 * ITERATION}_steps"]
    loaded = PPG.load_checkpoint(tmp_path, env=make_env())
    assert loaded.num_timesteps == 3 * ITERATION
    assert_identical(parameters(loaded), parameters(model))


def test_pruning_deletes_only_its_own_files(reference, tmp_path, make_model):
    """Symbolic links out of save_path (the rollouts folder, an old checkpoint from a backup) and files sb3_ppg did not
    write are left alone, with a warning."""
    save = tmp_path / "save"
    scratch, backup = tmp_path / "scratch", tmp_path / "backup" / "ppg_16_steps"
    (scratch / "sub").mkdir(parents=True)
    (scratch / "notes.txt").write_text("mine")
    shutil.copytree(reference[0] / f"ppg_{ITERATION}_steps", backup)
    save.mkdir()
    (save / "ppg_rollouts").symlink_to(scratch)
    (save / "ppg_16_steps").symlink_to(backup)
    (save / "ppg_48_steps").mkdir()  # an incomplete checkpoint holding a file of the user's
    (save / "ppg_48_steps" / "notes.txt").write_text("mine")
    (save / ".notes.txt.tmp-1").write_text("mine")
    model = make_model(make_env(), **RUN)
    with pytest.warns(UserWarning) as warned:
        model.learn(TOTAL, callback=callback(save, keep_last=2))
    messages = "\n".join(str(warning.message) for warning in warned)
    assert "ppg_rollouts' leads out of save_path" in messages
    assert "ppg_48_steps' holds files sb3_ppg does not write (notes.txt)" in messages
    assert (scratch / "notes.txt").read_text() == "mine" and (scratch / "sub").is_dir()
    assert (backup / "manifest.json").is_file() and (save / "ppg_16_steps").is_symlink()
    assert sorted(path.name for path in (save / "ppg_48_steps").iterdir()) == ["notes.txt"]
    assert (save / ".notes.txt.tmp-1").is_file()
    assert checkpoint_names(save) == ["ppg_16_steps", "ppg_224_steps", "ppg_256_steps", "ppg_48_steps"]
    assert PPG.load_checkpoint(save, env=make_env()).num_timesteps == TOTAL


def test_stray_files_do_not_stop_training(run):
    """A damaged manifest in the oldest checkpoint, a foreign manifest.json in a sub-folder, a folder and a foreign
    file in the rollouts folder: skipped with warnings naming them, training and pruning go on."""
    oldest = run / f"ppg_{ITERATION}_steps" / "manifest.json"
    oldest.write_text(oldest.read_text()[:20])
    (run / "other").mkdir()
    (run / "other" / "manifest.json").write_text(json.dumps({"name": "not a checkpoint"}))
    (run / "ppg_rollouts" / "sub").mkdir()
    (run / "ppg_rollouts" / "README").write_text("mine")
    with pytest.warns(UserWarning) as warned:
        model = PPG.load_checkpoint(run, env=make_env())
        model.learn(ITERATION, reset_num_timesteps=False, callback=callback(run, keep_last=2))
    messages = "\n".join(str(warning.message) for warning in warned)
    assert f"The manifest {str(oldest)!r} is damaged" in messages
    assert f"{str(run / 'other' / 'manifest.json')!r} is not a PPG checkpoint manifest" in messages
    assert "ppg_rollouts/sub' is not a stored rollout" in messages and "ppg_rollouts/README' is not" in messages
    assert checkpoint_names(run) == sorted(f"ppg_{steps}_steps" for steps in (ITERATION, TOTAL, TOTAL + ITERATION))
    assert (run / "other" / "manifest.json").is_file() and (run / "ppg_rollouts" / "sub").is_dir()


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("files", [], r"holds \[\] under 'files', which should be an object"),
        ("world_size", "1", r"holds '1' under 'world_size', which should be an integer >= 1"),
        ("aux_rollout_files", None, r"has no key 'aux_rollout_files'"),
        ("num_timesteps", -5, r"holds -5 under 'num_timesteps'"),
        ("files", {"../model.zip": "0"}, r"under 'files'"),
    ],
)
def test_manifest_of_wrong_types(run, key, value, message):
    directory = run / f"ppg_{TOTAL}_steps"
    manifest = json.loads((directory / "manifest.json").read_text())
    if value is None:
        del manifest[key]
    else:
        manifest[key] = value
    (directory / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=rf"{directory / 'manifest.json'}.*{message}"):
        PPG.load_checkpoint(directory, env=make_env())


@pytest.mark.parametrize("prefix", ["a/b", "../x", "a\\b"])
def test_name_prefix_with_a_path(tmp_path, prefix):
    with pytest.raises(ValueError, match="name_prefix must be a name"):
        PPGCheckpointCallback(N_STEPS, str(tmp_path), name_prefix=prefix)


def test_refused_for_sb3_ppo(tmp_path):
    """Given to SB3's PPO: an error at the start of learn(), nothing written."""
    model = PPO("MlpPolicy", make_env(), n_steps=N_STEPS, batch_size=N_STEPS, policy_kwargs=dict(net_arch=[8]))
    with pytest.raises(TypeError, match=r"checkpoints PPG models .*, not PPO.*SB3's CheckpointCallback"):
        model.learn(2 * ITERATION, callback=callback(tmp_path / "save"))
    assert not (tmp_path / "save").exists()


def test_interrupted_train_writes_no_checkpoint(tmp_path, monkeypatch, make_model):
    """Ctrl-C inside train(), then on_training_end() (as the RL Zoo calls it): no checkpoint of the half-trained model."""
    model = make_model(make_env(), **RUN)
    checkpoints = callback(tmp_path)
    original = PPG._policy_phase
    calls = []

    def interrupted(self):
        original(self)
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(PPG, "_policy_phase", interrupted)
    with pytest.raises(KeyboardInterrupt):
        model.learn(TOTAL, callback=checkpoints)
    checkpoints.on_training_end()
    assert checkpoint_names(tmp_path) == [f"ppg_{ITERATION}_steps", f"ppg_{2 * ITERATION}_steps"]


def test_another_process_writing_here(tmp_path, make_model):
    """A second run writing into a folder a live process has locked stops at its start, naming that process; the lock
    of a process that ended does not block."""
    context = multiprocessing.get_context("fork")
    ready, release = context.Event(), context.Event()
    holder = context.Process(target=hold_lock, args=(str(tmp_path), ready, release))
    holder.start()
    try:
        assert ready.wait(30)
        model = make_model(make_env(), **RUN)
        with pytest.raises(RuntimeError, match=rf"Another run is writing here \(pid {holder.pid} on "):
            model.learn(TOTAL, callback=callback(tmp_path))
        assert checkpoint_names(tmp_path) == []
    finally:
        release.set()
        holder.join(30)
    model.learn(2 * ITERATION, callback=callback(tmp_path))
    assert checkpoint_names(tmp_path) == [f"ppg_{ITERATION}_steps", f"ppg_{2 * ITERATION}_steps"]
    assert f"pid {os.getpid()} on" in (tmp_path / ".sb3_ppg.lock").read_text()


def test_a_kill_while_model_zip_is_written_leaves_nothing_pruning_keeps(run, monkeypatch):
    """A checkpoint's model.zip is written through one temporary file, which pruning deletes after a kill; it used
    to be written through two (``..model.zip.tmp-<pid>.tmp-<pid>``), which pruning never deleted, so the
    incomplete checkpoint's folder stayed for good (tests/test_checkpoints.py::test_sigkill_anywhere_then_resume
    found 4 and 5 checkpoints where keep_last is 3)."""
    written_to = []
    original = PPG._write_zip

    def recording_write_zip(self, file, *args, **kwargs):
        written_to.append(pathlib.Path(file.name).name)
        return original(self, file, *args, **kwargs)

    monkeypatch.setattr(PPG, "_write_zip", recording_write_zip)
    model = PPG.load_checkpoint(run / f"ppg_{TOTAL}_steps", env=make_env())
    model.learn(ITERATION, reset_num_timesteps=False, callback=callback(run))
    assert written_to == [f".model.zip.tmp-{os.getpid()}"]
    # What a kill left with the two temporary names, in an incomplete checkpoint: pruning removes it
    killed = run / f"ppg_{TOTAL - ITERATION}_steps"
    (killed / "manifest.json").unlink()
    (killed / "model.zip").unlink()
    (killed / "..model.zip.tmp-1.tmp-1").write_bytes(b"half a zip")
    model = PPG.load_checkpoint(run, env=make_env())
    model.learn(0, reset_num_timesteps=False, callback=callback(run, keep_last=3))
    assert not killed.exists()
    assert checkpoint_names(run) == [f"ppg_{steps}_steps" for steps in (TOTAL - 2 * ITERATION, TOTAL, TOTAL + ITERATION)]


def test_save_path_in_the_home_folder(tmp_path, monkeypatch, make_model):
    """save_path="~/runs" is the home folder's runs, not a folder named "~" (issue 29); load_checkpoint reads it back."""
    for name in ("HOME", "USERPROFILE"):
        monkeypatch.setenv(name, str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    model = make_model(make_env(), **RUN)
    model.learn(ITERATION, callback=PPGCheckpointCallback(N_STEPS, "~/runs", name_prefix="ppg"))
    assert checkpoint_names(tmp_path / "home" / "runs") == [f"ppg_{ITERATION}_steps"]
    assert not (tmp_path / "~").exists()
    assert PPG.load_checkpoint("~/runs", env=make_env()).num_timesteps == ITERATION
