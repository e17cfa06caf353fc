"""
The defaults that change what PPG computes, pinned to the references (issue 54): each expected value below is a constant
copied from the paper's code (``openai/phasic-policy-gradient`` @ 7295473, "ORIG"), CleanRL's ``ppg_procgen.py``
(@ fe8d8a03, "CRL") or SB3's PPO, with the place it comes from, never from this package's output. These tests compare
values and float64 losses (to 1e-12: float64 rounding of the same few operations), so they fail on every CPU and torch
build when a default changes, not only where a golden checksum was recorded.

``tests/test_fidelity.py::test_original_code_with_the_defaults`` then replays the original code's recorded updates with
the constructor's defaults (not a preset's), and ``docs/ppg.md`` (Hyperparameters) lists the same values.
"""

import inspect

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from stable_baselines3.common.type_aliases import RolloutBufferSamples
from stable_baselines3.common.vec_env import DummyVecEnv

from sb3_ppg import PPG
from sb3_ppg.common.aux_buffer import AuxiliaryBufferSamples
from sb3_ppg.common.reward_normalization import RolloutRewardNormalizer

#: The constructor's defaults that change what is computed: (value, where the value comes from)
COMPUTING_DEFAULTS = {
    "learning_rate": (5e-4, "ORIG train.py train_fn(lr=5e-4)"),
    "n_steps": (256, "ORIG ppo.py learn(nstep=256)"),
    "batch_size": (None, "ORIG train.py train_fn(nminibatch=8): 8 minibatches per rollout"),
    "policy_minibatches": ("transitions", "CRL ppg_procgen.py: np.random.shuffle(b_inds) over the flat batch"),
    "n_epochs": (1, "ORIG train.py train_fn(n_epoch_pi=1)"),
    "n_value_epochs": (None, "ORIG train.py train_fn(n_epoch_vf=1) = n_epoch_pi: joint epochs"),
    "gamma": (0.999, "ORIG train.py train_fn(gamma=.999)"),
    "gae_lambda": (0.95, "ORIG train.py ppo_hps(λ=0.95)"),
    "clip_range": (0.2, "ORIG train.py train_fn(clip_param=.2)"),
    "clip_range_vf": (None, "ORIG ppo.py compute_losses: vfcoef * ((vpred - vtarg) ** 2).mean(), unclipped"),
    "value_clipping": ("sb3", "SB3's PPO: the clipped prediction's MSE (only with clip_range_vf)"),
    "normalize_advantage": ("batch", "ORIG ppo.py compute_advantage: (adv - mean) / (sqrt(var) + 1e-8), whole batch"),
    "ent_coef": (0.01, "ORIG ppo.py learn(entcoef=0.01)"),
    "vf_coef": (0.5, "ORIG ppo.py learn(vfcoef=0.5), times the plain mean squared error"),
    "max_grad_norm": (None, "ORIG ppo.py and ppg.py: opt.step() without gradient clipping"),
    "kl_coef": (0.0, "ORIG train.py train_fn(kl_penalty=0.0)"),
    "n_policy_iters": (32, "ORIG train.py train_fn(n_pi=32)"),
    "n_aux_epochs": (6, "ORIG train.py train_fn(n_aux_epochs=6)"),
    "aux_batch_rollouts": (4, "ORIG train.py train_fn(aux_mbsize=4)"),
    "beta_clone": (1.0, "ORIG train.py train_fn(beta_clone=1.0)"),
    "vf_true_coef": (1.0, "ORIG train.py train_fn(vf_true_weight=1.0)"),
    "aux_learning_rate": (None, "ORIG train.py train_fn(aux_lr=5e-4) = lr"),
    "separate_aux_optimizer": (True, "ORIG ppg.py learn: aux_state = th.optim.Adam(model.parameters(), lr=aux_lr)"),
    "n_aux_grad_accum": (1, "ORIG ppg.py aux_train: one step per minibatch (CRL n_aux_grad_accum=1)"),
    "target_kl": (None, "ORIG ppo.py learn: no early stopping"),
    "use_sde": (False, "SB3's PPO"),
    "normalize_reward": (False, "CleanRL ppg_procgen.py: rewards normalized by env wrappers, not the algorithm"),
    "reward_normalizer_kwargs": (None, "ORIG reward_normalizer.py RewardNormalizer: see REWARD_NORMALIZER_DEFAULTS"),
}
#: ORIG reward_normalizer.py RewardNormalizer(gamma=0.99, cliprew=10.0, epsilon=1e-8): normalize_reward's settings
REWARD_NORMALIZER_DEFAULTS = {"gamma": 0.99, "clip_reward": 10.0, "epsilon": 1e-8}
#: The constructor's arguments that do not change what is computed (the same results: docs/ppg.md), or that say what
#: to run on
NOT_COMPUTING = {
    "policy",
    "env",
    "aux_buffer_device",
    "cuda_graphs",
    "parallel_networks",
    "micro_batch_size",
    "precision",  # bf16 where it is fast; tests/test_ppg.py::test_bf16_precision_trains_and_stays_close
    "sde_sample_freq",
    "rollout_buffer_class",
    "rollout_buffer_kwargs",
    "stats_window_size",
    "tensorboard_log",
    "policy_kwargs",
    "verbose",
    "seed",
    "device",
    "_init_setup_model",
    "kwargs",  # refused: the options removed from PPG, each with what replaced it
}
#: ORIG's Adam: th.optim.Adam(params, lr=lr) in ppo.py learn and ppg.py learn, torch's eps
ADAM_EPS = 1e-8
#: ORIG train.py train_fn(nminibatch=8)
N_MINIBATCHES = 8
#: ORIG train.py train_fn(arch="dual"); ppg.py PhasicValueModel: the detach arch detaches in every phase
POLICY_DEFAULTS = {"arch": ("dual", "ORIG train.py train_fn(arch='dual')"), "detach_value_in_aux": (True, "ORIG ppg.py")}
#: float64 rounding of the same few operations on both sides
EXACT = 1e-12


def test_every_argument_is_classified():
    """A new constructor argument says here whether it changes what is computed (and then where its default is from)."""
    arguments = set(inspect.signature(PPG.__init__).parameters) - {"self"}
    assert arguments == set(COMPUTING_DEFAULTS) | NOT_COMPUTING, arguments ^ (set(COMPUTING_DEFAULTS) | NOT_COMPUTING)
    assert not set(COMPUTING_DEFAULTS) & NOT_COMPUTING


@pytest.mark.parametrize("name", sorted(COMPUTING_DEFAULTS))
def test_constructor_default_is_the_references(name):
    """Each default that changes what is computed is the reference's value named in ``COMPUTING_DEFAULTS``."""
    expected, source = COMPUTING_DEFAULTS[name]
    assert inspect.signature(PPG.__init__).parameters[name].default == expected, source


def test_reward_normalizer_defaults_are_the_original_codes():
    """``normalize_reward``'s settings without ``reward_normalizer_kwargs``: the original code's ``RewardNormalizer``."""
    parameters = inspect.signature(RolloutRewardNormalizer.__init__).parameters
    assert {name: parameters[name].default for name in REWARD_NORMALIZER_DEFAULTS} == REWARD_NORMALIZER_DEFAULTS


def test_policy_defaults_are_the_papers():
    """``ProcgenCnn``'s architecture defaults: the paper's two networks, the value head detached in every phase."""
    signature = inspect.signature(PPG.policy_aliases["ProcgenCnn"].__init__)
    model = default_model(image=True)
    assert model.policy.arch == POLICY_DEFAULTS["arch"][0], POLICY_DEFAULTS["arch"][1]
    assert model.policy.detach_value_in_aux == POLICY_DEFAULTS["detach_value_in_aux"][0]
    assert signature.parameters["normed_init"].default and not signature.parameters["ortho_init"].default


class TinyImageEnv(gym.Env):
    """8x8x3 uint8 frames and 15 actions, as the fidelity fixtures' (never stepped)."""

    observation_space = gym.spaces.Box(0, 255, (8, 8, 3), np.uint8)
    action_space = gym.spaces.Discrete(15)


def default_model(image: bool = False, n_envs: int = 4) -> PPG:
    """A PPG with every default that changes what is computed (4 envs), in float64 on the CPU."""
    if image:
        env = DummyVecEnv([TinyImageEnv] * n_envs)
        kwargs = dict(policy_kwargs=dict(features_extractor_kwargs=dict(channels=(4,), features_dim=8)))
        model = PPG("ProcgenCnn", env, device="cpu", seed=0, precision="fp32", **kwargs)
    else:
        model = PPG("MlpPolicy", DummyVecEnv([lambda: gym.make("CartPole-v1")] * n_envs), device="cpu", seed=0)
    model.policy.to(th.float64)
    return model


def test_default_model_settings_are_the_references():
    """What the defaults resolve to once built: minibatches, optimizers, schedules, the auxiliary buffer's size."""
    model = default_model()
    n_envs, n_steps = 4, COMPUTING_DEFAULTS["n_steps"][0]
    assert model.batch_size == n_envs * n_steps // N_MINIBATCHES
    assert model.n_value_epochs == COMPUTING_DEFAULTS["n_epochs"][0]  # joint epochs, one optimizer
    assert model.value_optimizer is None
    assert model.clip_range(1.0) == model.clip_range(0.0) == 0.2 and model.clip_range_vf is None
    assert model.lr_schedule(1.0) == model.lr_schedule(0.0) == 5e-4  # ORIG: constant learning rate
    assert model.aux_optimizer is not None and model.aux_optimizer is not model.policy.optimizer
    for optimizer in (model.policy.optimizer, model.aux_optimizer):
        assert isinstance(optimizer, th.optim.Adam)
        assert [group["lr"] for group in optimizer.param_groups] == [5e-4]  # ORIG lr and aux_lr
        assert [group["eps"] for group in optimizer.param_groups] == [ADAM_EPS]
        assert [group["betas"] for group in optimizer.param_groups] == [(0.9, 0.999)]  # torch's, ORIG's
        assert {id(p) for group in optimizer.param_groups for p in group["params"]} == {
            id(p) for p in model.policy.parameters()
        }  # ORIG: both Adams over all parameters
    # ORIG: the aux phase after n_pi = 32 rollouts, on every env's rollout of them, 4 rollouts per minibatch
    assert model.aux_buffer is not None and model.aux_buffer.buffer_size == 32 * n_envs
    assert model.aux_buffer.n_steps == n_steps


def original_policy_phase_loss(values, log_prob, entropy, samples: RolloutBufferSamples) -> th.Tensor:
    """ORIG ppo.py compute_losses with learn()'s and train_fn's defaults, joint loss pi + vf (n_epoch_pi == n_epoch_vf)."""
    clip_param, vfcoef, entcoef, kl_penalty = 0.2, 0.5, 0.01, 0.0
    logratio = log_prob - samples.old_log_prob
    ratio = th.exp(logratio)
    adv = samples.advantages
    pg_losses = th.max(-adv * ratio, -adv * th.clamp(ratio, 1.0 - clip_param, 1.0 + clip_param))
    loss_pi = -entropy.mean() * entcoef + pg_losses.mean() + kl_penalty * 0.5 * (logratio**2).mean()
    loss_vf = vfcoef * ((values - samples.returns) ** 2).mean()
    return loss_pi + loss_vf


def test_default_policy_phase_loss_is_the_original_codes():
    """
    The default model's policy-phase loss on a minibatch whose ratios reach past the clip range and whose values move
    past any value clip range is ORIG's ``compute_losses`` with its defaults: clip 0.2, entropy 0.01, unclipped 0.5*MSE.
    """
    model = default_model()
    rng = np.random.default_rng(0)
    n = 64
    observations = th.as_tensor(rng.normal(size=(n, 4)))
    actions = th.as_tensor(rng.integers(0, 2, n), dtype=th.float64)
    with th.no_grad():
        values, log_prob, entropy = model.policy.evaluate_actions(observations, actions.long())
    samples = RolloutBufferSamples(
        observations=observations,
        actions=actions[:, None],
        old_values=values.flatten() + th.as_tensor(rng.choice([-1.0, 1.0], n)),  # 1 from the values: any clip matters
        old_log_prob=log_prob + th.as_tensor(rng.uniform(-0.5, 0.5, n)),  # ratios from 0.6 to 1.6
        advantages=th.as_tensor(rng.normal(size=n)),
        returns=th.as_tensor(rng.normal(size=n)),
    )
    clip_range = model._schedule_value("clip_range", 1.0)
    clip_range_vf = model._schedule_value("clip_range_vf", 1.0)
    with th.no_grad():
        loss, _ = model._joint_loss(samples, clip_range, clip_range_vf)
        expected = original_policy_phase_loss(values.flatten(), log_prob, entropy, samples)
    assert abs(loss.item() - expected.item()) <= EXACT * max(1.0, abs(expected.item())), (loss, expected)


def test_default_aux_loss_is_the_original_codes():
    """
    The default model's auxiliary loss is ORIG's ``aux_train``: ``beta_clone`` 1 times ``KL(pi_old || pi)``, plus
    ``0.5 * MSE`` of the aux value head and ``vf_true_weight`` 1 times ``0.5 * MSE`` of the true value head.
    """
    model = default_model()
    rng = np.random.default_rng(1)
    n = 64
    observations = th.as_tensor(rng.normal(size=(n, 4)))
    old_logits = th.as_tensor(rng.normal(size=(n, 2)))
    returns = th.as_tensor(rng.normal(size=n))
    batch = AuxiliaryBufferSamples(observations, returns, old_logits, np.arange(1))
    with th.no_grad():
        loss, _ = model._aux_loss(batch)
        distribution, values, aux_values = model.policy.forward_aux(observations)
        logits = distribution.distribution.logits
    old = th.distributions.Categorical(logits=old_logits)
    pol_distance = th.distributions.kl_divergence(old, th.distributions.Categorical(logits=logits)).mean()
    vf_aux = 0.5 * ((aux_values.flatten() - returns) ** 2).mean()
    vf_true = 0.5 * ((values.flatten() - returns) ** 2).mean()
    beta_clone, vf_true_weight = 1.0, 1.0  # ORIG train.py: name2coef = {"pol_distance": beta_clone, "vf_true": ...}
    expected = beta_clone * pol_distance + vf_aux + vf_true_weight * vf_true
    assert pol_distance > 0.1 and vf_true > 0.1  # each term weighs
    assert abs(loss.item() - expected.item()) <= EXACT * max(1.0, abs(expected.item())), (loss, expected)


def test_default_advantage_normalization_is_the_original_codes():
    """
    ``train()`` of the default model normalizes the rollout's advantages as ORIG's ``compute_advantage``: over the whole
    batch, the population std (``mpi_moments``), ``+ 1e-8``; not per minibatch, not with the Bessel correction.
    """
    model = default_model()
    buffer = model.rollout_buffer
    rng = np.random.default_rng(2)
    advantages = rng.normal(3.0, 2.0, buffer.advantages.shape)
    mean, var = advantages.mean(), ((advantages - advantages.mean()) ** 2).mean()
    expected = (advantages - mean) / (np.sqrt(var) + 1e-8)
    buffer.advantages = advantages.copy()
    model._normalize_advantages()
    assert np.abs(buffer.advantages - expected).max() <= EXACT
    # Once per rollout (train()), and the minibatches keep it as it is
    assert model.normalize_advantage == "batch"
    samples = buffer._get_samples(np.arange(8))
    assert model._normalize_minibatch_advantages(samples) is samples


def test_default_aux_phase_schedule_is_the_original_codes():
    """
    With the defaults, the auxiliary phase follows ORIG's ``ppg.py learn``: after ``n_pi`` = 32 rollouts, ``n_aux_epochs``
    = 6 epochs over the 32 x n_envs buffered rollouts in minibatches of ``aux_mbsize`` = 4 rollouts, one Adam step each
    (``aux_train``).
    """
    n_envs, n_steps = 2, 8  # short rollouts: n_steps does not set the schedule
    env = DummyVecEnv([lambda: gym.make("CartPole-v1")] * n_envs)
    model = PPG("MlpPolicy", env, n_steps=n_steps, device="cpu", seed=0)
    with pytest.warns(UserWarning, match="auxiliary"):
        model.learn(31 * n_envs * n_steps)
    assert model.n_aux_phases == 0
    model.learn(n_envs * n_steps, reset_num_timesteps=False)
    n_pi, n_aux_epochs, aux_mbsize = 32, 6, 4
    assert model.n_aux_phases == 1 and model._n_aux_updates == n_aux_epochs * (n_pi * n_envs // aux_mbsize)
