"""
Checkpoints loaded without unpickling anything (``load_checkpoint(..., allow_pickle=False)``, issue 29): a Procgen
checkpoint resumes exactly with no pickle loaded; pickled envs, pickled objects without plain description and old
checkpoints are refused before anything in them runs.
"""

import hashlib
import io
import json
import os
import pathlib
import pickle
import shutil
import zipfile

import cloudpickle
import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.utils import FloatSchedule, LinearSchedule

from sb3_ppg import PPG, PPGCheckpointCallback, ProcgenCnnPolicy
from sb3_ppg.common.array_files import read_array_file, write_array_file
from sb3_ppg.common.checkpoints.model_objects import NotDescribable, describe, rebuild
from sb3_ppg.procgen import make_procgen_env

# Many tests here train less than one auxiliary phase on purpose (the state they check comes before it): the warning
# that learn() then trains as plain PPO is meant
pytestmark = pytest.mark.filterwarnings(r"ignore:learn\(total_timesteps=.*this learn\(\) trains as plain PPO")

OLD_CHECKPOINTS = pathlib.Path(__file__).parent / "data" / "old_files" / "checkpoints"
PROCGEN_RUN = dict(
    n_steps=16,
    n_policy_iters=2,
    n_aux_epochs=1,
    aux_batch_rollouts=1,
    seed=0,
    policy_kwargs=dict(features_extractor_kwargs=dict(features_dim=16, channels=(4, 8))),
)


def procgen_env():
    return make_procgen_env("coinrun", 2, num_levels=1, start_level=0, distribution_mode="easy")


def parameters(model: PPG) -> dict[str, th.Tensor]:
    return {name: tensor.clone() for name, tensor in model.policy.state_dict().items()}


class CreatesFolder:
    """A pickle that creates a folder when it is loaded: the proof that loading it ran code."""

    def __init__(self, path: pathlib.Path):
        self.path = str(path)

    def __reduce__(self):
        return os.mkdir, (self.path,)


def replace_file(checkpoint: pathlib.Path, name: str, content: bytes) -> None:
    """Replace a checkpoint's file and update its checksum in the manifest (tampering, not damage)."""
    (checkpoint / name).write_bytes(content)
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    manifest["files"][name] = hashlib.sha256(content).hexdigest()
    (checkpoint / "manifest.json").write_text(json.dumps(manifest))


def with_zip_data(path: pathlib.Path, change) -> bytes:
    """The model zip ``path`` with its ``data`` JSON changed by ``change(data)``."""
    output = io.BytesIO()
    with zipfile.ZipFile(path) as source, zipfile.ZipFile(output, "w") as target:
        for item in source.infolist():
            content = source.read(item.filename)
            if item.filename == "data":
                data = json.loads(content)
                change(data)
                content = json.dumps(data).encode()
            target.writestr(item, content)
    return output.getvalue()


def serialized(value) -> dict[str, str]:
    """An entry of a zip's ``data`` as SB3 writes an object it cloudpickles."""
    import base64

    return {":type:": "<class 'object'>", ":serialized:": base64.b64encode(cloudpickle.dumps(value)).decode()}


@pytest.fixture(scope="module")
def procgen_run(tmp_path_factory):
    """A Procgen run of 64 steps with a checkpoint every 16, and its final parameters."""
    folder = tmp_path_factory.mktemp("procgen_run")
    model = PPG("ProcgenCnnPolicy", procgen_env(), **PROCGEN_RUN)
    model.learn(64, callback=PPGCheckpointCallback(16, str(folder), name_prefix="ppg"))
    return folder, parameters(model)


@pytest.fixture
def no_unpickling(monkeypatch):
    """Every pickle loader of the standard library and cloudpickle fails the test while active."""

    def refuse(*args, **kwargs):
        raise AssertionError("a pickle was loaded")

    for module in (pickle, cloudpickle):
        monkeypatch.setattr(module, "loads", refuse)
        monkeypatch.setattr(module, "load", refuse)


def test_procgen_checkpoint_resumes_exactly_without_pickle(procgen_run, no_unpickling):
    """Nothing of a Procgen checkpoint needs unpickling: it resumes to the uninterrupted run's parameters, bit for bit."""
    folder, final = procgen_run
    checkpoint = folder / "ppg_32_steps"
    assert not list(checkpoint.glob("*.pkl"))
    metadata, _ = read_array_file(checkpoint / "run_state.npz", "sb3_ppg.run_state")
    assert metadata["model_objects"]["not_described"] == {}
    model = PPG.load_checkpoint(checkpoint, env=procgen_env(), allow_pickle=False)
    assert model.policy_class is ProcgenCnnPolicy and model.num_timesteps == 32
    assert model.observation_space == spaces.Box(0, 255, (3, 64, 64), np.uint8)
    model.learn(32, reset_num_timesteps=False)
    resumed = parameters(model)
    assert all(th.equal(resumed[name], final[name]) for name in final)


def test_tampered_model_zip_runs_nothing_without_pickle(procgen_run, tmp_path):
    """
    A pickled object of the zip replaced by code (checksum updated) is not loaded: described objects come from the run
    state; an object that has no description is refused, naming it, before anything is unpickled.
    """
    folder, _ = procgen_run
    checkpoint = tmp_path / "ppg_32_steps"
    shutil.copytree(folder / "ppg_32_steps", checkpoint)
    shutil.copytree(folder / "ppg_rollouts", tmp_path / "ppg_rollouts")
    marker = tmp_path / "code_ran"
    original = (checkpoint / "model.zip").read_bytes()

    def replace_policy_class(data):
        data["policy_class"] = serialized(CreatesFolder(marker))

    replace_file(checkpoint, "model.zip", with_zip_data(checkpoint / "model.zip", replace_policy_class))
    model = PPG.load_checkpoint(checkpoint, env=procgen_env(), allow_pickle=False)
    assert model.policy_class is ProcgenCnnPolicy and not marker.exists()

    def add_object(data):
        data["extra"] = serialized(CreatesFolder(marker))

    replace_file(checkpoint, "model.zip", original)
    replace_file(checkpoint, "model.zip", with_zip_data(checkpoint / "model.zip", add_object))
    with pytest.raises(ValueError, match=r"without unpickling objects of its model\.zip \(extra: not described") as error:
        PPG.load_checkpoint(checkpoint, env=procgen_env(), allow_pickle=False)
    assert "allow_pickle=True only if you trust" in str(error.value)
    assert not marker.exists()


def test_tampered_env_states_pickle_is_refused(tmp_path, make_model):
    """
    An env_states.pkl replaced by code (checksum updated) ran it in load_checkpoint on main. allow_pickle=False refuses
    the pickled envs before reading them; the default still loads it (docs/checkpoints.md says which files run code).
    """
    model = make_model("CartPole-v1", n_envs=2)
    model.learn(32, callback=PPGCheckpointCallback(16, str(tmp_path / "run"), name_prefix="ppg"))
    checkpoint = tmp_path / "run" / "ppg_32_steps"
    marker = tmp_path / "code_ran"
    replace_file(checkpoint, "env_states.pkl", pickle.dumps(CreatesFolder(marker)))
    with pytest.raises(ValueError, match=r"holds the pickled envs of a DummyVecEnv \(env_states\.pkl\)"):
        PPG.load_checkpoint(checkpoint, env=make_vec_env("CartPole-v1", n_envs=2), allow_pickle=False)
    assert not marker.exists()
    with pytest.raises(Exception):  # noqa: B017  the code runs, then the restore fails on what it returned
        PPG.load_checkpoint(checkpoint, env=make_vec_env("CartPole-v1", n_envs=2))
    assert marker.exists()


@pytest.mark.parametrize("allow_pickle", ["False", "no", 0, None, [False]])
def test_allow_pickle_takes_only_a_bool(tmp_path, make_model, allow_pickle):
    """
    allow_pickle="False" (a true string) loaded the tampered env_states.pkl and ran its code: anything but a bool is
    refused before a file is read (issue 51).
    """
    model = make_model("CartPole-v1", n_envs=2)
    model.learn(32, callback=PPGCheckpointCallback(16, str(tmp_path / "run"), name_prefix="ppg"))
    checkpoint = tmp_path / "run" / "ppg_32_steps"
    marker = tmp_path / "code_ran"
    replace_file(checkpoint, "env_states.pkl", pickle.dumps(CreatesFolder(marker)))
    with pytest.raises(TypeError, match=r"allow_pickle must be True or False, got .* pass allow_pickle=False"):
        PPG.load_checkpoint(checkpoint, env=make_vec_env("CartPole-v1", n_envs=2), allow_pickle=allow_pickle)
    assert not marker.exists()
    with pytest.raises(ValueError, match=r"holds the pickled envs"):  # numpy's bool is a bool
        PPG.load_checkpoint(checkpoint, env=make_vec_env("CartPole-v1", n_envs=2), allow_pickle=np.bool_(False))


def with_zip_member(path: pathlib.Path, name: str, content: bytes) -> bytes:
    """The model zip ``path`` with its member ``name`` replaced by ``content``."""
    output = io.BytesIO()
    with zipfile.ZipFile(path) as source, zipfile.ZipFile(output, "w") as target:
        for item in source.infolist():
            target.writestr(item, content if item.filename == name else source.read(item.filename))
    return output.getvalue()


@pytest.mark.parametrize("allow_pickle", [True, False])
def test_tampered_pth_file_names_the_checkpoint_and_file(procgen_run, tmp_path, allow_pickle):
    """
    A .pth member of model.zip replaced by a pickle that runs code (checksums updated) failed safely but with torch's
    "Weights only load failed", naming neither the checkpoint nor the file (issue 51): the error names both.
    """
    folder, _ = procgen_run
    checkpoint = tmp_path / "ppg_32_steps"
    shutil.copytree(folder / "ppg_32_steps", checkpoint)
    shutil.copytree(folder / "ppg_rollouts", tmp_path / "ppg_rollouts")
    marker = tmp_path / "code_ran"
    payload = io.BytesIO()
    th.save(CreatesFolder(marker), payload)
    replace_file(checkpoint, "model.zip", with_zip_member(checkpoint / "model.zip", "policy.pth", payload.getvalue()))
    with pytest.raises(ValueError, match=r"Checkpoint '.*ppg_32_steps' cannot be loaded: model\.zip, policy\.pth") as error:
        PPG.load_checkpoint(checkpoint, env=procgen_env(), allow_pickle=allow_pickle)
    assert "changed after the checkpoint was written" in str(error.value)
    assert not marker.exists()
    # An optimizer state of other parameters (plain tensors and containers: torch loads it)
    payload = io.BytesIO()
    th.save({"state": {}, "param_groups": [{"params": [0], "lr": 1e-3}]}, payload)
    tampered = with_zip_member(folder / "ppg_32_steps" / "model.zip", "policy.optimizer.pth", payload.getvalue())
    replace_file(checkpoint, "model.zip", tampered)
    with pytest.raises(ValueError, match=r"ppg_32_steps' cannot be loaded: model\.zip, its optimizers' \.pth members"):
        PPG.load_checkpoint(checkpoint, env=procgen_env(), allow_pickle=allow_pickle)


def test_tampered_space_description_names_the_checkpoint_and_file(procgen_run, tmp_path):
    """
    An observation space changed in the run state's plain descriptions (checksums updated) failed with a state_dict
    size mismatch naming no file (issue 51): the error names the checkpoint and run_state.npz.
    """
    folder, _ = procgen_run
    checkpoint = tmp_path / "ppg_32_steps"
    shutil.copytree(folder / "ppg_32_steps", checkpoint)
    shutil.copytree(folder / "ppg_rollouts", tmp_path / "ppg_rollouts")
    metadata, arrays = read_array_file(checkpoint / "run_state.npz", "sb3_ppg.run_state")
    metadata = {key: value for key, value in metadata.items() if key not in ("arrays", "checksum")}
    space = metadata["model_objects"]["objects"]["observation_space"]
    changed = json.loads(json.dumps(space).replace("64", "32"))
    assert changed != space
    metadata["model_objects"]["objects"]["observation_space"] = changed
    content = io.BytesIO()
    write_array_file(content, arrays, metadata)
    replace_file(checkpoint, "run_state.npz", content.getvalue())
    where = r"Checkpoint '.*ppg_32_steps' cannot be loaded: "
    with pytest.raises(ValueError, match=where + r"run_state\.npz: its description of the spaces does not fit the env"):
        PPG.load_checkpoint(checkpoint, env=procgen_env(), allow_pickle=False)
    with pytest.raises(ValueError, match=where + r"model\.zip, policy\.pth: its parameters do not fit .* run_state\.npz"):
        PPG.load_checkpoint(checkpoint, allow_pickle=False)


def test_old_checkpoint_is_refused_without_pickle(tmp_path, no_unpickling):
    """A checkpoint of an earlier version describes none of its pickled objects: refused, naming the first ones."""
    shutil.copytree(OLD_CHECKPOINTS, tmp_path / "checkpoints")
    with pytest.raises(ValueError, match=r"pickled envs of a DummyVecEnv"):
        PPG.load_checkpoint(tmp_path / "checkpoints", env=make_vec_env("CartPole-v1", n_envs=2), allow_pickle=False)
    manifest = json.loads((tmp_path / "checkpoints" / "ppg_96_steps" / "manifest.json").read_text())
    del manifest["files"]["env_states.pkl"]  # as if its envs had been saved as arrays
    (tmp_path / "checkpoints" / "ppg_96_steps" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"policy_class: not described in its run state"):
        PPG.load_checkpoint(tmp_path / "checkpoints", env=make_vec_env("CartPole-v1", n_envs=2), allow_pickle=False)


@pytest.mark.parametrize(
    "value",
    [
        spaces.Box(-np.inf, np.inf, (3,), np.float32),
        spaces.Box(np.array([0.0, -1.5]), np.array([1.0, 2.5]), dtype=np.float64),
        spaces.Dict({"a": spaces.Discrete(3, start=1), "b": spaces.MultiDiscrete([2, 3]), "c": spaces.MultiBinary(4)}),
        FloatSchedule(LinearSchedule(1e-3, 0.0, 0.5)),
        {"net_arch": [16, 16], "activation_fn": th.nn.Tanh, "optimizer_class": th.optim.SGD, "channels": (4, 8)},
    ],
    ids=["box-inf", "box-bounds", "dict", "linear-schedule", "policy-kwargs"],
)
def test_descriptions_round_trip(value):
    """What a description rebuilds equals the object (schedules by their values)."""
    rebuilt = rebuild(json.loads(json.dumps(describe(value))))
    if callable(value) and not isinstance(value, type):
        assert [rebuilt(p) for p in (1.0, 0.75, 0.5, 0.0)] == [value(p) for p in (1.0, 0.75, 0.5, 0.0)]
    else:
        assert rebuilt == value


@pytest.mark.parametrize("value", [lambda progress: progress, pathlib.Path("x"), {"a": os.system}, spaces.Text(3)])
def test_what_cannot_be_described(value):
    """Functions, other classes' instances and other spaces are not described (a checkpoint needs pickle for them)."""
    with pytest.raises(NotDescribable):
        describe(value)
