"""Saving and loading PPG models, policies, optimizers and the auxiliary buffer."""

import errno
import functools
import hashlib
import io
import json
import pickle
import warnings
import zipfile

import numpy as np
import pytest
import torch as th
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.envs import FakeImageEnv, SimpleMultiObsEnv

from sb3_ppg import PPG
from sb3_ppg.common.aux_buffer import AuxiliaryBuffer
from sb3_ppg.common.distributions import get_distribution_params
from sb3_ppg.ppg.policies import PPGPolicy

# Many tests here train less than one auxiliary phase on purpose (the state they check comes before it): the warning
# that learn() then trains as plain PPO is meant
pytestmark = pytest.mark.filterwarnings(r"ignore:learn\(total_timesteps=.*this learn\(\) trains as plain PPO")

ARCHS = ("dual", "detach", "shared")

# (policy alias, env name, policy kwargs): small networks to keep the tests fast
POLICY_CASES = {
    "mlp-cartpole": ("MlpPolicy", "CartPole-v1", dict(net_arch=[16])),
    "mlp-pendulum": ("MlpPolicy", "Pendulum-v1", dict(net_arch=[16])),
    "cnn": ("CnnPolicy", "image", dict(net_arch=[16], features_extractor_kwargs=dict(features_dim=16))),
    "procgen-cnn": ("ProcgenCnn", "image", dict(features_extractor_kwargs=dict(features_dim=16, channels=(4, 8)))),
    "multi-input": ("MultiInputPolicy", "multi", dict(net_arch=[16], features_extractor_kwargs=dict(cnn_output_dim=16))),
}

# One aux phase every 2 iterations of 2 envs x 16 steps


def make_env(name: str, n_envs: int = 2, seed: int = 0):
    if name == "image":
        env_id = lambda: FakeImageEnv(screen_height=36, screen_width=36, n_channels=3, discrete=True)  # noqa: E731
    elif name == "multi":
        env_id = SimpleMultiObsEnv
    else:
        env_id = name
    return make_vec_env(env_id, n_envs=n_envs, seed=seed)


def sample_observations(vec_env, n_steps: int = 4):
    """Observations of a few random steps of a VecEnv, stacked into one batch (a dict of batches for Dict spaces)."""
    vec_env.seed(123)
    observations = [vec_env.reset()]
    for _ in range(n_steps - 1):
        actions = np.array([vec_env.action_space.sample() for _ in range(vec_env.num_envs)])
        observations.append(vec_env.step(actions)[0])
    if isinstance(observations[0], dict):
        return {key: np.concatenate([obs[key] for obs in observations]) for key in observations[0]}
    return np.concatenate(observations)


def policy_outputs(policy: PPGPolicy, observations) -> tuple[th.Tensor, ...]:
    """Distribution parameters, value and auxiliary value of the policy, in eval mode."""
    policy.set_training_mode(False)
    obs_tensor, _ = policy.obs_to_tensor(observations)
    with th.no_grad():
        distribution, values, aux_values = policy.forward_aux(obs_tensor)
        return get_distribution_params(distribution), values, aux_values, policy.predict_values(obs_tensor)


def assert_same_outputs(policy_a: PPGPolicy, policy_b: PPGPolicy, observations) -> None:
    for output_a, output_b in zip(policy_outputs(policy_a, observations), policy_outputs(policy_b, observations), strict=True):
        assert th.equal(output_a, output_b)


def assert_same_state(state_a, state_b) -> None:
    """Recursively compare two state dicts (tensors exactly)."""
    if isinstance(state_a, th.Tensor):
        assert isinstance(state_b, th.Tensor)
        assert th.equal(state_a.cpu(), state_b.cpu())
    elif isinstance(state_a, dict):
        assert isinstance(state_b, dict)
        assert state_a.keys() == state_b.keys()
        for key in state_a:
            assert_same_state(state_a[key], state_b[key])
    elif isinstance(state_a, (list, tuple)):
        assert len(state_a) == len(state_b)
        for item_a, item_b in zip(state_a, state_b, strict=True):
            assert_same_state(item_a, item_b)
    else:
        assert state_a == state_b


def optimizer_has_state(optimizer: th.optim.Optimizer) -> bool:
    return len(optimizer.state_dict()["state"]) > 0


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("case", list(POLICY_CASES))
def test_save_load_predictions(tmp_path, case, arch, make_model):
    policy, env_name, policy_kwargs = POLICY_CASES[case]
    env = make_env(env_name)
    model = make_model(env, policy, {**policy_kwargs, "arch": arch})
    model.learn(64)
    assert model.n_aux_phases == 1
    observations = sample_observations(make_env(env_name))
    actions, _ = model.predict(observations, deterministic=True)
    params = model.get_parameters()

    model.save(tmp_path / "model.zip")
    loaded = PPG.load(tmp_path / "model.zip", env=env)

    assert type(loaded.policy) is type(model.policy)
    assert loaded.policy.arch == arch
    assert loaded.policy.share_features_extractor == (arch != "dual")
    assert loaded.n_aux_phases == 1
    assert_same_state(params, loaded.get_parameters())
    assert_same_outputs(model.policy, loaded.policy, observations)
    loaded_actions, _ = loaded.predict(observations, deterministic=True)
    np.testing.assert_array_equal(actions, loaded_actions)
    # The aux buffer is not saved: the loaded model starts a new aux phase
    assert loaded.aux_buffer.n_rollouts == 0
    # A loaded model keeps learning
    loaded.learn(64, reset_num_timesteps=False)
    assert loaded.num_timesteps == 128
    assert loaded.n_aux_phases == 2


def test_save_load_gsde(tmp_path, make_model):
    env = make_env("Pendulum-v1")
    model = make_model(env, use_sde=True, sde_sample_freq=4)
    model.learn(64)
    observations = sample_observations(env)
    model.save(tmp_path / "model.zip")
    loaded = PPG.load(tmp_path / "model.zip", env=env)
    assert loaded.use_sde and loaded.policy.use_sde
    assert_same_outputs(model.policy, loaded.policy, observations)
    assert th.equal(model.policy.log_std, loaded.policy.log_std)


@pytest.mark.parametrize(
    "kwargs, saved_optimizers",
    [
        (dict(), {"aux_optimizer"}),
        (dict(separate_aux_optimizer=False), set()),
        (dict(n_epochs=1, n_value_epochs=2), {"aux_optimizer", "value_optimizer"}),
        (dict(separate_aux_optimizer=False, n_value_epochs=3), {"value_optimizer"}),
        (dict(n_aux_epochs=0), set()),
    ],
)
def test_optimizers_round_trip(tmp_path, kwargs, saved_optimizers, make_model):
    env = make_env("CartPole-v1")
    model = make_model(env, **kwargs)
    model.learn(64)
    extra_optimizers = {"aux_optimizer", "value_optimizer"}
    for name in extra_optimizers:
        assert (getattr(model, name) is not None) == (name in saved_optimizers)
    for name in saved_optimizers:
        assert optimizer_has_state(getattr(model, name)), f"{name} has not stepped"

    model.save(tmp_path / "model.zip")
    with zipfile.ZipFile(tmp_path / "model.zip") as archive:
        members = set(archive.namelist())
    assert {f"{name}.pth" for name in extra_optimizers} & members == {f"{name}.pth" for name in saved_optimizers}

    loaded = PPG.load(tmp_path / "model.zip", env=env)
    assert_same_state(model.policy.optimizer.state_dict(), loaded.policy.optimizer.state_dict())
    for name in extra_optimizers:
        if name in saved_optimizers:
            assert_same_state(getattr(model, name).state_dict(), getattr(loaded, name).state_dict())
            # The restored optimizer steps the loaded policy's parameters
            optimizer_params = {id(param) for group in getattr(loaded, name).param_groups for param in group["params"]}
            assert optimizer_params == {id(param) for param in loaded.policy.parameters()}
        else:
            assert getattr(loaded, name) is None


@pytest.mark.parametrize("kwargs", [dict(), dict(separate_aux_optimizer=False, n_value_epochs=2)])
def test_continue_training_after_load_matches_in_memory_model(tmp_path, kwargs, make_model):
    """Training a loaded model gives bit-identical weights to training the original: nothing is lost in the zip."""
    model = make_model(make_env("CartPole-v1"), **kwargs)
    model.learn(64)  # ends right after an aux phase: the aux buffer is empty
    assert model.aux_buffer.n_rollouts == 0
    model.save(tmp_path / "model.zip")
    loaded = PPG.load(tmp_path / "model.zip", env=make_env("CartPole-v1"))
    model.set_env(make_env("CartPole-v1"))  # start from a reset env, as the loaded model does

    for agent in (model, loaded):
        agent.set_random_seed(1)
        agent.learn(64, reset_num_timesteps=False)
        assert agent.n_aux_phases == 2
    assert_same_state(model.get_parameters(), loaded.get_parameters())


def test_aux_buffer_not_saved(tmp_path, make_model):
    env = make_env("image")
    policy_kwargs = dict(net_arch=[16], features_extractor_kwargs=dict(features_dim=16))
    model = make_model(env, "CnnPolicy", policy_kwargs, n_policy_iters=8)
    model.learn(32)
    model.save(tmp_path / "one.zip")
    model.learn(5 * 32, reset_num_timesteps=False)
    assert model.aux_buffer.n_iterations == 6
    model.save(tmp_path / "six.zip")

    with zipfile.ZipFile(tmp_path / "six.zip") as archive:
        members = set(archive.namelist())
        data = json.loads(archive.read("data"))
    assert members == {
        "data",
        "pytorch_variables.pth",
        "policy.pth",
        "policy.optimizer.pth",
        "aux_optimizer.pth",
        "_stable_baselines3_version",
        "system_info.txt",
    }
    assert not {"aux_buffer", "aux_optimizer", "value_optimizer", "rollout_buffer"} & data.keys()
    # 5 more iterations of incompressible random images in the buffer (5 * 32 * 3888 bytes) do not reach the zip
    one_iteration_bytes = 32 * 36 * 36 * 3
    size_one, size_six = ((tmp_path / name).stat().st_size for name in ("one.zip", "six.zip"))
    assert abs(size_six - size_one) < one_iteration_bytes

    loaded = PPG.load(tmp_path / "six.zip", env=env)
    assert isinstance(loaded.aux_buffer, AuxiliaryBuffer)
    assert loaded.aux_buffer.n_rollouts == 0
    assert loaded.aux_buffer.n_envs == 2


@pytest.mark.parametrize("new_n_envs", [1, 4])
def test_load_with_different_n_envs(tmp_path, new_n_envs, make_model):
    model = make_model(make_env("CartPole-v1", n_envs=2))
    model.learn(64)
    model.save(tmp_path / "model.zip")

    loaded = PPG.load(tmp_path / "model.zip", env=make_env("CartPole-v1", n_envs=new_n_envs))
    assert loaded.n_envs == new_n_envs
    assert loaded.rollout_buffer.n_envs == new_n_envs
    assert loaded.aux_buffer.n_envs == new_n_envs
    assert loaded.aux_buffer.buffer_size == 2 * new_n_envs
    params_before = [param.detach().clone() for param in loaded.policy.parameters()]
    loaded.learn(2 * 16 * new_n_envs, reset_num_timesteps=False)
    assert loaded.num_timesteps == 64 + 2 * 16 * new_n_envs
    assert loaded.n_aux_phases == 2
    assert not all(th.equal(a, b) for a, b in zip(params_before, loaded.policy.parameters(), strict=True))


def test_set_env_with_different_n_envs(make_model):
    model = make_model(make_env("CartPole-v1", n_envs=2), n_policy_iters=3)
    model.learn(32)
    assert model.aux_buffer.n_rollouts == 2

    # Same number of envs: the buffered rollouts are kept, silently
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.set_env(make_env("CartPole-v1", n_envs=2, seed=1))
    assert model.aux_buffer.n_rollouts == 2

    # Different number: the buffers are rebuilt and the dropped rollouts are announced
    with pytest.warns(UserWarning, match="dropped"):
        model.set_env(make_env("CartPole-v1", n_envs=3))
    assert model.n_envs == model.get_env().num_envs == 3
    assert model.rollout_buffer.n_envs == 3
    assert model.aux_buffer.n_envs == 3
    assert model.aux_buffer.n_rollouts == 0

    # The next aux phase comes after n_policy_iters new iterations
    model.learn(2 * 16 * 3, reset_num_timesteps=False)
    assert model.n_aux_phases == 0
    assert model.aux_buffer.n_rollouts == 6
    model.learn(16 * 3, reset_num_timesteps=False)
    assert model.n_aux_phases == 1
    assert model.num_timesteps == 32 + 3 * 16 * 3

    # An empty aux buffer loses nothing: no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.set_env(make_env("CartPole-v1", n_envs=1))
    model.learn(3 * 16, reset_num_timesteps=False)
    assert model.n_aux_phases == 2


def test_failed_set_env_leaves_model_unchanged(make_model):
    model = make_model(make_env("CartPole-v1", n_envs=2), aux_batch_rollouts=4)
    # aux_batch_rollouts=4 does not fit an auxiliary buffer of 2 iterations x 1 env (a batch_size larger than the
    # rollout is a warning, as in SB3's PPO: test_load_with_fewer_envs_than_the_batch_needs)
    with pytest.raises(ValueError, match="aux_batch_rollouts"):
        model.set_env(make_env("CartPole-v1", n_envs=1))
    assert model.n_envs == model.get_env().num_envs == model.rollout_buffer.n_envs == model.aux_buffer.n_envs == 2
    model.learn(64)
    assert model.n_aux_phases == 1


def test_load_with_fewer_envs_default_batch_size(tmp_path, make_model):
    env = make_env("CartPole-v1", n_envs=16)
    model = make_model(env, batch_size=None)
    assert model.batch_size == 32
    model.save(tmp_path / "model.zip")
    loaded = PPG.load(tmp_path / "model.zip", env=make_env("CartPole-v1", n_envs=1))
    loaded.learn(32)
    assert loaded.n_aux_phases == 1


@pytest.mark.parametrize("use_str_path", [True, False])
def test_aux_buffer_round_trip(tmp_path, use_str_path, make_model):
    """save_aux_buffer / load_aux_buffer resume a run mid-phase: the next aux phase comes at the same iteration."""
    model = make_model(make_env("CartPole-v1"), n_policy_iters=3)
    model.learn(2 * 32)
    assert model.aux_buffer.n_iterations == 2
    model.save(tmp_path / "model.zip")
    # A str path without suffix gets ".npz", as numpy's savez
    buffer_path = str(tmp_path / "aux_buffer") if use_str_path else tmp_path / "aux_buffer.npz"
    model.save_aux_buffer(buffer_path)
    assert (tmp_path / "aux_buffer.npz").is_file()
    buffer_path = tmp_path / "aux_buffer.npz"

    resumed = PPG.load(tmp_path / "model.zip", env=make_env("CartPole-v1"))
    assert resumed.aux_buffer.n_rollouts == 0
    resumed.load_aux_buffer(buffer_path)
    assert resumed.aux_buffer.n_rollouts == model.aux_buffer.n_rollouts == 4
    assert resumed.aux_buffer.device == resumed.device
    np.testing.assert_array_equal(resumed.aux_buffer.observations, model.aux_buffer.observations)
    np.testing.assert_array_equal(resumed.aux_buffer.returns, model.aux_buffer.returns)
    assert resumed.aux_buffer.returns[:4].any()

    # Without the buffer, a loaded model waits n_policy_iters iterations for its next aux phase
    not_resumed = PPG.load(tmp_path / "model.zip", env=make_env("CartPole-v1"))
    for agent in (model, resumed, not_resumed):
        agent.learn(32, reset_num_timesteps=False)
    assert model.n_aux_phases == resumed.n_aux_phases == 1
    assert resumed.aux_buffer.n_rollouts == 0
    assert not_resumed.n_aux_phases == 0
    assert not_resumed.aux_buffer.n_iterations == 1


def test_load_aux_buffer_errors(tmp_path, make_model):
    model = make_model(make_env("CartPole-v1"), n_policy_iters=3)
    model.learn(32)
    model.save_aux_buffer(tmp_path / "buffer.npz")

    def check_rejected(other: PPG, path, match: str) -> None:
        n_rollouts = other.aux_buffer.n_rollouts
        buffer = other.aux_buffer
        with pytest.raises(ValueError, match=match):
            other.load_aux_buffer(path)
        # The model's own buffer is untouched
        assert other.aux_buffer is buffer
        assert other.aux_buffer.n_rollouts == n_rollouts

    # Wrong shape: different n_envs, n_steps or n_policy_iters
    check_rejected(make_model(make_env("CartPole-v1", n_envs=3), n_policy_iters=3), tmp_path / "buffer.npz", "n_envs")
    check_rejected(make_model(make_env("CartPole-v1"), n_policy_iters=3, n_steps=32), tmp_path / "buffer.npz", "n_steps")
    check_rejected(make_model(make_env("CartPole-v1"), n_policy_iters=4), tmp_path / "buffer.npz", "n_policy_iters")
    # Same shapes, other env
    check_rejected(make_model(make_env("Acrobot-v1"), n_policy_iters=3), tmp_path / "buffer.npz", "space")
    # A pickle (even of a real buffer) is refused
    with open(tmp_path / "buffer.pkl", "wb") as file:
        pickle.dump(model.aux_buffer, file)
    check_rejected(model, tmp_path / "buffer.pkl", "looks like a pickle")
    # An npz of other arrays
    np.savez(tmp_path / "other.npz", observations=np.zeros(3))
    check_rejected(model, tmp_path / "other.npz", "no metadata")
    # Corrupt and truncated files
    (tmp_path / "garbage.npz").write_bytes(b"\x00\xff not a buffer" * 10)
    check_rejected(model, tmp_path / "garbage.npz", "not a sb3_ppg.aux_buffer file")
    raw = (tmp_path / "buffer.npz").read_bytes()
    for fraction in (0.3, 0.6, 0.95):
        (tmp_path / "truncated.npz").write_bytes(raw[: int(len(raw) * fraction)])
        check_rejected(model, tmp_path / "truncated.npz", "truncated or damaged|not a valid")
    # A missing file stays a FileNotFoundError
    with pytest.raises(FileNotFoundError):
        model.load_aux_buffer(tmp_path / "missing.npz")


class _Marker:
    """Unpickling this creates a file: the proof that a pickle's code ran."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_aux_buffer_pickle_never_executed(tmp_path, make_model):
    """A crafted pickle where an aux buffer file belongs is refused, and the code it carries never runs."""
    model = make_model(make_env("CartPole-v1"), n_policy_iters=3)
    marker = tmp_path / "marker"
    payload = pickle.dumps(_Marker(str(marker)))
    for name in ("aux_buffer.pkl", "aux_buffer.npz", "aux_buffer"):
        (tmp_path / name).write_bytes(payload)
        with pytest.raises(ValueError, match="pickle"):
            model.load_aux_buffer(tmp_path / name)
    # The same payload inside an npz member (np.load would unpickle it with allow_pickle=True)
    with zipfile.ZipFile(tmp_path / "inside.npz", "w") as archive:
        archive.writestr("metadata.json", json.dumps({"format": "sb3_ppg.aux_buffer"}))
        archive.writestr("observations.npy", payload)
    with pytest.raises(ValueError):
        model.load_aux_buffer(tmp_path / "inside.npz")
    assert not marker.exists()
    # Sanity check: the payload does run when unpickled
    pickle.loads(payload).close()
    assert marker.exists()


def _rewrite_member(path, name: str, transform) -> None:
    """Rewrite one member of an npz archive (as a tool editing the file would)."""
    with zipfile.ZipFile(path) as archive:
        members = {info.filename: archive.read(info.filename) for info in archive.infolist()}
    members[name] = transform(members[name])
    with zipfile.ZipFile(path, "w") as archive:
        for member, data in members.items():
            archive.writestr(member, data)


def test_aux_buffer_damage_detected(tmp_path, make_model):
    model = make_model(make_env("CartPole-v1"), n_policy_iters=3)
    model.learn(64)
    path = tmp_path / "buffer.npz"
    model.save_aux_buffer(path)
    raw = path.read_bytes()
    observations, returns = model.aux_buffer.observations.clone(), model.aux_buffer.returns.clone()

    # A flipped byte inside the observations (the zip's own CRC is rewritten: only our checksum can tell)
    (tmp_path / "flipped.npz").write_bytes(raw)
    _rewrite_member(tmp_path / "flipped.npz", "observations.npy", lambda data: data[:-5] + bytes([data[-5] ^ 1]) + data[-4:])
    with pytest.raises(ValueError, match="does not match its checksum"):
        model.load_aux_buffer(tmp_path / "flipped.npz")

    # A flipped byte anywhere in the file
    for offset in range(0, len(raw), max(1, len(raw) // 25)):
        damaged = bytearray(raw)
        damaged[offset] ^= 0x10
        (tmp_path / "damaged.npz").write_bytes(bytes(damaged))
        try:
            model.load_aux_buffer(tmp_path / "damaged.npz")
        except ValueError:
            continue
        # Only bytes the reader never uses (e.g. a zip header's timestamp) may change without an error
        np.testing.assert_array_equal(model.aux_buffer.observations[:4], observations[:4])
        np.testing.assert_array_equal(model.aux_buffer.returns[:4], returns[:4])

    # A tampered position, with or without a matching metadata checksum
    def set_pos(data: bytes, pos: int, fix_checksum: bool) -> bytes:
        metadata = json.loads(data)
        metadata["pos"] = pos
        if fix_checksum:
            del metadata["checksum"]
            metadata["checksum"] = hashlib.sha256(json.dumps(metadata, sort_keys=True).encode()).hexdigest()
        return json.dumps(metadata).encode()

    for pos, fix_checksum, match in (
        (6, False, "checksum"),
        (6, True, "position 6"),
        (3, True, "position 3"),
        (-2, True, "position"),
    ):
        (tmp_path / "tampered.npz").write_bytes(raw)
        _rewrite_member(
            tmp_path / "tampered.npz", "metadata.json", functools.partial(set_pos, pos=pos, fix_checksum=fix_checksum)
        )
        with pytest.raises(ValueError, match=match):
            model.load_aux_buffer(tmp_path / "tampered.npz")


def test_no_aux_buffer_to_save_or_load(tmp_path, make_model):
    model = make_model(make_env("CartPole-v1"), n_aux_epochs=0)
    assert model.aux_buffer is None
    with pytest.raises(ValueError, match="n_aux_epochs=0"):
        model.save_aux_buffer(tmp_path / "buffer.npz")
    with pytest.raises(ValueError, match="n_aux_epochs=0"):
        model.load_aux_buffer(tmp_path / "buffer.npz")


def test_load_corrupt_model_zip(tmp_path, make_model):
    make_model(make_env("CartPole-v1")).save(tmp_path / "model.zip")
    raw = (tmp_path / "model.zip").read_bytes()

    # Not a zip at all: SB3 raises ValueError
    (tmp_path / "garbage.zip").write_bytes(b"garbage" * 100)
    with pytest.raises(ValueError, match="wasn't a zip-file"):
        PPG.load(tmp_path / "garbage.zip")

    # Bytes flipped inside a member: the CRC check fails, SB3 raises ValueError
    with zipfile.ZipFile(tmp_path / "model.zip") as archive:
        info = archive.getinfo("policy.pth")
    start = info.header_offset + 30 + len(info.filename) + len(info.extra) + info.compress_size // 2
    corrupt = bytearray(raw)
    corrupt[start : start + 32] = bytes(byte ^ 0xFF for byte in corrupt[start : start + 32])
    (tmp_path / "corrupt.zip").write_bytes(bytes(corrupt))
    with pytest.raises(ValueError, match="wasn't a zip-file"):
        PPG.load(tmp_path / "corrupt.zip")

    # Truncated (an interrupted copy): SB3 raises ValueError when no zip directory is left, but usually an
    # AssertionError "No data found in the saved file": the tail of the truncated file still holds the zip
    # directory of the nested policy.pth (itself a zip), which zipfile opens instead.
    for fraction in (0.1, 0.5, 0.9):
        (tmp_path / "truncated.zip").write_bytes(raw[: int(len(raw) * fraction)])
        with pytest.raises(ValueError, match=r"wasn't a zip-file|not a complete PPG model zip"):
            PPG.load(tmp_path / "truncated.zip")


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("case", ["mlp-pendulum", "cnn", "procgen-cnn"])
def test_policy_save_load(tmp_path, case, arch, make_model):
    """Policy-only save/load keeps the arch: SB3's own policies silently rebuild a non-shared policy shared."""
    policy, env_name, policy_kwargs = POLICY_CASES[case]
    env = make_env(env_name)
    model = make_model(env, policy, {**policy_kwargs, "arch": arch})
    model.learn(64)
    observations = sample_observations(env)

    model.policy.save(tmp_path / "policy.pth")
    # With the policy's own class, or with the base class (the saved constructor arguments give the extractor)
    for loaded in (type(model.policy).load(tmp_path / "policy.pth"), PPGPolicy.load(tmp_path / "policy.pth")):
        assert loaded.compute_dtype == model.policy.compute_dtype  # the rollouts' precision ("auto": bf16 on AMX)
        assert loaded.arch == arch
        assert loaded.share_features_extractor == (arch != "dual")
        assert (loaded.pi_features_extractor is loaded.vf_features_extractor) == (arch != "dual")
        assert type(loaded.features_extractor) is type(model.policy.features_extractor)
        assert_same_state(model.policy.state_dict(), loaded.state_dict())
        assert_same_outputs(model.policy, loaded, observations)
        np.testing.assert_array_equal(
            model.predict(observations, deterministic=True)[0], loaded.predict(observations, deterministic=True)[0]
        )


def test_policy_save_load_keeps_the_precision(tmp_path, make_model):
    """
    A policy saved alone predicts at the precision it was saved with (its model's rollout precision), loaded with
    either class; a file without one (SB3's format, saved before) loads in float32.
    """
    policy, env_name, policy_kwargs = POLICY_CASES["procgen-cnn"]
    env = make_env(env_name)
    model = make_model(env, policy, {**policy_kwargs, "arch": "dual"}, precision="bf16")
    assert model.policy.compute_dtype == th.bfloat16
    observations = sample_observations(env)
    model.policy.save(tmp_path / "policy.pth")
    for loaded in (type(model.policy).load(tmp_path / "policy.pth"), PPGPolicy.load(tmp_path / "policy.pth")):
        assert loaded.compute_dtype == th.bfloat16
        assert_same_outputs(model.policy, loaded, observations)
    saved = th.load(tmp_path / "policy.pth", weights_only=False)
    assert saved["precision"] == "bf16"
    del saved["precision"]
    th.save(saved, tmp_path / "old.pth")
    old = PPGPolicy.load(tmp_path / "old.pth")
    assert old.compute_dtype == th.float32
    assert_same_state(model.policy.state_dict(), old.state_dict())
    fp32 = make_model(env, policy, {**policy_kwargs, "arch": "dual"}, precision="fp32").policy
    fp32.save(tmp_path / "fp32.pth")
    assert PPGPolicy.load(tmp_path / "fp32.pth").compute_dtype == th.float32
    fp32.compute_dtype = th.float16
    with pytest.raises(ValueError, match=r"compute_dtype torch\.float16 is not one of"):
        fp32.save(tmp_path / "fp16.pth")


def test_get_set_parameters(tmp_path, make_model):
    env = make_env("CartPole-v1")
    model = make_model(env, n_value_epochs=2)
    model.learn(64)
    params = model.get_parameters()
    assert set(params) == {"policy", "policy.optimizer", "aux_optimizer", "value_optimizer"}
    observations = sample_observations(env)

    other = make_model(make_env("CartPole-v1"), n_value_epochs=2, seed=1)
    assert not th.equal(policy_outputs(model.policy, observations)[0], policy_outputs(other.policy, observations)[0])
    other.set_parameters(params)
    assert_same_state(params, other.get_parameters())
    assert_same_outputs(model.policy, other.policy, observations)

    # From a zip, too
    model.save(tmp_path / "model.zip")
    third = make_model(make_env("CartPole-v1"), n_value_epochs=2, seed=2)
    third.set_parameters(tmp_path / "model.zip")
    assert_same_outputs(model.policy, third.policy, observations)
    assert_same_state(model.aux_optimizer.state_dict(), third.aux_optimizer.state_dict())

    # exact_match: a missing optimizer is an error
    del params["aux_optimizer"]
    with pytest.raises(ValueError, match="aux_optimizer"):
        other.set_parameters(params, exact_match=True)
    other.set_parameters(params, exact_match=False)


def test_load_with_custom_objects(tmp_path, make_model):
    """What rl-zoo's enjoy.py does."""
    env = make_env("Pendulum-v1")
    model = make_model(env, learning_rate=1e-3, aux_learning_rate=2e-3, clip_range_vf=0.5)
    model.learn(64)
    model.save(tmp_path / "model.zip")
    observations = sample_observations(env)

    custom_objects = {"learning_rate": 0.0, "lr_schedule": lambda _: 0.0, "clip_range": lambda _: 0.0}
    loaded = PPG.load(tmp_path / "model.zip", env=env, custom_objects=custom_objects)
    assert loaded.learning_rate == 0.0
    assert loaded.lr_schedule(1.0) == 0.0
    assert loaded.clip_range(1.0) == 0.0
    # Values that were not replaced are loaded as saved
    assert loaded.aux_learning_rate(1.0) == pytest.approx(2e-3)
    assert loaded.clip_range_vf(1.0) == pytest.approx(0.5)
    assert_same_outputs(model.policy, loaded.policy, observations)
    # Loading without an env (prediction only), as enjoy.py may
    no_env = PPG.load(tmp_path / "model.zip", custom_objects=custom_objects)
    assert no_env.get_env() is None
    np.testing.assert_array_equal(
        model.predict(observations, deterministic=True)[0], no_env.predict(observations, deterministic=True)[0]
    )


# ----------------------------------------------------------------------------------------------------------------------
# Atomic saves, checked loading (issue 19)


def test_save_over_a_good_zip_is_atomic(tmp_path, monkeypatch, make_model):
    """A save that fails midway (a full disk) leaves the previous zip intact and no partial or temporary file."""
    model = make_model(make_env("CartPole-v1"))
    model.learn(32)
    model.save(tmp_path / "model.zip")
    good = (tmp_path / "model.zip").read_bytes()
    observations = sample_observations(make_env("CartPole-v1"))

    def full_disk(obj, file, *args, **kwargs):
        file.write(b"\0" * 4096)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(th, "save", full_disk)  # SB3 writes the zip's .pth members with torch.save
    model.learn(32, reset_num_timesteps=False)
    for path in (tmp_path / "model.zip", str(tmp_path / "model.zip"), str(tmp_path / "model")):
        with pytest.raises(OSError, match="No space left"):
            model.save(path)
        assert (tmp_path / "model.zip").read_bytes() == good
        assert [entry.name for entry in tmp_path.iterdir()] == ["model.zip"]
    monkeypatch.undo()
    loaded = PPG.load(tmp_path / "model.zip")
    assert loaded.num_timesteps == 32
    loaded.predict(observations)


def test_save_paths_and_file_objects_as_sb3(tmp_path, make_model):
    """SB3's rules for where save() writes hold: ".zip" appended without a suffix, missing folders created, another
    suffix kept, a file object written in place; a symbolic link keeps pointing to the new file."""
    model = make_model(make_env("CartPole-v1"))
    model.save(str(tmp_path / "a" / "b" / "model"))
    model.save(tmp_path / "model.pkl")
    buffer = io.BytesIO(b"head")
    buffer.seek(4)
    model.save(buffer)
    (tmp_path / "target.zip").write_bytes(b"old")
    (tmp_path / "link.zip").symlink_to(tmp_path / "target.zip")
    model.save(tmp_path / "link.zip")
    assert (tmp_path / "link.zip").is_symlink()
    assert buffer.getvalue()[:4] == b"head"
    buffer.seek(4)
    for source in (tmp_path / "a" / "b" / "model.zip", tmp_path / "model.pkl", buffer, tmp_path / "target.zip"):
        assert_same_state(model.get_parameters(), PPG.load(source).get_parameters())
    assert sorted(entry.name for entry in tmp_path.iterdir()) == ["a", "link.zip", "model.pkl", "target.zip"]


def _edit_data(path, edit) -> None:
    """Rewrite the JSON "data" of a model zip, as a person editing the file would."""
    with zipfile.ZipFile(path) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    data = json.loads(members["data"])
    edit(data)
    members["data"] = json.dumps(data).encode()
    with zipfile.ZipFile(path, "w") as archive:
        for name, content in members.items():
            archive.writestr(name, content)


@pytest.mark.parametrize(
    "load_kwargs, match",
    [
        (dict(gamma=2.0), r"gamma must be in \[0, 1\], got 2.0 \(given to load\(\)\)"),
        (dict(custom_objects={"gamma": 2.0}), r"gamma must be in \[0, 1\], got 2.0 \(from custom_objects\)"),
        (dict(learning_rate="abc"), r"learning_rate must be a number, a schedule .*got 'abc' \(str\) \(given"),
        (dict(batch_size=7.5), r"batch_size must be an integer, got 7.5 \(float\)"),
        (dict(normalize_advantage="bogus"), "normalize_advantage must be one of"),
        (dict(n_aux_epochs=0), "drops aux_optimizer: the file holds the state of the auxiliary phase's own optimizer"),
        (dict(separate_aux_optimizer=False), r"separate_aux_optimizer=False \(separate_aux_optimizer given to load"),
        (dict(n_value_epochs=3), "needs value_optimizer, the optimizer of separate value epochs"),
        (dict(gama=0.9), r"'gama' is neither a PPG hyperparameter .*\(did you mean 'gamma'\?\)"),
        (dict(value_clipping="min"), r"value_clipping must be one of \('sb3', 'max'\), got 'min' \(given to load\(\)\)"),
    ],
)
def test_load_checks_hyperparameters_as_the_constructor(tmp_path, make_model, load_kwargs, match):
    make_model(make_env("CartPole-v1")).save(tmp_path / "model.zip")
    with pytest.raises(ValueError, match=match) as error:
        PPG.load(tmp_path / "model.zip", env=make_env("CartPole-v1"), **load_kwargs)
    assert "model.zip" in str(error.value)


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda data: data.update(normalize_advantage="bogus"), r"normalize_advantage .*got 'bogus' \(stored in the file\)"),
        (lambda data: data.update(gamma=2.0), r"gamma must be in \[0, 1\], got 2.0 \(stored in the file\)"),
        (lambda data: data.pop("n_steps"), r"holds no value for these PPG hyperparameters.*\n- n_steps is missing"),
        (lambda data: data.update(n_aux_epochs=0), r"n_aux_epochs=0, .*\(the file's own values .*\) drops aux_optimizer"),
    ],
)
def test_load_checks_an_edited_zip(tmp_path, make_model, edit, match):
    make_model(make_env("CartPole-v1")).save(tmp_path / "model.zip")
    _edit_data(tmp_path / "model.zip", edit)
    with pytest.raises(ValueError, match=match) as error:
        PPG.load(tmp_path / "model.zip", env=make_env("CartPole-v1"))
    assert repr(str(tmp_path / "model.zip")) in str(error.value)


def test_value_clipping_and_policy_minibatches_are_saved(tmp_path, make_model):
    """Both options travel with the model; a zip written before they existed loads with the defaults (its behaviour)."""
    kwargs = dict(policy_minibatches="envs", clip_range_vf=0.2, value_clipping="max")
    make_model(make_env("CartPole-v1"), **kwargs).save(tmp_path / "model.zip")
    loaded = PPG.load(tmp_path / "model.zip", env=make_env("CartPole-v1"))
    assert (loaded.policy_minibatches, loaded.value_clipping) == ("envs", "max")
    _edit_data(tmp_path / "model.zip", lambda data: [data.pop("policy_minibatches"), data.pop("value_clipping")])
    loaded = PPG.load(tmp_path / "model.zip", env=make_env("CartPole-v1"))
    assert (loaded.policy_minibatches, loaded.value_clipping) == ("transitions", "sb3")


def test_load_arguments_mean_what_they_mean_in_the_constructor(tmp_path, make_model):
    """Valid hyperparameters given to load() apply, with the constructor's meaning of None and of n_epochs alone."""
    model = make_model(make_env("CartPole-v1", n_envs=2), batch_size=None, n_epochs=1)
    assert model.batch_size == 4 and model.n_value_epochs == 1 and model.value_optimizer is None
    model.save(tmp_path / "model.zip")
    env = make_env("CartPole-v1", n_envs=2)

    # A number stops following the number of envs; None follows it again
    loaded = PPG.load(tmp_path / "model.zip", env=env, batch_size=8, gamma=0.9, normalize_advantage=False)
    assert (loaded.batch_size, loaded.gamma, loaded.normalize_advantage) == (8, 0.9, "none")
    loaded.save(tmp_path / "fixed.zip")
    assert PPG.load(tmp_path / "fixed.zip", env=make_env("CartPole-v1", n_envs=1)).batch_size == 8
    assert PPG.load(tmp_path / "fixed.zip", env=env, batch_size=None).batch_size == 4
    # n_epochs alone keeps joint value epochs joint (n_value_epochs=None in the constructor)
    loaded = PPG.load(tmp_path / "model.zip", env=env, n_epochs=3)
    assert (loaded.n_epochs, loaded.n_value_epochs, loaded.value_optimizer) == (3, 3, None)
    loaded.learn(64)
    assert loaded._n_updates == 2 * 3


def test_ppo_and_ppg_zips_say_which_algorithm_they_hold(tmp_path, make_model):
    from stable_baselines3 import PPO
    from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm

    PPO("MlpPolicy", make_env("CartPole-v1"), n_steps=16, batch_size=16).save(tmp_path / "ppo.zip")
    with pytest.raises(ValueError, match=r"ppo.zip' does not hold a PPG model: its policy is .*ActorCriticPolicy.*SB3's PPO"):
        PPG.load(tmp_path / "ppo.zip")
    # With an auxiliary phase (an optimizer PPO lacks) and without (a PPG zip that PPO used to load and train)
    for kwargs in (dict(), dict(n_aux_epochs=0)):
        model = make_model(make_env("CartPole-v1"), **kwargs)
        model.save(tmp_path / "ppg.zip")
        with pytest.raises(ValueError, match=r"holds a PPG model \(sb3_ppg.PPG, policy .*\.PPGPolicy\).*PPG.load"):
            PPO.load(tmp_path / "ppg.zip", env=make_env("CartPole-v1"))
        loaded = PPG.load(tmp_path / "ppg.zip")
        assert loaded.policy_class is model.policy_class is PPGPolicy
        assert_same_state(model.get_parameters(), loaded.get_parameters())
    # A zip written before the policy class was wrapped still loads
    OnPolicyAlgorithm.save(model, tmp_path / "old.zip")
    assert PPG.load(tmp_path / "old.zip").policy_class is PPGPolicy


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A checkpoint of a small run (2 envs x 16 steps, N_pi 2) after 3 iterations: one rollout stored."""
    from helpers import small_ppg

    from sb3_ppg import PPGCheckpointCallback

    folder = tmp_path_factory.mktemp("run")
    small_ppg(make_env("CartPole-v1")).learn(3 * 32, callback=PPGCheckpointCallback(16, str(folder), name_prefix="ppg"))
    return folder / "ppg_96_steps"


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(n_aux_epochs=0), "n_aux_epochs=0, separate_aux_optimizer=True .* drops aux_optimizer"),
        (dict(learning_rate="abc"), "learning_rate must be a number, a schedule"),
        (dict(batch_size=7.5), r"batch_size must be an integer, got 7.5 \(float\) \(given to load\(\)\)"),
        (dict(gamma=2.0), r"gamma must be in \[0, 1\], got 2.0"),
        (dict(n_steps=32), "cannot change.*\n- n_steps=32 given, the run has n_steps=16"),
        (dict(n_policy_iters=3), "cannot change.*\n- n_policy_iters=3 given, the run has n_policy_iters=2"),
    ],
)
def test_load_checkpoint_checks_its_keyword_arguments(checkpoint, kwargs, match):
    """Bad or unsafe hyperparameters given to load_checkpoint() are named as such, not as a damaged checkpoint."""
    with pytest.raises(ValueError, match=match) as error:
        PPG.load_checkpoint(checkpoint, env=make_env("CartPole-v1"), **kwargs)
    assert "damaged" not in str(error.value)


def test_load_checkpoint_applies_valid_keyword_arguments(checkpoint):
    resumed = PPG.load_checkpoint(checkpoint, env=make_env("CartPole-v1"), n_steps=16, learning_rate=1e-4, n_aux_epochs=2)
    assert (resumed.n_steps, resumed.learning_rate, resumed.n_aux_epochs) == (16, 1e-4, 2)
    assert resumed.aux_buffer.n_iterations == 1
    resumed.learn(32, reset_num_timesteps=False)
    assert resumed.n_aux_phases == 2 and resumed._n_aux_updates == 2 * 2 + 2 * 2 * 2


@pytest.mark.filterwarnings("ignore:.*CartPole-v0 is out of date")
def test_load_checkpoint_with_envs_of_another_id_is_refused(checkpoint):
    """A DummyVecEnv's saved envs replace those given: envs made with another id would be silently ignored."""
    with pytest.raises(ValueError, match=r"settings of its env 0 differ \(id='CartPole-v0' in the env, 'CartPole-v1' in"):
        PPG.load_checkpoint(checkpoint, env=make_vec_env("CartPole-v0", n_envs=2))


def test_load_with_fewer_envs_than_the_batch_needs(tmp_path):
    """PPG.load(path, env=<fewer envs>) with a saved batch_size larger than the new rollout: a warning that names the
    fix (as SB3's PPO, which trains on with one minibatch per epoch), not an error; each epoch is one minibatch."""
    model = PPG("MlpPolicy", make_vec_env("CartPole-v1", n_envs=8, seed=0), n_steps=32, batch_size=256, seed=0)
    model.save(tmp_path / "model")
    with pytest.warns(UserWarning, match=r"batch_size=256 is larger than the rollout \(n_steps \* n_envs = 32 \* 2 = 64\)"):
        # On the CPU the minibatches come from the rollout buffer's get() (on CUDA they are gathered on the device)
        loaded = PPG.load(tmp_path / "model", env=make_vec_env("CartPole-v1", n_envs=2, seed=0), device="cpu")
    sizes = []
    get = loaded.rollout_buffer.get

    def recording_get(batch_size=None):
        for minibatch in get(batch_size):
            sizes.append(len(minibatch.actions))
            yield minibatch

    loaded.rollout_buffer.get = recording_get
    loaded.learn(64)
    assert sizes == [64] * loaded.n_epochs
    # batch_size=None follows the new number of envs, without a warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = PPG.load(tmp_path / "model", env=make_vec_env("CartPole-v1", n_envs=2, seed=0), batch_size=None)
    assert loaded.batch_size == 8
