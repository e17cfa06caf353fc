import os

import gymnasium
import numpy as np
import pytest
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import EvalCallback
from stable_baselines3.common.env_checker import check_env
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import (
    DummyVecEnv,
    VecMonitor,
    VecNormalize,
    VecTransposeImage,
    VecVideoRecorder,
    is_vecenv_wrapped,
    unwrap_vec_normalize,
)

from sb3_ppg.procgen import (
    DISTRIBUTION_MODES,
    PROCGEN_GAMES,
    ProcgenGymnasiumEnv,
    ProcgenVecEnv,
    convert_legacy_procgen_env,
    make_procgen_env,
    procgen_seed,
    register_procgen_envs,
)

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


def test_constants_match_procgen():
    from procgen.env import DISTRIBUTION_MODE_DICT, ENV_NAMES, EXPLORATION_LEVEL_SEEDS

    assert PROCGEN_GAMES == tuple(ENV_NAMES)
    assert len(PROCGEN_GAMES) == 16
    assert set(DISTRIBUTION_MODES) == set(DISTRIBUTION_MODE_DICT)
    assert set(DISTRIBUTION_MODES["exploration"]) == set(EXPLORATION_LEVEL_SEEDS)
    assert procgen_seed(2**31 - 1) == 0
    assert procgen_seed(-1) == 2**31 - 2
    assert procgen_seed(np.uint64(2**40)) == 2**40 % (2**31 - 1)


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
    from procgen import ProcgenGym3Env

    env = ProcgenVecEnv(2, GAME, distribution_mode="easy", rand_seed=0, render_mode="rgb_array")
    assert env.render_mode == "rgb_array" and env.metadata["render_fps"] == 15
    # procgen's own rendering (every game at every step) as the reference
    reference = ProcgenGym3Env(2, GAME, distribution_mode="easy", rand_seed=0, render_mode="rgb_array")
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


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(env_name="pong"), "Unknown procgen game 'pong'. Valid games: bigfish, bossfight,"),
        (dict(distribution_mode="insane"), "Valid modes: easy, hard, extreme, memory, exploration"),
        (dict(env_name="coinrun", distribution_mode="memory"), "coinrun does not support .* it supports easy, hard, explo"),
        (dict(env_name="bigfish", distribution_mode="exploration"), "Games with the 'exploration' mode: caveflyer"),
        (dict(num_levels=-1), "`num_levels` must be between 0 and"),
        (dict(start_level=-5), "`start_level` must be between 0 and"),
        (dict(num_levels=1.5), "`num_levels` must be an integer"),
        (dict(start_level=True), "`start_level` must be an integer"),
        (dict(num_levels=2**30, start_level=2**30), "start_level \\+ num_levels must be at most"),
        (dict(env_name="maze", distribution_mode="exploration", num_levels=10), "exploration.* num_levels and start_level"),
        (dict(use_background=False), "Unknown procgen option 'use_background'. Valid options: .*use_backgrounds"),
        (dict(restrict_themes="yes"), "'restrict_themes' must be a bool"),
        (dict(render_mode="human"), "render_mode=None or 'rgb_array'"),
    ],
)
def test_bad_options(kwargs, match):
    kwargs = {"env_name": GAME, **kwargs}
    for make in (
        lambda: ProcgenVecEnv(2, **kwargs),
        lambda: ProcgenGymnasiumEnv(**kwargs),
        lambda: make_procgen_env(n_envs=2, **kwargs),
    ):
        with pytest.raises(ValueError, match=match):
            make()


def test_bad_vec_env_arguments_and_actions():
    with pytest.raises(ValueError, match="`num_envs` must be between 1"):
        ProcgenVecEnv(0, GAME)
    with pytest.raises(ValueError, match="`num_threads` must be between 0"):
        ProcgenVecEnv(2, GAME, num_threads=-1)
    with pytest.raises(ValueError, match="reward_gamma must be in"):
        make_procgen_env(GAME, n_envs=2, reward_gamma=1.0)
    with pytest.raises(ValueError, match="clip_reward must be positive"):
        make_procgen_env(GAME, n_envs=2, clip_reward=0.0)
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
    gym_env = ProcgenGymnasiumEnv(GAME, distribution_mode="easy")
    for action in (15, -1, 1.5, np.array([1, 2])):
        with pytest.raises(ValueError, match="Expected one integer action in"):
            gym_env.step(action)
    env.close()
    gym_env.close()


def test_supported_modes_build():
    # One pair per non-default mode (an unsupported pair would abort the process in procgen's C++)
    for game, mode in (("starpilot", "extreme"), ("maze", "memory"), ("maze", "exploration")):
        env = ProcgenVecEnv(1, game, distribution_mode=mode, num_threads=0)
        env.reset()
        env.step(np.array([0]))
        env.close()
    env = ProcgenGymnasiumEnv("maze", distribution_mode="exploration")
    env.reset(seed=0)
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
    path = str(tmp_path / "vecnormalize.pkl")
    unwrap_vec_normalize(env).save(path)
    loaded = make_procgen_env(GAME, n_envs=2, training=False, vec_normalize_path=path)
    loaded_normalize = unwrap_vec_normalize(loaded)
    assert loaded_normalize.ret_rms.var == unwrap_vec_normalize(env).ret_rms.var
    assert loaded_normalize.ret_rms.count == unwrap_vec_normalize(env).ret_rms.count
    assert not loaded_normalize.training and not loaded_normalize.norm_reward and loaded.num_envs == 2
    resumed = make_procgen_env(GAME, n_envs=4, vec_normalize_path=path)
    assert unwrap_vec_normalize(resumed).training and unwrap_vec_normalize(resumed).norm_reward
    by_hand = VecNormalize.load(path, VecMonitor(ProcgenVecEnv(4, GAME, distribution_mode="easy", channels_first=True)))
    assert by_hand.ret_rms.count == loaded_normalize.ret_rms.count
    model.set_env(resumed)
    model.learn(64, reset_num_timesteps=False)
    for vec_env in (eval_env, loaded, resumed, by_hand):
        vec_env.close()


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


def test_make_vec_env_with_gymnasium_id():
    register_procgen_envs()
    env_kwargs = dict(distribution_mode="easy")
    vec_env = make_vec_env("procgen/bossfight-v0", n_envs=2, seed=0, env_kwargs=env_kwargs)
    other = make_vec_env("procgen/bossfight-v0", n_envs=2, seed=0, env_kwargs=env_kwargs)
    obs = vec_env.reset()
    assert obs.shape == (2, 64, 64, 3)
    np.testing.assert_array_equal(other.reset(), obs)
    assert vec_env.get_attr("env_name") == ["bossfight", "bossfight"]
    _, _, _, dones, infos = run_until_done(vec_env, 2)
    idx = int(np.flatnonzero(dones)[0])
    assert "terminal_observation" in infos[idx] and "episode" in infos[idx]
    # make_vec_env(seed=None) draws uint32 seeds, beyond procgen's range
    large = make_vec_env("procgen/bossfight-v0", n_envs=2, seed=2**32 - 1, env_kwargs=env_kwargs)
    assert large.reset().shape == (2, 64, 64, 3)
    for env in (vec_env, other, large):
        env.close()


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
    assert model._n_aux_phases == 2
    assert model.aux_buffer.observations.dtype == np.uint8
    env.close()
