"""The PPG algorithm: phase schedule, losses, optimizers, advantage normalization and failure modes (the constructor's
validation is in test_hostile_inputs.py)."""

import copy
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from double_precision import run_in_float64
from stable_baselines3 import PPO
from stable_baselines3.common.envs import FakeImageEnv
from stable_baselines3.common.logger import configure

from sb3_ppg import PPG
from sb3_ppg.common.distributions import kl_divergence_from_params
from sb3_ppg.common.precision import PHASES, resolve_precision
from sb3_ppg.ppg import losses

# Many tests here train less than one auxiliary phase on purpose (the state they check comes before it): the warning
# that learn() then trains as plain PPO is meant
pytestmark = pytest.mark.filterwarnings(r"ignore:learn\(total_timesteps=.*this learn\(\) trains as plain PPO")


def adam_steps(optimizer: th.optim.Optimizer) -> int:
    """Largest Adam step count over the optimizer's parameters (0 if it never stepped)."""
    steps = [int(state["step"]) for state in optimizer.state.values() if "step" in state]
    return max(steps, default=0)


def params_of(module: th.nn.Module) -> list[th.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


def same_params(a: list[th.Tensor], b: list[th.Tensor]) -> bool:
    return all(th.equal(x, y) for x, y in zip(a, b, strict=True))


def test_smoke_procgen_cnn_like_cleanrl():
    """CleanRL's smoke test shape: 1 env, 64 steps, N_pi = 1, 2 minibatches (here on 64x64 images, 2 iterations)."""
    env = FakeImageEnv(screen_height=64, screen_width=64, n_channels=3, discrete=True)
    model = PPG("ProcgenCnn", env, n_steps=64, batch_size=32, n_policy_iters=1, n_aux_epochs=1, aux_batch_rollouts=1, seed=0)
    model.learn(128)
    assert model.num_timesteps == 128
    assert model.n_aux_phases == 2
    assert model.aux_buffer.observations.dtype == th.uint8
    assert model.aux_buffer.observations.shape == (1, 64, 3, 64, 64)


@pytest.mark.parametrize(
    "n_envs, n_policy_iters, aux_batch_rollouts, accum", [(1, 3, 1, 1), (2, 2, 3, 1), (2, 3, 2, 2), (3, 1, 1, 2)]
)
def test_aux_phase_cadence_and_update_counts(make_model, n_envs, n_policy_iters, aux_batch_rollouts, accum):
    model = make_model(
        "CartPole-v1",
        n_envs=n_envs,
        n_steps=8,
        batch_size=8,
        n_policy_iters=n_policy_iters,
        n_aux_epochs=2,
        aux_batch_rollouts=aux_batch_rollouts,
        n_aux_grad_accum=accum,
    )
    iterations = 2 * n_policy_iters + 1
    model.learn(iterations * 8 * n_envs)
    assert model.n_aux_phases == iterations // n_policy_iters
    # What is left waits in the buffer for the next phase
    assert model.aux_buffer.n_iterations == iterations % n_policy_iters
    n_batches = -(-(n_policy_iters * n_envs) // aux_batch_rollouts)
    steps_per_epoch = -(-n_batches // accum)
    assert model._n_aux_updates == model.n_aux_phases * 2 * steps_per_epoch
    # The paper's default: E_aux * N_pi * n_envs / rollouts per minibatch optimizer steps per phase
    assert adam_steps(model.aux_optimizer) == model._n_aux_updates
    # No gradient left behind after a phase (nothing spills into the next epoch or phase)
    assert all(p.grad is None for p in model.policy.parameters())


def test_n_aux_phases_is_public_and_read_only(make_model, tmp_path):
    """``model.n_aux_phases`` counts the auxiliary phases, is saved with the model and cannot be set."""
    model = make_model(n_policy_iters=1)
    model.learn(2 * 16)
    assert model.n_aux_phases == 2
    with pytest.raises(AttributeError):
        model.n_aux_phases = 0
    model.save(tmp_path / "model")
    assert PPG.load(tmp_path / "model", device="cpu").n_aux_phases == 2


def test_paper_default_aux_update_count():
    model = PPG("MlpPolicy", "CartPole-v1", seed=0, policy_kwargs=dict(net_arch=[8]))
    # E_aux * N_pi * n_envs / aux_batch_rollouts with the paper's 6, 32, 64 and 4 -> 3,072 steps per phase
    assert (model.n_aux_epochs, model.n_policy_iters, model.aux_batch_rollouts) == (6, 32, 4)
    assert model.n_aux_epochs * model.n_policy_iters * 64 // model.aux_batch_rollouts == 3072
    assert model.batch_size == 256 * 1 // 8


def test_first_aux_minibatch_has_zero_kl_and_kl_grows(make_model):
    model = make_model(n_aux_epochs=2)
    model.learn(2 * 16)
    assert model.n_aux_phases == 1
    # Refill the buffer without an aux phase, then check the first minibatch by hand
    model.aux_buffer.reset()
    model.learn(16, reset_num_timesteps=False)
    model.aux_buffer.add(model.rollout_buffer)
    model._compute_old_distributions()
    batch = next(model.aux_buffer.get(1))
    with th.no_grad():
        distribution, _, _ = model.policy.forward_aux(batch.observations)
        kl = kl_divergence_from_params(batch.old_distribution_params, distribution)
    assert th.allclose(kl, th.zeros_like(kl), atol=1e-6)

    # Over a real phase the policy moves away from pi_old: the logged KL is positive (guards against comparing
    # SB3's reused Distribution object with itself, which always gives 0)
    model = make_model(n_aux_epochs=4)
    model.set_logger(configure(None, [""]))
    recorded = {}
    original_record = model.logger.record

    def record(key, value, exclude=None):
        recorded[key] = value
        original_record(key, value, exclude)

    model.logger.record = record
    model.learn(2 * 16)
    assert recorded["aux/kl_loss"] > 0
    assert recorded["aux/aux_value_loss"] > 0 and recorded["aux/real_value_loss"] > 0
    assert recorded["time/aux_phase_s"] > 0
    assert recorded["train/n_aux_phases"] == 1


def test_batch_advantage_normalization(make_model):
    captured = {}

    def capture(model):
        def train_policy_phase():
            captured[model.normalize_advantage] = model.rollout_buffer.advantages.copy()

        return train_policy_phase

    for mode in ("batch", "minibatch", "none"):
        model = make_model(normalize_advantage=mode, n_aux_epochs=0)
        model._policy_phase = capture(model)
        model.learn(16)
    batch = captured["batch"]
    assert abs(batch.mean()) < 1e-6
    assert abs(batch.std() - 1) < 1e-4
    # The other modes leave the rollout's advantages raw (same seed -> same rollout)
    np.testing.assert_allclose(captured["minibatch"], captured["none"])
    assert abs(captured["none"].std() - 1) > 1e-2
    assert make_model(normalize_advantage=True).normalize_advantage == "batch"
    assert make_model(normalize_advantage=False).normalize_advantage == "none"


@pytest.mark.parametrize("micro_batch_size", [None, 3])
def test_minibatch_advantage_normalization(monkeypatch, make_model, micro_batch_size):
    """With "minibatch", the policy loss sees each minibatch's advantages normalized over the whole minibatch."""
    seen = []
    policy_loss = losses.policy_loss

    def recording_policy_loss(advantages, *args):
        seen.append(advantages.detach().clone())
        return policy_loss(advantages, *args)

    monkeypatch.setattr(losses, "policy_loss", recording_policy_loss)
    model = make_model(normalize_advantage="minibatch", batch_size=8, n_aux_epochs=0, micro_batch_size=micro_batch_size)
    model.learn(16)
    minibatches = [th.cat(seen[i : i + 3]) for i in range(0, len(seen), 3)] if micro_batch_size else seen
    assert len(minibatches) == 2 and all(len(advantages) == 8 for advantages in minibatches)
    for advantages in minibatches:
        assert abs(advantages.mean().item()) < 1e-6 and advantages.std().item() == pytest.approx(1.0, abs=1e-4)


def test_separate_value_epochs(make_model):
    model = make_model(n_epochs=1, n_value_epochs=3, n_aux_epochs=0, n_steps=32, batch_size=16)
    assert model.value_optimizer is not None
    model.learn(32)
    # 2 minibatches per epoch: 3 value epochs with the value optimizer, then 1 policy epoch with the policy optimizer
    assert adam_steps(model.value_optimizer) == 6
    assert adam_steps(model.policy.optimizer) == 2
    assert model._n_updates == 4
    # Joint loss with one optimizer when E_pi == E_V
    assert make_model(n_epochs=2, n_value_epochs=2).value_optimizer is None


def test_value_only_epochs_do_not_touch_the_policy_network(make_model):
    model = make_model(n_epochs=1, n_value_epochs=2, n_aux_epochs=0)
    model.learn(16)  # build the logger and a rollout
    policy_params = params_of(model.policy.mlp_extractor.policy_net) + params_of(model.policy.action_net)
    value_params = params_of(model.policy.mlp_extractor.value_net) + params_of(model.policy.value_net)
    # Run the value epochs alone: the policy epochs that follow them are skipped
    model.n_epochs = 0
    model._policy_phase()
    assert same_params(policy_params, params_of(model.policy.mlp_extractor.policy_net) + params_of(model.policy.action_net))
    assert not same_params(value_params, params_of(model.policy.mlp_extractor.value_net) + params_of(model.policy.value_net))


def test_early_stopping_is_decided_before_backward(make_model):
    """
    With target_kl, a minibatch whose approx KL is too large is not backpropagated at all (SB3's PPO decides before
    backward()): one backward pass per iteration here, for the first minibatch (regression: the stopped minibatch was
    backpropagated, then its gradient dropped).
    """
    model = make_model(target_kl=1e-12, batch_size=8, n_epochs=2, n_aux_epochs=0, n_policy_iters=1, micro_batch_size=None)
    backward_passes = []
    model.policy.action_net.weight.register_hook(lambda grad: backward_passes.append(1))
    model.learn(2 * 16)
    # Each iteration: the first minibatch steps (its KL is ~0), the second stops the phase in its first epoch
    assert len(backward_passes) == 2 and model._n_updates == 2
    assert model.logger.name_to_value["train/approx_kl"] > 1.5e-12


def test_kl_penalty_objective_without_clipping(make_model):
    model = make_model(clip_range=None, kl_coef=1.0)
    model.set_logger(configure(None, [""]))
    recorded = {}
    original = model.logger.record
    model.logger.record = lambda key, value, exclude=None: (recorded.__setitem__(key, value), original(key, value, exclude))
    model.learn(2 * 16)
    assert "train/kl_penalty" in recorded and recorded["train/kl_penalty"] >= 0
    assert "train/clip_fraction" not in recorded and "train/clip_range" not in recorded
    assert model.clip_range is None


def test_gradient_clipping_only_when_asked(monkeypatch, make_model):
    calls = []
    original = th.nn.utils.clip_grad_norm_
    monkeypatch.setattr(
        th.nn.utils, "clip_grad_norm_", lambda *args, **kwargs: calls.append(args[1]) or original(*args, **kwargs)
    )
    make_model(max_grad_norm=None).learn(2 * 16)
    assert calls == []
    make_model(max_grad_norm=0.5).learn(2 * 16)
    # Both phases clip: 1 policy minibatch per iteration x 2, then 2 aux minibatches
    assert calls == [0.5] * 4


def test_clipped_value_loss_is_used(make_model):
    model = make_model(clip_range_vf=0.2, n_aux_epochs=0)
    model.learn(16)
    assert model.clip_range_vf(1.0) == 0.2
    with pytest.raises(ValueError, match="clip_range_vf must be a number > 0"):
        make_model(clip_range_vf=0.0)


@pytest.mark.parametrize("n_value_epochs", [1, 2])
def test_value_clipping_form_reaches_the_value_loss(monkeypatch, make_model, n_value_epochs):
    """value_clipping is the form of every value loss of the policy phase (joint loss, or separate value epochs)."""
    forms = []
    value_loss = losses.value_loss

    def recording_value_loss(values, returns, old_values, clip_range_vf, value_clipping):
        forms.append((clip_range_vf, value_clipping))
        return value_loss(values, returns, old_values, clip_range_vf, value_clipping)

    monkeypatch.setattr(losses, "value_loss", recording_value_loss)
    model = make_model(clip_range_vf=0.2, value_clipping="max", n_value_epochs=n_value_epochs, n_aux_epochs=0)
    model.learn(16)
    assert forms == [(0.2, "max")] * n_value_epochs
    assert make_model().value_clipping == "sb3"


@pytest.mark.parametrize(
    "n_envs, batch_size, expected",
    [
        (4, None, 16),  # ceil(4 / 8) = 1 env per minibatch: 4 minibatches (the paper's code: torch.chunk(envs, 8))
        (16, None, 32),  # 2 envs: 8 minibatches
        (4, 32, 32),
    ],
)
def test_env_minibatches_batch_size(make_model, n_envs, batch_size, expected):
    model = make_model("CartPole-v1", n_envs=n_envs, policy_minibatches="envs", batch_size=batch_size, n_aux_epochs=0)
    assert model.batch_size == expected
    model.learn(16 * n_envs)
    assert model._n_updates == 1


def test_env_minibatches_are_used_in_every_epoch(monkeypatch, make_model):
    """policy_minibatches="envs": every minibatch of the value and policy epochs holds whole env rollouts."""
    minibatch_envs = []
    loss = PPG._joint_loss

    def recording_loss(self, rollout_data, **kwargs):
        minibatch_envs.append(rollout_data.observations.shape[0] // self.n_steps)
        return loss(self, rollout_data, **kwargs)

    monkeypatch.setattr(PPG, "_joint_loss", recording_loss)
    # On the CPU the minibatches come from the rollout buffer's _get_samples (on CUDA they are gathered on the device)
    model = make_model(
        "CartPole-v1", n_envs=6, policy_minibatches="envs", batch_size=32, n_epochs=2, n_aux_epochs=0, device="cpu"
    )
    env_rows = []
    get_samples = model.rollout_buffer._get_samples

    def recording_get_samples(indices, env=None):
        env_rows.append(sorted(set(np.asarray(indices) // model.n_steps)))
        assert sorted(indices) == [env * model.n_steps + step for env in env_rows[-1] for step in range(model.n_steps)]
        return get_samples(indices, env)

    model.rollout_buffer._get_samples = recording_get_samples
    model.learn(16 * 6)
    assert minibatch_envs == [2] * 6  # 2 epochs of 3 minibatches of 2 whole envs
    for epoch in range(2):  # each epoch's minibatches hold every env once
        assert sorted(env for minibatch in env_rows[epoch * 3 : epoch * 3 + 3] for env in minibatch) == list(range(6))


def test_aux_phase_true_value_weight_and_separate_optimizer(make_model):
    # vf_true_coef = 0 in the dual arch: the aux phase leaves the value network alone and trains the policy network
    model = make_model(vf_true_coef=0.0, n_aux_epochs=2)
    model.learn(16)
    value_params = params_of(model.policy.mlp_extractor.value_net) + params_of(model.policy.value_net)
    policy_params = params_of(model.policy.mlp_extractor.policy_net)
    model.aux_buffer.add(model.rollout_buffer)
    model._compute_old_distributions()
    model._train_aux_phase()
    assert same_params(value_params, params_of(model.policy.mlp_extractor.value_net) + params_of(model.policy.value_net))
    assert not same_params(policy_params, params_of(model.policy.mlp_extractor.policy_net))
    # The aux optimizer is separate from, and persists alongside, the policy optimizer
    assert model.aux_optimizer is not model.policy.optimizer
    assert adam_steps(model.aux_optimizer) == 2 * 2  # 2 epochs x 2 one-rollout minibatches
    model.aux_buffer.reset()
    model.learn(2 * 16, reset_num_timesteps=False)
    # One more phase of 2 epochs x 2 minibatches on the same optimizer
    assert adam_steps(model.aux_optimizer) == 4 + 4


def test_shared_optimizer_option(make_model):
    model = make_model(separate_aux_optimizer=False, n_aux_epochs=2)
    assert model.aux_optimizer is None
    model.learn(2 * 16)
    # 2 policy minibatches + 2 epochs x 2 aux minibatches on the one optimizer
    assert adam_steps(model.policy.optimizer) == 2 + 4


def test_aux_learning_rate(make_model):
    model = make_model(learning_rate=1e-3, aux_learning_rate=2e-4)
    model.learn(2 * 16)
    assert model.aux_optimizer.param_groups[0]["lr"] == pytest.approx(2e-4)
    assert model.policy.optimizer.param_groups[0]["lr"] == pytest.approx(1e-3)
    # Default: the policy-phase schedule, read at the same progress point
    model = make_model(learning_rate=lambda progress: 1e-3 * progress)
    model.learn(2 * 16)
    assert model.aux_optimizer.param_groups[0]["lr"] == pytest.approx(model.policy.optimizer.param_groups[0]["lr"])


def test_no_stale_gradient_enters_the_aux_phase(monkeypatch, make_model):
    model = make_model(n_aux_epochs=1, max_grad_norm=0.5)
    seen = []
    original = model._compute_old_distributions

    def check_then_compute():
        seen.append([p.grad is None for p in model.policy.parameters()])
        original()

    monkeypatch.setattr(model, "_compute_old_distributions", check_then_compute)
    model.learn(2 * 16)
    assert len(seen) == 1 and all(seen[0])


def test_no_aux_epochs_is_plain_ppo():
    """n_aux_epochs=0 with SB3's PPO settings reproduces one SB3 PPO update exactly."""
    env_kwargs = dict(n_steps=32, batch_size=16, n_epochs=2, learning_rate=3e-4, gamma=0.99, gae_lambda=0.95, ent_coef=0.01)
    ppo = PPO("MlpPolicy", "CartPole-v1", seed=0, **env_kwargs)
    ppg = PPG(
        "MlpPolicy",
        "CartPole-v1",
        seed=0,
        n_aux_epochs=0,
        normalize_advantage="minibatch",
        max_grad_norm=0.5,
        policy_kwargs=dict(optimizer_kwargs=dict(eps=1e-5)),
        **env_kwargs,
    )
    assert ppg.aux_buffer is None and ppg.aux_optimizer is None
    missing, unexpected = ppg.policy.load_state_dict(ppo.policy.state_dict(), strict=False)
    assert unexpected == [] and all(key.startswith("aux_value_net") for key in missing)
    # Same weights, fresh Adam states on both sides (PPG's optimizer also holds the aux head, which gets no gradient),
    # in float64: the two implementations order their sums differently, which float32 would show in the last bits
    for model in (ppo, ppg):
        run_in_float64(model)
        model.policy.optimizer = th.optim.Adam(model.policy.parameters(), lr=3e-4, eps=1e-5)
    _, callback = ppo._setup_learn(32)
    ppo.collect_rollouts(ppo.env, callback, ppo.rollout_buffer, n_rollout_steps=32)
    ppg._setup_learn(32)
    ppg.rollout_buffer = copy.deepcopy(ppo.rollout_buffer)
    initial_action_weight = ppo.policy.action_net.weight.detach().clone()
    for model in (ppo, ppg):
        np.random.seed(1)
        model.train()
    ppg_params = ppg.policy.state_dict()
    for name, param in ppo.policy.named_parameters():
        th.testing.assert_close(param, ppg_params[name], rtol=0.0, atol=1e-10, msg=name)
    # ... and the update did move the weights
    assert not th.allclose(ppo.policy.action_net.weight, initial_action_weight)
    assert ppg.n_aux_phases == 0


def test_learn_warns_when_it_ends_before_the_first_aux_phase(make_model):
    """N_pi 4 rollouts of 16 steps x 2 envs: the first auxiliary phase runs at step 128."""
    model = make_model("CartPole-v1", n_envs=2, n_policy_iters=4)
    message = (
        "learn(total_timesteps=96) stops at step 96, before PPG's first auxiliary phase at step 128 (after "
        "n_policy_iters=4 rollouts of 16 steps x 2 envs): this learn() trains as plain PPO. Lower n_policy_iters (to at "
        "most 3 for this budget) or n_steps, or raise total_timesteps to at least 128."
    )
    with pytest.warns(UserWarning) as warned:
        model.learn(96)
    assert [str(warning.message) for warning in warned] == [message]
    # The warning points at the caller's learn()
    assert warned[0].filename == __file__
    assert model.n_aux_phases == 0 and model.aux_buffer.n_iterations == 3
    # A total inside a rollout: SB3 runs that rollout to its end, and the warning says where it stops
    model = make_model("CartPole-v1", n_envs=2, n_policy_iters=4)
    with pytest.warns(UserWarning, match=r"learn\(total_timesteps=65\) stops at step 96, before .* at step 128 .* most 3"):
        model.learn(65)
    assert model.num_timesteps == 96


@pytest.mark.parametrize("total_timesteps", [128, 97])
def test_learn_does_not_warn_when_the_aux_phase_runs(make_model, total_timesteps):
    """SB3 collects whole rollouts until the total is reached: 97 steps run the 4th rollout, and its aux phase, too."""
    model = make_model("CartPole-v1", n_envs=2, n_policy_iters=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.learn(total_timesteps)
    assert model.n_aux_phases == 1


def test_ppo_mode_never_warns_about_the_aux_phase(make_model):
    model = make_model("CartPole-v1", n_envs=2, n_policy_iters=4, n_aux_epochs=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.learn(32)
    assert model.aux_buffer is None


def test_resumed_learn_counts_the_stored_rollouts_for_the_aux_phase_warning(make_model):
    """A continued run (reset_num_timesteps=False) counts its steps from the run's start and the buffer's rollouts."""
    model = make_model("CartPole-v1", n_envs=2, n_policy_iters=4)
    with pytest.warns(UserWarning, match="before PPG's first auxiliary phase"):
        model.learn(64)
    # 2 rollouts stored: 32 more steps end at step 96, before the phase at step 128
    with pytest.warns(UserWarning) as warned:
        model.learn(32, reset_num_timesteps=False)
    assert [str(warning.message) for warning in warned] == [
        "learn(total_timesteps=32) stops at step 96, before PPG's first auxiliary phase at step 128 (after "
        "n_policy_iters=4 rollouts of 16 steps x 2 envs; the auxiliary buffer holds 2 of them): this learn() trains as "
        "plain PPO. Raise total_timesteps to at least 64."
    ]
    # 3 stored: one more rollout runs the phase, and once a phase has run no learn() warns
    for _ in range(2):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            model.learn(32, reset_num_timesteps=False)
    assert model.n_aux_phases == 1 and model.num_timesteps == 160
    # A new run (reset_num_timesteps=True) keeps the stored rollouts too: 1 of 4 stored, 3 rollouts (96 steps) to go
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.learn(96)
    assert model.n_aux_phases == 2


def test_aux_buffer_size_is_in_the_log(tmp_path, make_model):
    """The log (SB3's logger, here its log.txt) states the auxiliary buffer's size at the start of a run."""
    model = make_model("CartPole-v1", n_envs=2, n_policy_iters=4, device="cpu")
    model.set_logger(configure(str(tmp_path), ["log"]))
    model.learn(128)
    # CartPole: 4 float32 observations, plus the value target and 2 logits (4 bytes each) per step
    assert model.aux_buffer.nbytes == 4 * 2 * 16 * (16 + 12)
    line = (
        "Auxiliary buffer: n_policy_iters * n_envs * n_steps = 4 * 2 * 16 steps of 28 bytes (16 of observations), "
        "3.6 kB, taken as rollouts arrive; next auxiliary phase at step 128. It lives in CPU memory "
        "(aux_buffer_device='auto' and the model is on cpu, not a CUDA device)."
    )
    assert line in (tmp_path / "log.txt").read_text().splitlines()


class NaNRewardEnv(gym.Wrapper):
    def step(self, action):
        obs, _, terminated, truncated, info = self.env.step(action)
        return obs, float("nan"), terminated, truncated, info


def test_non_finite_loss_stops_training_with_clear_error(make_model):
    model = make_model(NaNRewardEnv(gym.make("CartPole-v1")))
    before = params_of(model.policy)
    with pytest.raises(FloatingPointError, match=r"(?s)policy-phase loss is nan.*VecNormalize"):
        model.learn(2 * 16)
    # The bad loss never reached the weights
    assert same_params(before, params_of(model.policy))


def test_continuous_actions_and_single_network_archs_run(make_model):
    for arch in ("detach", "shared"):
        model = make_model("Pendulum-v1", policy_kwargs=dict(arch=arch, net_arch=[16]))
        model.learn(2 * 16)
        assert model.n_aux_phases == 1
        assert model.aux_buffer.old_distribution_params.shape[-1] == 2  # mean and log std of 1 action


def test_channels_last_and_nchw_train_to_the_same_parameters(make_model):
    """
    The optimized memory format computes what the reference NCHW one does. Compared in float64 (see
    ``double_precision.run_in_float64``: the two layouts then agree to rounding at ~1e-16, on any CPU), one iteration with its
    policy phase and an aux phase gives the same parameters to 1e-8, while training moved them by ~1e-3.
    """
    trained, initial = [], []
    for channels_last in (True, False):
        env = FakeImageEnv(screen_height=16, screen_width=16, n_channels=3, discrete=True)
        env.observation_space.seed(0)
        policy_kwargs = dict(features_extractor_kwargs=dict(channels=(4, 8), channels_last=channels_last))
        model = make_model(env, "ProcgenCnn", policy_kwargs, batch_size=8, n_policy_iters=1, n_aux_epochs=2, precision="fp32")
        run_in_float64(model)
        extractor = model.policy.pi_features_extractor
        memory_format = th.channels_last if channels_last else th.contiguous_format
        assert extractor.stacks[0].conv.weight.is_contiguous(memory_format=memory_format)
        initial.append(params_of(model.policy))
        # One iteration (the same rollout: same initial weights), its policy phase and an aux phase
        model.learn(16)
        assert model.n_aux_phases == 1
        trained.append(params_of(model.policy))
    assert all(th.equal(a, b) for a, b in zip(*initial, strict=True))
    moved = max((a - b).abs().max().item() for a, b in zip(trained[0], initial[0], strict=True))
    assert moved > 1e-4
    for a, b in zip(*trained, strict=True):
        assert a.dtype == th.float64
        th.testing.assert_close(a, b, rtol=0, atol=1e-8)


@pytest.mark.parametrize(
    "precision", ["bf16", {"rollout": "bf16"}, {"aux": "bf16", "policy": "fp32"}, {"policy": "bf16", "aux": "bf16"}]
)
def test_bf16_precision_trains_and_stays_close(make_model, precision):
    """bf16 autocast runs the features extractor only: outputs stay float32 and close to fp32's."""
    reference = make_model(n_aux_epochs=1)
    model = make_model(n_aux_epochs=1, precision=precision)
    obs = th.as_tensor(np.random.default_rng(0).uniform(-1, 1, (8, 4)).astype(np.float32))
    model.policy.compute_dtype = th.bfloat16
    with th.no_grad():
        values = model.policy.predict_values(obs)
        distribution = model.policy.get_distribution(obs)
        expected = reference.policy.predict_values(obs)
    assert values.dtype == th.float32 and distribution.distribution.logits.dtype == th.float32
    th.testing.assert_close(values, expected, rtol=0.05, atol=0.05)
    # Between train() calls (rollouts, predict) the policy runs at the rollout precision, after an iteration without
    # an aux phase too (regression: the policy phase's precision used to stay on for the next rollout)
    expected_dtype = th.bfloat16 if precision == "bf16" or precision.get("rollout") == "bf16" else th.float32
    model.learn(16)
    assert model.n_aux_phases == 0 and model.policy.compute_dtype == expected_dtype
    model.learn(16, reset_num_timesteps=False)
    assert model.n_aux_phases == 1 and model.policy.compute_dtype == expected_dtype
    assert all(th.isfinite(p).all() for p in model.policy.parameters())


@pytest.mark.parametrize("amx", [True, False])
def test_auto_precision(monkeypatch, tmp_path, amx):
    """
    The default, "auto": bf16 in every phase (rollouts, policy and aux phases) for a convolutional extractor on a CPU
    with AMX; fp32 for an MLP extractor, without AMX, and on CUDA (not measured yet). A saved model resolves it again on
    load.
    """
    monkeypatch.setattr("sb3_ppg.common.precision.cpu_has_amx", lambda: amx)
    images = FakeImageEnv(screen_height=16, screen_width=16, n_channels=3, discrete=True)
    cnn = PPG("ProcgenCnn", images, n_steps=8, batch_size=8, policy_kwargs=dict(features_extractor_kwargs=dict(channels=(4,))))
    mlp = PPG("MlpPolicy", "CartPole-v1", n_steps=8, batch_size=8)
    assert cnn.precision == mlp.precision == "auto"
    auto_bf16, all_fp32 = dict.fromkeys(PHASES, "bf16"), dict.fromkeys(PHASES, "fp32")
    assert cnn.phase_precision == (auto_bf16 if amx else all_fp32)
    assert mlp.phase_precision == all_fp32
    assert cnn.policy.compute_dtype == (th.bfloat16 if amx else th.float32)  # rollouts and predict()
    assert mlp.policy.compute_dtype == th.float32
    assert resolve_precision("auto", "cuda", convolutional=True) == dict.fromkeys(PHASES, th.float32)
    # An explicit precision is used as given
    assert PPG("ProcgenCnn", images, n_steps=8, precision="fp32").phase_precision == all_fp32
    cnn.save(tmp_path / "cnn")
    monkeypatch.setattr("sb3_ppg.common.precision.cpu_has_amx", lambda: not amx)
    loaded = PPG.load(tmp_path / "cnn", env=images)
    assert loaded.precision == "auto"
    assert loaded.phase_precision == (all_fp32 if amx else auto_bf16)  # this machine's answer now


@pytest.mark.parametrize(
    "precision, message",
    [("fp16", "'fp16' .* is not one of"), ({"rollouts": "bf16"}, "unknown phases"), (16, "must be 'auto', 'fp32'")],
)
def test_invalid_precision(make_model, precision, message):
    with pytest.raises(ValueError, match=message):
        make_model(precision=precision)


def test_float64_policy_trains_in_float64(make_model):
    """
    model.policy.to(th.float64) trains end to end in float64: rollouts, policy phase, old policy, auxiliary phase. The
    observations are preprocessed in float64 and pi_old is stored in float64 (no float32 rounding on the way).
    """
    model = make_model("CartPole-v1", n_envs=2, n_aux_epochs=2)
    model.policy.to(th.float64)
    model.learn(16 * 2)  # one iteration: the auxiliary buffer holds it, the phase waits for a second one
    model._compute_old_distributions()
    stored = model.aux_buffer.old_distribution_params[: model.n_envs]
    assert stored.dtype == th.float64
    observations = model.aux_buffer.observations[: model.n_envs].reshape(-1, 4)
    with th.no_grad():
        logits = model.policy.get_distribution(observations).distribution.logits
    assert logits.dtype == th.float64
    assert th.equal(stored.reshape(-1, 2), logits)
    assert th.any(stored != stored.float())  # float64 values, not float32 ones stored in float64
    initial = params_of(model.policy)
    model.learn(16 * 2, reset_num_timesteps=False)
    assert model.n_aux_phases == 1
    assert not same_params(initial, params_of(model.policy))
    assert all(parameter.dtype == th.float64 and th.isfinite(parameter).all() for parameter in model.policy.parameters())
    for optimizer in model._optimizers():
        assert all(state["exp_avg"].dtype == th.float64 for state in optimizer.state.values())
