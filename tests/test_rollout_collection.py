"""
PPG's rollout collection (``PPG._collect_rollout``, ``MaskablePPG``'s): SB3's (sb3-contrib's) rollouts, with PPG's
rollout buffers written while the envs step (``add_before_step()`` between the env's ``step_async()`` and
``step_wait()``, ``add_after_step()`` with the reward).
"""

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from helpers import small_ppg
from sb3_contrib.common.envs import InvalidActionEnvMultiDiscrete
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from stable_baselines3.common.vec_env import DummyVecEnv, VecEnv, VecEnvWrapper, VecNormalize

from sb3_ppg import PPG, MaskablePPG, make_procgen_env
from sb3_ppg.common import rollout as rollout_module
from sb3_ppg.common.envs import make_dict_cartpole
from sb3_ppg.common.rollout import writes_while_envs_step
from sb3_ppg.common.rollout_buffers import UnflattenedRolloutBuffer
from sb3_ppg.ppg_mask.buffers import MaskablePPGRolloutBuffer

ROLLOUT_ARRAYS = ("actions", "rewards", "episode_starts", "values", "log_probs", "returns", "advantages")


def procgen_model() -> PPG:
    """Procgen's envs step in C++ threads between step_async() and step_wait()."""
    env = make_procgen_env("starpilot", n_envs=2, seed=3, num_threads=1)
    return small_ppg(
        env, policy="CnnPolicy", policy_kwargs=dict(net_arch=[16], features_extractor_kwargs=dict(features_dim=16)), n_steps=8
    )


def box_model() -> PPG:
    """Box actions (clipped), gSDE with new noise every 3 steps, episodes truncated every 5 steps (bootstrapped)."""
    env = make_vec_env(
        "Pendulum-v1", n_envs=2, seed=1, wrapper_class=gym.wrappers.TimeLimit, wrapper_kwargs=dict(max_episode_steps=5)
    )
    return small_ppg(env, use_sde=True, sde_sample_freq=3, n_steps=8)


def dict_model() -> PPG:
    """Dict observations, normalized by VecNormalize (its statistics move during the rollout)."""
    env = VecNormalize(make_vec_env(make_dict_cartpole, n_envs=3, seed=2))
    return small_ppg(env, policy="MultiInputPolicy", n_steps=8, batch_size=12)


MODELS = {"procgen": procgen_model, "box, gSDE, timeouts": box_model, "dict, VecNormalize": dict_model}


class StopAt(BaseCallback):
    """Records the names of the rollout's local variables at every step; stops the rollout at step ``stop_at``."""

    def __init__(self, stop_at: int | None = None) -> None:
        super().__init__()
        self.stop_at = stop_at
        self.local_names: list[set[str]] = []

    def _on_step(self) -> bool:
        self.local_names.append(set(self.locals))
        return self.stop_at is None or len(self.local_names) < self.stop_at


def collect(model: PPG, collect_rollouts, n_rollouts: int = 2, stop_at: int | None = None):
    """
    The rollouts that ``collect_rollouts`` collects, after the model's ``_setup_learn``: the buffer's arrays after each,
    whether each was complete, and where the model stands after them.
    """
    _, callback = model._setup_learn(10**6, callback=StopAt(stop_at))
    rollouts = []
    for _ in range(n_rollouts):
        complete = collect_rollouts(model, model.env, callback, model.rollout_buffer, model.n_steps)
        buffer = model.rollout_buffer
        observations = buffer.observations
        arrays = {name: getattr(buffer, name).copy() for name in ROLLOUT_ARRAYS}
        if isinstance(observations, dict):
            arrays.update({f"observations/{key}": array.copy() for key, array in observations.items()})
        else:
            arrays["observations"] = observations.copy()
        if hasattr(buffer, "action_masks"):
            arrays["action_masks"] = buffer.action_masks.copy()
        rollouts.append((complete, buffer.pos, buffer.full, arrays))
    last_obs = model._last_obs
    state = dict(
        num_timesteps=model.num_timesteps,
        last_obs=dict(last_obs) if isinstance(last_obs, dict) else last_obs,
        last_episode_starts=model._last_episode_starts,
        episodes=[{key: value for key, value in info.items() if key != "t"} for info in model.ep_info_buffer],  # not the time
        torch_rng=th.get_rng_state(),
    )
    return rollouts, state, callback


def assert_same(run, expected) -> None:
    """The same rollouts (arrays bit for bit) and the same state after them."""
    (rollouts, state, _), (expected_rollouts, expected_state, _) = run, expected
    assert len(rollouts) == len(expected_rollouts)
    for (complete, pos, full, arrays), (expected_complete, expected_pos, expected_full, expected_arrays) in zip(
        rollouts, expected_rollouts, strict=True
    ):
        assert (complete, pos, full) == (expected_complete, expected_pos, expected_full)
        assert arrays.keys() == expected_arrays.keys()
        for name, array in arrays.items():
            assert array.dtype == expected_arrays[name].dtype, name
            np.testing.assert_array_equal(array, expected_arrays[name], err_msg=name)
    assert state.keys() == expected_state.keys()
    for name, value in state.items():
        if isinstance(value, dict):
            for key in value:
                np.testing.assert_array_equal(value[key], expected_state[name][key], err_msg=f"{name}/{key}")
        elif isinstance(value, th.Tensor):
            assert th.equal(value, expected_state[name]), name
        else:
            np.testing.assert_array_equal(value, expected_state[name], err_msg=name)


def sb3_collect_rollouts(model, env, callback, rollout_buffer, n_rollout_steps):
    """SB3's own ``OnPolicyAlgorithm.collect_rollouts``, which writes the buffer after the envs step."""
    return OnPolicyAlgorithm.collect_rollouts(model, env, callback, rollout_buffer, n_rollout_steps)


def count_calls(monkeypatch, owner: type, name: str) -> list[int]:
    """Count the calls of ``owner.name`` (the list's one item)."""
    calls = [0]
    method = getattr(owner, name)

    def counted(*args, **kwargs):
        calls[0] += 1
        return method(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls


@pytest.mark.parametrize("make_model", MODELS.values(), ids=MODELS.keys())
def test_rollouts_are_sb3s(make_model, monkeypatch):
    """
    PPG's rollouts, written into its buffer while the envs step, are those of SB3's collect_rollouts: every array of
    the buffer, the last observations and episode starts, the timesteps, the episodes and torch's generator, bit for bit;
    the callbacks see SB3's local variables (and more).
    """
    expected = collect(make_model(), sb3_collect_rollouts)
    written_early = count_calls(monkeypatch, UnflattenedRolloutBuffer, "add_before_step")
    model = make_model()
    assert writes_while_envs_step(model.env, model.rollout_buffer)
    run = collect(model, PPG.collect_rollouts)
    assert written_early[0] == 2 * model.n_steps  # every step written while the envs stepped
    assert_same(run, expected)
    assert all(mine >= sb3s for mine, sb3s in zip(run[2].local_names, expected[2].local_names, strict=True))
    assert {"new_obs", "rewards", "dones", "infos", "actions", "values", "log_probs", "clipped_actions"} <= run[2].local_names[
        0
    ]


@pytest.mark.parametrize("make_model", [procgen_model, dict_model], ids=["procgen", "dict"])
def test_a_rollout_stopped_by_a_callback_leaves_sb3s_buffer(make_model):
    """A callback that stops the rollout after a step leaves the buffer as SB3's: that step's row as reset() left it."""
    stop_at = 8 + 3  # the 3rd step of the 2nd rollout
    expected = collect(make_model(), sb3_collect_rollouts, stop_at=stop_at)
    run = collect(make_model(), PPG.collect_rollouts, stop_at=stop_at)
    assert [rollout[:3] for rollout in run[0]] == [(True, 8, True), (False, 2, False)]
    assert_same(run, expected)
    assert not run[0][1][3]["values"][2:].any() and not run[0][1][3]["actions"][2:].any()


def test_maskable_rollouts_are_the_same_written_early():
    """MaskablePPG's rollouts, written while the envs step (masks included), are those written after them."""
    runs = []
    for early in (True, False):
        env = make_vec_env(lambda: InvalidActionEnvMultiDiscrete(dims=[2, 3], n_invalid_actions=1), n_envs=3, seed=0)
        model = MaskablePPG("MlpPolicy", env, policy_kwargs=dict(net_arch=[16]), seed=0, n_steps=8, batch_size=12)
        with pytest.MonkeyPatch.context() as patch:
            if not early:
                patch.setattr(rollout_module, "writes_while_envs_step", lambda env, rollout_buffer: False)
            written_early = count_calls(patch, MaskablePPGRolloutBuffer, "add_before_step")
            added = count_calls(patch, MaskablePPGRolloutBuffer, "add")
            runs.append(collect(model, MaskablePPG.collect_rollouts, stop_at=8 + 5))
        # Written early: every step, the stopped one too (then discarded); else add() of the complete steps, its two parts
        assert (written_early[0], added[0]) == ((8 + 5, 0) if early else (8 + 4, 8 + 4))
        assert runs[-1][0][1][3]["action_masks"][4:].all()  # the stopped step's masks as reset() left them
        assert not runs[-1][0][1][3]["action_masks"][:4].all()
    assert_same(*runs)


class StepOverridden(VecEnvWrapper):
    """A VecEnv whose step() is its own, not step_async() then step_wait()."""

    def step(self, actions):
        return self.venv.step(actions)

    def reset(self):
        return self.venv.reset()

    def step_wait(self):
        return self.venv.step_wait()


def test_which_rollouts_write_while_the_envs_step():
    """PPG's buffers with an env that steps as step_async() then step_wait(); else the buffer is written after."""
    model = small_ppg(n_envs=2)
    assert writes_while_envs_step(model.env, model.rollout_buffer)
    assert writes_while_envs_step(VecNormalize(model.env), model.rollout_buffer)
    assert not writes_while_envs_step(StepOverridden(model.env), model.rollout_buffer)
    sb3_buffer = RolloutBuffer(16, model.observation_space, model.action_space, n_envs=2)
    assert not writes_while_envs_step(model.env, sb3_buffer)
    patched = DummyVecEnv([lambda: gym.make("CartPole-v1")])
    patched.step = lambda actions: VecEnv.step(patched, actions)  # patched on the instance
    assert not writes_while_envs_step(patched, model.rollout_buffer)


def test_rollout_with_an_env_of_its_own_step_is_sb3s(monkeypatch):
    """An env whose step() is its own is stepped by it, the buffer written after: SB3's rollouts still."""
    expected = collect(small_ppg(n_envs=2), sb3_collect_rollouts)
    model = small_ppg(n_envs=2)
    model.env = StepOverridden(model.env)
    own_steps = count_calls(monkeypatch, StepOverridden, "step")
    written_early = count_calls(monkeypatch, UnflattenedRolloutBuffer, "add_before_step")
    added = count_calls(monkeypatch, UnflattenedRolloutBuffer, "add")
    assert_same(collect(model, PPG.collect_rollouts), expected)
    assert own_steps[0] == added[0] == written_early[0] == 2 * 16


def test_add_in_two_parts_refuses_misuse_and_discards():
    """add_after_step() needs add_before_step() for the row, once; discard_before_step() leaves the row as reset()."""
    model = small_ppg(n_envs=2)
    buffer = model.rollout_buffer
    buffer.reset()
    with pytest.raises(RuntimeError, match=r"add_after_step\(\) for row 0 .* without add_before_step\(\)"):
        buffer.add_after_step(np.zeros(2))
    step = (np.ones((2, 4)), np.ones(2), np.ones(2, bool), th.ones(2), th.ones(2))
    buffer.add_before_step(*step)
    with pytest.raises(RuntimeError, match=r"add_before_step\(\) twice for row 0"):
        buffer.add_before_step(*step)
    buffer.discard_before_step()
    for name in ("observations", "actions", "episode_starts", "values", "log_probs", "rewards"):
        assert not getattr(buffer, name).any(), name
    assert buffer.pos == 0
    buffer.add_before_step(*step)
    buffer.add_after_step(np.ones(2))
    assert buffer.pos == 1 and buffer.rewards[0].all()
    buffer.add_before_step(*step)
    buffer.reset()  # a new rollout: nothing started
    buffer.add_before_step(*step)


class HookedPPG(PPG):
    """A subclass that changes the rollout through RolloutAlgorithm's hooks only (as a recurrent PPG does)."""

    def _on_rollout_start(self, env, rollout_buffer):
        self.rollout_starts.append((rollout_buffer.pos, self._last_episode_starts.copy()))

    def _policy_step(self, obs_tensor, env):
        self.n_policy_steps += 1
        return super()._policy_step(obs_tensor, env)

    def _last_values(self, new_obs, dones):
        return th.full((len(dones),), 100.0)


def test_a_subclass_changes_the_rollout_through_its_hooks():
    env = make_vec_env("CartPole-v1", n_envs=2, seed=0)
    model = HookedPPG("MlpPolicy", env, n_steps=8, n_aux_epochs=0, policy_kwargs=dict(net_arch=[8]), seed=0)
    model.rollout_starts, model.n_policy_steps = [], 0
    _, callback = model._setup_learn(32, callback=None)
    for _ in range(2):
        assert model.collect_rollouts(model.env, callback, model.rollout_buffer, model.n_steps)
    # Once per rollout, on the emptied buffer, with the episode starts the rollout begins from; once per step
    assert [pos for pos, _ in model.rollout_starts] == [0, 0] and model.n_policy_steps == 16
    np.testing.assert_array_equal(model.rollout_starts[0][1], np.ones(2))
    # The returns of the last step bootstrap from _last_values where the episode goes on (CartPole's reward: 1)
    ongoing = ~model._last_episode_starts.astype(bool)
    assert ongoing.any()
    np.testing.assert_allclose(model.rollout_buffer.returns[-1][ongoing], 1 + model.gamma * 100.0, rtol=1e-6)
