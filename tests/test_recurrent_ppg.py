"""RecurrentPPG: its policies' architectures, its rollout's states, both phases on sequences, predict, save and load."""

import io
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.vec_env import DummyVecEnv

from sb3_ppg import RecurrentPPG
from sb3_ppg.common.aux_buffer import AuxiliaryBuffer
from sb3_ppg.common.recurrent.buffers import RecurrentAuxiliaryBuffer, sequence_minibatches, stack_states
from sb3_ppg.ppg_recurrent.policies import resolve_lstm_arch

# Some runs here stop before an auxiliary phase on purpose (the buffer's state is what they check)
pytestmark = pytest.mark.filterwarnings(r"ignore:learn\(total_timesteps=.*this learn\(\) trains as plain PPO")

#: One auxiliary phase every 2 rollouts of 16 steps, minibatches of 2 env sequences, LSTMs of 8 units
SMALL = dict(n_steps=16, batch_size=32, n_policy_iters=2, n_aux_epochs=2, aux_batch_rollouts=2)
SMALL_POLICY = dict(lstm_hidden_size=8, net_arch=[8])

#: PPG's architectures in sb3-contrib's keyword arguments
ARCH_KWARGS = {
    "dual": dict(),
    "dual, feed-forward value network": dict(enable_critic_lstm=False),
    "detach (shared_lstm)": dict(shared_lstm=True),
    "shared": dict(arch="shared"),
}


def small_model(env: Any = None, seed: int = 0, policy: str = "MlpLstmPolicy", **kwargs: Any) -> RecurrentPPG:
    policy_kwargs = {**SMALL_POLICY, **kwargs.pop("policy_kwargs", {})}
    env = env if env is not None else make_vec_env("CartPole-v1", n_envs=4, seed=seed)
    return RecurrentPPG(policy, env, seed=seed, policy_kwargs=policy_kwargs, **{**SMALL, **kwargs})


def test_arch_mapping() -> None:
    """sb3-contrib's keyword arguments map onto PPG's arch; combinations without a PPG meaning are errors."""
    assert resolve_lstm_arch(None, None, False, None) == ("dual", True)
    assert resolve_lstm_arch(None, None, False, False) == ("dual", False)
    assert resolve_lstm_arch(None, None, True, False) == ("detach", False)
    assert resolve_lstm_arch("shared", None, True, None) == ("shared", False)
    assert resolve_lstm_arch("detach", None, False, None) == ("detach", False)
    with pytest.raises(ValueError, match="shared_lstm=True and enable_critic_lstm=True"):
        resolve_lstm_arch(None, None, True, True)
    with pytest.raises(ValueError, match="shared_lstm=True contradicts arch='dual'"):
        resolve_lstm_arch("dual", None, True, None)
    with pytest.raises(ValueError, match="enable_critic_lstm=True contradicts arch='detach'"):
        resolve_lstm_arch("detach", None, False, True)
    with pytest.raises(ValueError, match="share_features_extractor=True without shared_lstm"):
        resolve_lstm_arch(None, True, False, None)
    with pytest.raises(ValueError, match="Unknown PPG arch"):
        resolve_lstm_arch("single", None, False, None)


@pytest.mark.parametrize("name", list(ARCH_KWARGS))
def test_each_arch_learns_with_aux_phase(name: str) -> None:
    """Each architecture with an LSTM trains through both phases; its LSTMs are those the architecture has."""
    model = small_model(policy_kwargs=ARCH_KWARGS[name])
    before = {key: value.clone() for key, value in model.policy.state_dict().items()}
    model.learn(128)
    assert model.n_aux_phases == 1
    policy = model.policy
    assert (policy.lstm_critic is not None) == (name == "dual")
    assert (policy.critic is not None) == (name == "dual, feed-forward value network")
    changed = [key for key, value in policy.state_dict().items() if not th.equal(value, before[key])]
    assert any(key.startswith("lstm_actor.") for key in changed)
    assert any(key.startswith("aux_value_net.") for key in changed)
    if name == "dual":
        assert any(key.startswith("lstm_critic.") for key in changed)


def test_separate_value_epochs_train_the_value_lstm() -> None:
    """n_value_epochs != n_epochs: the value epochs run over the sequences and train the value network's LSTM only."""
    model = small_model(n_value_epochs=2, n_aux_epochs=0)
    before = {key: value.clone() for key, value in model.policy.state_dict().items()}
    _, callback = model._setup_learn(1000)
    model.collect_rollouts(model.env, callback, model.rollout_buffer, model.n_steps)
    model.policy.set_training_mode(True)
    model.n_epochs = 0  # the value epochs alone
    model._policy_phase()
    changed = {key for key, value in model.policy.state_dict().items() if not th.equal(value, before[key])}
    assert any(key.startswith("lstm_critic.") for key in changed)
    assert not any(key.startswith("lstm_actor.") for key in changed)


@pytest.mark.parametrize("name", ["dual", "detach (shared_lstm)"])
def test_sequences_reproduce_the_rollout(name: str) -> None:
    """
    The policy phase's pass over whole env sequences, from the stored start states with the episode starts, gives the
    log-probabilities and values the rollout computed step by step (the same networks: nothing trained yet).
    """
    model = small_model(policy_kwargs=ARCH_KWARGS[name], n_steps=32, batch_size=64)
    model.learn(256)  # several rollouts: the start states are not zeros, episodes end inside the rollouts
    _, callback = model._setup_learn(128, reset_num_timesteps=False)
    assert model.collect_rollouts(model.env, callback, model.rollout_buffer, model.n_steps)
    buffer = model.rollout_buffer
    assert buffer.episode_starts[1:].any(), "no episode starts inside the rollout: the test would not test resets"
    assert np.abs(buffer.lstm_start_states).max() > 0
    with th.no_grad():
        for batch in sequence_minibatches(buffer, model.batch_size, model.device):
            values, log_prob, _ = model._evaluate_actions(batch)
            th.testing.assert_close(log_prob, batch.old_log_prob, rtol=1e-5, atol=1e-5)
            th.testing.assert_close(values.flatten(), batch.old_values, rtol=1e-5, atol=1e-5)


def test_both_lstms_share_one_layout_per_pass(monkeypatch) -> None:
    """The policy and value LSTMs of a pass over sequences run on one layout of pieces, computed once."""
    from sb3_ppg.common.recurrent import sequences as sequences_module
    from sb3_ppg.ppg_recurrent import policies as policies_module

    model = small_model(n_steps=32, batch_size=64)
    model.learn(128)
    calls = []
    layout = policies_module.sequence_layout

    def counted(*args, **kwargs):
        calls.append(1)
        return layout(*args, **kwargs)

    monkeypatch.setattr(policies_module, "sequence_layout", counted)
    monkeypatch.setattr(sequences_module, "sequence_layout", counted)
    batch = next(iter(sequence_minibatches(model.rollout_buffer, model.batch_size, model.device)))
    model._evaluate_actions(batch)
    assert len(calls) == 1


def test_adam_steps_fused_on_a_cpu_unless_the_user_chose() -> None:
    """RecurrentPPG's Adam runs torch's fused kernel on a CPU too (loaded models as well); a user's choice is kept."""
    model = small_model(device="cpu")
    assert all(group["fused"] and not group["foreach"] for opt in model._optimizers() for group in opt.param_groups)
    model.learn(128)
    file = io.BytesIO()
    model.save(file)
    file.seek(0)
    loaded = RecurrentPPG.load(file, device="cpu")
    assert all(group["fused"] for optimizer in loaded._optimizers() for group in optimizer.param_groups)
    chosen = small_model(device="cpu", policy_kwargs=dict(optimizer_kwargs=dict(foreach=False)))
    assert all(not group["fused"] and group["foreach"] is False for group in chosen.policy.optimizer.param_groups)


def test_aux_buffer_stores_start_states_and_recomputes_them() -> None:
    """
    The auxiliary buffer keeps each rollout's start states and episode starts. With unchanged networks, the states
    recomputed over each env's rollouts in order equal the stored ones, and so do the old distributions.
    """
    model = small_model(n_aux_epochs=1)
    _, callback = model._setup_learn(1000, reset_num_timesteps=False)
    buffer = model.aux_buffer
    start_states = []
    for _ in range(2):
        model.collect_rollouts(model.env, callback, model.rollout_buffer, model.n_steps)
        start_states.append(model.rollout_buffer.lstm_start_states.copy())
        buffer.add(model.rollout_buffer)
    assert buffer.full() and buffer.episode_starts.any()
    np.testing.assert_array_equal(buffer.lstm_start_states[4:8].cpu(), start_states[1].transpose(2, 0, 1, 3))
    stored = buffer.lstm_start_states.cpu().clone()
    model.aux_start_states = "stored"
    model._compute_old_distributions()
    old_stored = buffer.old_distribution_params.cpu().numpy()
    np.testing.assert_array_equal(buffer.lstm_start_states.cpu(), stored)
    model.aux_start_states = "recomputed"
    model._compute_old_distributions()
    np.testing.assert_allclose(buffer.lstm_start_states.cpu(), stored, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(buffer.old_distribution_params.cpu().numpy(), old_stored, rtol=1e-5, atol=1e-6)


def test_aux_buffer_memory_check_counts_its_start_states() -> None:
    """
    RecurrentPPG's auxiliary buffer is a ``RecurrentAuxiliaryBuffer`` with the policy's state shape, built by PPG's
    machinery, and the memory check's estimate is its size, episode starts and start states included.
    """
    model = small_model(n_aux_epochs=1)
    buffer = model.aux_buffer
    assert isinstance(buffer, RecurrentAuxiliaryBuffer)
    assert buffer.lstm_state_shape == (model.policy.n_lstm_layers, model.policy.lstm_hidden_size)
    layout = (model.n_policy_iters, model.n_steps, model.n_envs, model.observation_space, model.action_space)
    estimate = RecurrentAuxiliaryBuffer.estimate_nbytes(*layout, lstm_state_shape=buffer.lstm_state_shape)
    assert estimate == buffer.nbytes > AuxiliaryBuffer.estimate_nbytes(*layout)


def test_recomputed_states_are_the_current_networks() -> None:
    """
    After a policy phase, the recomputed start state of the next rollout is the current networks' (not the stored
    one); the first rollout of each env keeps its stored state.
    """
    model = small_model(aux_start_states="recomputed", learning_rate=1e-2)
    _, callback = model._setup_learn(1000)
    model.collect_rollouts(model.env, callback, model.rollout_buffer, model.n_steps)
    model.train()  # a policy phase, and the rollout into the auxiliary buffer (not full yet)
    model.collect_rollouts(model.env, callback, model.rollout_buffer, model.n_steps)
    buffer = model.aux_buffer
    buffer.add(model.rollout_buffer)
    stored = buffer.lstm_start_states.cpu().clone()
    model._compute_old_distributions()
    np.testing.assert_array_equal(buffer.lstm_start_states[:4].cpu(), stored[:4])
    continued = ~buffer.episode_starts[4:, 0].cpu()
    assert continued.any()
    assert not np.allclose(buffer.lstm_start_states[4:].cpu()[continued], stored[4:][continued], atol=1e-4)
    # They are the states the current networks reach at the end of the first rollout
    episode_starts, states = buffer.sequence_inputs(slice(0, 4))
    with th.no_grad():
        _, end_states = model.policy.sequence_distribution(buffer._observations_to_tensor(slice(0, 4)), states, episode_starts)
    expected = stack_states(end_states).permute(2, 0, 1, 3).cpu().numpy()
    np.testing.assert_allclose(buffer.lstm_start_states[4:].cpu(), expected, rtol=1e-5, atol=1e-6)


def test_predict_carries_states() -> None:
    """predict() returns the next states; stepping with them equals the policy's pass over the whole sequence."""
    model = small_model()
    env = make_vec_env("CartPole-v1", n_envs=2, seed=3)
    obs = env.reset()
    state = None
    episode_start = np.ones(2, dtype=bool)
    observations, starts = [], []
    actions = []
    for _ in range(12):
        action, state = model.predict(obs, state=state, episode_start=episode_start, deterministic=True)
        assert state[0].shape == (1, 2, 8) and state[1].shape == (1, 2, 8)
        observations.append(obs)
        starts.append(episode_start)
        actions.append(action)
        obs, _, dones, _ = env.step(action)
        episode_start = dones
    policy = model.policy
    sequence_obs = th.as_tensor(np.stack(observations, axis=1).reshape(24, -1))
    sequence_starts = th.as_tensor(np.stack(starts, axis=1), dtype=th.float32)
    with th.no_grad():
        distribution, states = policy.get_distribution(sequence_obs, policy.initial_states(2).pi, sequence_starts)
    np.testing.assert_array_equal(distribution.mode().numpy().reshape(2, 12), np.stack(actions, axis=1))
    np.testing.assert_allclose(states[0].numpy(), state[0], rtol=1e-5, atol=1e-6)
    # An episode start resets the given state
    zero_action, zero_state = model.predict(obs, state=None, episode_start=np.zeros(2, dtype=bool), deterministic=True)
    reset_action, reset_state = model.predict(obs, state=state, episode_start=np.ones(2, dtype=bool), deterministic=True)
    np.testing.assert_array_equal(zero_action, reset_action)
    np.testing.assert_allclose(zero_state[0], reset_state[0])
    with pytest.raises(ValueError, match="state must be"):
        model.predict(obs, state=(state[0][:, :1], state[1][:, :1]))


def test_evaluate_policy_and_save_load(tmp_path) -> None:
    """SB3's evaluate_policy runs the model (states carried); a saved model loads and predicts the same."""
    model = small_model()
    model.learn(128)
    env = make_vec_env("CartPole-v1", n_envs=2, seed=5)
    mean, _ = evaluate_policy(model, env, n_eval_episodes=4, deterministic=True)
    assert mean > 0
    model.save(tmp_path / "model.zip")
    loaded = RecurrentPPG.load(tmp_path / "model.zip")
    obs = env.reset()
    state = None
    for _ in range(5):
        action, new_state = model.predict(obs, state=state, deterministic=True)
        loaded_action, loaded_state = loaded.predict(obs, state=state, deterministic=True)
        np.testing.assert_array_equal(action, loaded_action)
        np.testing.assert_array_equal(new_state[0], loaded_state[0])
        state = new_state
        obs, *_ = env.step(action)
    assert loaded.policy.lstm_hidden_size == 8 and loaded.policy.arch == "dual"
    loaded.set_env(make_vec_env("CartPole-v1", n_envs=4, seed=6))
    loaded.learn(128)
    assert loaded.n_aux_phases == 2


def test_load_refuses_the_other_algorithm(tmp_path) -> None:
    """A PPG zip given to RecurrentPPG.load, and a RecurrentPPG zip given to PPG.load, are refused with the right class."""
    from sb3_ppg import PPG

    PPG("MlpPolicy", "CartPole-v1", n_steps=16, batch_size=16, n_policy_iters=2, aux_batch_rollouts=1).save(tmp_path / "ppg")
    with pytest.raises(ValueError, match=r"holds a PPG model .* load it with sb3_ppg.PPG.load"):
        RecurrentPPG.load(tmp_path / "ppg.zip")
    small_model().save(tmp_path / "recurrent")
    with pytest.raises(ValueError, match=r"holds a RecurrentPPG model .* sb3_ppg.RecurrentPPG.load"):
        PPG.load(tmp_path / "recurrent.zip")


def test_aux_buffer_save_and_load(tmp_path) -> None:
    """save_aux_buffer / load_aux_buffer keep the rollouts' start states and episode starts; another shape is refused."""
    model = small_model(n_policy_iters=3)
    model.learn(128)  # two of three iterations stored
    buffer = model.aux_buffer
    assert buffer.n_iterations == 2 and buffer.lstm_start_states[4:8].abs().max() > 0
    model.save_aux_buffer(tmp_path / "aux.npz")
    other = small_model(n_policy_iters=3, seed=1)
    other.load_aux_buffer(tmp_path / "aux.npz")
    assert other.aux_buffer.pos == buffer.pos
    assert th.equal(other.aux_buffer.lstm_start_states, buffer.lstm_start_states)
    assert th.equal(other.aux_buffer.episode_starts, buffer.episode_starts)
    wider = small_model(n_policy_iters=3, policy_kwargs=dict(lstm_hidden_size=16))
    with pytest.raises(ValueError, match="lstm_start_states"):
        wider.load_aux_buffer(tmp_path / "aux.npz")


def test_dict_observations_box_actions_and_gsde() -> None:
    """MultiInputLstmPolicy on Dict observations; continuous actions with gSDE."""
    from stable_baselines3.common.envs import SimpleMultiObsEnv

    model = small_model(DummyVecEnv([SimpleMultiObsEnv] * 2), policy="MultiInputLstmPolicy")
    model.learn(64)
    assert model.n_aux_phases == 1
    pendulum = make_vec_env("Pendulum-v1", n_envs=2, seed=0)
    model = small_model(pendulum, use_sde=True, sde_sample_freq=4)
    model.learn(64)
    assert model.n_aux_phases == 1
    action, _ = model.predict(pendulum.reset())
    assert action.shape == (2, 1)


def test_cnn_lstm_policies() -> None:
    """CnnLstmPolicy (NatureCNN) and the Procgen IMPALA + LSTM policy act on images."""
    from stable_baselines3.common.envs import FakeImageEnv

    env = DummyVecEnv([lambda: FakeImageEnv(screen_height=36, screen_width=36, n_channels=1)] * 2)
    model = small_model(env, policy="CnnLstmPolicy", n_steps=8, batch_size=8, aux_batch_rollouts=1)
    model.learn(32)
    assert model.n_aux_phases == 1
    space = gym.spaces.Box(0, 255, (64, 64, 3), np.uint8)
    procgen_env = DummyVecEnv([lambda: FakeImageEnv(screen_height=64, screen_width=64, n_channels=3)])
    assert procgen_env.observation_space == space
    model = RecurrentPPG("ProcgenCnnLstm", procgen_env, n_steps=4, batch_size=4, policy_kwargs=dict(lstm_hidden_size=16))
    assert model.policy.lstm_actor.input_size == 256 and model.policy.arch == "dual"
    _, state = model.predict(procgen_env.reset())
    assert state[0].shape == (1, 1, 16)


def test_unsupported_settings_are_errors() -> None:
    env = make_vec_env("CartPole-v1", n_envs=2)
    with pytest.raises(ValueError, match="policy_minibatches must be 'envs'"):
        RecurrentPPG("MlpLstmPolicy", env, policy_minibatches="transitions")
    with pytest.raises(ValueError, match="micro_batch_size must be None"):
        RecurrentPPG("MlpLstmPolicy", env, micro_batch_size=64)
    with pytest.raises(ValueError, match="aux_start_states"):
        RecurrentPPG("MlpLstmPolicy", env, aux_start_states="zeros")
    # PPG's GPU levers for feed-forward rollouts: off here, an error when asked for
    model = RecurrentPPG("MlpLstmPolicy", env)
    assert not model.cuda_graphs and not model.parallel_networks
    for name in ("cuda_graphs", "parallel_networks"):
        with pytest.raises(ValueError, match=f"RecurrentPPG does not support {name}=True"):
            RecurrentPPG("MlpLstmPolicy", env, **{name: True})


@pytest.mark.slow
def test_command_line_round_trip(tmp_path, capsys):
    """
    python -m sb3_ppg.train --algo recurrent_ppg with the packaged recurrent_ppg.yml (rl-zoo3's CartPoleNoVel-v1), its
    evaluations carrying the states; --resume continues from its checkpoint; enjoy plays it with states.
    """
    from helpers import QUIET_CPU_RUN

    from sb3_ppg.cli import enjoy, train

    common = ["--algo", "recurrent_ppg", "--env", "CartPoleNoVel-v1", "-f", str(tmp_path)]
    options = [*QUIET_CPU_RUN, "--eval-freq", "256", "--eval-episodes", "2", "--save-freq", "256"]
    params = ["-params", "n_policy_iters:2", "n_epochs:2"]
    train.main([*common, "-n", "1024", *options, *params])
    run_folder = tmp_path / "recurrent_ppg" / "CartPoleNoVel-v1_1"
    model = RecurrentPPG.load(run_folder / "CartPoleNoVel-v1.zip", device="cpu")
    assert model.num_timesteps == 1024 and model.n_aux_phases == 2
    assert model.n_steps == 32 and model.policy.lstm_hidden_size == 64 and model.policy.arch == "dual"
    with np.load(run_folder / "evaluations.npz") as evaluations:
        assert len(evaluations["timesteps"]) == 4 and (evaluations["results"] > 0).all()
    train.main([*common, "-n", "1536", *options, *params, "--resume"])
    assert RecurrentPPG.load(run_folder / "CartPoleNoVel-v1.zip", device="cpu").num_timesteps == 1536
    capsys.readouterr()
    enjoy.main([*common, "--no-render", "-n", "200", "--verbose", "1"])
    out = capsys.readouterr().out
    assert any(line.startswith("Episode Reward") for line in out.splitlines())
