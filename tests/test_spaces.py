"""PPG on every supported action space and on vector, image and Dict observations."""

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.envs import (
    FakeImageEnv,
    IdentityEnv,
    IdentityEnvBox,
    IdentityEnvMultiBinary,
    IdentityEnvMultiDiscrete,
    SimpleMultiObsEnv,
)
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecTransposeImage

from sb3_ppg import PPG, MlpPolicy
from sb3_ppg.cli.vec_env import ProcgenVecEnvFactory
from sb3_ppg.common.distributions import get_distribution_params, kl_divergence_from_params

# One aux phase every 2 iterations; a step's reward does not depend on the past actions, so a short horizon helps
IDENTITY_HYPERPARAMS = dict(
    n_steps=100,
    batch_size=50,
    n_epochs=4,
    learning_rate=3e-3,
    gamma=0.5,
    ent_coef=0.0,
    n_policy_iters=2,
    n_aux_epochs=1,
    aux_batch_rollouts=1,
    policy_kwargs=dict(net_arch=[16]),
)
SMALL = dict(n_steps=16, batch_size=16, n_policy_iters=2, aux_batch_rollouts=1, n_aux_epochs=2)
IMAGE_POLICY_KWARGS = {
    "CnnPolicy": dict(net_arch=[16], features_extractor_kwargs=dict(features_dim=16)),
    "ProcgenCnn": dict(features_extractor_kwargs=dict(features_dim=16, channels=(4, 8))),
}


class DictIdentityEnv(IdentityEnv):
    """IdentityEnv(dim) whose observation is a Dict: the state one-hot encoded, and a distracting noise vector."""

    def __init__(self, dim: int = 4):
        super().__init__(dim=dim)
        self.observation_space = spaces.Dict(
            {"state": spaces.Box(0.0, 1.0, (dim,), dtype=np.float32), "noise": spaces.Box(-1.0, 1.0, (2,), dtype=np.float32)}
        )

    def _observation(self) -> dict[str, np.ndarray]:
        one_hot = np.zeros(self.action_space.n, dtype=np.float32)
        one_hot[self.state] = 1.0
        return {"state": one_hot, "noise": self.np_random.uniform(-1.0, 1.0, 2).astype(np.float32)}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        return self._observation(), {}

    def step(self, action):
        _, reward, terminated, truncated, info = super().step(action)
        return self._observation(), reward, terminated, truncated, info


class TupleActionEnv(gym.Env):
    """Box observations, an action space that PPG does not support."""

    def __init__(self, action_space: spaces.Space):
        self.observation_space = spaces.Box(-1.0, 1.0, (2,), dtype=np.float32)
        self.action_space = action_space

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, False, False, {}


# (env factory, training steps, expected mean reward of a uniformly random policy over 100 steps, threshold)
IDENTITY_CASES = {
    "discrete": (lambda: IdentityEnv(dim=2), 600, 50.0, 90.0),
    # |a - s| <= 0.5 with a, s ~ U[-1, 1]: probability 1 - 1.5 ** 2 / 4
    "box": (lambda: IdentityEnvBox(eps=0.5), 600, 43.75, 90.0),
    "multidiscrete": (lambda: IdentityEnvMultiDiscrete(dim=2), 600, 25.0, 90.0),
    "multibinary": (lambda: IdentityEnvMultiBinary(dim=3), 2000, 12.5, 80.0),
    "dict-observation": (lambda: DictIdentityEnv(dim=4), 800, 25.0, 90.0),
}


@pytest.mark.parametrize("case", ["discrete", "box", "multidiscrete", "multibinary", "dict-observation"])
def test_identity_learns(case):
    """Each action space learns the identity well above chance (thresholds checked with seeds 0-4: all reach >= 91)."""
    make_env, n_steps, random_reward, threshold = IDENTITY_CASES[case]
    policy = "MultiInputPolicy" if case == "dict-observation" else "MlpPolicy"
    model = PPG(policy, make_env(), seed=0, **IDENTITY_HYPERPARAMS)
    model.learn(n_steps)
    assert model.n_aux_phases >= 2
    eval_env = Monitor(make_env())
    eval_env.reset(seed=1)
    eval_env.action_space.seed(1)
    mean_reward, _ = evaluate_policy(model, eval_env, n_eval_episodes=5, deterministic=True)
    assert threshold > random_reward + 25
    assert mean_reward >= threshold, f"{case}: mean reward {mean_reward} (random policy: {random_reward})"


@pytest.mark.parametrize("squash_output", [False, True])
def test_gsde_box(squash_output):
    env = IdentityEnvBox(eps=0.5)
    model = PPG(
        "MlpPolicy",
        env,
        use_sde=True,
        sde_sample_freq=4,
        seed=0,
        policy_kwargs=dict(net_arch=[16], squash_output=squash_output),
        **SMALL,
    )
    assert model.policy.use_sde
    old_params = get_distribution_params(model.policy.get_distribution(th.zeros((1, 1)))).detach().clone()
    # The aux phase runs in the last iteration: its logs are still in the logger
    model.learn(64)
    assert model.n_aux_phases == 2
    logged = model.logger.name_to_value
    for key in ("aux/kl_loss", "aux/aux_value_loss", "aux/real_value_loss", "train/approx_kl", "train/std"):
        assert np.isfinite(logged[key]), key
    # Two aux epochs: the policy moved away from pi_old a little (the first minibatch has KL exactly 0)
    assert 0.0 < logged["aux/kl_loss"] < 1.0
    buffered = model.aux_buffer.old_distribution_params.numpy()
    assert buffered.shape == (2, 16, 2) and np.isfinite(buffered).all()
    # The stored log std is the gSDE one, which depends on the state
    assert np.unique(buffered[..., 1]).size > 1
    kl = kl_divergence_from_params(old_params, model.policy.get_distribution(th.zeros((1, 1))))
    assert th.isfinite(kl).all() and (kl > 0).all()
    actions, _ = model.predict(np.array([[0.3]]), deterministic=False)
    assert actions.shape == (1, 1) and -1.0 <= actions[0, 0] <= 1.0


@pytest.mark.parametrize("arch", ["dual", "detach", "shared"])
def test_multi_input_env(arch):
    """SimpleMultiObsEnv (image + vector): the channel-last image key is transposed and buffered as uint8."""
    env = make_vec_env(SimpleMultiObsEnv, n_envs=2, seed=0)
    policy_kwargs = dict(arch=arch, net_arch=[16], features_extractor_kwargs=dict(cnn_output_dim=16))
    model = PPG("MultiInputPolicy", env, policy_kwargs=policy_kwargs, seed=0, **SMALL)
    assert isinstance(model.get_env(), VecTransposeImage)
    assert model.observation_space["img"].shape == (1, 64, 64)
    parameters = [param.detach().clone() for param in model.policy.parameters()]
    model.learn(64)
    assert model.n_aux_phases == 1
    images = model.aux_buffer.observations["img"].numpy()
    assert images.dtype == np.uint8 and images.shape == (4, 16, 1, 64, 64)
    # The buffered images are the channel-first ones of the rollout buffer (SimpleMultiObsEnv rows: random images),
    # whose arrays PPG's rollout buffer keeps as (n_steps, n_envs, ...)
    assert images.any()
    np.testing.assert_array_equal(
        images[2:].reshape(-1, 1, 64, 64), model.rollout_buffer.observations["img"].swapaxes(0, 1).reshape(-1, 1, 64, 64)
    )
    assert np.isfinite(model.logger.name_to_value["aux/kl_loss"])
    assert not all(th.equal(a, b) for a, b in zip(parameters, model.policy.parameters(), strict=True))
    # predict accepts the env's raw, channel-last observations
    raw_obs = SimpleMultiObsEnv().reset(seed=0)[0]
    action, _ = model.predict(raw_obs, deterministic=True)
    assert model.action_space.contains(action.item())


@pytest.mark.parametrize("discrete", [True, False])
@pytest.mark.parametrize("policy", ["CnnPolicy", "ProcgenCnn"])
def test_image_env(policy, discrete):
    env = make_vec_env(
        FakeImageEnv, n_envs=2, seed=0, env_kwargs=dict(screen_height=36, screen_width=36, n_channels=3, discrete=discrete)
    )
    model = PPG(policy, env, policy_kwargs=IMAGE_POLICY_KWARGS[policy], seed=0, **SMALL)
    # Channel-last images are transposed for PyTorch
    assert isinstance(model.get_env(), VecTransposeImage)
    assert model.observation_space.shape == (3, 36, 36)
    parameters = [param.detach().clone() for param in model.policy.parameters()]
    model.learn(64)
    assert model.n_aux_phases == 1
    assert model.aux_buffer.observations.dtype == th.uint8
    assert model.aux_buffer.observations.shape == (4, 16, 3, 36, 36)
    rollout_observations = model.rollout_buffer.observations.swapaxes(0, 1)  # (n_envs, n_steps, ...)
    np.testing.assert_array_equal(
        model.aux_buffer.observations[2:].reshape(-1, 3, 36, 36).numpy(), rollout_observations.reshape(-1, 3, 36, 36)
    )
    for key in ("aux/kl_loss", "aux/aux_value_loss", "aux/real_value_loss"):
        assert np.isfinite(model.logger.name_to_value[key]), key
    assert not all(th.equal(a, b) for a, b in zip(parameters, model.policy.parameters(), strict=True))
    # predict takes channel-last and channel-first images alike
    channel_last = np.stack(
        [FakeImageEnv(screen_height=36, screen_width=36, n_channels=3).observation_space.sample() for _ in range(3)]
    )
    actions_last, _ = model.predict(channel_last, deterministic=True)
    actions_first, _ = model.predict(channel_last.transpose(0, 3, 1, 2), deterministic=True)
    np.testing.assert_array_equal(actions_last, actions_first)
    assert actions_last.shape == (3, *model.action_space.shape)


def test_channel_first_images_not_transposed():
    env = make_vec_env(
        FakeImageEnv, n_envs=2, env_kwargs=dict(screen_height=36, screen_width=36, n_channels=3, channel_first=True)
    )
    model = PPG("ProcgenCnn", env, policy_kwargs=IMAGE_POLICY_KWARGS["ProcgenCnn"], seed=0, **SMALL)
    assert not isinstance(model.get_env(), VecTransposeImage)
    assert model.observation_space.shape == (3, 36, 36)
    model.learn(64)
    assert model.n_aux_phases == 1


@pytest.mark.parametrize(
    "action_space",
    [
        spaces.Tuple((spaces.Discrete(2), spaces.Discrete(3))),
        spaces.Dict({"move": spaces.Discrete(2), "speed": spaces.Box(-1.0, 1.0, (1,))}),
    ],
)
def test_unsupported_action_space(action_space):
    # SB3's check (an AssertionError naming the supported spaces)
    with pytest.raises(AssertionError, match="only supports"):
        PPG("MlpPolicy", TupleActionEnv(action_space))


@pytest.mark.parametrize("policy", ["MlpPolicy", "CnnPolicy"])
def test_dict_observations_need_multi_input_policy(policy):
    with pytest.raises(ValueError, match="You must use `MultiInputPolicy`"):
        PPG(policy, SimpleMultiObsEnv())


def test_procgen_cnn_needs_images():
    with pytest.raises(ValueError, match="ImpalaCNN needs an image observation space"):
        PPG("ProcgenCnn", SimpleMultiObsEnv())
    with pytest.raises(ValueError, match="ImpalaCNN needs an image observation space"):
        PPG("ProcgenCnn", "CartPole-v1")


class SpacesEnv(gym.Env):
    """Random observations of any space, no reward; an action outside the action space fails the step."""

    def __init__(self, observation_space: spaces.Space, action_space: spaces.Space | None = None):
        self.observation_space = observation_space
        self.action_space = spaces.Discrete(2) if action_space is None else action_space
        self.received_actions: list = []

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.observation_space.seed(seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        assert self.action_space.contains(action), f"action {action!r} is outside {self.action_space}"
        self.received_actions.append(action)
        return self.observation_space.sample(), 0.0, False, False, {}


@pytest.mark.parametrize(
    "action_space, start",
    [(spaces.Discrete(3, start=5), "5"), (spaces.MultiDiscrete([3, 2], start=[1, -1]), r"\[1, -1\]")],
    ids=["discrete", "multidiscrete"],
)
def test_action_space_with_nonzero_start_is_refused(action_space, start):
    """SB3's distributions sample from 0: the env would receive actions outside its space (it did, on main)."""
    env = SpacesEnv(spaces.Box(-1.0, 1.0, (2,), dtype=np.float32), action_space)
    with pytest.raises(ValueError, match=rf"action space .* start={start}.*outside its space.*TransformAction"):
        PPG("MlpPolicy", env, **SMALL)
    # Also where the policy is built from saved spaces (PPG.load without an env, PPGPolicy.load)
    with pytest.raises(ValueError, match=rf"start={start}"):
        MlpPolicy(env.observation_space, action_space, lambda _: 1e-3)


def test_action_space_start_fix_from_the_message_trains():
    """The fix the error names: a zero-based space for the model, the start added back for the env."""
    env = SpacesEnv(spaces.Box(-1.0, 1.0, (2,), dtype=np.float32), spaces.Discrete(3, start=5))
    model = PPG("MlpPolicy", gym.wrappers.TransformAction(env, lambda action: action + 5, spaces.Discrete(3)), seed=0, **SMALL)
    model.learn(64)
    assert model.n_aux_phases == 2
    assert len(env.received_actions) == 64 and set(env.received_actions) == {5, 6, 7}


@pytest.mark.parametrize(
    "observation_space",
    [
        spaces.Graph(spaces.Box(0.0, 1.0, (2,)), None),
        spaces.Sequence(spaces.Box(0.0, 1.0, (2,))),
        spaces.Text(5),
        spaces.Tuple((spaces.Discrete(2), spaces.Box(0.0, 1.0, (2,)))),
        spaces.Dict({"pole": spaces.Box(0.0, 1.0, (2,)), "name": spaces.Text(5)}),
        spaces.Dict({"pole": spaces.Box(0.0, 1.0, (2,)), "cart": spaces.Dict({"x": spaces.Discrete(2)})}),
        spaces.Discrete(3, start=1),
        spaces.Dict({"pole": spaces.MultiDiscrete([3, 2], start=[0, 2])}),
    ],
    ids=["graph", "sequence", "text", "tuple", "dict-with-text", "nested-dict", "discrete-start", "multidiscrete-start"],
)
def test_unsupported_observation_space_is_refused_at_construction(observation_space):
    """Graph / Sequence / Text failed with "'NoneType' object is not iterable" inside SB3's DummyVecEnv on main."""
    policy = "MultiInputPolicy" if isinstance(observation_space, spaces.Dict) else "MlpPolicy"
    with pytest.raises(ValueError, match="PPG does not support the observation space") as error:
        PPG(policy, SpacesEnv(observation_space), **SMALL)
    message = str(error.value)
    if isinstance(observation_space, spaces.Dict):
        assert "of the Dict observation space" in message
    if "start" in str(observation_space):
        assert "start=" in message and "ObservationWrapper" in message
    else:
        assert "Box, Discrete, MultiDiscrete and MultiBinary observations, or a Dict of those" in message
        assert "ObservationWrapper" in message


@pytest.mark.parametrize("dict_observation", [False, True])
def test_scalar_box_observation_learns_predicts_saves_and_loads(tmp_path, dict_observation):
    """A Box of shape () is one feature (it failed with an IndexError in SB3's flatten on main), end to end."""
    scalar = spaces.Box(-1.0, 1.0, (), dtype=np.float32)
    noise = spaces.Box(-1.0, 1.0, (2,), dtype=np.float32)
    observation_space = spaces.Dict({"x": scalar, "noise": noise}) if dict_observation else scalar
    policy = "MultiInputPolicy" if dict_observation else "MlpPolicy"
    env = SpacesEnv(observation_space)
    model = PPG(policy, env, seed=0, **SMALL)
    assert model.policy.pi_features_extractor.features_dim == (3 if dict_observation else 1)
    model.learn(64)
    assert model.n_aux_phases == 2 and np.isfinite(model.logger.name_to_value["aux/kl_loss"])
    # The aux buffer stored the last rollouts' scalars (the rollout buffer holds the last one)
    stored = model.aux_buffer.observations["x"] if dict_observation else model.aux_buffer.observations
    last_rollout = model.rollout_buffer.observations["x"] if dict_observation else model.rollout_buffer.observations
    assert stored.shape == (2, 16)
    np.testing.assert_array_equal(stored[1].numpy(), last_rollout.reshape(16))

    rng = np.random.default_rng(0)
    if dict_observation:
        one = {"x": np.float32(0.5), "noise": np.zeros(2, np.float32)}
        batch = {"x": rng.uniform(-1, 1, 5).astype(np.float32), "noise": np.zeros((5, 2), np.float32)}
        batch_item = {"x": batch["x"][2], "noise": batch["noise"][2]}
    else:
        one, batch = np.float32(0.5), rng.uniform(-1, 1, 5).astype(np.float32)
        batch_item = batch[2]
    action, _ = model.predict(one, deterministic=True)
    actions, _ = model.predict(batch, deterministic=True)
    assert action.shape == () and actions.shape == (5,)
    assert actions[2] == model.predict(batch_item, deterministic=True)[0]
    # The scalar reaches the network: the action distribution depends on it
    obs_tensor, _ = model.policy.obs_to_tensor(batch)
    with th.no_grad():
        logits = model.policy.get_distribution(obs_tensor).distribution.logits
    assert not th.allclose(logits[0], logits[1])

    model.save(tmp_path / "model.zip")
    model.save_aux_buffer(tmp_path / "aux.npz")
    loaded = PPG.load(tmp_path / "model.zip", env=env)
    loaded.load_aux_buffer(tmp_path / "aux.npz")
    np.testing.assert_array_equal(loaded.predict(batch, deterministic=True)[0], actions)
    loaded.learn(32, reset_num_timesteps=False)
    assert loaded.n_aux_phases == 3


@pytest.fixture(scope="module")
def dict_model():
    return PPG("MultiInputPolicy", SimpleMultiObsEnv(), seed=0, **SMALL)


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda obs: {"vec": obs["vec"]}, r"missing \['img'\]\. Expected exactly the keys \['img', 'vec'\]"),
        (lambda obs: {**obs, "pole": np.zeros(1)}, r"unexpected \['pole'\]\. Expected exactly the keys \['img', 'vec'\]"),
        (lambda obs: {"img": obs["img"], "pole": obs["vec"]}, r"missing \['vec'\], unexpected \['pole'\]"),
        (lambda obs: obs["vec"], r"takes Dict observations with the keys \['img', 'vec'\], got ndarray"),
        (lambda obs: {**obs, "vec": obs["vec"][:2]}, r"Observation key 'vec': .*Unexpected observation shape \(2,\)"),
        (
            lambda obs: {**obs, "vec": np.stack([obs["vec"]] * 2)},
            r"different numbers of observations \('img': one observation, 'vec': a batch of 2\)",
        ),
    ],
    ids=["missing-key", "extra-key", "renamed-key", "not-a-dict", "wrong-shape", "mixed-batch"],
)
def test_predict_dict_observation_errors_name_the_keys(dict_model, change, match):
    """On main: a bare KeyError 'pole', an IndexError, SB3's shape error without the key, a torch.cat error."""
    observation = SimpleMultiObsEnv().reset(seed=0)[0]
    assert dict_model.predict(observation, deterministic=True)[0].shape == ()
    with pytest.raises(ValueError, match=match):
        dict_model.predict(change(observation), deterministic=True)


def test_predict_box_observation_errors(make_model):
    model = make_model()
    with pytest.raises(ValueError, match=r"takes Box\(.*\) observations, got a dict with the keys \['pole'\]"):
        model.predict({"pole": np.zeros(4, dtype=np.float32)})
    # SB3's own message for a wrong shape
    with pytest.raises(ValueError, match=r"Unexpected observation shape \(3,\) for Box environment, please use \(4,\)"):
        model.predict(np.zeros(3, dtype=np.float32))


@pytest.mark.parametrize(
    "observation_space",
    [
        spaces.Graph(spaces.Box(0.0, 1.0, (2,)), None),
        spaces.Sequence(spaces.Box(0.0, 1.0, (2,))),
        spaces.Text(5),
    ],
    ids=["graph", "sequence", "text"],
)
@pytest.mark.parametrize("vec_env_cls", [DummyVecEnv, SubprocVecEnv])
def test_command_line_vec_env_refuses_unsupported_space_before_wrapping(observation_space, vec_env_cls):
    """
    The command line's VecEnv factory checks the probe's space before the VecEnv is built: on main SB3's DummyVecEnv
    failed with "'NoneType' object is not iterable" and PPG's message was never reached.
    """
    factory = ProcgenVecEnvFactory(vec_env_cls)
    with pytest.raises(ValueError, match=r"PPG does not support the observation space .*ObservationWrapper"):
        factory([lambda: SpacesEnv(observation_space)] * 2)


class UnitIntervalImageEnv(SpacesEnv):
    """Declares ``Box(0, 255, uint8)`` images (or a Dict holding them) and returns float64 values given by ``make``."""

    def __init__(self, make, dict_observation: bool = False):
        image_space = spaces.Box(0, 255, (8, 8, 1), dtype=np.uint8)
        super().__init__(spaces.Dict({"image": image_space}) if dict_observation else image_space)
        self.make = make
        self.dict_observation = dict_observation

    def _observation(self):
        image = self.make(self.np_random)
        return {"image": image} if self.dict_observation else image

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        gym.Env.reset(self, seed=seed)
        return self._observation(), {}

    def step(self, action):
        return self._observation(), 0.0, False, False, {}


def unit_floats(rng: np.random.Generator) -> np.ndarray:
    return rng.uniform(0.0, 1.0, (8, 8, 1))


@pytest.mark.parametrize("dict_observation", [False, True])
def test_float_observations_of_a_uint8_space_are_refused(dict_observation):
    """
    Floats in [0, 1) from an env declaring Box(0, 255, uint8): DummyVecEnv's cast made every observation 0 and PPG
    trained on them without a word on main. Now the model and the command line's VecEnv factory refuse the env.
    """
    policy = "MultiInputPolicy" if dict_observation else "MlpPolicy"
    match = r"are float64 .* is uint8: SB3's VecEnv casts them to uint8, which changes them"
    with pytest.raises(ValueError, match=match) as error:
        PPG(policy, UnitIntervalImageEnv(unit_floats, dict_observation), **SMALL)
    assert "(obs * 255).astype(np.uint8)" in str(error.value) and "Box(0.0, 1.0, shape, np.float32)" in str(error.value)
    assert ("key 'image'" in str(error.value)) == dict_observation
    with pytest.raises(ValueError, match=match):
        ProcgenVecEnvFactory(DummyVecEnv)([lambda: UnitIntervalImageEnv(unit_floats, dict_observation)])


def test_observations_that_survive_the_cast_are_accepted():
    """Whole numbers within 0-255 in float64 are stored unchanged as uint8: accepted. Out of range ones wrap: refused."""
    model = PPG("MlpPolicy", UnitIntervalImageEnv(lambda rng: rng.integers(0, 256, (8, 8, 1)).astype(np.float64)), **SMALL)
    assert model.observation_space.dtype == np.uint8
    with pytest.raises(ValueError, match=r"are int64 \(values from 0 to 300\)"):
        PPG("MlpPolicy", UnitIntervalImageEnv(lambda rng: np.array([0, 300] * 32, dtype=np.int64).reshape(8, 8, 1)), **SMALL)
