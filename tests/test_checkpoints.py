"""PPGCheckpointCallback and PPG.load_checkpoint: a run cut anywhere and resumed ends bit-identical to an uninterrupted one."""

import json
import pathlib
import shutil

import pytest
import torch as th
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import SubprocVecEnv, VecNormalize

from sb3_ppg import PPG, PPGCheckpointCallback

N_ENVS, N_STEPS = 2, 16
ITERATION = N_ENVS * N_STEPS  # env steps per iteration
TOTAL = 8 * ITERATION  # aux phases after iterations 3 and 6
RUN = dict(n_policy_iters=3, n_steps=N_STEPS)


def make_env(seed: int = 0, normalize: bool = False):
    env = make_vec_env("CartPole-v1", n_envs=N_ENVS, seed=seed)
    return VecNormalize(env, gamma=0.99) if normalize else env


def parameters(model: PPG) -> dict[str, th.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in model.policy.state_dict().items()}


def assert_identical(params_a: dict[str, th.Tensor], params_b: dict[str, th.Tensor]) -> None:
    assert params_a.keys() == params_b.keys()
    for name in params_a:
        assert th.equal(params_a[name], params_b[name]), f"{name} differs"


def checkpoint_dir(folder: pathlib.Path, steps: int) -> pathlib.Path:
    return folder / f"ppg_{steps}_steps"


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run (a checkpoint every iteration), and the same run without callback."""
    folder = tmp_path_factory.mktemp("reference")
    from tests.conftest import small_ppg

    runs = {}
    for normalize in (False, True):
        model = small_ppg(make_env(normalize=normalize), **RUN)
        callback = PPGCheckpointCallback(N_STEPS, str(folder / str(normalize)), name_prefix="ppg")
        model.learn(TOTAL, callback=callback)
        plain = small_ppg(make_env(normalize=normalize), **RUN).learn(TOTAL)
        runs[normalize] = (folder / str(normalize), parameters(model), parameters(plain), model)
    return runs


@pytest.mark.parametrize("normalize", [False, True])
def test_checkpoints_do_not_change_training(reference, normalize):
    folder, params, plain_params, model = reference[normalize]
    assert_identical(params, plain_params)
    assert model._n_aux_phases == 2
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
    assert resumed.num_timesteps == TOTAL and resumed._n_aux_phases == 2
    assert_identical(params, parameters(resumed))
    # The resumed run writes its checkpoints at the same steps, with the same rollouts
    assert checkpoint_dir(tmp_path, TOTAL).is_dir()
    manifest = json.loads((checkpoint_dir(tmp_path, TOTAL) / "manifest.json").read_text())
    reference_manifest = json.loads((checkpoint_dir(folder, TOTAL) / "manifest.json").read_text())
    assert manifest["aux_rollout_files"] == reference_manifest["aux_rollout_files"]


def test_load_newest_in_folder_and_damage(reference, tmp_path):
    folder = tmp_path / "run"
    shutil.copytree(reference[False][0], folder)
    model = PPG.load_checkpoint(folder, env=make_env())
    assert model.num_timesteps == TOTAL
    # An incomplete checkpoint (no manifest) is ignored
    (checkpoint_dir(folder, TOTAL) / "manifest.json").unlink()
    assert PPG.load_checkpoint(folder, env=make_env()).num_timesteps == TOTAL - ITERATION
    # A damaged one is detected, and the previous complete one is named
    newest = checkpoint_dir(folder, TOTAL - ITERATION)
    raw = bytearray((newest / "run_state.npz").read_bytes())
    raw[len(raw) // 2] ^= 1
    (newest / "run_state.npz").write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=r"damaged.*ppg_192_steps"):
        PPG.load_checkpoint(folder, env=make_env())
    # A damaged stored rollout, too
    older = checkpoint_dir(folder, 5 * ITERATION)
    rollout = folder / "ppg_rollouts" / json.loads((older / "manifest.json").read_text())["aux_rollout_files"][0]
    rollout.write_bytes(rollout.read_bytes()[:-10])
    with pytest.raises(ValueError, match=r"ppg_160_steps.*damaged.*ppg_128_steps"):
        PPG.load_checkpoint(older, env=make_env())
    # Nothing to load
    with pytest.raises(FileNotFoundError):
        PPG.load_checkpoint(tmp_path / "empty")
    # Another number of envs
    with pytest.raises(ValueError, match="2 envs"):
        PPG.load_checkpoint(checkpoint_dir(folder, 4 * ITERATION), env=make_vec_env("CartPole-v1", n_envs=3))


def test_keep_last_prunes_checkpoints_and_rollouts(tmp_path, make_model):
    model = make_model(make_env(), **RUN)
    callback = PPGCheckpointCallback(N_STEPS, str(tmp_path), name_prefix="ppg", keep_last=2)
    model.learn(TOTAL, callback=callback)
    assert sorted(path.name for path in tmp_path.glob("ppg_*_steps")) == ["ppg_224_steps", "ppg_256_steps"]
    # Iteration 7 and 8 are in the buffer: one file each, nothing else
    assert len(list((tmp_path / "ppg_rollouts").iterdir())) == 2
    assert not list(tmp_path.rglob(".*tmp*"))


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
    assert resumed.num_timesteps == 3 * ITERATION and resumed._n_aux_phases == 1
    env.close()
