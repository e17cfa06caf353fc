"""
MaskablePPG: PPG with invalid action masking in sb3-contrib's MaskablePPO API. Mirrors sb3-contrib's tests of
MaskablePPO (tests/test_invalid_actions.py) on its invalid-action envs, plus what PPG adds: the masks in the auxiliary
buffer, the masked behaviour-cloning KL, the same updates as PPG without masks, checkpoints.
"""

import json

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from helpers import QUIET_CPU_RUN
from sb3_contrib.common.envs import InvalidActionEnvDiscrete, InvalidActionEnvMultiBinary, InvalidActionEnvMultiDiscrete
from sb3_contrib.common.maskable.callbacks import MaskableEvalCallback
from sb3_contrib.common.maskable.evaluation import evaluate_policy
from sb3_contrib.common.maskable.utils import get_action_masks
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.envs import IdentityEnv
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

from sb3_ppg import PPG, MaskablePPG, PPGCheckpointCallback
from sb3_ppg.ppg_mask.distributions import make_maskable_distribution, masked_kl_divergence

# Many tests here train less than one auxiliary phase on purpose (the state they check comes before it): the warning
# that learn() then trains as plain PPO is meant
pytestmark = pytest.mark.filterwarnings(r"ignore:learn\(total_timesteps=.*this learn\(\) trains as plain PPO")

# One auxiliary phase every 2 iterations of 16 steps, one-rollout aux minibatches, a 16-unit MLP (tests/helpers.py)
SMALL = dict(n_steps=16, batch_size=16, n_policy_iters=2, n_aux_epochs=1, aux_batch_rollouts=1)

# Each action space, with only the right action(s) valid: a model that acts among the valid actions scores 100
ONLY_RIGHT_ACTION = {
    "Discrete": lambda: InvalidActionEnvDiscrete(dim=20, n_invalid_actions=19),
    "MultiDiscrete": lambda: InvalidActionEnvMultiDiscrete(dims=[2, 3], n_invalid_actions=3),
    "MultiBinary": lambda: InvalidActionEnvMultiBinary(dims=3, n_invalid_actions=3),
}
SOME_INVALID = {
    "Discrete": lambda: InvalidActionEnvDiscrete(dim=20, n_invalid_actions=10),
    "MultiDiscrete": lambda: InvalidActionEnvMultiDiscrete(dims=[2, 3], n_invalid_actions=1),
    "MultiBinary": lambda: InvalidActionEnvMultiBinary(dims=3, n_invalid_actions=1),
}


def small_maskable(env, policy="MlpPolicy", seed=0, **overrides) -> MaskablePPG:
    return MaskablePPG(
        policy, env, policy_kwargs=overrides.pop("policy_kwargs", dict(net_arch=[16])), seed=seed, **{**SMALL, **overrides}
    )


def is_valid(action, masks: np.ndarray, env) -> bool:
    """Whether an action is allowed by one state's masks (sb3-contrib's layout)."""
    space = env.action_space
    if isinstance(space, gym.spaces.Discrete):
        return bool(masks[int(action)])
    sizes = list(space.nvec) if isinstance(space, gym.spaces.MultiDiscrete) else [2] * space.n
    starts = np.cumsum([0, *sizes[:-1]])
    return all(masks[start + int(choice)] for start, choice in zip(starts, np.asarray(action).ravel(), strict=True))


def count_invalid_actions(model, env, n_steps: int, use_masks: bool = True) -> int:
    """Stochastic actions on ``n_steps`` states of a gymnasium env: how many its masks refuse."""
    obs, _ = env.reset(seed=0)
    invalid = 0
    for _ in range(n_steps):
        masks = np.asarray(env.action_masks())
        action, _ = model.predict(obs, action_masks=masks if use_masks else None)
        invalid += not is_valid(action, masks, env)
        obs, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            obs, _ = env.reset()
    return invalid


def test_identity_reaches_maskable_ppo_reward():
    """sb3-contrib's performance test of MaskablePPO (test_identity): reward >= 90 of 100 after 3000 steps."""
    env = InvalidActionEnvDiscrete(dim=70, n_invalid_actions=55)
    model = MaskablePPG(
        "MlpPolicy", env, gamma=0.4, seed=32, n_steps=256, batch_size=64, n_epochs=4, n_policy_iters=4, n_aux_epochs=2,
        aux_batch_rollouts=1, learning_rate=3e-4,
    )  # fmt: skip
    model.learn(3000)
    assert model.n_aux_phases == 3
    evaluate_policy(model, env, n_eval_episodes=20, reward_threshold=90, warn=False)
    assert count_invalid_actions(model, env, 300) == 0


@pytest.mark.parametrize("space", sorted(ONLY_RIGHT_ACTION))
def test_each_action_space_learns_and_never_picks_an_invalid_action(space):
    """
    sb3-contrib's test_supports_*_action_space, with an auxiliary phase: no invalid action, and the full reward when only
    the right action is valid.
    """
    env = SOME_INVALID[space]()
    model = small_maskable(env)
    model.learn(64)
    assert model.n_aux_phases == 2
    assert count_invalid_actions(model, env, 200) == 0
    env = ONLY_RIGHT_ACTION[space]()
    model = small_maskable(env).learn(32)
    evaluate_policy(model, env, reward_threshold=99, warn=False)
    # Without masks the same model picks invalid actions (the masks are what makes it perfect)
    assert count_invalid_actions(model, env, 200, use_masks=False) > 0


def test_predict_with_and_without_masks():
    env = InvalidActionEnvDiscrete(dim=20, n_invalid_actions=19)
    model = small_maskable(env)
    obs, _ = env.reset(seed=1)
    masks = np.asarray(env.action_masks())
    # One observation (a list of booleans is fine), a batch of observations with a batch of masks
    for _ in range(20):
        action, _ = model.predict(obs, action_masks=env.action_masks())
        assert np.shape(action) == () and masks[int(action)]
    actions, _ = model.predict(np.stack([obs, obs]), action_masks=np.stack([masks, masks]), deterministic=True)
    assert actions.shape == (2,) and masks[actions].all()
    unmasked = {int(model.predict(obs)[0]) for _ in range(50)}
    assert len(unmasked) > 1  # without masks: any of the 20 actions


@pytest.mark.parametrize(
    "masks, message",
    [
        (np.ones(19, dtype=bool), "have shape (19,), expected (1, 20)"),
        (np.ones((2, 20), dtype=bool), "have shape (2, 20), expected (1, 20)"),
        (np.full(20, 0.5), "dtype float64 with values other than 0 and 1"),
        (np.array(["yes"] * 20), "dtype <U3: they must be booleans"),
        (np.zeros(20, dtype=bool), "allow no action in state(s) [0]"),
    ],
)
def test_predict_refuses_bad_masks(masks, message):
    env = InvalidActionEnvDiscrete(dim=20, n_invalid_actions=10)
    model = small_maskable(env)
    obs, _ = env.reset(seed=0)
    with pytest.raises(ValueError, match="predict\\(\\)'s action_masks") as error:
        model.predict(obs, action_masks=masks)
    assert message in str(error.value)
    # 0 / 1 integers are booleans
    assert model.predict(obs, action_masks=np.asarray(env.action_masks(), dtype=int))[0] in np.flatnonzero(env.action_masks())


def test_multidiscrete_part_without_valid_choice():
    env = InvalidActionEnvMultiDiscrete(dims=[2, 3], n_invalid_actions=1)
    model = small_maskable(env)
    obs, _ = env.reset(seed=0)
    with pytest.raises(
        ValueError, match=r"allow no action in part 1 of the action \(mask entries 2 to 4\) in state\(s\) \[0\]"
    ):
        model.predict(obs, action_masks=np.array([True, True, False, False, False]))


class BrokenMasksEnv(InvalidActionEnvDiscrete):
    """An env whose masks forbid every action after some steps."""

    def action_masks(self) -> list[bool]:
        return [self.current_step < 5] * int(self.action_space.n)


def test_env_errors_name_the_fix():
    """sb3-contrib's test_disabling_masking, with the messages: no action_masks(), masks with no valid action."""
    model = small_maskable(IdentityEnv(dim=2))
    with pytest.raises(ValueError, match=r"has none\. Wrap the env with sb3_contrib\.common\.wrappers\.ActionMasker") as error:
        model.learn(32)
    assert "learn(..., use_masking=False)" in str(error.value)
    model.learn(32, use_masking=False)
    assert model.num_timesteps == 32
    model = small_maskable(BrokenMasksEnv(dim=4))
    with pytest.raises(ValueError, match=r"the env's action_masks\(\) allow no action in state\(s\) \[0\]"):
        model.learn(32)
    model = small_maskable(make_vec_env(lambda: InvalidActionEnvDiscrete(dim=4, n_invalid_actions=1), n_envs=2))
    with pytest.raises(ValueError, match=r"have shape \(1, 4\), expected \(2, 4\)"):
        model.predict(np.array([0, 1]), action_masks=np.ones((1, 4), dtype=bool))


class WrongMasksEnv(IdentityEnv):
    """An env whose action_masks() has the wrong length (3 entries for 4 actions), or values that are not booleans."""

    def __init__(self, masks) -> None:
        super().__init__(dim=4)
        self.masks = masks

    def action_masks(self):
        return self.masks


@pytest.mark.parametrize(
    "masks, message",
    [
        ([True, True, False], r"the env's action_masks\(\) have shape \(1, 3\), expected \(1, 4\)"),
        ([0, 2, 1, 1], r"the env's action_masks\(\) .*values other than 0 and 1"),
        (["yes", "no", "no", "no"], r"the env's action_masks\(\)"),
    ],
)
def test_env_masks_of_wrong_shape_or_dtype_stop_learn(masks, message):
    """Masks from the env are checked at every step of learn(): a clear error, before any sample is stored."""
    model = small_maskable(WrongMasksEnv(masks))
    with pytest.raises(ValueError, match=message):
        model.learn(32)
    assert model.num_timesteps == 0


def test_box_action_space_refused():
    with pytest.raises(ValueError, match="MaskablePPG does not support the action space Box"):
        MaskablePPG("MlpPolicy", "Pendulum-v1")


@pytest.mark.parametrize(
    "make_env", [lambda: InvalidActionEnvDiscrete(dim=6), lambda: InvalidActionEnvMultiDiscrete(dims=[2, 3])]
)
@pytest.mark.parametrize("use_masking", [False, True])
@pytest.mark.parametrize("arch", ["dual", "detach"])
def test_same_updates_as_ppg_without_masks(make_env, use_masking, arch):
    """Without masking, or with masks that allow every action, MaskablePPG trains exactly as PPG (same seed)."""
    policy_kwargs = dict(net_arch=[16], arch=arch)
    ppg = PPG("MlpPolicy", make_env(), policy_kwargs=policy_kwargs, seed=0, **SMALL).learn(64)
    maskable = small_maskable(make_env(), policy_kwargs=policy_kwargs).learn(64, use_masking=use_masking)
    assert maskable.n_aux_phases == ppg.n_aux_phases == 2
    expected, actual = ppg.policy.state_dict(), maskable.policy.state_dict()
    assert expected.keys() == actual.keys()
    for name in expected:
        assert th.equal(expected[name], actual[name]), name


def direct_kl(old_logits: np.ndarray, logits: np.ndarray, masks: np.ndarray) -> float:
    """KL(p_old || p) of the two softmaxes renormalized on the valid actions, in float64."""
    p_old = np.where(masks, np.exp(old_logits - old_logits.max()), 0.0)
    p = np.where(masks, np.exp(logits - logits.max()), 0.0)
    p_old, p = p_old / p_old.sum(), p / p.sum()
    return float(sum(p_old[i] * np.log(p_old[i] / p[i]) for i in np.flatnonzero(masks)))


def test_masked_kl_against_a_direct_computation():
    space = gym.spaces.MultiDiscrete([4, 3])
    old_logits = th.tensor([[2.0, -1.0, 0.5, 30.0, 0.0, 1.0, -2.0], [0.1, 0.2, 0.3, 0.4, 5.0, -5.0, 0.0]], dtype=th.float64)
    logits = th.tensor([[-3.0, 1.0, 0.0, -40.0, 2.0, 0.0, 1.0], [1.0, 0.0, -1.0, 2.0, 0.0, 3.0, -1.0]], dtype=th.float64)
    # Row 0: the large logits (30, -40) are on masked actions; row 1: one valid action in the first part, all in the second
    masks = th.tensor([[True, True, True, False, True, False, True], [False, False, True, False, True, True, True]])
    logits.requires_grad_(True)
    distribution = make_maskable_distribution(space).proba_distribution(logits)
    kl = masked_kl_divergence(old_logits, distribution, masks)
    for row in range(2):
        expected = sum(
            direct_kl(old_logits[row, part].numpy(), logits[row, part].detach().numpy(), masks[row, part].numpy())
            for part in (slice(0, 4), slice(4, 7))
        )
        assert kl[row].item() == pytest.approx(expected, rel=1e-12, abs=1e-12)
    assert kl[1].item() > 0  # the second part differs
    kl.sum().backward()
    assert th.isfinite(logits.grad).all()
    # Masked actions get no gradient (up to the rounding of Categorical's normalization, which they enter)
    assert logits.grad[masks.logical_not()].abs().max() < 1e-15 * logits.grad.abs().max() + 1e-300
    # Without masks (or all-true masks): the plain KL
    plain = masked_kl_divergence(old_logits, distribution, None)
    assert th.equal(plain, masked_kl_divergence(old_logits, distribution, th.ones_like(masks)))
    expected = [direct_kl(old_logits[0, :4].numpy(), logits[0, :4].detach().numpy(), np.ones(4, bool))]
    expected.append(direct_kl(old_logits[0, 4:].numpy(), logits[0, 4:].detach().numpy(), np.ones(3, bool)))
    assert plain[0].item() == pytest.approx(sum(expected), rel=1e-12)


def test_masks_in_the_aux_buffer_and_the_masked_aux_phase():
    """The aux buffer holds every sample's masks (booleans, in nbytes), and the aux phase's KL is the masked one."""
    env = DummyVecEnv([lambda: InvalidActionEnvDiscrete(dim=10, n_invalid_actions=7)] * 2)
    model = small_maskable(env, n_policy_iters=3)
    model.learn(32)  # one iteration: stored, no aux phase yet
    buffer = model.aux_buffer
    assert buffer.action_masks.dtype == th.bool and buffer.action_masks.shape == (6, 16, 10)
    stored = buffer.action_masks[:2].numpy()
    assert (stored.sum(axis=2) == 3).all()  # 7 of 10 actions invalid in every state
    # The rollout buffer's masks, env by env (MaskablePPG's rollout buffer keeps its arrays (n_steps, n_envs, ...))
    assert not model.rollout_buffer.generator_ready
    np.testing.assert_array_equal(stored, model.rollout_buffer.action_masks.swapaxes(0, 1).astype(bool))
    obs_bytes = buffer.observations.nbytes
    assert buffer.nbytes == obs_bytes + buffer.returns.nbytes + buffer.old_distribution_params.nbytes + 6 * 16 * 10
    assert buffer.nbytes == MaskablePPG._make_aux_buffer(model).nbytes
    # The KL of an aux minibatch: over the valid actions
    model._compute_old_distributions()
    batch = next(buffer.get(1))
    distribution, _, _ = model.policy.forward_aux(batch.observations)
    kl = model._behaviour_cloning_kl(batch, distribution)
    assert th.allclose(kl, th.zeros_like(kl), atol=1e-6)  # pi_old is pi: no distance
    assert th.isfinite(kl).all()


def test_save_load_and_aux_buffer_file(tmp_path):
    env = InvalidActionEnvDiscrete(dim=20, n_invalid_actions=10)
    model = small_maskable(env, n_policy_iters=3).learn(32)
    model.save(tmp_path / "model")
    model.save_aux_buffer(str(tmp_path / "buffer"))
    loaded = MaskablePPG.load(tmp_path / "model", env=env)
    loaded.load_aux_buffer(tmp_path / "buffer.npz")
    assert th.equal(loaded.aux_buffer.action_masks, model.aux_buffer.action_masks)
    obs, _ = env.reset(seed=0)
    masks = np.asarray(env.action_masks())
    for deterministic in (True, False):
        model.set_random_seed(3)
        actions = [model.predict(obs, action_masks=masks, deterministic=deterministic)[0] for _ in range(10)]
        loaded.set_random_seed(3)
        assert actions == [loaded.predict(obs, action_masks=masks, deterministic=deterministic)[0] for _ in range(10)]
        assert all(masks[int(action)] for action in actions)
    loaded.learn(32, reset_num_timesteps=False)
    assert loaded.n_aux_phases == 1
    # A PPG model cannot take the masked buffer
    ppg = PPG("MlpPolicy", InvalidActionEnvDiscrete(dim=20), **{**SMALL, "n_policy_iters": 3})
    with pytest.raises(ValueError, match="mask_dims: buffer 20 != model 0"):
        ppg.load_aux_buffer(tmp_path / "buffer.npz")


def test_each_algorithm_refuses_the_others_zip(tmp_path):
    """PPG.load of a MaskablePPG zip used to load it as a PPG, which then trained and predicted without masks; SB3's
    PPO.load named PPG for it. Both now name MaskablePPG; MaskablePPG.load refuses a PPG zip."""
    from stable_baselines3 import PPO

    env = InvalidActionEnvDiscrete(dim=20, n_invalid_actions=10)
    small_maskable(env).save(tmp_path / "maskable")
    with pytest.raises(ValueError, match=r"holds a MaskablePPG model .*load it with sb3_ppg\.MaskablePPG\.load"):
        PPG.load(tmp_path / "maskable.zip")
    with pytest.raises(ValueError, match=r"holds a MaskablePPG model \(sb3_ppg\.MaskablePPG.*sb3_ppg\.MaskablePPG\.load"):
        PPO.load(tmp_path / "maskable.zip")
    assert isinstance(MaskablePPG.load(tmp_path / "maskable.zip"), MaskablePPG)
    PPG("MlpPolicy", env, **SMALL).save(tmp_path / "ppg")
    with pytest.raises(ValueError, match=r"holds a PPG model .*not a MaskablePPG one: load it with sb3_ppg\.PPG\.load"):
        MaskablePPG.load(tmp_path / "ppg.zip")
    with pytest.raises(ValueError, match=r"holds a PPG model \(sb3_ppg\.PPG,"):
        PPO.load(tmp_path / "ppg.zip")


class ToDictWrapper(gym.Wrapper):
    """sb3-contrib's wrapper that puts the observation in a Dict (its test_dict_obs)."""

    def __init__(self, env):
        super().__init__(env)
        self.observation_space = gym.spaces.Dict({"obs": env.observation_space})

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        return {"obs": obs}, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return {"obs": obs}, reward, terminated, truncated, info


def test_dict_observations():
    env = ToDictWrapper(InvalidActionEnvDiscrete(dim=20, n_invalid_actions=19))
    model = small_maskable(env, "MultiInputPolicy").learn(32)
    assert model.n_aux_phases == 1
    evaluate_policy(model, env, reward_threshold=99, warn=False)


def test_vec_normalize_and_maskable_eval_callback(tmp_path):
    """sb3-contrib's MaskableEvalCallback and evaluate_policy on a model trained on a VecNormalize env."""

    def make_env():
        # One-hot observations (a Box, which VecNormalize normalizes); the wrapper passes action_masks() through
        return gym.wrappers.FlattenObservation(InvalidActionEnvDiscrete(dim=20, n_invalid_actions=19))

    env = VecNormalize(make_vec_env(make_env, n_envs=2, seed=0))
    eval_env = VecNormalize(make_vec_env(make_env, n_envs=1, seed=1), training=False)
    callback = MaskableEvalCallback(eval_env, eval_freq=16, n_eval_episodes=2, log_path=str(tmp_path), warn=False)
    model = small_maskable(env).learn(64, callback=callback)
    assert model.n_aux_phases == 1
    results = np.load(tmp_path / "evaluations.npz")["results"]
    assert results.shape == (2, 2) and (results == 100).all()
    mean_reward, _ = evaluate_policy(model, eval_env, n_eval_episodes=2, warn=False)
    assert mean_reward == 100
    assert get_action_masks(env).shape == (2, 20)


@pytest.mark.parametrize("arch", ["dual", "detach", "shared"])
def test_architectures_and_cnn_policies(arch):
    env = InvalidActionEnvDiscrete(dim=8, n_invalid_actions=5)
    model = small_maskable(env, policy_kwargs=dict(net_arch=[16], arch=arch)).learn(32)
    assert model.policy.arch == arch and count_invalid_actions(model, env, 50) == 0
    image_space = gym.spaces.Box(0, 255, (3, 64, 64), np.uint8)
    for policy in ("ProcgenCnn", "CnnPolicy"):
        policy_class = MaskablePPG.policy_aliases[policy]
        net = policy_class(image_space, gym.spaces.Discrete(4), lambda _: 1e-3, arch=arch)
        masks = np.array([[False, True, False, False]] * 3)
        actions, _ = net.predict(np.zeros((3, 3, 64, 64), np.uint8), action_masks=masks)
        assert (actions == 1).all()


def test_checkpoint_resume_bit_identical(tmp_path):
    """PPGCheckpointCallback and load_checkpoint: the rollout files carry the masks (version 2) and resume exactly."""

    def make_env():
        return make_vec_env(lambda: InvalidActionEnvDiscrete(dim=10, n_invalid_actions=6), n_envs=2, seed=0)

    model = small_maskable(make_env(), n_policy_iters=3)
    model.learn(6 * 32, callback=PPGCheckpointCallback(16, str(tmp_path), name_prefix="ppg"))
    checkpoint = tmp_path / "ppg_64_steps"  # 2 of 3 iterations in the aux buffer
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    rollout = tmp_path / "ppg_rollouts" / manifest["aux_rollout_files"][0]
    with np.load(rollout) as archive:
        stored_masks = archive["action_masks"]
    assert stored_masks.dtype == bool and stored_masks.shape == (2, 16, 10) and (stored_masks.sum(axis=2) == 4).all()
    resumed = MaskablePPG.load_checkpoint(checkpoint, env=make_env())
    assert resumed.aux_buffer.n_iterations == 2
    np.testing.assert_array_equal(resumed.aux_buffer.action_masks[:2], stored_masks)
    resumed.learn(6 * 32 - 64, reset_num_timesteps=False)
    expected, actual = model.policy.state_dict(), resumed.policy.state_dict()
    for name in expected:
        assert th.equal(expected[name], actual[name]), name


#: Command line options of the tests' training runs: seeded, on the CPU, without the zoo's output


def test_command_line_trains_maskable_ppg(tmp_path):
    """
    python -m sb3_ppg.train --algo maskable_ppg with the packaged maskable_ppg.yml on a registered invalid-action env:
    a MaskablePPG run whose evaluations use the masks (only the right action valid: a masked evaluation scores 100,
    an unmasked one about 100 / 70), resumable from its checkpoints.
    """
    from sb3_ppg.cli import train, zoo

    zoo.register_zoo()
    env_id = "sb3_ppg/InvalidActionEnvDiscrete-v0"
    only_right_action = ["n_invalid_actions:69"]
    common = ["--algo", "maskable_ppg", "--env", env_id, "-f", str(tmp_path), *QUIET_CPU_RUN]
    options = ["--eval-freq", "256", "--eval-episodes", "2", "--save-freq", "256", "-params", "n_steps:64"]
    kwargs = ["--env-kwargs", *only_right_action, "--eval-env-kwargs", *only_right_action]
    train.main([*common, "-n", "512", *options, "n_policy_iters:2", *kwargs])
    run_folder = tmp_path / "maskable_ppg" / "sb3_ppg-InvalidActionEnvDiscrete-v0_1"
    model = MaskablePPG.load(run_folder / "sb3_ppg-InvalidActionEnvDiscrete-v0.zip", device="cpu")
    assert model.num_timesteps == 512 and model.n_aux_phases == 4
    assert model.n_steps == 64 and model.gamma == 0.4  # -params over the packaged file
    with np.load(run_folder / "evaluations.npz") as evaluations:
        assert list(evaluations["timesteps"]) == [256, 512]
        assert (evaluations["results"] == 100).all()
    # --resume continues the run from its newest checkpoint with MaskablePPG.load_checkpoint
    train.main([*common, "-n", "768", *options, "n_policy_iters:2", *kwargs, "--resume"])
    resumed = MaskablePPG.load(run_folder / "sb3_ppg-InvalidActionEnvDiscrete-v0.zip", device="cpu")
    assert resumed.num_timesteps == 768


def test_enjoy_plays_with_the_env_masks(tmp_path, capsys):
    """
    python -m sb3_ppg.enjoy --algo maskable_ppg plays with the masks of its env (the zoo's enjoy calls predict without
    them). Only the right action is valid: every episode scores 100 with the masks; without, the policy (which gets
    no gradient when a single action is valid) picks the right one of 70 about once in 70 steps.
    """
    from sb3_ppg.cli import enjoy, train

    only_right_action = ["--env-kwargs", "n_invalid_actions:69"]
    common = ["--algo", "maskable_ppg", "--env", "sb3_ppg/InvalidActionEnvDiscrete-v0", "-f", str(tmp_path)]
    # the run's args.yml gives enjoy the env kwargs
    train_args = ["-n", "128", *QUIET_CPU_RUN, "-params", "n_steps:64", "n_policy_iters:2", *only_right_action]
    train.main([*common, *train_args])
    capsys.readouterr()
    enjoy.main([*common, "--no-render", "-n", "300", "--verbose", "1"])
    out = capsys.readouterr().out
    assert "Playing with the env's action masks (MaskablePPG)" in out
    rewards = [float(line.split(":")[1]) for line in out.splitlines() if line.startswith("Episode Reward")]
    assert rewards == [100.0, 100.0, 100.0]


def test_masked_player_without_masks_and_with_wrong_masks():
    """MaskedPlayer: an env without action_masks() is played without masks; masks of the wrong shape are refused."""
    from stable_baselines3.common.vec_env import DummyVecEnv

    from sb3_ppg.ppg_mask import MaskedPlayer

    env = DummyVecEnv([lambda: InvalidActionEnvDiscrete(dim=10, n_invalid_actions=9)])
    model = small_maskable(InvalidActionEnvDiscrete(dim=10, n_invalid_actions=9))
    player = MaskedPlayer(model, env)
    obs = env.reset()
    for _ in range(20):
        action, _ = player.predict(obs, deterministic=True)
        assert player.action_masks()[0, action[0]]
        obs, _, _, _ = env.step(action)

    unmasked_env = DummyVecEnv([lambda: IdentityEnv(dim=10)])
    unmasked = MaskedPlayer(model, unmasked_env)
    assert not unmasked.use_masking and unmasked.action_masks() is None
    unmasked.predict(unmasked_env.reset())

    class WrongMasks(gym.Wrapper):
        def action_masks(self):
            return np.ones(9, dtype=bool)

    wrong_env = DummyVecEnv([lambda: WrongMasks(InvalidActionEnvDiscrete(dim=10, n_invalid_actions=9))])
    with pytest.raises(ValueError, match="10 booleans per state"):
        MaskedPlayer(model, wrong_env).predict(wrong_env.reset())


def test_policy_phase_log_probs_and_entropy_are_the_masked_ones():
    """The policy phase evaluates the rollout's actions under the masked distribution: its log-probabilities are the
    ones computed when acting (before any update), its entropies those of the softmax over the valid actions."""
    env = InvalidActionEnvDiscrete(dim=10, n_invalid_actions=6)
    model = small_maskable(env)
    _, callback = model._setup_learn(16)
    assert model.collect_rollouts(model.env, callback, model.rollout_buffer, 16)
    batch = next(model.rollout_buffer.get(None))
    assert (batch.action_masks.sum(dim=1) == 4).all()
    with th.no_grad():
        _, log_prob, entropy = model._evaluate_actions(batch)
        logits = model.policy.get_distribution(batch.observations).distribution.logits.double()
    assert th.allclose(log_prob, batch.old_log_prob, atol=1e-6)
    valid = batch.action_masks.bool()
    masked_log_p = th.log_softmax(logits.masked_fill(~valid, -th.inf), dim=1)
    expected_entropy = -(masked_log_p.exp() * th.where(valid, masked_log_p, 0.0)).sum(dim=1)
    assert th.allclose(entropy.double(), expected_entropy, atol=1e-5)
    expected_log_prob = masked_log_p.gather(1, batch.actions.long()).flatten()
    assert th.allclose(log_prob.double(), expected_log_prob, atol=1e-5)
    # Unmasked, the 10 actions would give other values: the masks are what these are computed with
    unmasked_log_p = th.log_softmax(logits, dim=1).gather(1, batch.actions.long()).flatten()
    assert (unmasked_log_p - expected_log_prob).abs().min() > 1e-3


def test_same_updates_as_ppg_with_whole_env_minibatches():
    """policy_minibatches="envs" (the paper's whole env rollouts) takes the masks along: the same updates as PPG."""

    def make_env():
        return make_vec_env(lambda: InvalidActionEnvDiscrete(dim=6), n_envs=2, seed=0)

    settings = dict(SMALL, batch_size=16, policy_minibatches="envs", policy_kwargs=dict(net_arch=[16]), seed=0)
    ppg = PPG("MlpPolicy", make_env(), **settings).learn(128)
    maskable = MaskablePPG("MlpPolicy", make_env(), **settings).learn(128)
    assert maskable.n_aux_phases == ppg.n_aux_phases == 2
    expected, actual = ppg.policy.state_dict(), maskable.policy.state_dict()
    for name in expected:
        assert th.equal(expected[name], actual[name]), name
    # With invalid actions, the whole-env minibatches carry each state's masks
    env = make_vec_env(lambda: InvalidActionEnvDiscrete(dim=6, n_invalid_actions=3), n_envs=2)
    model = small_maskable(env, policy_minibatches="envs").learn(64)
    batch = next(model._rollout_minibatches())
    assert batch.action_masks.shape == (16, 6) and (batch.action_masks.sum(dim=1) == 3).all()
