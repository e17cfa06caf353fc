"""
``PPG(normalize_reward=True)``: the paper code's per-rollout reward normalization (``RolloutRewardNormalizer``) against a
float64 reference of the original semantics, in PPG's rollouts, in model zips and checkpoints, and under torchrun.
"""

import io
import pathlib
import sys
import zipfile

import numpy as np
import pytest
import torch as th
from helpers import assert_identical, parameters
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import VecNormalize

from sb3_ppg import PPG, PPGCheckpointCallback
from sb3_ppg.common.hyperparameters import HyperparameterError
from sb3_ppg.common.reward_normalization import RolloutRewardNormalizer

# Runs shorter than an auxiliary phase are meant in some tests
pytestmark = pytest.mark.filterwarnings(r"ignore:learn\(total_timesteps=.*this learn\(\) trains as plain PPO")

N_ENVS, N_STEPS = 2, 16
ITERATION = N_ENVS * N_STEPS
TOTAL = 6 * ITERATION  # auxiliary phases after iterations 3 and 6
RUN = dict(n_steps=N_STEPS, n_policy_iters=3, normalize_reward=True)


class OriginalRewards:
    """
    A float64 reference of the original code's ``RewardNormalizer`` (gamma, clip 10, epsilon 1e-8, a prior of mean 0,
    variance 1 and count 1e-4), in closed form: after each rollout, the mean and variance of every discounted return
    seen so far together with the prior, computed from their sums.
    """

    def __init__(self, n_envs: int, gamma: float = 0.99, clip: float = 10.0) -> None:
        self.gamma, self.clip = gamma, clip
        self.running_return = np.zeros(n_envs)
        self.returns: list[np.ndarray] = []

    def __call__(self, rewards: np.ndarray, episode_starts: np.ndarray) -> np.ndarray:
        for step in range(len(rewards)):
            self.running_return = rewards[step] + self.gamma * np.where(episode_starts[step] > 0, 0.0, self.running_return)
            self.returns.append(self.running_return.copy())
        seen = np.concatenate(self.returns)
        count = 1e-4 + seen.size
        mean = seen.sum() / count
        var = (1e-4 * 1.0 + (seen**2).sum()) / count - mean**2
        self.statistics = np.array([mean, var, count])
        return np.clip(rewards / np.sqrt(var + 1e-8), -self.clip, self.clip)


def random_rollout(rng: np.random.Generator, n_steps: int = 7, n_envs: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """Rewards on very different scales and episode starts, ``(n_steps, n_envs)`` each."""
    rewards = rng.normal(size=(n_steps, n_envs)) * rng.choice([0.1, 1.0, 30.0], size=(n_steps, n_envs))
    return rewards, (rng.random((n_steps, n_envs)) < 0.25).astype(np.float32)


def normalizer_state(normalizer: RolloutRewardNormalizer) -> np.ndarray:
    return np.array([normalizer.mean, normalizer.var, normalizer.count])


@pytest.mark.parametrize("gamma, clip", [(0.99, 10.0), (0.9, 0.5)])
def test_normalizer_matches_the_original_semantics(gamma, clip):
    """Five rollouts: the normalized rewards, the statistics and the running returns of the float64 reference."""
    rng = np.random.default_rng(0)
    normalizer = RolloutRewardNormalizer(3, gamma=gamma, clip_reward=clip)
    reference = OriginalRewards(3, gamma=gamma, clip=clip)
    for _ in range(5):
        rewards, starts = random_rollout(rng)
        np.testing.assert_allclose(normalizer.normalize(rewards, starts), reference(rewards, starts), rtol=1e-12, atol=0)
        np.testing.assert_allclose(normalizer_state(normalizer), reference.statistics, rtol=1e-12)
        np.testing.assert_allclose(normalizer.running_return, reference.running_return, rtol=1e-12)
    if clip < 1.0:  # the small clip bounds some rewards
        assert np.abs(normalizer.normalize(*random_rollout(rng))).max() == clip


def test_statistics_change_once_per_rollout():
    """Not per step (VecNormalize's rule): the first rollout's rewards are all scaled by the std after the whole rollout."""
    normalizer = RolloutRewardNormalizer(1, gamma=0.0)
    normalized = normalizer.normalize(np.array([[1.0], [3.0]]), np.zeros((2, 1)))
    std = normalizer.std
    assert std == pytest.approx(np.sqrt((1e-4 + 1.0 + 9.0) / (2 + 1e-4) - (4.0 / (2 + 1e-4)) ** 2 + 1e-8), rel=1e-12)
    np.testing.assert_allclose(normalized[:, 0], [1.0 / std, 3.0 / std], rtol=1e-15)


def test_wrong_shapes_and_settings():
    normalizer = RolloutRewardNormalizer(2)
    with pytest.raises(ValueError, match=r"shape \(n_steps, 2\)"):
        normalizer.normalize(np.zeros((4, 3)), np.zeros((4, 3)))
    with pytest.raises(ValueError, match=r"gamma'\] must be in \[0, 1\)"):
        RolloutRewardNormalizer(2, gamma=1.0)


class RolloutRecorder(BaseCallback):
    """The raw rewards of every step, and each rollout's episode starts and rewards as the buffer holds them at its end."""

    def __init__(self) -> None:
        super().__init__()
        self.raw: list[np.ndarray] = []
        self.rollouts: list[tuple[np.ndarray, np.ndarray]] = []

    def _on_step(self) -> bool:
        self.raw.append(np.array(self.locals["rewards"], dtype=np.float64))
        return True

    def _on_rollout_end(self) -> None:
        buffer = self.model.rollout_buffer
        self.rollouts.append((buffer.episode_starts.copy(), buffer.rewards.copy()))


def test_ppg_normalizes_each_finished_rollout(make_model):
    """PPG's rollouts hold the reference's normalized rewards (float32), with the running returns carried between them."""
    model = make_model(make_vec_env("CartPole-v1", n_envs=N_ENVS, seed=0), **RUN)
    recorder = RolloutRecorder()
    model.learn(4 * ITERATION, callback=recorder)
    reference = OriginalRewards(N_ENVS)
    assert len(recorder.rollouts) == 4
    for index, (starts, rewards) in enumerate(recorder.rollouts):
        raw = np.stack(recorder.raw[index * N_STEPS : (index + 1) * N_STEPS])
        np.testing.assert_allclose(rewards, reference(raw, starts), rtol=1e-6)
    # Episodes ended inside the rollouts: the running returns were cut there
    assert any(starts[1:].any() for starts, _ in recorder.rollouts)
    np.testing.assert_allclose(normalizer_state(model.reward_normalizer), reference.statistics, rtol=1e-12)
    assert model.reward_normalizer.count == pytest.approx(1e-4 + 4 * ITERATION)


def test_hyperparameters_are_checked(make_model):
    with pytest.raises(HyperparameterError) as error:
        make_model("CartPole-v1", normalize_reward="False", reward_normalizer_kwargs=dict(gama=0.9, clip_reward=-1))
    assert "normalize_reward must be a bool, got 'False'" in str(error.value)
    assert "unknown keys ['gama']" in str(error.value)
    assert "reward_normalizer_kwargs['clip_reward'] must be a number > 0, got -1" in str(error.value)
    model = make_model("CartPole-v1", normalize_reward=True, reward_normalizer_kwargs=dict(gamma=0.9, clip_reward=5))
    assert (model.reward_normalizer.gamma, model.reward_normalizer.clip_reward) == (0.9, 5.0)
    assert make_model("CartPole-v1").reward_normalizer is None  # off by default


def test_refuses_a_vec_normalize_that_normalizes_rewards(make_model):
    venv = make_vec_env("CartPole-v1", n_envs=N_ENVS, seed=0)
    with pytest.raises(ValueError, match=r"would be scaled twice.*VecNormalize\(norm_reward=False\)"):
        make_model(VecNormalize(venv), normalize_reward=True)
    model = make_model(VecNormalize(venv, norm_reward=False), normalize_reward=True)  # observations only: fine
    with pytest.raises(ValueError, match="would be scaled twice"):
        model.set_env(VecNormalize(make_vec_env("CartPole-v1", n_envs=N_ENVS, seed=1)))


def test_save_load_restores_the_statistics(make_model, tmp_path):
    model = make_model(make_vec_env("CartPole-v1", n_envs=N_ENVS, seed=0), **RUN)
    model.learn(2 * ITERATION)
    model.save(tmp_path / "model.zip")
    loaded = PPG.load(tmp_path / "model.zip", env=make_vec_env("CartPole-v1", n_envs=N_ENVS, seed=1))
    assert (normalizer_state(loaded.reward_normalizer) == normalizer_state(model.reward_normalizer)).all()
    assert (loaded.reward_normalizer.running_return == model.reward_normalizer.running_return).all()
    assert loaded.reward_normalizer.gamma == 0.99 and loaded.reward_normalizer.count > 2 * ITERATION
    # Loaded with another number of envs: the statistics stay, the running returns restart
    with pytest.warns(UserWarning, match="running returns of the reward normalizer are for 2 envs, this model has 3"):
        other = PPG.load(tmp_path / "model.zip", env=make_vec_env("CartPole-v1", n_envs=3, seed=1))
    assert (normalizer_state(other.reward_normalizer) == normalizer_state(model.reward_normalizer)).all()
    assert (other.reward_normalizer.running_return == 0).all() and other.reward_normalizer.running_return.shape == (3,)
    # load() can neither drop nor add the statistics
    with pytest.raises(HyperparameterError, match=r"normalize_reward=False .* drops reward_normalizer"):
        PPG.load(tmp_path / "model.zip", normalize_reward=False)
    make_model("CartPole-v1").save(tmp_path / "plain.zip")
    with pytest.raises(HyperparameterError, match=r"normalize_reward=True .* needs reward_normalizer"):
        PPG.load(tmp_path / "plain.zip", normalize_reward=True)


def test_set_env_with_other_envs_restarts_the_running_returns(make_model):
    model = make_model(make_vec_env("CartPole-v1", n_envs=N_ENVS, seed=0), **RUN)
    model.learn(ITERATION)
    statistics = normalizer_state(model.reward_normalizer)
    with pytest.warns(UserWarning, match="set_env\\(\\) changes the number of environments from 2 to 3"):
        model.set_env(make_vec_env("CartPole-v1", n_envs=3, seed=0))
    assert model.reward_normalizer.running_return.shape == (3,) and (model.reward_normalizer.running_return == 0).all()
    assert (normalizer_state(model.reward_normalizer) == statistics).all()
    model.learn(3 * N_STEPS)  # the rollouts of 3 envs normalize


@pytest.fixture(scope="module")
def checkpointed_run(tmp_path_factory, make_model):
    """The uninterrupted run with a checkpoint every iteration."""
    folder = tmp_path_factory.mktemp("checkpoints")
    model = make_model(make_vec_env("CartPole-v1", n_envs=N_ENVS, seed=0), **RUN)
    model.learn(TOTAL, callback=PPGCheckpointCallback(N_STEPS, str(folder), name_prefix="ppg"))
    return folder, model


@pytest.mark.parametrize("cut", [1, 3, 4])
def test_checkpoint_resume_is_exact(checkpointed_run, cut):
    """Resumed after 1, 3 (an auxiliary phase) or 4 rollouts: the run's statistics, running returns and parameters."""
    folder, model = checkpointed_run
    directory = folder / f"ppg_{cut * ITERATION}_steps"
    env = make_vec_env("CartPole-v1", n_envs=N_ENVS, seed=123)  # its envs' states come from the checkpoint
    resumed = PPG.load_checkpoint(directory, env=env)
    assert resumed.reward_normalizer.count == pytest.approx(1e-4 + cut * ITERATION)
    # The statistics are plain tensors in the zip (what allow_pickle=False loads: torch's weights-only unpickler)
    with zipfile.ZipFile(directory / "model.zip") as archive:
        state = th.load(io.BytesIO(archive.read("reward_normalizer.pth")), weights_only=True)
    assert float(state["count"]) == resumed.reward_normalizer.count
    assert (state["running_return"].numpy() == resumed.reward_normalizer.running_return).all()
    resumed.learn(TOTAL - resumed.num_timesteps, reset_num_timesteps=False)
    assert (normalizer_state(resumed.reward_normalizer) == normalizer_state(model.reward_normalizer)).all()
    assert (resumed.reward_normalizer.running_return == model.reward_normalizer.running_return).all()
    assert_identical(parameters(model), parameters(resumed))


def test_checkpoint_run_state_holds_the_running_returns(checkpointed_run):
    """The running returns are per env, hence per rank: each rank's run_state.npz holds its own."""
    folder, _ = checkpointed_run
    arrays = np.load(folder / f"ppg_{2 * ITERATION}_steps" / "run_state.npz")
    running_return = arrays["reward_running_return"]
    assert running_return.shape == (N_ENVS,) and running_return.dtype == np.float64 and (running_return > 0).all()


# ---------------------------------------------------------------------------------------------------------------------
# Under torchrun: two gloo processes (tests/distributed_worker.py, scenario "reward_normalization")
# ---------------------------------------------------------------------------------------------------------------------


def reduced_reference(world_size: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """
    The original code's all-reduce in float64: the ranks' rollout mean and variance averaged, their counts added, then
    the parallel-variance update; each rank's rewards divided by the same std.

    :return: each rank's normalized rewards per rollout, and the statistics after each rollout
    """
    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    from distributed_worker import REWARD_NORMALIZER_KWARGS, reward_rollout

    gamma, clip = REWARD_NORMALIZER_KWARGS["gamma"], REWARD_NORMALIZER_KWARGS["clip_reward"]
    running = [np.zeros(2) for _ in range(world_size)]
    mean, var, count = 0.0, 1.0, 1e-4
    normalized, statistics = [], []
    for iteration in range(3):
        rollouts, moments = [], []
        for rank in range(world_size):
            rewards, starts = reward_rollout(rank, iteration)
            returns = []
            for step in range(len(rewards)):
                running[rank] = rewards[step] + gamma * (1.0 - starts[step]) * running[rank]
                returns.append(running[rank])
            moments.append((np.mean(returns), np.var(returns), np.size(returns)))
            rollouts.append(rewards)
        batch_mean = np.mean([m[0] for m in moments])
        batch_var = np.mean([m[1] for m in moments])
        batch_count = float(sum(m[2] for m in moments))
        delta, total = batch_mean - mean, count + batch_count
        mean = mean + delta * batch_count / total
        var = (var * count + batch_var * batch_count + delta**2 * count * batch_count / total) / total
        count = total
        normalized.append(np.stack([np.clip(r / np.sqrt(var + 1e-8), -clip, clip) for r in rollouts]))
        statistics.append(np.array([mean, var, count]))
    return normalized, statistics


@pytest.mark.slow
def test_two_ranks_reduce_the_statistics(tmp_path):
    from test_distributed import results, start_ranks, wait_all

    wait_all(start_ranks("reward_normalization", tmp_path), tmp_path)
    ranks = results(tmp_path)
    normalized, statistics = reduced_reference(2)
    for iteration in range(3):
        for rank, result in enumerate(ranks):
            np.testing.assert_allclose(result["normalized"][iteration], normalized[iteration][rank], rtol=1e-12)
            np.testing.assert_allclose(result["statistics"][iteration], statistics[iteration], rtol=1e-12)
    # Rank 1 stopped mid-rollout: rank 0 got its raw rewards back and both kept the statistics of 3 rollouts
    assert (ranks[0]["stopped_rewards"] == ranks[0]["raw_stopped_rewards"]).all()
    for result in ranks:
        np.testing.assert_allclose(result["statistics_after_stop"], statistics[-1], rtol=1e-12)
    # PPG's rollouts: the same statistics on both ranks (rank 0's at the start, then 2 full rollouts of 2 ranks x 2 envs
    # x 8 steps), other running returns (other envs); rank 1's stop in the third rollout ended learn() on both, no hang
    first, second = (result["ppg_statistics"] for result in ranks)
    assert (first == second).all() and first[2] == pytest.approx(1e-4 + 2 * 2 * 2 * 8)
    assert not np.array_equal(ranks[0]["ppg_running_return"], ranks[1]["ppg_running_return"])
    assert ranks[0]["ppg_timesteps"] == ranks[1]["ppg_timesteps"]
