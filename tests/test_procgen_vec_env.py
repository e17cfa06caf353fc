"""sb3_ppg.procgen.vec_env: the native ProcgenVecEnv."""

import gymnasium
import numpy as np
import pytest
from stable_baselines3.common.monitor import Monitor

from sb3_ppg.procgen import ProcgenVecEnv, procgen_seed

# Random play ends a bossfight episode every ~50 steps in easy mode: episode ends come quickly
GAME = "bossfight"
# Info keys of ProcgenVecEnv at an episode end (other steps have empty infos)
EPISODE_END_INFO_KEYS = {
    "terminal_observation",
    "TimeLimit.truncated",
    "is_success",
    "level_seed",
    "prev_level_seed",
    "prev_level_complete",
}


def run_until_done(env, n_envs: int, max_steps: int = 1000, seed: int = 0):
    """Step with random actions until an episode ends; return the previous obs and the done step's results."""
    rng = np.random.default_rng(seed)
    obs = env.reset()
    for _ in range(max_steps):
        prev_obs = obs
        obs, rewards, dones, infos = env.step(rng.integers(0, 15, n_envs))
        if dones.any():
            return prev_obs, obs, rewards, dones, infos
    raise AssertionError(f"no episode ended in {max_steps} steps")


def test_vec_env_spaces_step_and_infos():
    env = ProcgenVecEnv(3, GAME, distribution_mode="easy", rand_seed=0)
    assert env.observation_space == gymnasium.spaces.Box(0, 255, (64, 64, 3), np.uint8)
    assert env.action_space == gymnasium.spaces.Discrete(15)
    assert env.num_envs == 3 and env.render_mode is None
    assert env.procgen_kwargs == {"distribution_mode": "easy", "num_levels": 0, "start_level": 0}
    obs = env.reset()
    assert obs.shape == (3, 64, 64, 3) and obs.dtype == np.uint8
    assert len(env.reset_infos) == 3 and "level_seed" in env.reset_infos[0]
    # step_async accepts (n,) and (n, 1) integer actions, and integral floats
    for actions in (np.array([0, 1, 14]), np.array([[3], [4], [5]]), np.array([1.0, 2.0, 3.0]), [7, 7, 7]):
        env.step_async(actions)
        obs, rewards, dones, infos = env.step_wait()
        assert obs.shape == (3, 64, 64, 3) and obs.dtype == np.uint8
        assert rewards.shape == (3,) and rewards.dtype == np.float32
        assert dones.shape == (3,) and dones.dtype == bool
        assert len(infos) == 3
        for info, done in zip(infos, dones, strict=True):
            assert set(info) == (EPISODE_END_INFO_KEYS if done else set())
    env.close()
    env.close()  # closing twice is harmless


def test_vec_env_terminal_observation():
    env = ProcgenVecEnv(4, GAME, distribution_mode="easy", rand_seed=1)
    prev_obs, _, _, dones, infos = run_until_done(env, 4)
    for idx in range(4):
        if dones[idx]:
            # The last frame of the finished episode is the one seen before the last action
            np.testing.assert_array_equal(infos[idx]["terminal_observation"], prev_obs[idx])
            assert infos[idx]["terminal_observation"].shape == (64, 64, 3)
            assert infos[idx]["TimeLimit.truncated"] is False
            assert infos[idx]["is_success"] == bool(infos[idx]["prev_level_complete"])
            # procgen already started the next level
            assert infos[idx]["prev_level_seed"] != infos[idx]["level_seed"]
            assert set(infos[idx]) == EPISODE_END_INFO_KEYS
        else:
            assert infos[idx] == {}
    env.close()


def test_vec_env_seeding():
    def first_frames(env, seed):
        env.seed(seed)
        return env.reset()

    env = ProcgenVecEnv(2, GAME, distribution_mode="easy")
    other = ProcgenVecEnv(2, GAME, distribution_mode="easy")
    frames_123 = first_frames(env, 123)
    np.testing.assert_array_equal(first_frames(other, 123), frames_123)
    assert not np.array_equal(first_frames(other, 124), frames_123)
    # Same seed -> same trajectory with the same actions, also after stepping
    actions = np.random.default_rng(0).integers(0, 15, (30, 2))
    trajectories = []
    for _ in range(2):
        first_frames(env, 123)
        trajectories.append([env.step(action)[:3] for action in actions])
    for (obs_a, rew_a, done_a), (obs_b, rew_b, done_b) in zip(*trajectories, strict=True):
        np.testing.assert_array_equal(obs_a, obs_b)
        np.testing.assert_array_equal(rew_a, rew_b)
        np.testing.assert_array_equal(done_a, done_b)
    # Seeds outside procgen's int32 range are mapped (SB3 draws uint32 seeds)
    seeds = env.seed(2**32 + 5)
    assert seeds == [2**32 + 5, 2**32 + 6]
    np.testing.assert_array_equal(env.reset(), first_frames(other, procgen_seed(2**32 + 5)))
    # The construction seed works like seed() + reset()
    constructed = ProcgenVecEnv(2, GAME, distribution_mode="easy", rand_seed=123)
    np.testing.assert_array_equal(constructed.reset(), frames_123)
    for vec_env in (env, other, constructed):
        vec_env.close()


def test_vec_env_reset_restarts_episodes():
    env = ProcgenVecEnv(2, "coinrun", distribution_mode="easy", rand_seed=7)
    obs = env.reset()
    level_seeds = [info["level_seed"] for info in env.reset_infos]
    # A reset right after construction (or another reset) keeps the env as it is
    np.testing.assert_array_equal(env.reset(), obs)
    assert [info["level_seed"] for info in env.reset_infos] == level_seeds
    for _ in range(5):
        env.step(np.array([4, 4]))
    # A reset after steps starts new episodes, on new levels (reproducibly)
    env.reset()
    new_level_seeds = [info["level_seed"] for info in env.reset_infos]
    assert new_level_seeds != level_seeds
    replay = ProcgenVecEnv(2, "coinrun", distribution_mode="easy", rand_seed=7)
    replay.step(np.array([4, 4]))
    replay.reset()
    assert [info["level_seed"] for info in replay.reset_infos] == new_level_seeds
    env.close()
    replay.close()


def test_vec_env_attr_and_method_api():
    env = ProcgenVecEnv(3, GAME, distribution_mode="easy", rand_seed=0, use_backgrounds=False)
    env.reset()
    assert env.get_attr("env_name") == [GAME] * 3
    assert env.get_attr("procgen_kwargs", indices=[0, 2]) == [env.procgen_kwargs] * 2
    assert env.procgen_kwargs["use_backgrounds"] is False
    assert env.get_attr("render_mode", indices=1) == [None]
    assert env.has_attr("num_threads") and not env.has_attr("not_an_attribute")
    env.set_attr("custom_value", 42)
    assert env.get_attr("custom_value") == [42, 42, 42]
    assert env.env_method("seed", 10) == [[10, 11, 12]] * 3
    assert env.env_method("get_attr", "env_name", indices=[0]) == [[GAME] * 3]
    assert env.env_is_wrapped(Monitor) == [False, False, False]
    assert env.env_is_wrapped(Monitor, indices=[1]) == [False]
    env.set_options({"unused": 1})
    env.reset()
    assert env._options == [{}, {}, {}]
    images = env.get_images()
    assert len(images) == 3 and images[0].shape == (64, 64, 3)
    with pytest.warns(UserWarning, match="render_mode"):
        assert env.render() is None
    assert env.unwrapped is env
    env.close()


def test_vec_env_render_rgb_array():
    from sb3_ppg.procgen.backend import make_native_env

    env = ProcgenVecEnv(2, GAME, distribution_mode="easy", rand_seed=0, render_mode="rgb_array")
    assert env.render_mode == "rgb_array" and env.metadata["render_fps"] == 15
    # procgen's own rendering (every game at every step) as the reference
    reference = make_native_env(2, GAME, distribution_mode="easy", rand_seed=0, render_mode="rgb_array")
    env.reset()
    for action in np.random.default_rng(0).integers(0, 15, (20, 2)):
        _, _, _, infos = env.step(action)
        reference.act(action.astype(np.int32))
    # The 512x512 frames are drawn on demand, they are not in the step infos
    assert "rgb" not in infos[0] and "rgb" not in env.reset_infos[0]
    images = env.get_images()
    assert len(images) == 2 and images[0].shape == (512, 512, 3) and images[0].dtype == np.uint8
    for image, info in zip(images, reference.get_info(), strict=True):
        np.testing.assert_array_equal(image, info["rgb"])
    assert env.render().shape == (1024, 512, 3)  # 2 frames tiled by SB3 (one above the other)
    env.close()
    reference.close()


def test_bad_vec_env_arguments_and_actions():
    with pytest.raises(ValueError, match="`num_envs` must be between 1"):
        ProcgenVecEnv(0, GAME)
    with pytest.raises(ValueError, match="`num_threads` must be between 0"):
        ProcgenVecEnv(2, GAME, num_threads=-1)
    env = ProcgenVecEnv(2, GAME, distribution_mode="easy")
    with pytest.raises(ValueError, match=r"Expected actions of shape \(2,\).*got shape \(3,\)"):
        env.step_async(np.array([0, 1, 2]))
    with pytest.raises(ValueError, match=r"got shape \(2, 2\)"):
        env.step_async(np.zeros((2, 2), dtype=np.int64))
    with pytest.raises(ValueError, match=r"got shape \(\)"):
        env.step_async(np.int64(3))
    with pytest.raises(ValueError, match=r"Actions must be in \[0, 15\)"):
        env.step_async(np.array([0, 15]))
    with pytest.raises(ValueError, match="Actions must be in"):
        env.step_async(np.array([-1, 0]))
    with pytest.raises(ValueError, match="Expected integer actions"):
        env.step_async(np.array([0.5, 1.0]))
    # Every integer dtype is range-checked (negative values too), integral floats are accepted
    for dtype in (np.int8, np.int16, np.int32, np.int64):
        with pytest.raises(ValueError, match="Actions must be in"):
            env.step_async(np.array([3, -1], dtype=dtype))
    for dtype in (np.uint8, np.uint32, np.int8, np.float32):
        with pytest.raises(ValueError, match="Actions must be in"):
            env.step_async(np.array([3, 100], dtype=dtype))
        env.step_async(np.array([14, 0], dtype=dtype))
        np.testing.assert_array_equal(env._actions, [14, 0])
    with pytest.raises(ValueError, match="Actions must be in"):
        env.step_async(np.array([-1.0, 2.0]))
    with pytest.raises(ValueError, match="Expected integer actions"):
        env.step_async(np.array([True, False]))
    env.close()


def test_channels_first_observations():
    """channels_first=True gives the (3, 64, 64) transposes of the same frames, terminal observations included."""
    last = ProcgenVecEnv(3, GAME, distribution_mode="easy", rand_seed=5)
    first = ProcgenVecEnv(3, GAME, distribution_mode="easy", rand_seed=5, channels_first=True)
    assert last.observation_space.shape == (64, 64, 3) and first.observation_space.shape == (3, 64, 64)
    assert first.observation_space.dtype == np.uint8
    np.testing.assert_array_equal(first.reset(), last.reset().transpose(0, 3, 1, 2))
    rng = np.random.default_rng(0)
    n_terminal = 0
    for _ in range(200):
        actions = rng.integers(0, 15, size=3)
        (obs_last, _, dones, infos_last), (obs_first, _, _, infos_first) = last.step(actions), first.step(actions)
        assert obs_first.shape == (3, 3, 64, 64)
        np.testing.assert_array_equal(obs_first, obs_last.transpose(0, 3, 1, 2))
        for idx in np.flatnonzero(dones):
            n_terminal += 1
            terminal = infos_first[idx]["terminal_observation"]
            assert terminal.shape == (3, 64, 64) and terminal.flags["C_CONTIGUOUS"]
            np.testing.assert_array_equal(terminal, infos_last[idx]["terminal_observation"].transpose(2, 0, 1))
    assert n_terminal > 0
    # Images stay images
    assert first.get_images()[0].shape == (64, 64, 3)
    last.close()
    first.close()
