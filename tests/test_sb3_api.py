"""PPG with SB3's tooling: callbacks, logging, seeding, predict/evaluate, VecNormalize, devices, train/eval modes."""

import csv
import functools

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from stable_baselines3.common.callbacks import (
    BaseCallback,
    CheckpointCallback,
    EvalCallback,
    StopTrainingOnMaxEpisodes,
    StopTrainingOnRewardThreshold,
)
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.logger import configure
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
from stable_baselines3.common.utils import get_device
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize
from torch import nn

from sb3_ppg import PPG

# Many tests here train less than one auxiliary phase on purpose (the state they check comes before it): the warning
# that learn() then trains as plain PPO is meant
pytestmark = pytest.mark.filterwarnings(r"ignore:learn\(total_timesteps=.*this learn\(\) trains as plain PPO")

# One aux phase every 2 iterations of 2 envs x 16 steps


@pytest.fixture
def make_model(make_model):
    """The shared small-model builder (conftest.py), with two ``make_vec_env`` envs for env ids."""
    return functools.partial(make_model, n_envs=2)


LOGGED_KEYS = (
    "train/policy_gradient_loss",
    "train/value_loss",
    "train/entropy_loss",
    "train/approx_kl",
    "train/clip_fraction",
    "train/explained_variance",
    "train/learning_rate",
    "train/n_aux_phases",
    "aux/kl_loss",
    "aux/aux_value_loss",
    "aux/real_value_loss",
    "time/aux_phase_s",
)


# ----------------------------------------------------------------------------------------------------------------
# Callbacks
# ----------------------------------------------------------------------------------------------------------------


def test_eval_callback(tmp_path, make_model):
    model = make_model(n_envs=1, n_steps=32, batch_size=32)
    eval_env = make_vec_env("CartPole-v1", n_envs=1, seed=1)
    callback = EvalCallback(eval_env, n_eval_episodes=2, eval_freq=32, log_path=tmp_path, best_model_save_path=tmp_path)
    model.learn(128, callback=callback)

    evaluations = np.load(tmp_path / "evaluations.npz")
    np.testing.assert_array_equal(evaluations["timesteps"], [32, 64, 96, 128])
    assert evaluations["results"].shape == evaluations["ep_lengths"].shape == (4, 2)
    # CartPole: one reward per step
    np.testing.assert_array_equal(evaluations["results"], evaluations["ep_lengths"])
    assert callback.best_mean_reward == evaluations["results"].mean(axis=1).max()
    best = PPG.load(tmp_path / "best_model.zip")
    assert 32 <= best.num_timesteps <= 128


def test_checkpoint_callback(tmp_path, make_model):
    model = make_model(n_envs=1, n_steps=32, batch_size=32)
    model.learn(96, callback=CheckpointCallback(save_freq=32, save_path=tmp_path, name_prefix="ppg"))
    assert sorted(path.name for path in tmp_path.iterdir()) == ["ppg_32_steps.zip", "ppg_64_steps.zip", "ppg_96_steps.zip"]
    checkpoint = PPG.load(tmp_path / "ppg_64_steps.zip")
    assert checkpoint.num_timesteps == 64
    # Saved after the 2nd rollout was collected, before it was trained on: one aux phase behind the final model
    assert model.n_aux_phases == 1
    assert checkpoint.n_aux_phases == 0


def test_stop_training_on_max_episodes(make_model):
    model = make_model(n_envs=1)
    callback = StopTrainingOnMaxEpisodes(max_episodes=3)
    model.learn(10_000, callback=callback)
    assert callback.n_episodes == 3
    # Stopped right at the end of the 3rd episode (whose info the callback saw before the model stores it)
    assert len(model.ep_info_buffer) == 2
    last_episode = callback.locals["infos"][0]["episode"]
    assert model.num_timesteps == sum(info["l"] for info in model.ep_info_buffer) + last_episode["l"] < 10_000


def test_stop_training_on_reward_threshold(tmp_path, make_model):
    model = make_model(n_envs=1)
    # Any CartPole episode is worth more than 5
    stop = StopTrainingOnRewardThreshold(reward_threshold=5, verbose=0)
    callback = EvalCallback(make_vec_env("CartPole-v1", n_envs=1), callback_on_new_best=stop, eval_freq=48, log_path=tmp_path)
    model.learn(10_000, callback=callback)
    assert model.num_timesteps == 48
    assert len(np.load(tmp_path / "evaluations.npz")["timesteps"]) == 1


class EventRecorder(BaseCallback):
    """Records the callback events in order, and what the model looks like at each."""

    def __init__(self):
        super().__init__()
        self.events: list[str] = []
        self.aux_rollouts_at_rollout_start: list[int] = []

    def _on_training_start(self) -> None:
        self.events.append("training_start")

    def _on_rollout_start(self) -> None:
        self.events.append("rollout_start")
        self.aux_rollouts_at_rollout_start.append(self.model.aux_buffer.n_rollouts)

    def _on_step(self) -> bool:
        self.events.append("step")
        assert {"actions", "rewards", "dones", "infos"} <= self.locals.keys()
        return True

    def _on_rollout_end(self) -> None:
        self.events.append("rollout_end")
        assert self.locals["rollout_buffer"].full

    def _on_training_end(self) -> None:
        self.events.append("training_end")


def test_custom_callback_order(make_model):
    model = make_model(n_policy_iters=3)
    recorder = EventRecorder()
    model.learn(3 * 32, callback=recorder)
    rollout = ["rollout_start", *["step"] * 16, "rollout_end"]
    assert recorder.events == ["training_start", *rollout * 3, "training_end"]
    assert recorder.n_calls == 3 * 16
    assert recorder.num_timesteps == model.num_timesteps == 96
    # train() runs between a rollout's end and the next rollout's start; the 3rd one runs the aux phase
    assert recorder.aux_rollouts_at_rollout_start == [0, 2, 4]
    assert model.n_aux_phases == 1


@pytest.mark.filterwarnings("ignore:rich is experimental")
def test_progress_bar(capsys, make_model):
    model = make_model()
    model.learn(64, progress_bar=True)
    assert model.num_timesteps == 64
    assert "64/64" in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------------------------
# Logging
# ----------------------------------------------------------------------------------------------------------------


def test_tensorboard_logging(tmp_path, make_model):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    model = make_model(n_policy_iters=1, tensorboard_log=str(tmp_path))
    model.learn(3 * 32)
    # Continuing a run logs to the same directory (SB3 starts a new logger: what the last train() of the previous
    # learn() call recorded is never dumped, as with PPO)
    model.learn(32, reset_num_timesteps=False)
    assert [path.name for path in tmp_path.iterdir()] == ["PPG_1"]
    assert len(list((tmp_path / "PPG_1").iterdir())) == 2

    accumulator = EventAccumulator(str(tmp_path / "PPG_1"))
    accumulator.Reload()
    tags = set(accumulator.Tags()["scalars"])
    missing = set(LOGGED_KEYS) - tags
    assert not missing, f"missing TensorBoard keys: {sorted(missing)}"
    # train() of iteration k is dumped at iteration k + 1
    n_aux_phases = accumulator.Scalars("train/n_aux_phases")
    assert [event.step for event in n_aux_phases] == [64, 96]
    assert [event.value for event in n_aux_phases] == [1, 2]
    assert accumulator.Scalars("time/fps")[-1].step == 128
    assert all(event.value > 0 for event in accumulator.Scalars("time/aux_phase_s"))
    assert all(np.isfinite(event.value) for event in accumulator.Scalars("aux/kl_loss"))


def test_csv_logging(tmp_path, make_model):
    model = make_model()
    model.set_logger(configure(str(tmp_path), ["csv"]))
    model.learn(4 * 32)
    with open(tmp_path / "progress.csv") as file:
        rows = list(csv.DictReader(file))
    assert len(rows) == 4
    assert set(LOGGED_KEYS) <= set(rows[0])
    assert [int(row["time/total_timesteps"]) for row in rows] == [32, 64, 96, 128]
    # Nothing is trained before the first dump; the aux phase of iteration 2 is dumped with iteration 3
    assert rows[0]["train/value_loss"] == ""
    assert [row["aux/kl_loss"] != "" for row in rows] == [False, False, True, False]
    assert [row["train/n_aux_phases"] for row in rows] == ["", "0", "1", "1"]
    assert float(rows[2]["aux/real_value_loss"]) > 0


def test_reset_num_timesteps(make_model):
    model = make_model()
    model.learn(64)
    assert model.num_timesteps == 64
    assert model.n_aux_phases == 1
    model.learn(64, reset_num_timesteps=False)
    assert model.num_timesteps == 128
    assert model.n_aux_phases == 2
    model.learn(32)
    assert model.num_timesteps == 32


# ----------------------------------------------------------------------------------------------------------------
# Seeding
# ----------------------------------------------------------------------------------------------------------------


class RolloutRecorder(BaseCallback):
    """Keeps the actions and rewards of every rollout."""

    def __init__(self):
        super().__init__()
        self.actions: list[np.ndarray] = []
        self.rewards: list[np.ndarray] = []

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        self.actions.append(self.model.rollout_buffer.actions.copy())
        self.rewards.append(self.model.rollout_buffer.rewards.copy())


@pytest.mark.parametrize("env_id, kwargs", [("CartPole-v1", {}), ("Pendulum-v1", dict(use_sde=True, sde_sample_freq=4))])
def test_deterministic_training(env_id, kwargs, make_model):
    """Two runs with the same seed are identical, across aux phases (in the style of sb3-contrib's test_deterministic)."""
    results = []
    for seed in (0, 0, 1):
        model = make_model(env_id, seed=seed, **kwargs)
        recorder = RolloutRecorder()
        model.learn(5 * 32, callback=recorder)
        assert model.n_aux_phases == 2
        results.append((np.concatenate(recorder.actions), np.concatenate(recorder.rewards), model.get_parameters()["policy"]))

    (actions_a, rewards_a, params_a), (actions_b, rewards_b, params_b), (actions_c, _, params_c) = results
    np.testing.assert_array_equal(actions_a, actions_b)
    np.testing.assert_array_equal(rewards_a, rewards_b)
    for name in params_a:
        assert th.equal(params_a[name], params_b[name]), name
    # Another seed gives another run
    assert not np.array_equal(actions_a, actions_c)
    assert not all(th.equal(params_a[name], params_c[name]) for name in params_a)


# ----------------------------------------------------------------------------------------------------------------
# predict / evaluate_policy
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_predict(env_id, make_model):
    model = make_model(env_id)
    model.learn(32)
    env = gym.make(env_id)
    observation, _ = env.reset(seed=0)
    env.observation_space.seed(0)
    batch = np.stack([env.observation_space.sample() for _ in range(5)])
    action_shape = model.action_space.shape

    action, state = model.predict(observation, deterministic=True)
    assert state is None
    assert action.shape == action_shape
    assert model.action_space.contains(action.item() if action_shape == () else action)
    actions, _ = model.predict(batch, deterministic=True)
    assert actions.shape == (5, *action_shape)
    # A batch predicts what each observation predicts alone, up to the float32 rounding of batched matmuls, which
    # differs between CPUs: below 1e-6 in absolute terms for this 16-unit MLP with SB3's 0.01-gain action head (a
    # relative tolerance would not hold for an action near 0, as Pendulum's ~0.007 is)
    np.testing.assert_allclose(actions[2], model.predict(batch[2], deterministic=True)[0], rtol=0, atol=1e-6)
    # Deterministic: repeatable; stochastic: samples differ
    np.testing.assert_array_equal(actions, model.predict(batch, deterministic=True)[0])
    samples = np.stack([model.predict(observation, deterministic=False)[0] for _ in range(50)])
    assert len(np.unique(samples)) > 1
    if isinstance(model.action_space, gym.spaces.Box):
        # Sampled actions are clipped to the bounds
        assert np.all(samples >= model.action_space.low) and np.all(samples <= model.action_space.high)
    # The gymnasium (obs, info) tuple is rejected with SB3's message
    with pytest.raises(ValueError, match="tuple"):
        model.predict(env.reset(), deterministic=True)


def test_evaluate_policy(make_model):
    model = make_model()
    model.learn(64)
    eval_env = Monitor(gym.make("CartPole-v1"))
    rewards, lengths = evaluate_policy(model, eval_env, n_eval_episodes=3, return_episode_rewards=True)
    assert len(rewards) == len(lengths) == 3
    np.testing.assert_array_equal(rewards, lengths)
    mean_reward, std_reward = evaluate_policy(model, make_vec_env("CartPole-v1", n_envs=2), n_eval_episodes=4)
    assert 8 <= mean_reward <= 500 and std_reward >= 0


# ----------------------------------------------------------------------------------------------------------------
# Environments, VecNormalize, devices
# ----------------------------------------------------------------------------------------------------------------


def test_vec_normalize_save_load(tmp_path, make_model):
    env = VecNormalize(make_vec_env("Pendulum-v1", n_envs=2, seed=0), gamma=0.999)
    model = make_model(env)
    assert model.get_vec_normalize_env() is env
    model.learn(64)
    # 2 reset observations and 64 steps
    assert env.obs_rms.count == pytest.approx(66, abs=1e-3)
    model.save(tmp_path / "model.zip")
    env.save(tmp_path / "vec_normalize.pkl")

    new_env = VecNormalize.load(tmp_path / "vec_normalize.pkl", make_vec_env("Pendulum-v1", n_envs=2, seed=1))
    np.testing.assert_array_equal(new_env.obs_rms.mean, env.obs_rms.mean)
    np.testing.assert_array_equal(new_env.obs_rms.var, env.obs_rms.var)
    np.testing.assert_array_equal(new_env.ret_rms.var, env.ret_rms.var)
    loaded = PPG.load(tmp_path / "model.zip", env=new_env)
    assert loaded.get_vec_normalize_env() is new_env
    raw_obs = np.stack([new_env.observation_space.sample() for _ in range(4)])
    np.testing.assert_array_equal(
        model.predict(env.normalize_obs(raw_obs), deterministic=True)[0],
        loaded.predict(new_env.normalize_obs(raw_obs), deterministic=True)[0],
    )
    # Training goes on and keeps updating the statistics
    count = new_env.obs_rms.count
    loaded.learn(32, reset_num_timesteps=False)
    assert new_env.obs_rms.count == pytest.approx(count + 2 + 32)


@pytest.mark.parametrize("device", ["cpu", "auto"])
def test_device(tmp_path, device, make_model):
    model = make_model(device=device)
    expected = get_device("auto") if device == "auto" else th.device("cpu")
    if not th.cuda.is_available():
        assert expected == th.device("cpu")
    assert model.device.type == expected.type
    assert all(param.device.type == expected.type for param in model.policy.parameters())
    assert model.aux_buffer.device.type == expected.type
    model.learn(64)
    assert model.n_aux_phases == 1
    # The aux buffer's arrays stay in CPU memory whatever the device
    assert model.aux_buffer.observations.device.type == "cpu"
    model.save(tmp_path / "model.zip")
    loaded = PPG.load(tmp_path / "model.zip", device="cpu")
    assert loaded.device == th.device("cpu")
    assert all(param.device == th.device("cpu") for param in loaded.policy.parameters())


def test_get_env(tmp_path, make_model):
    # A gymnasium env is wrapped in Monitor and DummyVecEnv
    model = make_model(gym.make("CartPole-v1"))
    env = model.get_env()
    assert isinstance(env, DummyVecEnv) and env is model.env
    assert env.num_envs == model.n_envs == 1
    assert isinstance(env.envs[0], Monitor)
    model.learn(16)
    assert model.aux_buffer.n_rollouts == 1
    new_env = make_vec_env("CartPole-v1", n_envs=1)
    model.set_env(new_env)
    assert model.get_env() is new_env
    # A model loaded without env has none
    model.save(tmp_path / "model.zip")
    assert PPG.load(tmp_path / "model.zip").get_env() is None


# ----------------------------------------------------------------------------------------------------------------
# Train / eval mode (as sb3-contrib's test_train_eval_mode)
# ----------------------------------------------------------------------------------------------------------------


class ModeRecorder(BaseCallback):
    """Marks which phase of learn() is running: collecting rollouts or training."""

    phase = "setup"

    def _on_rollout_start(self) -> None:
        ModeRecorder.phase = "collect"
        self.tracked_at_start = self.batches_tracked()

    def _on_step(self) -> bool:
        assert not self.model.policy.training
        return True

    def _on_rollout_end(self) -> None:
        # BatchNorm statistics do not move while collecting
        assert self.batches_tracked() == self.tracked_at_start
        ModeRecorder.phase = "train"

    def batches_tracked(self) -> list[int]:
        return [
            int(module.num_batches_tracked) for module in self.model.policy.modules() if isinstance(module, nn.BatchNorm1d)
        ]


class DropoutBatchNormExtractor(BaseFeaturesExtractor):
    """A features extractor whose output depends on the mode, recording the mode of every call."""

    calls: list[tuple[str, bool]] = []

    def __init__(self, observation_space: gym.spaces.Box, features_dim: int = 16):
        super().__init__(observation_space, features_dim)
        self.net = nn.Sequential(
            nn.Linear(observation_space.shape[0], features_dim), nn.BatchNorm1d(features_dim), nn.Dropout(0.5), nn.ReLU()
        )

    def forward(self, observations: th.Tensor) -> th.Tensor:
        DropoutBatchNormExtractor.calls.append((ModeRecorder.phase, self.training))
        return self.net(observations)


@pytest.mark.parametrize("arch", ["dual", "shared"])
def test_train_eval_mode(arch, make_model):
    DropoutBatchNormExtractor.calls = []
    ModeRecorder.phase = "setup"
    policy_kwargs = dict(arch=arch, net_arch=[16], features_extractor_class=DropoutBatchNormExtractor)
    model = make_model(policy_kwargs=policy_kwargs)
    recorder = ModeRecorder()
    batchnorm_steps = recorder.batches_tracked
    model.learn(64, callback=recorder)
    assert model.n_aux_phases == 1

    modes = {
        phase: {training for call_phase, training in DropoutBatchNormExtractor.calls if call_phase == phase}
        for phase in ("collect", "train")
    }
    assert modes == {"collect": {False}, "train": {True}}
    # The BatchNorm statistics were updated by the policy and aux phases
    assert all(count > 0 for count in batchnorm_steps())

    # predict uses eval mode: deterministic despite dropout, and BatchNorm statistics untouched
    observations = np.stack([model.observation_space.sample() for _ in range(8)])
    tracked = batchnorm_steps()
    actions = model.predict(observations, deterministic=True)[0]
    assert not model.policy.training
    for _ in range(3):
        np.testing.assert_array_equal(actions, model.predict(observations, deterministic=True)[0])
    assert batchnorm_steps() == tracked
    # In train mode, dropout makes the outputs random
    model.policy.set_training_mode(True)
    obs_tensor = th.as_tensor(observations)
    with th.no_grad():
        first, second = (model.policy.get_distribution(obs_tensor).distribution.logits for _ in range(2))
    assert not th.equal(first, second)
