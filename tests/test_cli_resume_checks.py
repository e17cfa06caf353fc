"""
What the command line refuses or survives around ``--resume`` and the files of a run folder: a resumed command that
changes the run's settings (``-params``, ``--env-kwargs``, ``--env``), a checkpoint written from Python, a tampered
``config.yml`` / ``args.yml`` (read without running code), a damaged ``evaluations.npz``, a full disk while the
evaluation log or ``vecnormalize.pkl`` is written, and ``n_envs`` below 1.
"""

import argparse
import errno
import pickle
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from stable_baselines3.common.callbacks import EvalCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import VecNormalize
from torch import nn

from sb3_ppg import PPG, PPGCheckpointCallback, PPGEvalCallback
from sb3_ppg.cli import arguments, enjoy, train, zoo
from sb3_ppg.cli.run_folders import UnsafeRunFileError, read_run_file

ENV_NAME = "CartPole-v1"
RUN = [
    "--env",
    ENV_NAME,
    "--seed",
    "0",
    "--device",
    "cpu",
    "--verbose",
    "0",
    "--save-freq",
    "128",
    "--eval-freq",
    "128",
    "--eval-episodes",
    "1",
]
TOTAL = ["-n", "256"]
# A class and a tuple among the values: the zoo writes them with Python tags into config.yml / args.yml
PARAMS = [
    "-params",
    "n_envs:2",
    "n_steps:64",
    "batch_size:64",
    "n_epochs:2",
    "n_policy_iters:2",
    "n_aux_epochs:1",
    "aux_batch_rollouts:2",
    "policy_kwargs:dict(activation_fn=nn.ReLU,net_arch=(16,))",
]


# Many tests here train less than one auxiliary phase on purpose (the state they check comes before it): the warning
# that learn() then trains as plain PPO is meant
pytestmark = [
    pytest.mark.usefixtures("registered_zoo"),
    pytest.mark.filterwarnings(r"ignore:learn\(total_timesteps=.*this learn\(\) trains as plain PPO"),
]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The log folder of one complete command-line run (checkpoints at 128 and 256 steps, two evaluations)."""
    folder = tmp_path_factory.mktemp("finished")
    config = folder / "hyperparams.yml"
    shutil.copy(arguments.hyperparams_file(), config)
    train.main([*RUN, *TOTAL, "-conf", str(config), "-f", str(folder / "logs"), *PARAMS])
    return folder


@pytest.fixture
def log_folder(finished_run: Path, tmp_path: Path) -> Path:
    """A copy of the finished run's log folder."""
    shutil.copytree(finished_run / "logs", tmp_path / "logs")
    return tmp_path / "logs"


def folder_contents(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` with its bytes."""
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def exit_message(argv: list[str]) -> str:
    """The one-line error ``python -m sb3_ppg.train`` exits with."""
    with pytest.raises(SystemExit) as error:
        train.main(argv)
    text = str(error.value.code)
    assert text.startswith("error: ") and "\n" not in text.strip()
    return text


# ----------------------------------------------------------------------------------------------------------------------
# --resume keeps the run's settings


@pytest.mark.parametrize(
    "changes, message",
    [
        (
            [*PARAMS, "n_epochs:3", "learning_rate:0.1"],
            r"this command changes them: -params n_epochs \(run: 2, command: 3\), learning_rate \(run: 'lin_1e-3', "
            r"command: 0\.1\)\. Pass the run's values",
        ),
        ([*PARAMS[:1], "n_envs:4"], r"-params n_envs \(run: 2, command: 4\)"),
        (
            [*PARAMS, "--env-kwargs", "render_mode:'rgb_array'"],
            r"--env-kwargs render_mode \(run: not set, command: 'rgb_array'\)",
        ),
        (
            ["--env", "CartPole-v0", *PARAMS],
            r"CartPole-v1_1 is a run of 'CartPole-v1' \(.*args\.yml\), not of --env CartPole-v0\. Pass --env CartPole-v1",
        ),
    ],
)
def test_resume_refuses_to_change_the_run(finished_run: Path, log_folder: Path, changes: list[str], message: str):
    run = log_folder / "ppg" / f"{ENV_NAME}_1"
    before = folder_contents(log_folder)
    text = exit_message(
        [*RUN, *TOTAL, "-conf", str(finished_run / "hyperparams.yml"), "-f", str(log_folder), *changes, "--resume", str(run)]
    )
    assert re.search(message, text), text
    # Nothing written: config.yml still describes the run, no files of another env in its folder
    assert folder_contents(log_folder) == before


def test_resume_keeps_the_run_hyperparameters_when_the_file_changed(finished_run: Path, log_folder: Path):
    run = log_folder / "ppg" / f"{ENV_NAME}_1"
    # A job stopped after its checkpoint at 128 steps, requeued with a newer version of the hyperparameter file
    shutil.rmtree(run / "checkpoints" / "ppg_256_steps")
    (run / f"{ENV_NAME}.zip").unlink()
    run_files = {name: (run / ENV_NAME / name).read_bytes() for name in ("config.yml", "args.yml", "command.txt")}
    newer = finished_run / "hyperparams.yml"
    newer = newer.with_name("newer.yml")
    text = (finished_run / "hyperparams.yml").read_text()
    assert "  gamma: 0.98\n" in text
    newer.write_text(text.replace("  gamma: 0.98\n", "  gamma: 0.9\n  normalize: true\n", 1))

    # The same command, without -n: the run's total is kept
    train.main([*RUN, "-conf", str(newer), "-f", str(log_folder), *PARAMS, "--resume"])
    model = PPG.load(run / f"{ENV_NAME}.zip", device="cpu")
    assert model.num_timesteps == 256 and model.gamma == 0.98 and model.policy.activation_fn is nn.ReLU
    assert not (run / ENV_NAME / "vecnormalize.pkl").exists()
    assert {name: (run / ENV_NAME / name).read_bytes() for name in run_files} == run_files


def test_resume_refuses_a_checkpoint_written_from_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make_model):
    project = tmp_path / "project"
    model = make_model(ENV_NAME, n_envs=2, aux_batch_rollouts=2)
    model.learn(32, callback=PPGCheckpointCallback(16, str(project / "checkpoints"), name_prefix="rl_model"))
    before = folder_contents(project)
    monkeypatch.chdir(project)
    for resume in ("checkpoints/rl_model_32_steps", "checkpoints", "."):
        text = exit_message(["--env", ENV_NAME, "-f", str(tmp_path / "logs"), "--device", "cpu", "--resume", resume])
        assert re.search(
            r"rl_model_32_steps is not a checkpoint of a python -m sb3_ppg\.train run .* writes only into its own run "
            r"folders\. Continue it from Python: model = PPG\.load_checkpoint\(path, env=env\)",
            text,
        ), text
    assert folder_contents(project) == before and not (tmp_path / "logs").exists()


def test_resume_refuses_the_run_folder_of_another_env_without_config(tmp_path: Path):
    run = tmp_path / "ppg" / f"{ENV_NAME}_1"
    run.mkdir(parents=True)
    (run / "0.monitor.csv").write_text("")
    text = exit_message(["--env", "CartPole-v0", "-f", str(tmp_path), "--device", "cpu", "--resume", str(run)])
    assert "is not a run folder of --env CartPole-v0 (the command line names them CartPole-v0_<id>)" in text
    assert [path.name for path in run.iterdir()] == ["0.monitor.csv"]


@pytest.mark.parametrize("n_envs", ["0", "-2", "2.5"])
def test_n_envs_below_one_is_a_clear_error(tmp_path: Path, n_envs: str):
    text = exit_message(
        ["--env", ENV_NAME, "-f", str(tmp_path), "--device", "cpu", "-n", "256", "-params", f"n_envs:{n_envs}"]
    )
    assert f"n_envs must be an integer >= 1 (the number of environments trained on), got {n_envs}: fix -params" in text
    assert not (tmp_path / "ppg").exists()


# ----------------------------------------------------------------------------------------------------------------------
# Run files read without running code


def test_run_file_loader_reads_what_the_zoo_writes(finished_run: Path):
    params_path = finished_run / "logs" / "ppg" / f"{ENV_NAME}_1" / ENV_NAME
    assert "!!python/name:" in (params_path / "config.yml").read_text()
    config = read_run_file(params_path / "config.yml")
    assert list(config) == sorted(config) and (config["n_steps"], config["learning_rate"]) == (64, "lin_1e-3")
    assert config["policy_kwargs"] == {"activation_fn": nn.ReLU, "net_arch": (16,)}
    args = read_run_file(params_path / "args.yml")
    assert args["env"] == ENV_NAME and args["hyperparams"]["n_envs"] == 2


@pytest.mark.parametrize(
    "value, tag",
    [
        ("!!python/object/apply:builtins.print [TAMPERED]", "!!python/object/apply:builtins.print"),
        ("!!python/object/new:collections.Counter [[1]]", "!!python/object/new:collections.Counter"),
        ("!!python/name:os.system ''", r"!!python/name:os\.system \(not a class of an already imported module\)"),
        ("!!python/name:no_such_module.Thing ''", r"!!python/name:no_such_module\.Thing \(not a class"),
        ("!!python/object/apply:collections.OrderedDict {args: [[[1, 2]]]}", "!!python/object/apply:collections.OrderedDict"),
        ("!!python/object/apply:collections.OrderedDict [[[[1], 2]]]", r".*OrderedDict \(unhashable type: 'list'\)"),
    ],
)
def test_run_file_loader_refuses_other_python_objects(tmp_path: Path, capsys, value: str, tag: str):
    path = tmp_path / "config.yml"
    path.write_text(f"n_steps: 64\nkey: {value}\n")
    with pytest.raises(UnsafeRunFileError, match=rf"config\.yml, line 2: refused the YAML tag {tag}"):
        read_run_file(path)
    assert "TAMPERED" not in capsys.readouterr().out


@pytest.mark.parametrize("name", ["config.yml", "args.yml"])
def test_enjoy_reads_run_files_without_running_code(log_folder: Path, capsys, name: str):
    enjoy_argv = ["--env", ENV_NAME, "-f", str(log_folder), "--no-render", "-n", "20", "--verbose", "0"]
    enjoy.main(enjoy_argv)
    path = log_folder / "ppg" / f"{ENV_NAME}_1" / ENV_NAME / name
    # One more [key, value] pair at the end of the zoo's OrderedDict: a call to print
    path.write_text(path.read_text() + "  - - tampered\n    - !!python/object/apply:builtins.print [TAMPERED]\n")
    capsys.readouterr()
    with pytest.raises(SystemExit) as error:
        enjoy.main(enjoy_argv)
    assert re.match(rf"error: .*{name}, line \d+: refused the YAML tag !!python/object/apply:builtins.print", str(error.value))
    assert "TAMPERED" not in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------------------------------
# The files written over a good previous version


def full_disk_during(kind: type, write_partial: bool = True):
    """A ``pickle.dump`` that fails like a full disk for objects of ``kind`` (after writing a few bytes)."""
    real_dump = pickle.dump

    def dump(obj, file, *args, **kwargs):
        if isinstance(obj, kind):
            if write_partial:
                file.write(b"\x80\x04partial")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_dump(obj, file, *args, **kwargs)

    return dump


def test_evaluation_log_is_replaced_atomically(tmp_path: Path, make_model, monkeypatch: pytest.MonkeyPatch):
    model = make_model(n_envs=2)
    callback = PPGEvalCallback(make_vec_env(ENV_NAME, 1), n_eval_episodes=1, eval_freq=8, log_path=str(tmp_path), seed=0)
    model.learn(32, callback=callback)
    with np.load(tmp_path / "evaluations.npz") as data:
        assert list(data["timesteps"]) == [16, 32]
    good = (tmp_path / "evaluations.npz").read_bytes()

    def full_disk(file, *args, **kwargs):
        # As np.savez, which adds the extension
        with open(file if str(file).endswith(".npz") else f"{file}.npz", "wb") as handle:
            handle.write(b"PK\x03\x04")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(np, "savez", full_disk)
    with pytest.raises(OSError, match="No space left"):
        model.learn(32, callback=callback, reset_num_timesteps=False)
    assert (tmp_path / "evaluations.npz").read_bytes() == good
    assert [path.name for path in tmp_path.iterdir()] == ["evaluations.npz"]


def test_a_damaged_evaluation_log_is_moved_aside_on_resume(tmp_path: Path, make_model):
    model = make_model(n_envs=2)
    model.learn(32)
    (tmp_path / "evaluations.npz").write_bytes(b"PK\x03\x04truncated")
    callback = PPGEvalCallback(make_vec_env(ENV_NAME, 1), n_eval_episodes=1, eval_freq=16, log_path=str(tmp_path), seed=0)
    with pytest.warns(
        UserWarning, match=r"evaluations\.npz cannot be read \(BadZipFile: .*moved to .*evaluations\.npz\.damaged"
    ):
        model.learn(32, callback=callback, reset_num_timesteps=False)
    assert (tmp_path / "evaluations.npz.damaged").read_bytes() == b"PK\x03\x04truncated"
    with np.load(tmp_path / "evaluations.npz") as data:
        assert list(data["timesteps"]) == [64]


def test_vecnormalize_is_replaced_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    hyperparams = {
        "n_envs": 2,
        "n_steps": 16,
        "batch_size": 16,
        "n_policy_iters": 2,
        "aux_batch_rollouts": 2,
        "normalize": True,
    }
    manager = zoo.make_experiment_manager(
        argparse.Namespace(),
        "ppg",
        ENV_NAME,
        str(tmp_path),
        eval_freq=64,
        n_eval_episodes=1,
        hyperparams=hyperparams,
        seed=0,
        verbose=0,
        device="cpu",
        config=arguments.hyperparams_file(),
    )
    model, _ = manager.setup_experiment()
    path = Path(manager.params_path) / "vecnormalize.pkl"
    manager.save_trained_model(model)
    good = path.read_bytes()
    VecNormalize.load(str(path), make_vec_env(ENV_NAME, 1))

    monkeypatch.setattr(pickle, "dump", full_disk_during(VecNormalize))
    # At the end of the run, and when an evaluation finds a new best model
    with pytest.raises(OSError, match="No space left"):
        manager.save_trained_model(model)
    assert path.read_bytes() == good
    on_new_best = next(callback for callback in manager.callbacks if isinstance(callback, EvalCallback)).callback_on_new_best
    on_new_best.init_callback(model)
    with pytest.raises(OSError, match="No space left"):
        on_new_best.on_step()
    assert path.read_bytes() == good
    assert sorted(item.name for item in path.parent.iterdir()) == ["args.yml", "command.txt", "config.yml", "vecnormalize.pkl"]
