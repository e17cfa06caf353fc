"""sb3_ppg.procgen.wrappers: make_procgen_env, the PPG paper's wrapper chain."""

import os
import pickle

import numpy as np
import pytest
import torch as th
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import EvalCallback
from stable_baselines3.common.vec_env import (
    VecMonitor,
    VecNormalize,
    VecTransposeImage,
    VecVideoRecorder,
    is_vecenv_wrapped,
    unwrap_vec_normalize,
)

from sb3_ppg.procgen import ProcgenVecEnv, make_procgen_env, save_reward_statistics

# Random play ends a bossfight episode every ~50 steps in easy mode: episode ends come quickly
GAME = "bossfight"


def test_make_procgen_env_chain_and_reward_normalization():
    # Random play scores often in starpilot
    env = make_procgen_env("starpilot", n_envs=4, seed=0, num_threads=1)
    vec_normalize = env
    assert isinstance(vec_normalize, VecNormalize) and isinstance(vec_normalize.venv, VecMonitor)
    assert isinstance(vec_normalize.venv.venv, ProcgenVecEnv) and vec_normalize.venv.venv.channels_first
    assert vec_normalize.training and vec_normalize.norm_reward and not vec_normalize.norm_obs
    assert vec_normalize.gamma == 0.999 and vec_normalize.clip_reward == 10.0 and vec_normalize.epsilon == 1e-8
    assert env.observation_space.shape == (3, 64, 64) and env.observation_space.dtype == np.uint8
    assert env.get_attr("env_name") == ["starpilot"] * 4
    assert env.venv.venv.procgen_kwargs["distribution_mode"] == "easy"
    obs = env.reset()
    assert obs.shape == (4, 3, 64, 64)
    rng = np.random.default_rng(0)
    saw_reward = False
    for _ in range(200):
        obs, rewards, dones, infos = env.step(rng.integers(0, 15, 4))
        raw_rewards = vec_normalize.get_original_reward()
        if np.any(raw_rewards != 0):
            saw_reward = True
            # Scaled (not centred) by the running std of the discounted return, then clipped
            expected = np.clip(raw_rewards / np.sqrt(vec_normalize.ret_rms.var + 1e-8), -10, 10)
            np.testing.assert_allclose(rewards, expected, rtol=1e-5)
        for idx in np.flatnonzero(dones):
            assert infos[idx]["terminal_observation"].shape == (3, 64, 64)
            assert "episode" in infos[idx]  # VecMonitor statistics on raw rewards
    assert saw_reward
    env.close()

    eval_env = make_procgen_env("starpilot", n_envs=2, training=False)
    assert not unwrap_vec_normalize(eval_env).training and not unwrap_vec_normalize(eval_env).norm_reward
    eval_env.reset()
    for _ in range(100):
        eval_env.step(rng.integers(0, 15, 2))
        np.testing.assert_array_equal(eval_env.get_original_reward(), eval_env.old_reward)
    eval_env.close()

    # Same wrapper types without reward normalization: rewards pass through unchanged
    raw_env = make_procgen_env("starpilot", n_envs=2, normalize_reward=False)
    assert isinstance(raw_env, VecNormalize) and not raw_env.norm_reward
    raw_env.reset()
    for _ in range(50):
        _, rewards, _, _ = raw_env.step(rng.integers(0, 15, 2))
        np.testing.assert_array_equal(rewards, raw_env.get_original_reward())
    raw_env.close()


def test_train_and_eval_chains_with_ppo_and_eval_callback(tmp_path):
    env = make_procgen_env(GAME, n_envs=4, seed=0, num_threads=1, monitor_filename=str(tmp_path / "train"))
    eval_env = make_procgen_env(GAME, n_envs=2, seed=1, num_threads=1, training=False)
    # Procgen policies are evaluated with sampled actions (argmax play can stall until the 1000-step time limit)
    eval_callback = EvalCallback(
        eval_env, n_eval_episodes=2, eval_freq=32, log_path=str(tmp_path), deterministic=False, warn=False
    )
    policy_kwargs = dict(features_extractor_kwargs=dict(features_dim=64))
    model = PPO("CnnPolicy", env, n_steps=16, batch_size=32, n_epochs=1, policy_kwargs=policy_kwargs, seed=0, device="cpu")
    # No VecTransposeImage added by the algorithm: the chain is channel-first already
    assert model.get_env() is env and not is_vecenv_wrapped(env, VecTransposeImage)
    model.learn(256, callback=eval_callback)
    assert model.rollout_buffer.observations.dtype == np.uint8
    assert eval_callback.n_calls >= 64 and np.isfinite(eval_callback.last_mean_reward)
    evaluations = np.load(tmp_path / "evaluations.npz")
    assert evaluations["results"].shape == (2, 2)
    assert "successes" in evaluations  # is_success at episode ends
    # sync_envs_normalization copied the training statistics into the (frozen) eval env
    train_rms, eval_rms = unwrap_vec_normalize(env).ret_rms, unwrap_vec_normalize(eval_env).ret_rms
    assert eval_rms.count > 1 and eval_rms.var == train_rms.var and eval_rms.count == train_rms.count
    assert len(model.ep_info_buffer) > 0
    env.close()
    # VecMonitor CSV log
    with open(tmp_path / "train.monitor.csv") as file_handler:
        lines = file_handler.read().splitlines()
    assert lines[1] == "r,l,t" and len(lines) == 2 + len(model.ep_info_buffer)

    # VecNormalize statistics: save, then load into a new training or evaluation chain
    path = str(tmp_path / "reward_statistics.npz")
    save_reward_statistics(env, path)
    loaded = make_procgen_env(GAME, n_envs=2, training=False, vec_normalize_path=path)
    loaded_normalize = unwrap_vec_normalize(loaded)
    assert loaded_normalize.ret_rms.var == unwrap_vec_normalize(env).ret_rms.var
    assert loaded_normalize.ret_rms.count == unwrap_vec_normalize(env).ret_rms.count
    assert not loaded_normalize.training and not loaded_normalize.norm_reward and loaded.num_envs == 2
    resumed = make_procgen_env(GAME, n_envs=4, vec_normalize_path=path)
    assert unwrap_vec_normalize(resumed).training and unwrap_vec_normalize(resumed).norm_reward
    model.set_env(resumed)
    model.learn(64, reset_num_timesteps=False)
    for vec_env in (eval_env, loaded, resumed):
        vec_env.close()


def test_bad_chain_arguments():
    with pytest.raises(ValueError, match="reward_gamma must be in"):
        make_procgen_env(GAME, n_envs=2, reward_gamma=1.0)
    with pytest.raises(ValueError, match="clip_reward must be positive"):
        make_procgen_env(GAME, n_envs=2, clip_reward=0.0)


def test_video_recording(tmp_path):
    from moviepy.video.io.VideoFileClip import VideoFileClip

    env = make_procgen_env(GAME, n_envs=1, seed=0, render_mode="rgb_array", num_threads=0)
    env = VecVideoRecorder(env, str(tmp_path), record_video_trigger=lambda step: step == 0, video_length=10)
    env.reset()
    for _ in range(12):
        env.step(np.array([1]))
    env.close()
    videos = [name for name in os.listdir(tmp_path) if name.endswith(".mp4")]
    assert len(videos) == 1
    clip = VideoFileClip(str(tmp_path / videos[0]))
    assert tuple(clip.size) == (512, 512) and clip.fps == 15
    assert clip.n_frames >= 10
    clip.close()


def test_ppg_procgen_cnn_trains_with_aux_phase():
    from sb3_ppg import PPG

    n_envs, n_steps, n_policy_iters = 2, 16, 2
    env = make_procgen_env("coinrun", n_envs=n_envs, seed=0, num_threads=1)
    model = PPG(
        "ProcgenCnn",
        env,
        n_steps=n_steps,
        batch_size=16,
        n_policy_iters=n_policy_iters,
        n_aux_epochs=1,
        aux_batch_rollouts=2,
        seed=0,
        device="cpu",
    )
    model.learn(n_envs * n_steps * n_policy_iters * 2)
    assert model.n_aux_phases == 2
    assert model.aux_buffer.observations.dtype == th.uint8
    env.close()


def test_reward_statistics_files_are_plain_arrays(tmp_path):
    """Statistics of any reward-only VecNormalize save as plain arrays and load; pickles and damaged files do not."""
    plain = VecNormalize(ProcgenVecEnv(2, GAME, distribution_mode="easy", rand_seed=0), norm_obs=False)
    plain.reset()
    for _ in range(20):
        plain.step(np.zeros(2, dtype=np.int64))
    save_reward_statistics(plain, str(tmp_path / "plain.npz"))
    env = make_procgen_env(GAME, n_envs=4, vec_normalize_path=str(tmp_path / "plain.npz"), reward_gamma=0.99)
    loaded = unwrap_vec_normalize(env)
    assert type(loaded) is VecNormalize and loaded.gamma == 0.99 and loaded.training
    assert loaded.ret_rms.count == plain.ret_rms.count and loaded.ret_rms.var == plain.ret_rms.var
    env.close()
    # A pickled VecNormalize is refused and the code a pickle carries never runs
    plain.save(str(tmp_path / "plain.pkl"))
    with pytest.raises(ValueError, match=r"save_reward_statistics.*unpickling runs whatever code"):
        make_procgen_env(GAME, n_envs=2, vec_normalize_path=str(tmp_path / "plain.pkl"))
    marker = tmp_path / "marker"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    (tmp_path / "evil.npz").write_bytes(pickle.dumps(Payload()))
    with pytest.raises(ValueError, match="looks like a pickle"):
        make_procgen_env(GAME, n_envs=2, vec_normalize_path=str(tmp_path / "evil.npz"))
    assert not marker.exists()
    plain.close()
    obs_normalizing = VecNormalize(ProcgenVecEnv(2, GAME, distribution_mode="easy", rand_seed=0), norm_obs=True)
    with pytest.raises(ValueError, match="normalizes observations, procgen chains only normalize rewards"):
        save_reward_statistics(obs_normalizing, str(tmp_path / "obs.npz"))
    obs_normalizing.close()
    # A changed byte, a truncated file, a missing file: clear errors
    data = bytearray((tmp_path / "plain.npz").read_bytes())
    data[-200] ^= 0xFF
    (tmp_path / "flipped.npz").write_bytes(bytes(data))
    (tmp_path / "truncated.npz").write_bytes(bytes(data[:100]))
    for name in ("flipped.npz", "truncated.npz", "missing.npz"):
        with pytest.raises(ValueError, match=rf"Could not read reward statistics from .*{name}"):
            make_procgen_env(GAME, n_envs=2, vec_normalize_path=str(tmp_path / name))


def test_chain_is_sb3_wrappers_over_a_channel_first_procgen_vec_env():
    env = make_procgen_env(GAME, n_envs=2, seed=0)
    assert type(env) is VecNormalize
    assert type(env.venv) is VecMonitor
    assert type(env.venv.venv) is ProcgenVecEnv and env.venv.venv.channels_first
    # Channel-first images, so nothing adds a VecTransposeImage
    assert env.observation_space.shape == (3, 64, 64)
    assert not is_vecenv_wrapped(env, VecTransposeImage)
    env.close()
