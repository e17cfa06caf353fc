"""RecurrentPPG's checkpoints: a run cut anywhere, inside an auxiliary phase too, resumes bit-identical (LSTM states too)."""

import pathlib
import random
import signal

import numpy as np
import pytest
import torch as th
from helpers import assert_identical, parameters
from stable_baselines3.common.env_util import make_vec_env
from test_checkpoints import run_child

from sb3_ppg import PPGCheckpointCallback, RecurrentPPG
from sb3_ppg.common.checkpoints import RunState

N_ENVS, N_STEPS = 2, 16
ITERATION = N_ENVS * N_STEPS
TOTAL = 7 * ITERATION  # auxiliary phases after iterations 3 and 6
RUN = dict(n_steps=N_STEPS, batch_size=N_STEPS, n_policy_iters=3, n_aux_epochs=2, aux_batch_rollouts=1)
POLICY = dict(lstm_hidden_size=8, net_arch=[8])


def make_env(seed: int = 0):
    return make_vec_env("CartPole-v1", n_envs=N_ENVS, seed=seed)


def make_model(aux_start_states: str = "stored") -> RecurrentPPG:
    return RecurrentPPG("MlpLstmPolicy", make_env(), seed=0, policy_kwargs=POLICY, aux_start_states=aux_start_states, **RUN)


def checkpoint_dir(folder: pathlib.Path, steps: int) -> pathlib.Path:
    return folder / f"rppg_{steps}_steps"


@pytest.fixture(scope="module", params=["stored", "recomputed"])
def reference(request, tmp_path_factory):
    """The uninterrupted run with a checkpoint every iteration, and the same run without callback."""
    folder = tmp_path_factory.mktemp("reference")
    model = make_model(request.param)
    model.learn(TOTAL, callback=PPGCheckpointCallback(N_STEPS, str(folder), name_prefix="rppg"))
    plain = make_model(request.param).learn(TOTAL)
    assert_identical(parameters(model), parameters(plain))
    assert model.n_aux_phases == 2
    return request.param, folder, parameters(model)


@pytest.mark.parametrize("cut", [1, 2, 4])
def test_resume_bit_identical(reference, cut):
    """Resumed from a checkpoint (the live LSTM states inside), the run ends with the uninterrupted run's weights."""
    _, folder, params = reference
    resumed = RecurrentPPG.load_checkpoint(checkpoint_dir(folder, cut * ITERATION), env=make_env(seed=123))
    assert resumed.num_timesteps == cut * ITERATION
    assert np.abs(resumed.get_run_state().last_lstm_states).max() > 0
    resumed.learn(TOTAL - resumed.num_timesteps, reset_num_timesteps=False)
    assert resumed.n_aux_phases == 2
    assert_identical(params, parameters(resumed))


def test_zero_states_would_differ(reference):
    """The test above can fail: the same resume with the LSTM states zeroed ends elsewhere."""
    _, folder, params = reference
    resumed = RecurrentPPG.load_checkpoint(checkpoint_dir(folder, 2 * ITERATION), env=make_env(seed=123))
    resumed._last_lstm_states = resumed.policy.initial_states(N_ENVS)
    resumed.learn(TOTAL - resumed.num_timesteps, reset_num_timesteps=False)
    assert any(not th.equal(value, parameters(resumed)[name]) for name, value in params.items())


def test_interrupted_in_aux_phase_then_resumed(reference, tmp_path, monkeypatch):
    """A run stopped inside its first auxiliary phase resumes from its last checkpoint and ends bit-identical."""
    aux_start_states, _, params = reference
    model = make_model(aux_start_states)
    original = RecurrentPPG._aux_loss
    calls = [0]

    def interrupted_aux_loss(self, batch):
        calls[0] += 1
        if calls[0] == 5:
            raise KeyboardInterrupt
        return original(self, batch)

    monkeypatch.setattr(RecurrentPPG, "_aux_loss", interrupted_aux_loss)
    with pytest.raises(KeyboardInterrupt):
        model.learn(TOTAL, callback=PPGCheckpointCallback(N_STEPS, str(tmp_path), name_prefix="rppg"))
    monkeypatch.setattr(RecurrentPPG, "_aux_loss", original)
    resumed = RecurrentPPG.load_checkpoint(tmp_path, env=make_env(seed=7))
    assert resumed.num_timesteps == 2 * ITERATION and resumed.aux_buffer.n_iterations == 2
    resumed.learn(TOTAL - resumed.num_timesteps, reset_num_timesteps=False)
    assert_identical(params, parameters(resumed))


def test_run_state_of_another_model_is_refused():
    model = make_model()
    state = model.get_run_state()
    state_without = RunState(**{**vars(state), "last_lstm_states": None})
    with pytest.raises(ValueError, match="LSTM states of shape None"):
        model.set_run_state(state_without)


@pytest.mark.slow
def test_sigkill_anywhere_then_resume(tmp_path):
    """
    Killed with SIGKILL inside an auxiliary minibatch and at random moments (tests/checkpoint_child.py with a small
    RecurrentPPG), resumed each time from its last checkpoint, the run ends with the uninterrupted run's weights.
    """
    assert run_child(tmp_path / "reference", algo="recurrent") == 0
    reference = dict(np.load(tmp_path / "reference" / "final_params.npz"))
    folder = tmp_path / "killed"
    rng = random.Random(1)
    kills = [("aux:3", None)] + [("", rng.uniform(0.05, 1.0)) for _ in range(2)]
    for kill_at, kill_after in kills:
        returncode = run_child(folder, kill_at, kill_after, algo="recurrent")
        # The planned kill happens; a random one may come after the end of training
        assert returncode == -signal.SIGKILL or (kill_after is not None and returncode == 0)
    (folder / "final_params.npz").unlink(missing_ok=True)
    assert run_child(folder, algo="recurrent") == 0
    final = dict(np.load(folder / "final_params.npz"))
    assert final.keys() == reference.keys()
    for name in final:
        assert np.array_equal(final[name], reference[name]), name
