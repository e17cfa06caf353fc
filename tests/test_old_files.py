"""
Files written by an earlier sb3_ppg (tests/data/old_files/, written by the code of commit 8f45b61's parent, the 0.1.0a0
format, with tests/data/old_files/expected.json recording what that code computed from them) load and behave as then.
Model zips pickle classes by their module paths (the policy class, a features extractor named in ``policy_kwargs``),
so moving a module must leave an importable path behind for them.
"""

import base64
import hashlib
import json
import re
import shutil
import sys
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch as th
from stable_baselines3.common.env_util import make_vec_env

import sb3_ppg
from sb3_ppg import PPG

DATA = Path(__file__).parent / "data" / "old_files"
EXPECTED = json.loads((DATA / "expected.json").read_text())
# float32 forward passes of the same weights on another CPU sum in another order: sums of at most 128 terms differ by
# at most ~128 * 2**-24 ~ 1e-5 relative, far below what a different network or input would change
RTOL, ATOL = 1e-4, 1e-5


def saved_module_paths(path: Path) -> bytes:
    """The zip's ``data`` with its pickled objects decoded (where the module paths of pickled classes are)."""
    data = json.loads(zipfile.ZipFile(path).read("data"))
    pickled = [item[":serialized:"] for item in data.values() if isinstance(item, dict) and ":serialized:" in item]
    kwargs = data["policy_kwargs"]
    pickled += [value[":serialized:"] for value in kwargs.values() if isinstance(value, dict) and ":serialized:" in value]
    return b"".join(base64.b64decode(item) for item in pickled)


@pytest.mark.parametrize(
    "name, old_paths",
    [
        ("mlp_cartpole.zip", [b"sb3_ppg.policies"]),
        ("impala_images.zip", [b"sb3_ppg.policies", b"sb3_ppg.torch_layers"]),
    ],
)
def test_old_model_zip_predicts_as_recorded(name, old_paths):
    assert all(path in saved_module_paths(DATA / name) for path in old_paths)
    expected = EXPECTED[name]
    model = PPG.load(DATA / name, device="cpu")
    # The old paths are this package's own modules (not another copy of sb3_ppg that an editable install may expose)
    package = Path(sb3_ppg.__file__).parent
    for path in old_paths:
        assert Path(sys.modules[path.decode()].__file__).parent == package
    assert f"{type(model.policy).__module__}.{type(model.policy).__qualname__}".endswith(
        expected["policy_class"].rsplit(".", 1)[1]
    )
    observations = np.asarray(expected["observations"], dtype=model.observation_space.dtype)
    actions, _ = model.predict(observations, deterministic=True)
    assert actions.tolist() == expected["actions"]
    obs_tensor, _ = model.policy.obs_to_tensor(observations)
    with th.no_grad():
        logits = model.policy.get_distribution(obs_tensor).distribution.logits
        values = model.policy.predict_values(obs_tensor).flatten()
    np.testing.assert_allclose(logits.double().numpy(), expected["logits"], rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(values.double().numpy(), expected["values"], rtol=RTOL, atol=ATOL)


def test_old_checkpoint_resumes_with_its_run_state(tmp_path):
    expected = EXPECTED["checkpoint"]
    shutil.copytree(DATA / "checkpoints", tmp_path / "checkpoints")
    previous = th.get_num_threads()
    try:
        th.set_num_threads(previous + 1)  # its torch threads are not recorded: unknown, no warning
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message=".*torch threads")
            model = PPG.load_checkpoint(
                tmp_path / "checkpoints", env=make_vec_env("CartPole-v1", n_envs=2, seed=0), device="cpu"
            )
    finally:
        th.set_num_threads(previous)
    # What the checkpoint's run state holds, read as the code that wrote it read it
    assert hashlib.sha256(th.get_rng_state().numpy().tobytes()).hexdigest() == expected["torch_rng_sha256"]
    assert int(np.random.get_state()[2]) == expected["numpy_rng_pos"]
    state = model.get_run_state()
    counters = (state.num_timesteps, state.n_updates, state.n_aux_phases, state.n_aux_updates)
    assert counters == (expected["num_timesteps"], expected["n_updates"], expected["n_aux_phases"], expected["n_aux_updates"])
    assert np.array_equal(state.last_obs, np.asarray(expected["last_obs"], dtype=np.float32))
    assert len(state.ep_info_buffer) == expected["episodes"]
    assert model.aux_buffer.n_iterations == expected["aux_iterations"]
    stored_returns = model.aux_buffer.returns[: model.aux_buffer.n_rollouts]
    assert np.array_equal(stored_returns, np.asarray(expected["aux_returns"], np.float32))
    # The run goes on: the stored iteration and the next one fill the buffer, whose auxiliary phase then runs
    before = [parameter.detach().clone() for parameter in model.policy.parameters()]
    model.learn(32, reset_num_timesteps=False)
    state = model.get_run_state()
    assert state.num_timesteps == expected["num_timesteps"] + 32 and state.n_aux_phases == expected["n_aux_phases"] + 1
    assert not all(th.equal(a, b) for a, b in zip(before, model.policy.parameters(), strict=True))


#: Options that earlier versions stored in every model zip (with their defaults) and that were removed since
REMOVED_STORED_OPTIONS = {"overlap_rollouts": False, "keep_freed_memory": True}


def with_stored_options(source: Path, destination: Path, options: dict) -> None:
    """A copy of a model zip whose ``data`` also holds ``options``, as the versions that had them stored them."""
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(destination, "w") as new:
        for item in old.infolist():
            content = old.read(item.filename)
            if item.filename == "data":
                content = json.dumps({**json.loads(content), **options}, indent=4).encode()
            new.writestr(item, content)


@pytest.mark.parametrize("name", sorted(REMOVED_STORED_OPTIONS))
def test_removed_option_is_refused_and_zips_that_stored_it_load(tmp_path, name):
    from sb3_ppg import MaskablePPG
    from sb3_ppg.common.hyperparameters import REMOVED_OPTIONS

    value = REMOVED_STORED_OPTIONS[name]
    reason = REMOVED_OPTIONS[name]
    for algorithm in (PPG, MaskablePPG):
        with pytest.raises(TypeError) as error:
            algorithm("MlpPolicy", "CartPole-v1", **{name: value})
        assert str(error.value) == f"{algorithm.__name__}({name}={value!r}): {reason}."
    with pytest.raises(TypeError, match=r"PPG.__init__\(\) got an unexpected keyword argument 'not_an_option'"):
        PPG("MlpPolicy", "CartPole-v1", not_an_option=1)
    model = PPG("MlpPolicy", make_vec_env("CartPole-v1", n_envs=2, seed=0), n_steps=16, seed=0)
    model.save(tmp_path / "new.zip")
    with_stored_options(tmp_path / "new.zip", tmp_path / "old.zip", {name: value})
    loaded = PPG.load(tmp_path / "old.zip", env=make_vec_env("CartPole-v1", n_envs=2, seed=0))
    assert not hasattr(loaded, name)
    observations = np.zeros((3, 4), dtype=np.float32)
    expected = model.predict(observations, deterministic=True)[0]
    assert np.array_equal(loaded.predict(observations, deterministic=True)[0], expected)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*before PPG's first auxiliary phase")
        loaded.learn(32)  # trains as any model
    loaded.save(tmp_path / "again.zip")
    assert name not in json.loads(zipfile.ZipFile(tmp_path / "again.zip").read("data"))
    with pytest.raises(TypeError, match=re.escape(f"PPG.load({name}={value!r}): {reason}.")):
        PPG.load(tmp_path / "old.zip", **{name: value})


@pytest.mark.parametrize("name", ["PPGRolloutBuffer", "PPGDictRolloutBuffer"])
def test_the_rollout_buffer_class_of_a_0_1_0a0_zip_unpickles(name):
    """A zip saved by 0.1.0a0 pickles its ``rollout_buffer_class`` as ``sb3_ppg.common.buffers.<name>`` (moved since)."""
    import pickle

    from sb3_ppg.common import rollout_buffers

    assert pickle.loads(f"csb3_ppg.common.buffers\n{name}\n.".encode()) is getattr(rollout_buffers, name)
