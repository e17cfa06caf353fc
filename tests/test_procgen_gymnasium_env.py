"""sb3_ppg.procgen.gymnasium_env: one game as a gymnasium env (ids procgen/<game>-v0), and legacy gym envs converted."""

import importlib.util

import gymnasium
import numpy as np
import pytest
from stable_baselines3.common.env_checker import check_env
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import DummyVecEnv

from sb3_ppg.procgen import (
    PROCGEN_GAMES,
    ProcgenGymnasiumEnv,
    ProcgenVecEnv,
    convert_legacy_procgen_env,
    register_procgen_envs,
)

# Random play ends a bossfight episode every ~50 steps in easy mode: episode ends come quickly
GAME = "bossfight"


def test_gymnasium_ids_and_check_env():
    register_procgen_envs()
    register_procgen_envs()  # idempotent
    for game in PROCGEN_GAMES:
        spec = gymnasium.spec(f"procgen/{game}-v0")
        assert spec.kwargs == {"env_name": game}
    env = gymnasium.make("procgen/starpilot-v0", distribution_mode="easy", num_levels=10, start_level=5)
    unwrapped = env.unwrapped
    assert isinstance(unwrapped, ProcgenGymnasiumEnv)
    assert unwrapped.env_name == "starpilot"
    assert unwrapped.procgen_kwargs == {"distribution_mode": "easy", "num_levels": 10, "start_level": 5}
    check_env(env)
    # The attributes are enough to build the same game as a native VecEnv
    vec_env = ProcgenVecEnv(2, unwrapped.env_name, **unwrapped.procgen_kwargs)
    vec_env.reset()
    infos = [*vec_env.reset_infos, env.reset()[1]]
    assert all(5 <= info["level_seed"] < 15 for info in infos)
    vec_env.close()
    env.close()
    rendered = gymnasium.make("procgen/coinrun-v0", render_mode="rgb_array")
    rendered.reset(seed=0)
    assert rendered.render().shape == (512, 512, 3)
    rendered.close()


def test_gymnasium_env_episode_semantics():
    env = ProcgenGymnasiumEnv(GAME, distribution_mode="easy", render_mode="rgb_array")
    obs, info = env.reset(seed=3)
    assert obs.shape == (64, 64, 3) and obs.dtype == np.uint8 and "level_seed" in info
    np.testing.assert_array_equal(env.reset(seed=3)[0], obs)
    assert not np.array_equal(env.reset(seed=4)[0], obs)
    # Seeds outside procgen's range are mapped
    np.testing.assert_array_equal(env.reset(seed=3 + 2**31 - 1)[0], obs)
    env.reset(seed=3)
    rng = np.random.default_rng(0)
    for _ in range(1000):
        prev_obs = obs
        obs, reward, terminated, truncated, info = env.step(rng.integers(0, 15))
        assert type(reward) is float and truncated is False
        if terminated:
            break
    assert terminated
    # At the episode end: the last frame of the finished episode (procgen already started the next one)
    np.testing.assert_array_equal(obs, prev_obs)
    assert env.render().shape == (512, 512, 3)
    assert info["is_success"] == bool(info["prev_level_complete"])
    first_obs, reset_info = env.reset()
    assert reset_info["level_seed"] == info["level_seed"]  # the level procgen started
    assert not np.array_equal(first_obs, obs)
    # A reset in the middle of an episode starts a new one (a new level)
    env.step(0)
    level_before = reset_info["level_seed"]
    assert env.reset()[1]["level_seed"] != level_before
    env.close()


def test_bad_actions():
    env = ProcgenGymnasiumEnv(GAME, distribution_mode="easy")
    for action in (15, -1, 1.5, np.array([1, 2])):
        with pytest.raises(ValueError, match="Expected one integer action in"):
            env.step(action)
    env.close()


def test_make_vec_env_with_gymnasium_id():
    register_procgen_envs()
    env_kwargs = dict(distribution_mode="easy")
    vec_env = make_vec_env("procgen/bossfight-v0", n_envs=2, seed=0, env_kwargs=env_kwargs)
    other = make_vec_env("procgen/bossfight-v0", n_envs=2, seed=0, env_kwargs=env_kwargs)
    obs = vec_env.reset()
    assert obs.shape == (2, 64, 64, 3)
    np.testing.assert_array_equal(other.reset(), obs)
    assert vec_env.get_attr("env_name") == ["bossfight", "bossfight"]
    rng = np.random.default_rng(0)
    for _ in range(1000):
        _, _, dones, infos = vec_env.step(rng.integers(0, 15, 2))
        if dones.any():
            break
    idx = int(np.flatnonzero(dones)[0])
    assert "terminal_observation" in infos[idx] and "episode" in infos[idx]
    # make_vec_env(seed=None) draws uint32 seeds, beyond procgen's range
    large = make_vec_env("procgen/bossfight-v0", n_envs=2, seed=2**32 - 1, env_kwargs=env_kwargs)
    assert large.reset().shape == (2, 64, 64, 3)
    for env in (vec_env, other, large):
        env.close()


@pytest.mark.skipif(importlib.util.find_spec("gym") is None, reason="needs gym and procgen's gym envs (Python < 3.13)")
def test_legacy_gym_env_conversion():
    import gym
    from stable_baselines3.common.vec_env.patch_gym import _patch_env

    legacy = gym.make("procgen:procgen-bossfight-v0", distribution_mode="easy", num_levels=3, use_backgrounds=False)
    env = convert_legacy_procgen_env(legacy)
    assert isinstance(env, ProcgenGymnasiumEnv)
    assert env.env_name == "bossfight"
    assert env.procgen_kwargs == {"distribution_mode": "easy", "num_levels": 3, "start_level": 0, "use_backgrounds": False}
    check_env(env)
    # Seeds work now (shimmy's path calls the legacy ``seed(seed)``, which procgen's gym env does not accept)
    vec_env = make_vec_env(lambda: convert_legacy_procgen_env(legacy), n_envs=2, seed=0)
    assert vec_env.reset().shape == (2, 64, 64, 3)
    vec_env.close()
    # Also from shimmy's wrapper (what SB3 builds), and with render_mode / exploration
    with pytest.warns(UserWarning, match="OpenAI Gym"):
        shimmy_env = _patch_env(gym.make("procgen:procgen-maze-v0", render_mode="rgb_array"))
    converted = convert_legacy_procgen_env(shimmy_env)
    assert converted.env_name == "maze" and converted.render_mode == "rgb_array"
    exploration = convert_legacy_procgen_env(gym.make("procgen:procgen-coinrun-v0", distribution_mode="exploration"))
    assert exploration.procgen_kwargs["num_levels"] == 1
    with pytest.raises(ValueError, match=r"not a legacy procgen env.*ProcgenGymnasiumEnv"):
        convert_legacy_procgen_env(gym.make("CartPole-v1"))
    with pytest.raises(ValueError, match="not a legacy procgen env"):
        convert_legacy_procgen_env(DummyVecEnv([lambda: gymnasium.make("CartPole-v1")]))
