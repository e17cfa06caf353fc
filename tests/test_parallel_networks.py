"""
``PPG(parallel_networks=True)`` (sb3_ppg/common/cuda_streams.py): on a CUDA device ``arch="dual"``'s value network runs
on a second stream beside the policy network, with the same results bit for bit; on a CPU, and for the one-network
architectures, nothing changes. The CUDA tests run where a GPU is (the lead's GPU sessions); the rest everywhere.
"""

import copy
import pickle
import threading
from contextlib import contextmanager

import pytest
import torch as th
from helpers import SMALL_PPG, small_ppg
from stable_baselines3.common.env_util import make_vec_env
from test_cuda_graphs import (
    TINY_CNN,
    MaskedImageEnv,
    assert_same_run,
    image_model,
    requires_cuda,
    rollout_and_parameters,
)

from sb3_ppg import PPG, MaskablePPG
from sb3_ppg.common.cuda import cuda_streams
from sb3_ppg.ppg.policies import PPGPolicy


class InlineBranch:
    """``SideStream``'s interface on the current stream: the parallel code path, run in order (CPU)."""

    def __init__(self) -> None:
        self.branches = 0
        self.joins = 0

    @contextmanager
    def branch(self):
        self.branches += 1
        yield

    def join(self) -> None:
        self.joins += 1


def test_parallel_networks_is_checked():
    with pytest.raises(ValueError, match="parallel_networks must be a bool, got 'yes'"):
        small_ppg(parallel_networks="yes")


def test_parallel_networks_saved_and_loaded(tmp_path):
    model = small_ppg(parallel_networks=False)
    assert model.policy.parallel_networks is False
    model.save(tmp_path / "model.zip")
    loaded = PPG.load(tmp_path / "model.zip")
    assert loaded.parallel_networks is False and loaded.policy.parallel_networks is False
    assert PPG.load(tmp_path / "model.zip", parallel_networks=True).policy.parallel_networks is True


def test_parallel_networks_is_on_by_default():
    """On since it was measured (docs/throughput.md: 3 to 6% faster end to end on an H100, dual, bf16, 64 envs)."""
    assert small_ppg().policy.parallel_networks is True
    env = make_vec_env(MaskedImageEnv, n_envs=2, seed=0)
    assert MaskablePPG("ProcgenCnn", env, policy_kwargs=TINY_CNN, **SMALL_PPG).policy.parallel_networks is True


def test_no_side_stream_without_cuda(monkeypatch):
    """On a CPU the flag changes nothing: no stream is made, the run is the one without the flag."""

    def no_stream(*args, **kwargs):
        pytest.fail("a CUDA stream was made on a CPU")

    monkeypatch.setattr(cuda_streams.SideStream, "__init__", no_stream)
    runs = [rollout_and_parameters(image_model(False, "cpu", parallel_networks=flag), 128) for flag in (True, False)]
    assert_same_run(*runs)


def test_parallel_code_path_is_the_sequential_run(monkeypatch):
    """
    The parallel path's order (the value branch first, then the policy network, then the join), run inline on the
    CPU: the rollouts and the parameters after an auxiliary phase are bit for bit those of the sequential path.
    """
    branch = InlineBranch()
    monkeypatch.setattr(PPGPolicy, "_parallel_value_stream", lambda self: branch if self.parallel_networks else None)
    runs = [rollout_and_parameters(image_model(False, "cpu", parallel_networks=flag), 128) for flag in (True, False)]
    assert_same_run(*runs)
    # Every pass through both networks took the branch: the rollout's steps, the policy and auxiliary phases
    assert branch.branches == branch.joins and branch.branches > 128 // 4


@requires_cuda
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("cuda_graphs", [True, False])
def test_parallel_networks_are_bit_identical_on_cuda(precision, cuda_graphs):
    """Two iterations and an auxiliary phase (eager, and in CUDA graphs): the same rollouts and parameters."""
    runs = []
    for flag in (True, False):
        model = image_model(cuda_graphs, "cuda", precision=precision, parallel_networks=flag)
        runs.append(rollout_and_parameters(model, 128))
        assert (model.policy._value_stream is not None) == flag
    assert_same_run(*runs)


@requires_cuda
def test_parallel_networks_gradients_on_cuda():
    """One forward and backward pass of the auxiliary loss's networks: the same gradients on either path."""
    model = image_model(False, "cuda", parallel_networks=False)
    policy = model.policy
    obs = th.randint(0, 256, (64, *model.observation_space.shape), dtype=th.uint8, device="cuda")
    gradients = []
    for flag in (False, True):
        policy.parallel_networks = flag
        policy.zero_grad(set_to_none=True)
        distribution, values, aux_values = policy.forward_aux(obs)
        (distribution.entropy().mean() + values.square().mean() + aux_values.mean()).backward()
        gradients.append([parameter.grad.clone() for parameter in policy.parameters()])
    assert policy._value_stream is not None
    for sequential, parallel in zip(*gradients, strict=True):
        assert th.equal(sequential, parallel)


@requires_cuda
def test_parallel_networks_one_network_and_maskable_on_cuda():
    """The one-network architectures make no stream; MaskablePPG's dual policy runs the same as without the flag."""
    model = image_model(True, "cuda", policy_kwargs={**TINY_CNN, "arch": "detach"}, parallel_networks=True)
    model.learn(64)
    assert model.policy._value_stream is None
    runs = []
    for flag in (True, False):
        env = make_vec_env(MaskedImageEnv, n_envs=4, seed=3)
        model = MaskablePPG(
            "ProcgenCnn", env, policy_kwargs=TINY_CNN, seed=3, device="cuda", parallel_networks=flag, **SMALL_PPG
        )
        runs.append(rollout_and_parameters(model, 128))
    assert_same_run(*runs)


def test_policy_copies_without_graphs_and_stream():
    """pickle and deepcopy of a policy leave out its CUDA graphs and stream (which cannot be copied); the copy acts alike."""
    model = image_model(False, "cpu", parallel_networks=True)
    policy = model.policy
    policy._rollout_graphs = threading.Lock()  # stand-ins that cannot be copied, as CUDA graphs and streams
    policy._value_stream = threading.Lock()
    for copied in (copy.deepcopy(policy), pickle.loads(pickle.dumps(policy))):
        assert copied._rollout_graphs is None and copied._value_stream is None and copied.parallel_networks
        obs = th.as_tensor(model.env.reset())
        with th.no_grad():
            for a, b in zip(copied.rollout_latent_and_values(obs), policy.rollout_latent_and_values(obs), strict=True):
                assert th.equal(a, b)
    assert isinstance(policy._rollout_graphs, type(threading.Lock())) and policy._value_stream is not None


def test_policy_pickled_before_parallel_networks_loads():
    """A policy pickled by an earlier version (no ``cuda_graphs`` / ``parallel_networks`` attributes) unpickles and runs."""
    policy = image_model(False, "cpu").policy
    state = policy.__getstate__()
    for name in ("parallel_networks", "_value_stream", "rollout_cuda_graphs", "_rollout_graphs"):
        del state[name]
    old = PPGPolicy.__new__(type(policy))
    old.__setstate__(state)
    assert old.parallel_networks is False and old._parallel_value_stream() is None and old.rollout_cuda_graphs is False
    obs = th.zeros((2, *policy.observation_space.shape), dtype=th.uint8)
    with th.no_grad():
        for a, b in zip(old.rollout_latent_and_values(obs), policy.rollout_latent_and_values(obs), strict=True):
            assert th.equal(a, b)
