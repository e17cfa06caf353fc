"""The constructor's validation and hostile inputs: invalid, wrong-typed, negative or non-finite values and schedules,
malformed ``net_arch``, NaN observations, non-finite gradients and oversized auxiliary buffers, each refused with an
error naming the fix."""

import os
import re

import gymnasium as gym
import numpy as np
import pytest
import torch as th

from sb3_ppg import PPG

# Many tests here train less than one auxiliary phase on purpose (the state they check comes before it): the warning
# that learn() then trains as plain PPO is meant
pytestmark = pytest.mark.filterwarnings(r"ignore:learn\(total_timesteps=.*this learn\(\) trains as plain PPO")

INTEGER_HYPERPARAMETERS = (
    "n_steps",
    "batch_size",
    "n_epochs",
    "n_value_epochs",
    "n_policy_iters",
    "n_aux_epochs",
    "aux_batch_rollouts",
    "n_aux_grad_accum",
)


#: The integer hyperparameters whose documented default is None
NONE_DEFAULTS = ("batch_size", "n_value_epochs")


def test_invalid_hyperparameters_raise_clear_errors(make_model):
    cases = [
        (dict(n_policy_iters=0), "n_policy_iters must be >= 1 when n_aux_epochs > 0"),
        (
            dict(aux_batch_rollouts=3),
            r"aux_batch_rollouts=3 is larger than the auxiliary buffer \(n_policy_iters \* n_envs = 2 \* 1 = 2",
        ),
        (dict(n_epochs=0), "n_epochs must be >= 1"),
        (dict(gamma=1.5), "gamma must be in"),
        (dict(normalize_advantage="sometimes"), "normalize_advantage must be one of"),
        (dict(clip_range=0.0), "pass None to disable clipping"),
        (dict(max_grad_norm=0.0), "pass None to disable gradient clipping"),
        (dict(ent_coef=-0.1), "ent_coef must be a number >= 0"),
        (dict(n_aux_grad_accum=0), "n_aux_grad_accum must be >= 1"),
        (dict(n_aux_epochs=-1), "n_aux_epochs must be >= 0"),
        (dict(policy_kwargs=dict(arch="quad")), "Unknown PPG arch 'quad'"),
        (dict(value_clipping="min"), r"value_clipping must be one of \('sb3', 'max'\), got 'min'"),
        (dict(policy_minibatches="rows"), r"policy_minibatches must be one of \('transitions', 'envs'\), got 'rows'"),
        (
            dict(policy_minibatches="envs", batch_size=8),
            r"policy_minibatches='envs' .* batch_size must be a multiple of n_steps, got batch_size=8: use e.g. "
            r"batch_size=16 \(1 env\(s\) per minibatch\)",
        ),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            make_model(**kwargs)
    # n_policy_iters does not matter without an aux phase
    assert make_model(n_policy_iters=0, n_aux_epochs=0).aux_buffer is None
    # Several problems are reported together
    with pytest.raises(ValueError, match=r"(?s)n_epochs.*gamma"):
        make_model(n_epochs=0, gamma=2.0)
    with pytest.warns(UserWarning, match="not a multiple of batch_size"):
        make_model(batch_size=5)
    # A minibatch larger than the rollout: SB3's PPO warns and trains on the whole rollout, and so does PPG
    with pytest.warns(UserWarning, match=r"batch_size=1000 is larger than the rollout .* Pass batch_size=None"):
        make_model(batch_size=1000)
    with pytest.warns(UserWarning, match="n_envs=3 is not a multiple of the 2 envs per minibatch"):
        make_model("CartPole-v1", n_envs=3, policy_minibatches="envs", batch_size=32)


@pytest.mark.parametrize(
    "name, value",
    [
        (name, value)
        for name in INTEGER_HYPERPARAMETERS
        for value in (2.5, "256", True, None, [4])
        if not (value is None and name in NONE_DEFAULTS)
    ],
)
def test_non_integer_hyperparameters_are_named(make_model, name, value):
    with pytest.raises(ValueError, match=rf"{name} must be an integer, got {re.escape(repr(value))}"):
        make_model(**{name: value})


def test_none_means_the_default_of_batch_size_and_n_value_epochs(make_model):
    model = make_model("CartPole-v1", n_envs=2, batch_size=None, n_epochs=3, n_value_epochs=None)
    assert model.batch_size == 2 * 16 // 8  # 8 minibatches of the rollout
    assert model.n_value_epochs == 3 and model.value_optimizer is None  # joint value and policy epochs


def test_numpy_integers_are_accepted_as_python_ints(make_model):
    model = make_model(**{name: np.int64(value) for name, value in dict(n_steps=16, batch_size=8, n_epochs=2).items()})
    assert type(model.n_steps) is int and type(model.batch_size) is int and type(model.n_epochs) is int
    model.learn(32)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(learning_rate=-1e-3), "learning_rate must be a number >= 0, got -0.001"),
        (dict(aux_learning_rate=-1e-3), "aux_learning_rate must be a number >= 0, got -0.001"),
        (dict(learning_rate=float("nan")), "learning_rate must be a number >= 0, got nan"),
        (dict(learning_rate="3e-4"), "learning_rate must be a number, a schedule"),
        (dict(gamma="0.99"), r"gamma must be in \[0, 1\], got '0.99'"),
        (dict(ent_coef=float("inf")), "ent_coef must be a number >= 0, got inf"),
        (dict(clip_range="0.2"), "clip_range must be a number, a schedule"),
        (dict(max_grad_norm="0.5"), "max_grad_norm must be a number or None"),
        (dict(target_kl=-0.01), "target_kl must be a number > 0"),
    ],
)
def test_bad_float_hyperparameters(make_model, kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_model(**kwargs)


@pytest.mark.parametrize("name", ["learning_rate", "aux_learning_rate", "clip_range", "clip_range_vf"])
@pytest.mark.parametrize("bad", [-0.1, float("nan"), float("inf")])
def test_schedule_with_bad_value_stops_at_phase_start(make_model, name, bad):
    # Fine at the start (progress 1), bad once training has progressed
    model = make_model(**{name: lambda progress: 1e-3 if progress == 1 else bad})
    before = [p.detach().clone() for p in model.policy.parameters()]
    with pytest.raises(ValueError, match=rf"The {name} schedule returned {bad!r} at progress_remaining=.*Fix the function"):
        model.learn(4 * 16)
    if name != "aux_learning_rate":
        # Stopped at the start of the policy phase, before any update with the bad value
        assert all(th.equal(a, b) for a, b in zip(before, model.policy.parameters(), strict=True))


def test_schedules_reaching_zero_are_fine(make_model):
    model = make_model(learning_rate=lambda p: 1e-3 * p, clip_range=lambda p: 0.2 * p, clip_range_vf=lambda p: p)
    model.learn(64)
    # The last iteration ran at progress 0: a learning rate and clip ranges of 0, accepted
    assert model.num_timesteps == 64 and model.n_aux_phases == 2
    assert model.policy.optimizer.param_groups[0]["lr"] == 0.0
    logged = model.logger.name_to_value
    assert logged["train/clip_range"] == 0.0 and logged["train/clip_range_vf"] == 0.0
    assert all(th.isfinite(parameter).all() for parameter in model.policy.parameters())


def test_schedules_are_evaluated_at_progress_zero_after_the_total(make_model):
    # Regression: the last rollout (16 steps) ends at 48 > 40 steps, where SB3's progress_remaining is -0.2 and a
    # linear schedule is negative; PPG evaluates schedules at max(progress_remaining, 0)
    seen = []

    def learning_rate(progress: float) -> float:
        seen.append(progress)
        return 1e-3 * progress

    model = make_model(learning_rate=learning_rate, clip_range=lambda p: 0.2 * p, aux_learning_rate=lambda p: 1e-3 * p)
    model.learn(40)
    assert model.num_timesteps == 48 and model.n_aux_phases == 1
    assert min(seen) == 0.0 and model._current_progress_remaining == 0.0
    assert model.policy.optimizer.param_groups[0]["lr"] == 0.0


def test_valid_integer_and_float_types_still_train(make_model):
    model = make_model(gamma=np.float32(0.99), ent_coef=0, learning_rate=np.float64(1e-3), n_aux_epochs=np.int32(1))
    before = [parameter.detach().clone() for parameter in model.policy.parameters()]
    model.learn(32)
    # The NumPy integer is a Python int; the NumPy floats are used as the numbers they are
    assert type(model.n_aux_epochs) is int and model.gamma == np.float32(0.99)
    assert model.policy.optimizer.param_groups[0]["lr"] == pytest.approx(1e-3)
    assert model.num_timesteps == 32 and model.n_aux_phases == 1
    assert not all(th.equal(a, b) for a, b in zip(before, model.policy.parameters(), strict=True))


OBS_SPACE = gym.spaces.Box(-1, 1, (4,), np.float32)


def make_policy(**kwargs):
    from sb3_ppg.ppg.policies import PPGPolicy

    return PPGPolicy(OBS_SPACE, gym.spaces.Discrete(2), lambda _: 1e-3, **kwargs)


@pytest.mark.parametrize(
    "net_arch, message",
    [
        (dict(pi=[64], qf=[64]), r"unknown keys \['qf'\]: the valid keys are 'pi' .* and 'vf'"),
        (dict(pii=[64]), r"unknown keys \['pii'\]"),
        ([64, "64"], r"net_arch=\[64, '64'\] holds invalid layer sizes \['64'\]: each must be a positive int"),
        ([64, -8], r"invalid layer sizes \[-8\]"),
        ([0], r"invalid layer sizes \[0\]"),
        ([64.0], r"invalid layer sizes \[64.0\]"),
        ([[64, 64]], r"invalid layer sizes \[\[64, 64\]\]"),
        (dict(pi=64), r"net_arch\['pi'\] must be a list of layer sizes"),
        (dict(pi=[64], vf=[True]), r"net_arch\['vf'\]=\[True\] holds invalid layer sizes"),
        (64, "net_arch must be a list of layer sizes"),
        ("64,64", "net_arch must be a list of layer sizes"),
        ([64, dict(pi=[32])], r"mixes layer sizes and a dict .* would be dropped"),
        ([dict(pi=[32]), 64], r"mixes layer sizes and a dict .* would be dropped"),
        ([dict(pi=[32]), dict(vf=[32])], r"mixes layer sizes and a dict"),
    ],
)
def test_malformed_net_arch_is_refused(net_arch, message):
    with pytest.raises(ValueError, match=message):
        make_policy(net_arch=net_arch)


def test_old_net_arch_format_warns_like_ppo_and_keeps_the_dict():
    with pytest.warns(UserWarning, match="shared layers in the mlp_extractor are removed since SB3 v1.8.0"):
        policy = make_policy(net_arch=[dict(pi=[8], vf=[4])])
    assert policy.mlp_extractor.latent_dim_pi == 8 and policy.mlp_extractor.latent_dim_vf == 4


def test_valid_net_arch_forms():
    assert make_policy(net_arch=(np.int64(8), 4)).net_arch == [8, 4]
    assert make_policy(net_arch=dict(vf=[8])).mlp_extractor.latent_dim_pi == 4  # no policy layers: the features
    assert make_policy(net_arch=[]).mlp_extractor.latent_dim_vf == 4


@pytest.mark.parametrize(
    "share, arch, expected",
    [
        (None, None, "dual"),
        (False, None, "dual"),
        (True, None, "shared"),
        (True, "detach", "detach"),
        (None, "shared", "shared"),
    ],
)
def test_share_features_extractor_selects_the_arch_like_ppo(share, arch, expected):
    policy = make_policy(share_features_extractor=share, arch=arch)
    assert policy.arch == expected
    assert policy.share_features_extractor == (expected != "dual")


def test_share_features_extractor_contradicting_arch_is_an_error():
    with pytest.raises(ValueError, match="share_features_extractor=False contradicts arch='shared'"):
        make_policy(share_features_extractor=False, arch="shared")
    with pytest.raises(ValueError, match=r"(?s)would be unused.*share_features_extractor=False"):
        make_policy(share_features_extractor=True, net_arch=dict(pi=[8], vf=[8]))


def test_shared_extractor_model_saves_and_loads(tmp_path, make_model):
    model = make_model(policy_kwargs=dict(share_features_extractor=True, net_arch=[8]))
    assert model.policy.arch == "shared"
    model.save(tmp_path / "model")
    assert PPG.load(tmp_path / "model").policy.arch == "shared"


class BadObservationEnv(gym.ObservationWrapper):
    """Observations become ``value`` (NaN or inf) from the ``after``-th one on."""

    def __init__(self, env: gym.Env, value: float, after: int = 5):
        super().__init__(env)
        self.value, self.after, self.count = value, after, 0

    def observation(self, obs):
        self.count += 1
        return np.full_like(obs, self.value) if self.count > self.after else obs


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_non_finite_observations_name_the_fix(make_model, env_id, value):
    model = make_model(BadObservationEnv(gym.make(env_id), value))
    with pytest.raises(ValueError, match=r"The observation holds NaN or inf values.*VecCheckNan"):
        model.learn(64)
    with pytest.raises(ValueError, match=r"The observation holds NaN or inf values.*VecCheckNan"):
        model.predict(np.full(model.observation_space.shape, value, np.float32))


def test_non_finite_dict_observation_names_the_key():
    from sb3_ppg.common.preprocessing import check_finite_observations

    obs = {"image": th.zeros(2, 3, 4, 4, dtype=th.uint8), "vector": th.tensor([[0.0, np.nan]])}
    with pytest.raises(ValueError, match="Observation key 'vector' holds NaN or inf"):
        check_finite_observations(obs)
    check_finite_observations({"image": obs["image"], "vector": th.zeros(2, 2)})


def test_integer_observations_are_not_scanned(monkeypatch):
    from sb3_ppg.common import preprocessing

    calls = []
    monkeypatch.setattr(preprocessing.th, "isfinite", lambda tensor: calls.append(tensor) or th.ones((), dtype=th.bool))
    preprocessing.check_finite_observations(th.zeros(8, 3, 64, 64, dtype=th.uint8))
    assert calls == []
    preprocessing.check_finite_observations(th.zeros(8, 4))
    assert len(calls) == 1


@pytest.mark.parametrize("max_grad_norm", [None, 0.5])
@pytest.mark.parametrize("phase, head", [("policy", "action_net"), ("auxiliary", "aux_value_net")])
def test_non_finite_gradients_of_a_finite_loss_never_reach_the_weights(make_model, max_grad_norm, phase, head):
    model = make_model(max_grad_norm=max_grad_norm)
    # The aux value head only learns in the auxiliary phase: its gradient turns NaN there, the action head's at once
    getattr(model.policy, head).weight.register_hook(lambda grad: grad * float("nan"))
    before = {name: param.detach().clone() for name, param in model.policy.named_parameters()}
    with pytest.raises(FloatingPointError, match=rf"{phase}-phase gradients have a non-finite norm \(nan\) at timestep"):
        model.learn(4 * 16)
    after = dict(model.policy.named_parameters())
    if phase == "policy":
        assert all(th.equal(before[name], after[name]) for name in before)
    assert all(th.isfinite(param).all() for param in after.values())
    # The bad gradients are cleared: nothing leaks into a later step
    assert all(param.grad is None for param in after.values())


@pytest.mark.parametrize(
    "observation_space, action_space",
    [
        (gym.spaces.Box(0, 255, (8, 8, 3), np.uint8), gym.spaces.Discrete(15)),
        (gym.spaces.Box(-1, 1, (5,), np.float32), gym.spaces.Box(-1, 1, (2,), np.float32)),
        (gym.spaces.Discrete(4), gym.spaces.MultiBinary(3)),
        (
            gym.spaces.Dict(a=gym.spaces.Box(-1, 1, (2, 3)), b=gym.spaces.MultiDiscrete([2, 3])),
            gym.spaces.MultiDiscrete([2, 4]),
        ),
    ],
)
def test_aux_buffer_memory_estimate_is_exact(observation_space, action_space):
    from sb3_ppg.common.aux_buffer import AuxiliaryBuffer

    buffer = AuxiliaryBuffer(3, 5, 2, observation_space, action_space, device="cpu")
    assert AuxiliaryBuffer.estimate_nbytes(3, 5, 2, observation_space, action_space) == buffer.nbytes


def test_aux_buffer_larger_than_the_machine_is_refused_up_front(make_model):
    from sb3_ppg.common.aux_buffer import memory_info

    if memory_info()[1] is None:
        pytest.skip("the machine's memory is unknown here (no /proc/meminfo)")
    # About 400 TiB: never allocated (numpy would fail with a MemoryError naming no hyperparameter)
    with pytest.raises(
        ValueError,
        match=r"auxiliary buffer needs .* GiB \(n_policy_iters \* n_envs \* n_steps = "
        r"1000000000000 \* 1 \* 16 steps of 28 bytes\), more than this machine's .*reduce n_policy_iters",
    ):
        make_model(n_policy_iters=10**12)


def test_aux_buffer_memory_against_available_and_total(monkeypatch, make_model):
    from sb3_ppg.common import aux_buffer

    # CartPole, 16 steps, N_pi 2: 2 * 16 * 28 = 896 bytes
    monkeypatch.setattr(aux_buffer, "memory_info", lambda: (800, 10_000))
    with pytest.warns(UserWarning, match="more than the .* GiB of memory available now"):
        make_model()
    monkeypatch.setattr(aux_buffer, "memory_info", lambda: (800, 800))
    with pytest.raises(ValueError, match="more than this machine's"):
        make_model()
    monkeypatch.setattr(aux_buffer, "memory_info", lambda: (None, None))
    make_model()
    # set_env with more envs is checked before anything changes
    monkeypatch.setattr(aux_buffer, "memory_info", lambda: (None, 1000))
    model = make_model()
    from stable_baselines3.common.env_util import make_vec_env

    with pytest.raises(ValueError, match=r"n_policy_iters \* n_envs \* n_steps = 2 \* 2 \* 16"):
        model.set_env(make_vec_env("CartPole-v1", n_envs=2))
    assert model.n_envs == 1 and model.aux_buffer.n_envs == 1


def test_memory_info_reads_this_machine():
    from sb3_ppg.common.aux_buffer import memory_info

    if not os.path.isfile("/proc/meminfo"):
        pytest.skip("no /proc/meminfo here: memory_info() knows nothing")
    available, total = memory_info()
    assert total is not None and available is not None
    assert available > 0 and total > 0  # (a cgroup limit may make the total the smaller one)


def test_one_sample_rollouts_need_no_advantage_normalization():
    with pytest.raises(ValueError, match=r"n_steps \* n_envs must be > 1 with normalize_advantage='batch'"):
        PPG("MlpPolicy", "Pendulum-v1", n_steps=1)
    # As SB3's PPO: allowed without advantage normalization
    PPG("MlpPolicy", "Pendulum-v1", n_steps=1, batch_size=1, normalize_advantage=False, n_policy_iters=4).learn(8)


# ----------------------------------------------------------------------------------------------------------------------
# Procgen: options that would make procgen exit the process, and closed envs


def test_bad_resource_root_is_refused_before_procgen_exits_the_process(tmp_path):
    from sb3_ppg.procgen import ProcgenGymnasiumEnv, ProcgenVecEnv
    from sb3_ppg.procgen.backend import ASSETS_DIR

    with pytest.raises(ValueError, match="is not a folder"):
        ProcgenVecEnv(1, "starpilot", resource_root=str(tmp_path / "missing"))
    # A folder without procgen's layout: the first missing asset is named
    with pytest.raises(ValueError, match=r"lacks procgen's asset '.+\.png'.*copy the whole asset folder"):
        ProcgenGymnasiumEnv("starpilot", resource_root=str(tmp_path))
    with pytest.raises(ValueError, match="must be a folder name"):
        ProcgenVecEnv(1, "starpilot", resource_root=3)
    # procgen's own folder, given without the trailing separator procgen needs, works
    env = ProcgenVecEnv(1, "starpilot", resource_root=ASSETS_DIR.rstrip("/"))
    assert env.procgen_kwargs["resource_root"] == ASSETS_DIR
    env.reset()
    env.step(np.zeros(1, dtype=np.int64))
    env.close()


def test_closed_procgen_envs_say_so():
    from sb3_ppg.procgen import ProcgenGymnasiumEnv, ProcgenVecEnv

    vec_env = ProcgenVecEnv(2, "starpilot")
    vec_env.reset()
    vec_env.close()
    vec_env.close()  # twice is harmless
    for use in (vec_env.reset, lambda: vec_env.step(np.zeros(2, dtype=np.int64)), vec_env.get_env_states):
        with pytest.raises(RuntimeError, match=r"ProcgenVecEnv \(starpilot\) was closed.*build a new env"):
            use()
    env = ProcgenGymnasiumEnv("starpilot")
    env.close()
    for use in (env.reset, lambda: env.step(0)):
        with pytest.raises(RuntimeError, match=r"ProcgenGymnasiumEnv \(starpilot\) was closed"):
            use()


def test_procgen_resume_with_other_games_is_refused_before_their_states_are_set(tmp_path, make_model):
    """Resuming a Procgen checkpoint on other levels would train on silently, on another game procgen's C++
    assertion would end the process: the saved settings are compared first, naming both values."""
    from sb3_ppg import PPGCheckpointCallback, make_procgen_env

    def make(env_name: str = "starpilot", **kwargs):
        return make_procgen_env(env_name, n_envs=2, seed=1, num_threads=1, **kwargs)

    policy_kwargs = dict(arch="detach", features_extractor_kwargs=dict(channels=(4, 4, 4), features_dim=16))
    model = make_model(make(), "ProcgenCnn", policy_kwargs, n_steps=8, batch_size=8, seed=3)
    model.learn(16, callback=PPGCheckpointCallback(8, str(tmp_path), name_prefix="ppg"))
    for env_name, kwargs, message in (
        ("starpilot", dict(distribution_mode="hard"), "distribution_mode='hard' in the env, 'easy' in the checkpoint"),
        ("starpilot", dict(num_levels=10), "num_levels=10 in the env, 0 in the checkpoint"),
        ("starpilot", dict(start_level=5, use_backgrounds=False), "start_level=5 .*; use_backgrounds=False in the env"),
        ("coinrun", dict(), "env_name='coinrun' in the env, 'starpilot' in the checkpoint"),
    ):
        with pytest.raises(ValueError, match=rf"games differ \(.*{message}") as error:
            PPG.load_checkpoint(tmp_path, env=make(env_name, **kwargs))
        assert "damaged" not in str(error.value)
    # The same games (another seed, thread count and asset folder path) resume
    from sb3_ppg.procgen.backend import ASSETS_DIR

    resumed = PPG.load_checkpoint(tmp_path, env=make_procgen_env("starpilot", n_envs=2, seed=9, resource_root=ASSETS_DIR))
    resumed.learn(16, reset_num_timesteps=False)
    assert resumed.num_timesteps == 32
