"""
Overlapped rollouts (``overlap_rollouts=True``) over envs made of groups (``GroupedVecEnv``): the rollouts are those of
a sequential collection that samples group by group, on DummyVecEnvs and on Procgen (whose C++ threads step one group
while the network acts on the next); with VecNormalize and VecMonitor, MaskablePPG's masks, checkpoints; what is not
supported is refused clearly.
"""

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from sb3_contrib.common.envs import InvalidActionEnvDiscrete
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.utils import obs_as_tensor
from stable_baselines3.common.vec_env import DummyVecEnv, VecEnvWrapper, VecNormalize

from sb3_ppg import PPG, MaskablePPG, PPGCheckpointCallback, make_procgen_env
from sb3_ppg.common.rollout_groups import GroupedVecEnv, env_actions

N_STEPS = 8
# The tiny budgets end before the first auxiliary phase on purpose in some tests
pytestmark = pytest.mark.filterwarnings("ignore:learn.total_timesteps")
TINY_CNN = dict(arch="detach", features_extractor_kwargs=dict(channels=(4, 4, 4), features_dim=16))


def grouped_cartpole(sizes=(2, 1), seed: int = 0) -> GroupedVecEnv:
    return GroupedVecEnv([make_vec_env("CartPole-v1", n_envs=size, seed=seed) for size in sizes])


def procgen(seed: int = 5, n_envs: int = 3) -> VecNormalize:
    return make_procgen_env("starpilot", n_envs=n_envs, seed=seed, num_threads=2, n_groups=2)


def test_grouped_env_steps_as_one_env_of_the_same_envs():
    envs = [lambda: gym.make("CartPole-v1") for _ in range(3)]
    whole = DummyVecEnv(envs)
    grouped = GroupedVecEnv([DummyVecEnv(envs[:1]), DummyVecEnv(envs[1:])])
    assert grouped.groups == [(0, 1), (1, 3)] and grouped.num_envs == 3
    whole.seed(4)
    grouped.seed(4)
    np.testing.assert_array_equal(grouped.reset(), whole.reset())
    actions = np.random.default_rng(0).integers(0, 2, size=(40, 3))
    for step_actions in actions:
        # Group 1 starts its step first: the results are those of stepping all envs at once
        grouped.step_group_async(1, step_actions[1:])
        expected = whole.step(step_actions)
        result = grouped.step(step_actions)
        for got, want in zip(result[:3], expected[:3], strict=True):
            np.testing.assert_array_equal(got, want)
        assert [info.keys() for info in result[3]] == [info.keys() for info in expected[3]]
    assert grouped.get_attr("spec", [2, 0]) == whole.get_attr("spec", [2, 0])
    assert grouped.env_method("get_wrapper_attr", "np_random", indices=[1])[0].bit_generator.state == (
        whole.env_method("get_wrapper_attr", "np_random", indices=[1])[0].bit_generator.state
    )


def sequential_rollout(model, n_steps: int) -> dict[str, np.ndarray]:
    """A reference collection: at each step the policy samples group by group, then the whole env steps."""
    env, grouped = model.env, model.env
    while isinstance(grouped, VecEnvWrapper):
        grouped = grouped.venv
    obs, starts = model._last_obs, model._last_episode_starts
    records = {name: [] for name in ("observations", "actions", "values", "log_probs", "rewards", "episode_starts")}
    for _ in range(n_steps):
        parts = []
        with th.no_grad():
            for start, stop in grouped.groups:
                parts.append(model.policy(obs_as_tensor(obs[start:stop], model.device)))
        actions, values, log_probs = (th.cat(part) for part in zip(*parts, strict=True))
        actions = actions.numpy()
        new_obs, rewards, dones, _ = env.step(env_actions(actions, model.policy, model.action_space))
        for name, value in (("observations", obs), ("actions", actions), ("values", values.flatten().numpy())):
            records[name].append(value)
        records["log_probs"].append(log_probs.numpy())
        records["rewards"].append(rewards)
        records["episode_starts"].append(starts)
        obs, starts = new_obs, dones
    return {name: np.stack(values) for name, values in records.items()}


def collected_rollout(model, n_steps: int) -> dict[str, np.ndarray]:
    buffer = model.rollout_buffer
    _, callback = model._setup_learn(n_steps * model.n_envs)
    assert model.collect_rollouts(model.env, callback, buffer, n_steps)
    return {
        "observations": buffer.observations,
        "actions": buffer.actions.reshape(n_steps, model.n_envs, *buffer.actions.shape[2:]).squeeze(-1),
        "values": buffer.values,
        "log_probs": buffer.log_probs,
        "rewards": buffer.rewards,
        "episode_starts": buffer.episode_starts,
    }


@pytest.mark.parametrize("env_name", ["dummy", "procgen"])
def test_overlapped_rollout_equals_a_sequential_one_that_samples_group_by_group(env_name):
    def make(overlap):
        if env_name == "dummy":
            return PPG("MlpPolicy", grouped_cartpole(), n_steps=N_STEPS, seed=1, overlap_rollouts=overlap)
        return PPG("ProcgenCnn", procgen(), n_steps=N_STEPS, seed=1, policy_kwargs=TINY_CNN, overlap_rollouts=overlap)

    overlapped = collected_rollout(make(True), N_STEPS)
    reference_model = make(False)
    reference_model._setup_learn(N_STEPS * reference_model.n_envs)
    reference = sequential_rollout(reference_model, N_STEPS)
    for name, expected in reference.items():
        got = overlapped[name]
        np.testing.assert_array_equal(got.reshape(expected.shape), expected, err_msg=name)
    # The rollout differs from one forward pass over all envs only in how actions are sampled
    assert reference["episode_starts"][0].all()


def no_early_start(monkeypatch):
    """Make overlap_rollouts sequential: the groups' steps start only when the whole env steps."""
    monkeypatch.setattr(GroupedVecEnv, "step_group_async", lambda self, group, actions: None)


def parameters(model) -> dict[str, th.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in model.policy.state_dict().items()}


def test_procgen_training_with_overlap_equals_sequential(monkeypatch):
    """make_procgen_env's chain (VecNormalize, VecMonitor) over 2 groups of procgen's threaded C++ envs."""

    def train():
        model = PPG(
            "ProcgenCnn", procgen(), n_steps=N_STEPS, batch_size=12, n_policy_iters=2, n_aux_epochs=1,
            aux_batch_rollouts=1, policy_kwargs=TINY_CNN, overlap_rollouts=True, seed=2,
        )  # fmt: skip
        model.learn(4 * N_STEPS * 3)
        return model

    overlapped = train()
    with monkeypatch.context() as patch:
        no_early_start(patch)
        sequential = train()
    assert overlapped._n_aux_phases == 2
    for name, tensor in parameters(sequential).items():
        assert th.equal(parameters(overlapped)[name], tensor), name
    assert np.array_equal(overlapped.get_env().ret_rms.var, sequential.get_env().ret_rms.var)
    assert overlapped.ep_info_buffer == sequential.ep_info_buffer


def test_maskable_overlap_keeps_the_masks(monkeypatch):
    def train():
        env = GroupedVecEnv(
            # Seeded: make_vec_env seeds the action spaces, from which these envs draw their states
            [make_vec_env(lambda: InvalidActionEnvDiscrete(dim=20, n_invalid_actions=10), n_envs=n, seed=n) for n in (1, 2)]
        )
        model = MaskablePPG(
            "MlpPolicy", env, n_steps=N_STEPS, batch_size=8, n_policy_iters=2, n_aux_epochs=1,
            aux_batch_rollouts=1, policy_kwargs=dict(net_arch=[16]), overlap_rollouts=True, seed=0,
        )  # fmt: skip
        model.learn(4 * N_STEPS * 3)
        return model

    overlapped = train()
    with monkeypatch.context() as patch:
        no_early_start(patch)
        sequential = train()
    for name, tensor in parameters(sequential).items():
        assert th.equal(parameters(overlapped)[name], tensor), name
    # Every stored action was valid under its stored mask (the masks reached each group's forward pass)
    buffer = overlapped.rollout_buffer
    actions = buffer.actions.reshape(-1).astype(int)
    assert buffer.action_masks.reshape(len(actions), -1)[np.arange(len(actions)), actions].all()


def test_procgen_overlap_resumes_exactly_from_a_checkpoint(tmp_path):
    def make_model(env):
        return PPG(
            "ProcgenCnn", env, n_steps=N_STEPS, batch_size=12, n_policy_iters=3, n_aux_epochs=1,
            aux_batch_rollouts=1, policy_kwargs=TINY_CNN, overlap_rollouts=True, seed=3,
        )  # fmt: skip

    total = 5 * N_STEPS * 3
    model = make_model(procgen())
    model.learn(total, callback=PPGCheckpointCallback(N_STEPS, str(tmp_path / "run"), name_prefix="ppg"))
    resumed = PPG.load_checkpoint(tmp_path / "run" / f"ppg_{3 * N_STEPS * 3}_steps", env=procgen(seed=999))
    assert resumed.overlap_rollouts
    resumed.learn(total - resumed.num_timesteps, reset_num_timesteps=False)
    assert resumed._n_aux_phases == model._n_aux_phases == 1
    for name, tensor in parameters(model).items():
        assert th.equal(parameters(resumed)[name], tensor), name


class DoubleActions(VecEnvWrapper):
    """A wrapper that changes the actions on their way to the env."""

    def step_async(self, actions):
        self.venv.step_async(1 - actions)

    def step_wait(self):
        return self.venv.step_wait()

    def reset(self):
        return self.venv.reset()


def test_what_overlap_does_not_support_is_refused():
    with pytest.raises(ValueError, match=r"overlap_rollouts=True needs an env made of groups .*n_groups=2"):
        PPG("MlpPolicy", make_vec_env("CartPole-v1", n_envs=2), n_steps=N_STEPS, overlap_rollouts=True).learn(16)
    model = PPG("MlpPolicy", DoubleActions(grouped_cartpole()), n_steps=N_STEPS, overlap_rollouts=True)
    with pytest.raises(ValueError, match="a VecEnv wrapper above the GroupedVecEnv changes the actions"):
        model.learn(N_STEPS * 3)
    sde = PPG("MlpPolicy", make_vec_env("Pendulum-v1", n_envs=1), use_sde=True, overlap_rollouts=True, n_steps=N_STEPS)
    with pytest.raises(ValueError, match="needs an env made of groups"):
        sde.learn(8)
    grouped_sde = GroupedVecEnv([make_vec_env("Pendulum-v1", n_envs=1) for _ in range(2)])
    with pytest.raises(ValueError, match="does not support gSDE"):
        PPG("MlpPolicy", grouped_sde, use_sde=True, overlap_rollouts=True, n_steps=N_STEPS).learn(16)
    with pytest.raises(ValueError, match="overlap_rollouts must be a bool"):
        PPG("MlpPolicy", "CartPole-v1", overlap_rollouts=2)
    with pytest.raises(ValueError, match="n_groups must be an integer from 1 to n_envs=2"):
        make_procgen_env("starpilot", n_envs=2, n_groups=3)
    with pytest.raises(ValueError, match="at least 2 groups"):
        GroupedVecEnv([make_vec_env("CartPole-v1")])
