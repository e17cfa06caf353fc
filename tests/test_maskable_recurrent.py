"""MaskableRecurrentPPG: masks in the rollout, in both phases' sequence passes, in predict with states, save and load."""

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from helpers import assert_identical, parameters
from sb3_contrib.common.envs import InvalidActionEnvDiscrete, InvalidActionEnvMultiBinary, InvalidActionEnvMultiDiscrete
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.torch_layers import NatureCNN
from test_maskable import ToDictWrapper, is_valid

from sb3_ppg import MaskableRecurrentPPG, PPGCheckpointCallback, RecurrentPPG
from sb3_ppg.common.recurrent.buffers import sequence_minibatches
from sb3_ppg.common.torch_layers import ImpalaCNN
from sb3_ppg.ppg_mask import MaskablePPGPolicy, MaskedPlayer
from sb3_ppg.ppg_mask.buffers import MaskablePPGRolloutBuffer
from sb3_ppg.ppg_mask.distributions import masked_kl_divergence
from sb3_ppg.ppg_mask_recurrent.buffers import MaskableRecurrentRolloutBuffer
from sb3_ppg.ppg_recurrent import RecurrentPPGPolicy

# Some runs here stop before an auxiliary phase on purpose (predict, save and errors are what they check)
pytestmark = pytest.mark.filterwarnings(r"ignore:learn\(total_timesteps=.*this learn\(\) trains as plain PPO")

#: One auxiliary phase every 2 rollouts of 16 steps, minibatches of 2 env sequences, LSTMs of 8 units
SMALL = dict(n_steps=16, batch_size=32, n_policy_iters=2, n_aux_epochs=2, aux_batch_rollouts=2)
SMALL_POLICY = dict(lstm_hidden_size=8, net_arch=[8])

#: Envs with many invalid actions per state, episodes of 10 steps (several start inside each rollout)
ENVS = {
    "Discrete": lambda: InvalidActionEnvDiscrete(dim=10, ep_length=10, n_invalid_actions=7),
    "MultiDiscrete": lambda: InvalidActionEnvMultiDiscrete(dims=[2, 3], ep_length=10, n_invalid_actions=3),
    "MultiBinary": lambda: InvalidActionEnvMultiBinary(dims=3, ep_length=10, n_invalid_actions=2),
}


class AssertValidActions(gym.Wrapper):
    """Fails the step of an action that the env's current masks refuse."""

    def action_masks(self) -> list[bool]:
        return self.env.unwrapped.action_masks()  # type: ignore[attr-defined]

    def step(self, action: Any) -> Any:
        masks = np.asarray(self.action_masks())
        assert is_valid(action, masks, self.env), f"invalid action {action} for the masks {masks}"
        return self.env.step(action)


def asserting_vec_env(space: str, n_envs: int = 4, seed: int = 0):
    return make_vec_env(lambda: AssertValidActions(ENVS[space]()), n_envs=n_envs, seed=seed)


def small_model(env: Any, seed: int = 0, policy: str = "MlpLstmPolicy", **kwargs: Any) -> MaskableRecurrentPPG:
    policy_kwargs = {**SMALL_POLICY, **kwargs.pop("policy_kwargs", {})}
    return MaskableRecurrentPPG(policy, env, seed=seed, policy_kwargs=policy_kwargs, **{**SMALL, **kwargs})


@pytest.mark.parametrize("space", list(ENVS))
def test_no_invalid_action_in_learn_and_predict(space: str) -> None:
    """learn() (rollouts, both phases) and predict() with states and masks never take an invalid action."""
    model = small_model(asserting_vec_env(space))
    model.learn(256)
    assert model.n_aux_phases == 2
    assert isinstance(model.rollout_buffer, MaskableRecurrentRolloutBuffer)
    assert not model.rollout_buffer.action_masks.all()  # the rollout stored the masks
    env = asserting_vec_env(space, n_envs=2, seed=1)
    obs, state, episode_start = env.reset(), None, np.ones(2, dtype=bool)
    for _ in range(30):
        masks = np.stack(env.env_method("action_masks"))
        actions, state = model.predict(obs, state=state, episode_start=episode_start, action_masks=masks)
        obs, _, episode_start, _ = env.step(actions)
    # The env does refuse invalid actions: the same learn() without masks fails
    with pytest.raises(AssertionError, match="invalid action"):
        small_model(asserting_vec_env(space)).learn(128, use_masking=False)


def test_learns_the_invalid_action_identity_task() -> None:
    """
    The identity task with 7 of 10 actions invalid in each state (a random valid action earns about 33 of 100 per
    episode): 4,096 steps at docs/recurrent.md's example settings reach a deterministic evaluation of at least 90
    (100.0, 100.0 and 99.8 for seeds 0 to 2 when measured).
    """
    env = make_vec_env(lambda: InvalidActionEnvDiscrete(dim=10, n_invalid_actions=7), n_envs=8, seed=0)
    model = MaskableRecurrentPPG(
        "MlpLstmPolicy",
        env,
        n_steps=32,
        batch_size=256,
        n_epochs=10,
        gamma=0.4,
        learning_rate=1e-3,
        n_policy_iters=8,
        aux_batch_rollouts=8,
        policy_kwargs=dict(lstm_hidden_size=64),
        seed=0,
    )
    model.learn(4096)
    assert model.n_aux_phases == 2
    eval_env = make_vec_env(lambda: InvalidActionEnvDiscrete(dim=10, n_invalid_actions=7), n_envs=8, seed=100)
    mean_return, _ = evaluate_policy(MaskedPlayer(model, eval_env), eval_env, n_eval_episodes=16, deterministic=True)
    assert mean_return >= 90


def test_sequence_pass_reproduces_the_rollouts_masked_log_probs() -> None:
    """
    Before any update, the policy phase's masked pass over whole env sequences (from the stored start states, with
    the episode starts) gives the log-probabilities the rollout computed step by step; unmasked they would differ.
    """
    model = small_model(make_vec_env(ENVS["Discrete"], n_envs=4, seed=0), n_steps=32, batch_size=64)
    model.learn(256)  # trained: the start states are not zeros
    _, callback = model._setup_learn(128, reset_num_timesteps=False)
    assert model.collect_rollouts(model.env, callback, model.rollout_buffer, model.n_steps)
    buffer = model.rollout_buffer
    assert buffer.episode_starts[1:].any() and np.abs(buffer.lstm_start_states).max() > 0
    with th.no_grad():
        for batch in sequence_minibatches(buffer, model.batch_size, model.device):
            assert batch.action_masks.shape == (64, 10) and (batch.action_masks.sum(dim=1) == 3).all()
            values, log_prob, entropy = model._evaluate_actions(batch)
            th.testing.assert_close(log_prob, batch.old_log_prob, rtol=1e-5, atol=1e-5)
            th.testing.assert_close(values.flatten(), batch.old_values, rtol=1e-5, atol=1e-5)
            assert (entropy <= np.log(3) + 1e-5).all()  # the entropy over the 3 valid actions
            _, unmasked, _ = model.policy.evaluate_actions(
                batch.observations, model._actions(batch), batch.lstm_states, batch.episode_starts
            )
            assert (unmasked - log_prob).abs().min() > 1e-3


def test_aux_phase_masks_its_behaviour_cloning_kl() -> None:
    """The auxiliary buffer keeps the rollouts' masks with their start states; the aux loss's KL is the masked one."""
    model = small_model(make_vec_env(ENVS["Discrete"], n_envs=4, seed=0), n_aux_epochs=1)
    _, callback = model._setup_learn(1000, reset_num_timesteps=False)
    buffer = model.aux_buffer
    for _ in range(2):
        model.collect_rollouts(model.env, callback, model.rollout_buffer, model.n_steps)
        buffer.add(model.rollout_buffer)
    last_masks = model.rollout_buffer.action_masks.reshape(16, 4, 10).transpose(1, 0, 2)
    np.testing.assert_array_equal(buffer.action_masks[4:8].numpy(), last_masks)
    np.testing.assert_array_equal(buffer.lstm_start_states[4:8], model.rollout_buffer.lstm_start_states.transpose(2, 0, 1, 3))
    model._compute_old_distributions()
    batch = next(buffer.get(2))
    with th.no_grad():
        distribution, _, _ = model.policy.forward_aux(batch.observations, batch.lstm_states, batch.episode_starts)
        th.testing.assert_close(model._behaviour_cloning_kl(batch, distribution), th.zeros(32), atol=1e-5, rtol=0)
        model.policy.action_net.bias.add_(th.linspace(-1, 1, 10))  # another policy
        distribution, _, _ = model.policy.forward_aux(batch.observations, batch.lstm_states, batch.episode_starts)
        kl = model._behaviour_cloning_kl(batch, distribution)
    expected = masked_kl_divergence(batch.old_distribution_params, distribution, batch.action_masks)
    unmasked = masked_kl_divergence(batch.old_distribution_params, distribution, None)
    th.testing.assert_close(kl, expected)
    assert (kl - unmasked).abs().max() > 1e-3


def test_predict_states_and_masks_save_load_and_evaluate(tmp_path) -> None:
    """
    predict() carries the states and acts among the valid actions (stepping equals the masked pass over the whole
    sequence); a saved model predicts the same; SB3's evaluate_policy plays it with states and masks (MaskedPlayer).
    """
    model = small_model(make_vec_env(ENVS["Discrete"], n_envs=4, seed=0)).learn(64)
    env = asserting_vec_env("Discrete", n_envs=2, seed=3)
    obs, state, episode_start = env.reset(), None, np.ones(2, dtype=bool)
    observations, starts, all_masks, actions = [], [], [], []
    for _ in range(12):
        masks = np.stack(env.env_method("action_masks"))
        action, state = model.predict(obs, state=state, episode_start=episode_start, deterministic=True, action_masks=masks)
        assert state[0].shape == (1, 2, 8)
        observations.append(obs), starts.append(episode_start), all_masks.append(masks), actions.append(action)
        obs, _, episode_start, _ = env.step(action)
    policy = model.policy
    sequence_obs = th.as_tensor(np.stack(observations, axis=1).reshape(24, -1))
    sequence_starts = th.as_tensor(np.stack(starts, axis=1), dtype=th.float32)
    sequence_masks = np.stack(all_masks, axis=1).reshape(24, -1)
    with th.no_grad():
        start_states = policy.initial_states(2).pi
        distribution, states = policy.get_distribution(sequence_obs, start_states, sequence_starts, sequence_masks)
    np.testing.assert_array_equal(distribution.mode().numpy().reshape(2, 12), np.stack(actions, axis=1))
    np.testing.assert_allclose(states[0].numpy(), state[0], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="booleans per state"):
        model.predict(obs, state=state, action_masks=np.ones((2, 9), dtype=bool))

    model.save(tmp_path / "model.zip")
    loaded = MaskableRecurrentPPG.load(tmp_path / "model.zip")
    state = None
    for _ in range(5):
        masks = np.stack(env.env_method("action_masks"))
        action, new_state = model.predict(obs, state=state, deterministic=True, action_masks=masks)
        loaded_action, loaded_state = loaded.predict(obs, state=state, deterministic=True, action_masks=masks)
        np.testing.assert_array_equal(action, loaded_action)
        np.testing.assert_array_equal(new_state[0], loaded_state[0])
        state = new_state
        obs, *_ = env.step(action)
    with pytest.raises(ValueError, match=r"holds a MaskableRecurrentPPG model .* sb3_ppg.MaskableRecurrentPPG.load"):
        RecurrentPPG.load(tmp_path / "model.zip")

    seen_states = []
    mean, _ = evaluate_policy(
        MaskedPlayer(loaded, env),
        env,
        n_eval_episodes=2,
        callback=lambda local_vars, _: seen_states.append(local_vars["states"]),
    )
    assert mean > 0
    assert all(states is not None and np.abs(states[0]).max() > 0 for states in seen_states)


def test_checkpoint_resume_bit_identical(tmp_path) -> None:
    """A run resumed from a PPGCheckpointCallback checkpoint (aux buffer with masks and start states, live LSTM states)
    ends with the uninterrupted run's weights."""

    def make_env():
        return make_vec_env(ENVS["Discrete"], n_envs=2, seed=0)

    def make_model():
        return small_model(make_env(), batch_size=16, n_policy_iters=3, aux_batch_rollouts=1)

    model = make_model()
    model.learn(7 * 32, callback=PPGCheckpointCallback(16, str(tmp_path), name_prefix="mrppg"))
    assert model.n_aux_phases == 2
    resumed = MaskableRecurrentPPG.load_checkpoint(tmp_path / "mrppg_64_steps", env=make_env())
    assert resumed.aux_buffer.n_iterations == 2 and not resumed.aux_buffer.action_masks[:4].all()
    assert np.abs(resumed.get_run_state().last_lstm_states).max() > 0
    resumed.learn(7 * 32 - resumed.num_timesteps, reset_num_timesteps=False)
    assert resumed.n_aux_phases == 2
    assert_identical(parameters(model), parameters(resumed))


def test_dict_observations() -> None:
    env = make_vec_env(lambda: ToDictWrapper(ENVS["Discrete"]()), n_envs=4, seed=0)
    model = small_model(env, policy="MultiInputLstmPolicy")
    model.learn(128)
    assert model.n_aux_phases == 1 and model.policy.arch == "dual"


def test_errors_name_the_fix() -> None:
    """An env without action_masks(), a policy or buffer without masks or states, a Box action space."""
    model = small_model(make_vec_env("CartPole-v1", n_envs=4, seed=0))
    with pytest.raises(ValueError, match=r"MaskableRecurrentPPG.learn\(use_masking=True\) needs an env with an action_masks"):
        model.learn(64)
    model.learn(64, use_masking=False)  # without masks: RecurrentPPG
    env = make_vec_env(ENVS["Discrete"], n_envs=4)
    with pytest.raises(ValueError, match="needs a maskable recurrent policy: MaskablePPGPolicy"):
        small_model(env, policy=MaskablePPGPolicy)
    with pytest.raises(ValueError, match="needs a maskable recurrent policy: RecurrentPPGPolicy"):
        small_model(env, policy=RecurrentPPGPolicy)
    with pytest.raises(ValueError, match="rollout_buffer_class=MaskablePPGRolloutBuffer does not"):
        small_model(env, rollout_buffer_class=MaskablePPGRolloutBuffer)
    with pytest.raises(ValueError, match="does not support the action space"):
        small_model(make_vec_env("Pendulum-v1", n_envs=4))


@pytest.mark.parametrize("policy", ["CnnLstmPolicy", "ProcgenCnnLstm"])
@pytest.mark.parametrize("lstm_kwargs", [dict(), dict(shared_lstm=True)])
def test_cnn_lstm_policies_act_among_the_valid_actions(policy: str, lstm_kwargs: dict) -> None:
    """The CNN policies are maskable recurrent ones of their networks: their only valid action is the one chosen."""
    policy_class = MaskableRecurrentPPG.policy_aliases[policy]
    image_space = gym.spaces.Box(0, 255, (3, 64, 64), np.uint8)
    net = policy_class(image_space, gym.spaces.Discrete(4), lambda _: 1e-3, lstm_hidden_size=8, **lstm_kwargs)
    assert net.arch == ("detach" if lstm_kwargs else "dual")
    assert net.features_extractor_class is {"CnnLstmPolicy": NatureCNN, "ProcgenCnnLstm": ImpalaCNN}[policy]
    masks = np.array([[False, True, False, False], [False, False, False, True]] * 2)
    state = None
    for _ in range(2):
        actions, state = net.predict(np.zeros((4, 3, 64, 64), np.uint8), state=state, action_masks=masks)
        np.testing.assert_array_equal(actions, [1, 3, 1, 3])
    assert state[0].shape == (1, 4, 8)
