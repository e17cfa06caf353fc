"""
CUDA graphs of the rollout's forward pass (``PPG(cuda_graphs=True)``, sb3_ppg/common/cuda_graphs.py): on a CUDA device
the rollouts and the updates are bit for bit those of the plain pass; without CUDA, or where a capture fails, the
plain pass runs (the same numbers), with a warning for the failure. The CUDA tests run where a GPU is (the lead's GPU
sessions); the fallbacks run everywhere.
"""

import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from helpers import SMALL_PPG, assert_identical, parameters, small_ppg
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor

from sb3_ppg import PPG, MaskablePPG
from sb3_ppg.common.cuda import cuda_graphs
from sb3_ppg.common.cuda.cuda_graphs import GraphedForward, input_layout, parameter_addresses

requires_cuda = pytest.mark.skipif(not th.cuda.is_available(), reason="needs a CUDA device")

TINY_CNN = dict(features_extractor_kwargs=dict(channels=(4, 8), features_dim=16), net_arch=[])


class TinyImageEnv(gym.Env):
    """Random 16x16 RGB images, 3 actions, episodes of 9 steps (seeded)."""

    observation_space = spaces.Box(0, 255, (16, 16, 3), np.uint8)
    action_space = spaces.Discrete(3)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t = 0
        return self.np_random.integers(0, 256, (16, 16, 3), dtype=np.uint8), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        obs = self.np_random.integers(0, 256, (16, 16, 3), dtype=np.uint8)
        return obs, float(action == self.t % 3), self.t >= 9, False, {}


class BatchNormFeatures(BaseFeaturesExtractor):
    """A features extractor with buffers: a batch norm of the observations."""

    def __init__(self, observation_space: spaces.Box) -> None:
        super().__init__(observation_space, observation_space.shape[0])
        self.norm = th.nn.BatchNorm1d(observation_space.shape[0])

    def forward(self, observations: th.Tensor) -> th.Tensor:
        return self.norm(observations)


def image_model(cuda_graphs: bool, device: str, policy_kwargs: dict | None = None, **kwargs: object) -> PPG:
    env = make_vec_env(TinyImageEnv, n_envs=4, seed=3)
    policy_kwargs = TINY_CNN if policy_kwargs is None else policy_kwargs
    return small_ppg(env, "ProcgenCnn", policy_kwargs, seed=3, device=device, cuda_graphs=cuda_graphs, **kwargs)


def rollout_and_parameters(model: PPG, steps: int) -> tuple[dict[str, np.ndarray], dict[str, th.Tensor]]:
    model.learn(steps)
    buffer = model.rollout_buffer
    arrays = {name: getattr(buffer, name).copy() for name in ("observations", "actions", "values", "log_probs", "returns")}
    return arrays, parameters(model)


def assert_same_run(run_a: tuple, run_b: tuple) -> None:
    for name in run_a[0]:
        assert np.array_equal(run_a[0][name], run_b[0][name]), f"rollout {name} differs"
    assert_identical(run_a[1], run_b[1])


def test_input_layout_and_parameter_addresses():
    """A graph is captured per layout (shape, dtype, device; per key of a dict) and per place of the parameters."""
    assert input_layout(th.zeros(2, 3)) != input_layout(th.zeros(4, 3))
    assert input_layout(th.zeros(2, 3)) != input_layout(th.zeros(2, 3, dtype=th.uint8))
    assert input_layout({"b": th.zeros(1), "a": th.zeros(2)}) == input_layout({"a": th.zeros(2), "b": th.zeros(1)})
    module = th.nn.Linear(2, 2)
    before = parameter_addresses(module)
    module.load_state_dict({name: value.clone() for name, value in module.state_dict().items()}, assign=True)
    assert parameter_addresses(module) != before


@pytest.mark.parametrize("arch", ["dual", "detach", "shared"])
def test_parameter_addresses_are_the_policys_tensors(arch):
    """
    The addresses are those of ``parameters()`` and ``buffers()`` (each once, shared modules included), read from the
    live module tree: a replaced submodule, parameter or buffer changes them, nothing else does.
    """
    policy = small_ppg(policy_kwargs=dict(net_arch=[8], arch=arch, features_extractor_class=BatchNormFeatures)).policy
    addresses = parameter_addresses(policy)
    expected = [tensor.data_ptr() for tensor in (*policy.parameters(), *policy.buffers())]
    assert sorted(addresses) == sorted(expected) and len(addresses) == len(set(addresses))
    assert any(tensor.data_ptr() in addresses for tensor in policy.buffers())  # the batch norm's statistics
    assert parameter_addresses(policy) == addresses
    policy.value_net = th.nn.Linear(policy.value_net.in_features, 1)  # a new submodule
    replaced = parameter_addresses(policy)
    assert replaced != addresses
    policy.value_net.weight = th.nn.Parameter(policy.value_net.weight.detach().clone())  # a new parameter
    assert parameter_addresses(policy) != replaced
    replaced = parameter_addresses(policy)
    norm = policy.pi_features_extractor.norm
    norm.running_mean = norm.running_mean.clone()  # a new buffer
    assert parameter_addresses(policy) != replaced


def test_no_graphs_without_cuda(monkeypatch):
    """On a CPU the flag changes nothing: the graphs are never built, the run is the one without them."""
    monkeypatch.setattr(GraphedForward, "__call__", lambda *args, **kwargs: pytest.fail("graphs used on a CPU"))
    with_graphs = rollout_and_parameters(image_model(True, "cpu"), 128)
    without = rollout_and_parameters(image_model(False, "cpu"), 128)
    assert_same_run(with_graphs, without)


def test_failed_capture_falls_back_with_one_warning(monkeypatch):
    """A capture that fails leaves the plain pass for that layout (same outputs), with one warning, not one per call."""

    def failing_capture(self, function, observations):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(cuda_graphs.CapturedForward, "__init__", failing_capture)
    calls = []

    def function(observations):
        calls.append(1)
        return (observations * 2,)

    graphed = GraphedForward(function)
    with pytest.warns(UserWarning, match=r"could not be captured in a CUDA graph \(RuntimeError: operation not permitted"):
        (first,) = graphed(th.ones(3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (second,) = graphed(th.ones(3))
    assert th.equal(first, th.full((3,), 2.0)) and th.equal(second, first)
    assert len(calls) == 2 and not graphed.graphs


def test_cuda_graphs_is_checked():
    with pytest.raises(ValueError, match="cuda_graphs must be a bool, got 'yes'"):
        small_ppg(cuda_graphs="yes")


def test_cuda_graphs_saved_and_loaded(tmp_path):
    model = small_ppg(cuda_graphs=False)
    model.save(tmp_path / "model.zip")
    loaded = PPG.load(tmp_path / "model.zip")
    assert loaded.cuda_graphs is False and loaded.policy.rollout_cuda_graphs is False


@requires_cuda
@pytest.mark.parametrize("arch", ["dual", "detach", "shared"])
def test_graphed_rollouts_are_bit_identical_on_cuda(arch):
    """Two iterations and an auxiliary phase: the same rollouts and parameters with and without graphs."""
    runs = []
    for graphs in (True, False):
        model = image_model(graphs, "cuda", policy_kwargs={**TINY_CNN, "arch": arch})
        runs.append(rollout_and_parameters(model, 128))
        assert bool(model.policy._rollout_graphs and model.policy._rollout_graphs.graphs) == graphs
    assert_same_run(*runs)


class MaskedImageEnv(TinyImageEnv):
    """TinyImageEnv whose last action is valid every other step."""

    def action_masks(self) -> np.ndarray:
        return np.array([True, True, self.t % 2 == 0])


@requires_cuda
def test_graphed_rollouts_bf16_and_maskable_on_cuda():
    """bf16 autocast inside the graph, and MaskablePPG's masked sampling after it: the same as without graphs."""
    runs = [rollout_and_parameters(image_model(graphs, "cuda", precision="bf16"), 128) for graphs in (True, False)]
    assert_same_run(*runs)
    masked = []
    for graphs in (True, False):
        env = make_vec_env(MaskedImageEnv, n_envs=4, seed=3)
        model = MaskablePPG("ProcgenCnn", env, policy_kwargs=TINY_CNN, seed=3, device="cuda", cuda_graphs=graphs, **SMALL_PPG)
        masked.append(rollout_and_parameters(model, 128))
    assert_same_run(*masked)


@requires_cuda
def test_moved_parameters_are_captured_again_on_cuda():
    """Parameters replaced (``load_state_dict(assign=True)``): the old graph is not replayed on freed memory."""
    models = []
    for graphs in (True, False):
        model = image_model(graphs, "cuda")
        model.learn(64)
        models.append(model)
    graphs = models[0].policy._rollout_graphs
    assert graphs is not None and len(graphs.graphs) == 1
    for model in models:
        state = {name: value.clone() for name, value in model.policy.state_dict().items()}
        model.policy.load_state_dict(state, assign=True)
    obs = th.as_tensor(models[0].env.reset(), device="cuda")
    with th.no_grad():
        graphed = models[0].policy.rollout_latent_and_values(obs)
        plain = models[1].policy.rollout_latent_and_values(obs)
    assert len(graphs.graphs) == 2
    for a, b in zip(graphed, plain, strict=True):
        assert th.equal(a, b)


class SyncingExtractor(BaseFeaturesExtractor):
    """Reads a value on the host inside its forward: cannot be captured."""

    def __init__(self, observation_space: spaces.Box) -> None:
        super().__init__(observation_space, 8)
        self.linear = th.nn.Linear(int(np.prod(observation_space.shape)), 8)

    def forward(self, observations: th.Tensor) -> th.Tensor:
        scale = float(observations.abs().max().item() > -1)
        return self.linear(observations.flatten(1)) * scale


@requires_cuda
def test_network_that_syncs_runs_without_graphs_on_cuda():
    runs = []
    for graphs in (True, False):
        env = make_vec_env("CartPole-v1", n_envs=2, seed=0)
        model = small_ppg(
            env, policy_kwargs=dict(features_extractor_class=SyncingExtractor, net_arch=[]), device="cuda", cuda_graphs=graphs
        )
        if graphs:
            with pytest.warns(UserWarning, match="could not be captured in a CUDA graph"):
                runs.append(rollout_and_parameters(model, 64))
        else:
            runs.append(rollout_and_parameters(model, 64))
    assert_same_run(*runs)
