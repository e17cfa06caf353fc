"""
RecurrentPPG with ``precision="bf16"``: the features extractors run in bfloat16 in every phase, the LSTMs and the
weights stay float32, training is finite and changes the weights, and a saved model loads in its precision. Also
benchmarks/recurrent_bf16.py (the measurement in docs/results.md) at a tiny size.
"""

import math
from collections import defaultdict

import numpy as np
import pytest
import torch as th
from benchmark_scripts import load_script  # tests/ is on sys.path
from stable_baselines3.common.envs import FakeImageEnv
from stable_baselines3.common.vec_env import DummyVecEnv

from sb3_ppg import RecurrentPPG

# 2 envs, whole rollouts of 8 steps, an auxiliary phase every 2 rollouts
RUN = dict(n_steps=8, batch_size=8, n_policy_iters=2, n_aux_epochs=1, aux_batch_rollouts=1)


def image_env() -> DummyVecEnv:
    return DummyVecEnv([lambda: FakeImageEnv(screen_height=36, screen_width=36, n_channels=1)] * 2)


def bf16_model() -> RecurrentPPG:
    policy_kwargs = dict(lstm_hidden_size=8, net_arch=[8], features_extractor_kwargs=dict(features_dim=16))
    return RecurrentPPG("CnnLstmPolicy", image_env(), precision="bf16", policy_kwargs=policy_kwargs, seed=0, **RUN)


def record_dtypes(model: RecurrentPPG) -> dict[str, set]:
    """The dtypes that the features extractors put out and the LSTMs take and put out, from now on, by module."""
    dtypes: dict[str, set] = defaultdict(set)
    policy = model.policy
    modules = {
        "features": [policy.pi_features_extractor, policy.vf_features_extractor],
        "lstm": [policy.lstm_actor, policy.lstm_critic],
    }
    for kind, kind_modules in modules.items():
        for module in kind_modules:

            def hook(module, inputs, output, kind=kind):
                if kind == "lstm":
                    dtypes["lstm inputs"].update(tensor.dtype for tensor in (inputs[0], *inputs[1]))
                    output = output[0]
                dtypes[f"{kind} outputs"].add(output.dtype)

            module.register_forward_hook(hook)
    return dtypes


def test_bf16_runs_the_features_in_bfloat16_and_the_lstms_in_float32(tmp_path) -> None:
    model = bf16_model()
    assert model.phase_precision == dict(rollout="bf16", policy="bf16", aux="bf16")
    assert model.policy.arch == "dual" and model.policy.lstm_critic is not None
    dtypes = record_dtypes(model)
    before = {name: tensor.clone() for name, tensor in model.policy.state_dict().items()}
    model.learn(64)  # two auxiliary phases
    assert model.n_aux_phases == 2
    assert dict(dtypes) == {"features outputs": {th.bfloat16}, "lstm inputs": {th.float32}, "lstm outputs": {th.float32}}
    # The weights stay float32 and every part of both networks trained, the convolutions and the LSTMs included
    state = model.policy.state_dict()
    assert all(tensor.dtype == th.float32 for tensor in state.values() if tensor.is_floating_point())
    for part in ("pi_features_extractor.cnn.0", "vf_features_extractor.cnn.0", "lstm_actor", "lstm_critic", "action_net"):
        changed = [name for name in state if name.startswith(part) and not th.equal(state[name], before[name])]
        assert changed, f"{part} did not train"
    assert all(th.isfinite(tensor).all() for tensor in state.values() if tensor.is_floating_point())
    # The losses of the last policy and auxiliary phases are finite
    logged = model.logger.name_to_value
    for name in ("train/loss", "train/value_loss", "train/policy_gradient_loss", "aux/kl_loss", "aux/aux_value_loss"):
        assert math.isfinite(logged[name]), name
    # bf16 shows: the same weights in fp32 give other (close) outputs
    obs = model.env.reset()
    episode_start = np.ones(2, dtype=bool)
    obs_tensor, _ = model.policy.obs_to_tensor(obs)
    with th.no_grad():
        states = model.policy.initial_states(2)
        starts = th.ones(2)
        bf16_logits = model.policy.get_distribution(obs_tensor, states.pi, starts)[0].distribution.logits
        model.policy.compute_dtype = th.float32
        fp32_logits = model.policy.get_distribution(obs_tensor, states.pi, starts)[0].distribution.logits
        model.policy.compute_dtype = th.bfloat16
    assert not th.equal(bf16_logits, fp32_logits)
    th.testing.assert_close(bf16_logits, fp32_logits, rtol=0.1, atol=0.1)
    # Saved and loaded, the model runs in bf16 and predicts the same actions and states
    model.save(tmp_path / "model.zip")
    loaded = RecurrentPPG.load(tmp_path / "model.zip", env=image_env())
    assert loaded.phase_precision == model.phase_precision and loaded.policy.compute_dtype == th.bfloat16
    state = None
    for _ in range(4):
        action, new_state = model.predict(obs, state=state, episode_start=episode_start, deterministic=True)
        loaded_action, loaded_state = loaded.predict(obs, state=state, episode_start=episode_start, deterministic=True)
        np.testing.assert_array_equal(loaded_action, action)
        np.testing.assert_array_equal(loaded_state[0], new_state[0])
        np.testing.assert_array_equal(loaded_state[1], new_state[1])
        state, episode_start = new_state, np.zeros(2, dtype=bool)
        obs, *_ = model.env.step(action)
    loaded_dtypes = record_dtypes(loaded)
    loaded.learn(32)
    assert loaded.n_aux_phases == 3  # two saved with the model, one more
    assert loaded_dtypes["features outputs"] == {th.bfloat16} and loaded_dtypes["lstm outputs"] == {th.float32}


def test_bf16_benchmark_reports_both_precisions(capsys) -> None:
    pytest.importorskip("procgen")
    benchmark = load_script("recurrent_bf16")
    args = ["--n-envs", "1", "--n-steps", "4", "--lstm-hidden-size", "8", "--aux-batch-rollouts", "1", "--rounds", "2"]
    runs = benchmark.run(benchmark.parse_args(args))
    assert [(run["precision"], run["round"]) for run in runs] == [("fp32", 0), ("bf16", 0), ("fp32", 1), ("bf16", 1)]
    assert all(run["steps"] == 8 and run["steps_per_s"] == pytest.approx(8 / run["seconds"]) for run in runs)
    text = benchmark.report(runs, "python benchmarks/recurrent_bf16.py")
    fp32 = sorted(run["steps_per_s"] for run in runs if run["precision"] == "fp32")
    bf16 = sorted(run["steps_per_s"] for run in runs if run["precision"] == "bf16")
    ratio = (bf16[0] + bf16[1]) / (fp32[0] + fp32[1])
    assert f"bf16 / fp32 = {ratio:.2f}" in text and "round 1 bf16:" in text
    with pytest.raises(SystemExit):
        benchmark.parse_args(["--rounds", "0"])
    assert "--rounds must be at least 1, got 0" in capsys.readouterr().err
