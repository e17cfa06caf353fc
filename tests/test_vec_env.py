"""The faster SB3 wrappers of sb3_ppg.vec_env give exactly what SB3's wrappers give."""

import csv
import pickle

import numpy as np
import pytest
from stable_baselines3.common.vec_env import (
    VecMonitor,
    VecNormalize,
    VecTransposeImage,
    is_vecenv_wrapped,
    unwrap_vec_normalize,
)

from sb3_ppg.procgen import ProcgenVecEnv, make_procgen_env
from sb3_ppg.vec_env import FastVecMonitor, RewardOnlyVecNormalize, finished_indices

# Random play ends a bossfight episode every ~50 steps in easy mode: episode ends come quickly
GAME = "bossfight"


def make_pair(sb3_wrapper, our_wrapper, n_envs=4, **kwargs):
    """The same procgen env (same seed) under SB3's wrapper and under ours."""
    return [
        wrapper(ProcgenVecEnv(n_envs, GAME, distribution_mode="easy", rand_seed=3), **kwargs)
        for wrapper in (sb3_wrapper, our_wrapper)
    ]


def step_both(envs, n_steps=300, n_envs=4):
    """Step both envs with the same random actions, yield their step results; check that episodes ended."""
    for env in envs:
        env.reset()
    rng = np.random.default_rng(0)
    n_dones = 0
    for _ in range(n_steps):
        actions = rng.integers(0, 15, size=n_envs)
        sb3_step, our_step = envs[0].step(actions), envs[1].step(actions)
        np.testing.assert_array_equal(our_step[2], sb3_step[2])
        n_dones += int(sb3_step[2].sum())
        yield sb3_step, our_step
    assert n_dones > 5


def test_fast_vec_monitor_matches_sb3(tmp_path):
    sb3_monitor, ours = make_pair(VecMonitor, FastVecMonitor, info_keywords=("is_success",), filename=None)
    ours_logged = FastVecMonitor(
        ProcgenVecEnv(4, GAME, distribution_mode="easy", rand_seed=3),
        filename=str(tmp_path / "ours"),
        info_keywords=("is_success",),
    )
    sb3_logged = VecMonitor(
        ProcgenVecEnv(4, GAME, distribution_mode="easy", rand_seed=3),
        filename=str(tmp_path / "sb3"),
        info_keywords=("is_success",),
    )
    assert isinstance(ours, VecMonitor) and is_vecenv_wrapped(ours, VecMonitor)
    n_episodes = 0
    for (sb3_step, our_step), _ in zip(step_both([sb3_monitor, ours]), step_both([sb3_logged, ours_logged]), strict=True):
        np.testing.assert_array_equal(our_step[0], sb3_step[0])
        np.testing.assert_array_equal(our_step[1], sb3_step[1])
        for our_info, sb3_info in zip(our_step[3], sb3_step[3], strict=True):
            assert our_info.keys() == sb3_info.keys()
            if "episode" in sb3_info:
                n_episodes += 1
                ours_episode, sb3_episode = our_info["episode"], sb3_info["episode"]
                assert ours_episode.keys() == sb3_episode.keys() == {"r", "l", "t", "is_success"}
                assert ours_episode["r"] == sb3_episode["r"] and ours_episode["l"] == sb3_episode["l"]
                assert ours_episode["is_success"] == sb3_episode["is_success"]
                assert ours_episode["t"] == pytest.approx(sb3_episode["t"], abs=1.0)
    assert n_episodes > 5 and ours.episode_count == sb3_monitor.episode_count == n_episodes
    np.testing.assert_array_equal(ours.episode_returns, sb3_monitor.episode_returns)
    np.testing.assert_array_equal(ours.episode_lengths, sb3_monitor.episode_lengths)
    for env in (sb3_monitor, ours, sb3_logged, ours_logged):
        env.close()
    # Same CSV log (the times aside)
    rows = []
    for name in ("sb3", "ours"):
        with open(tmp_path / f"{name}.monitor.csv") as file_handler:
            file_handler.readline()  # JSON header
            rows.append([(row["r"], row["l"], row["is_success"]) for row in csv.DictReader(file_handler)])
    assert rows[0] == rows[1] and len(rows[0]) == n_episodes


def test_reward_only_vec_normalize_skips_the_observation_copy():
    """Regression test for the chain's throughput: SB3's VecNormalize deep-copies every observation batch."""
    env = make_procgen_env("coinrun", n_envs=2, seed=0)
    vec_normalize = unwrap_vec_normalize(env)
    assert isinstance(vec_normalize, RewardOnlyVecNormalize) and isinstance(vec_normalize, VecNormalize)
    observations = np.zeros((2, 64, 64, 3), dtype=np.uint8)
    assert vec_normalize.normalize_obs(observations) is observations
    # Rewards are still normalized and clipped with SB3's statistics, and the raw rewards are left as they were
    vec_normalize.ret_rms.var = np.array(4.0)
    rewards = np.array([1.0, 100.0, -100.0], dtype=np.float32)
    normalized = vec_normalize.normalize_reward(rewards)
    np.testing.assert_allclose(normalized, [0.5, 10.0, -10.0], rtol=1e-6)
    assert normalized.dtype == np.float32
    np.testing.assert_array_equal(rewards, [1.0, 100.0, -100.0])
    # Without reward normalization: the rewards, as float32
    vec_normalize.norm_reward = False
    np.testing.assert_array_equal(vec_normalize.normalize_reward(np.array([1.0, 100.0])), [1.0, 100.0])
    assert vec_normalize.normalize_reward(np.array([1.0, 100.0])).dtype == np.float32
    # With norm_obs=True it falls back to SB3's normalization
    obs_normalizing = RewardOnlyVecNormalize(ProcgenVecEnv(2, "coinrun", distribution_mode="easy"), norm_obs=True)
    assert obs_normalizing.normalize_obs(observations.astype(np.float32)) is not observations
    env.close()
    obs_normalizing.close()


@pytest.mark.parametrize("training", [True, False])
def test_reward_only_vec_normalize_matches_sb3(training):
    """The faster reward-only wrapper gives exactly what SB3's VecNormalize gives, step by step."""
    sb3_normalize, ours = make_pair(VecNormalize, RewardOnlyVecNormalize, norm_obs=False, gamma=0.99)
    if not training:
        # Frozen statistics, taken from a short training run
        for env in (sb3_normalize, ours):
            env.ret_rms.mean, env.ret_rms.var, env.ret_rms.count = np.array(0.5), np.array(2.5), 100.0
            env.training = False
    for sb3_step, our_step in step_both([sb3_normalize, ours]):
        np.testing.assert_array_equal(our_step[0], sb3_step[0])
        np.testing.assert_allclose(our_step[1], sb3_step[1], rtol=1e-6)
        assert our_step[1].dtype == sb3_step[1].dtype == np.float32
        for our_info, sb3_info in zip(our_step[3], sb3_step[3], strict=True):
            assert our_info.keys() == sb3_info.keys()
            if "terminal_observation" in sb3_info:
                np.testing.assert_array_equal(our_info["terminal_observation"], sb3_info["terminal_observation"])
        np.testing.assert_array_equal(ours.get_original_reward(), sb3_normalize.get_original_reward())
        np.testing.assert_allclose(ours.returns, sb3_normalize.returns, rtol=1e-12)
    np.testing.assert_allclose(ours.ret_rms.mean, sb3_normalize.ret_rms.mean, rtol=1e-10)
    np.testing.assert_allclose(ours.ret_rms.var, sb3_normalize.ret_rms.var, rtol=1e-10)
    assert ours.ret_rms.count == sb3_normalize.ret_rms.count
    assert ours.ret_rms.count > 1000 if training else ours.ret_rms.count == 100.0
    # Statistics stay SB3's types (0-d float64 arrays)
    assert isinstance(ours.ret_rms.var, np.ndarray) and ours.ret_rms.var.shape == () and ours.ret_rms.var.dtype == np.float64
    for env in (sb3_normalize, ours):
        env.close()


def test_make_procgen_env_loads_statistics_of_sb3_vec_normalize(tmp_path):
    """Statistics saved by a plain SB3 VecNormalize load into the fast chain; observation-normalizing ones do not."""
    plain = VecNormalize(ProcgenVecEnv(2, GAME, distribution_mode="easy", rand_seed=0), norm_obs=False)
    plain.reset()
    for _ in range(20):
        plain.step(np.zeros(2, dtype=np.int64))
    plain.save(str(tmp_path / "plain.pkl"))
    env = make_procgen_env(GAME, n_envs=4, vec_normalize_path=str(tmp_path / "plain.pkl"), reward_gamma=0.99)
    loaded = unwrap_vec_normalize(env)
    assert type(loaded) is RewardOnlyVecNormalize and loaded.gamma == 0.99 and loaded.training
    assert loaded.ret_rms.count == plain.ret_rms.count and loaded.ret_rms.var == plain.ret_rms.var
    env.close()
    plain.close()
    obs_normalizing = VecNormalize(ProcgenVecEnv(2, GAME, distribution_mode="easy", rand_seed=0), norm_obs=True)
    obs_normalizing.save(str(tmp_path / "obs.pkl"))
    obs_normalizing.close()
    with pytest.raises(ValueError, match="normalizes observations, procgen chains only normalize rewards"):
        make_procgen_env(GAME, n_envs=2, vec_normalize_path=str(tmp_path / "obs.pkl"))
    # Not statistics, a corrupt file, a missing file: clear errors
    with open(tmp_path / "list.pkl", "wb") as file_handler:
        pickle.dump([1, 2], file_handler)
    with pytest.raises(ValueError, match="holds a list, not VecNormalize statistics"):
        make_procgen_env(GAME, n_envs=2, vec_normalize_path=str(tmp_path / "list.pkl"))
    (tmp_path / "corrupt.pkl").write_bytes((tmp_path / "plain.pkl").read_bytes()[:50])
    with pytest.raises(ValueError, match=r"Could not read VecNormalize statistics from .*corrupt\.pkl"):
        make_procgen_env(GAME, n_envs=2, vec_normalize_path=str(tmp_path / "corrupt.pkl"))
    with pytest.raises(ValueError, match=r"Could not read VecNormalize statistics from .*missing\.pkl"):
        make_procgen_env(GAME, n_envs=2, vec_normalize_path=str(tmp_path / "missing.pkl"))


def test_procgen_chain_uses_the_fast_wrappers():
    env = make_procgen_env(GAME, n_envs=2, seed=0)
    assert type(env) is RewardOnlyVecNormalize
    assert type(env.venv) is FastVecMonitor
    assert type(env.venv.venv) is ProcgenVecEnv and env.venv.venv.channels_first
    # Channel-first images, so nothing adds a VecTransposeImage
    assert env.observation_space.shape == (3, 64, 64)
    assert not is_vecenv_wrapped(env, VecTransposeImage)
    env.close()


@pytest.mark.parametrize("n_envs", [1, 5, 64, 300])
def test_finished_indices(n_envs):
    rng = np.random.default_rng(n_envs)
    for probability in (0.0, 0.1, 1.0):
        dones = rng.random(n_envs) < probability
        indices = finished_indices(dones)
        assert indices == np.flatnonzero(dones).tolist()
        assert all(type(idx) is int for idx in indices)


def test_reward_only_vec_normalize_follows_attribute_changes():
    """Regression test: the per-step constant arrays are rebuilt when gamma or clip_reward change."""
    sb3_normalize, ours = make_pair(VecNormalize, RewardOnlyVecNormalize, norm_obs=False, gamma=0.99)
    steps = step_both([sb3_normalize, ours], n_steps=300)
    for step_index, (sb3_step, our_step) in enumerate(steps):
        np.testing.assert_allclose(our_step[1], sb3_step[1], rtol=1e-6)
        np.testing.assert_allclose(ours.returns, sb3_normalize.returns, rtol=1e-12)
        if step_index == 100:
            for env in (sb3_normalize, ours):
                env.gamma, env.clip_reward = 0.9, 0.5
    assert ours.gamma == 0.9 and np.all(np.abs(our_step[1]) <= 0.5)
    np.testing.assert_allclose(ours.ret_rms.var, sb3_normalize.ret_rms.var, rtol=1e-10)
    # The cached arrays are not part of the saved state
    assert "_constants" in ours.__dict__ and "_constants" not in ours.__getstate__()
    for env in (sb3_normalize, ours):
        env.close()


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_reward_only_normalize_reward_dtypes(dtype):
    """normalize_reward gives SB3's values (float32) for float32, float64 and integer rewards, and any shape."""
    ours = RewardOnlyVecNormalize(ProcgenVecEnv(4, GAME, distribution_mode="easy"), norm_obs=False, clip_reward=3.0)
    sb3_normalize = VecNormalize(ProcgenVecEnv(4, GAME, distribution_mode="easy"), norm_obs=False, clip_reward=3.0)
    for env in (ours, sb3_normalize):
        env.ret_rms.var = np.array(2.7)
    for rewards in (np.array([0, 1, -5, 40], dtype=dtype), np.array([7, 1], dtype=dtype)):
        normalized = ours.normalize_reward(rewards)
        assert normalized.dtype == np.float32
        np.testing.assert_array_equal(normalized, sb3_normalize.normalize_reward(rewards))
    for env in (ours, sb3_normalize):
        env.close()
