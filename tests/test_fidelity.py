"""
Update-level equivalence with the reference implementations (docs/fidelity.md): from the same initial weights and the
same rollouts, ``PPG`` makes the same parameter updates as the original code (openai/phasic-policy-gradient) and as
CleanRL's ``ppg_procgen.py``, to float64 precision, in the policy phase, for the old policy pi_old and in the auxiliary
phase.

The fixtures in ``tests/data/fidelity/`` were recorded by running each reference's own code in float64
(``benchmarks/fidelity/record_reference.py`` and ``record_cleanrl.py``; docs/fidelity.md says how to re-record them).
Each replay builds a float64 ``PPG`` with the matching preset (``"paper"`` for the original code, ``"cleanrl"`` for
CleanRL) and the fixture's small settings, loads the recorded initial weights, writes each recorded rollout into the
rollout buffer, injects the recorded minibatch orders (permutations of the envs, of the transitions and of the
auxiliary rollouts) and calls ``train()`` once per rollout.

The tolerance, 1e-10 on every parameter, follows from the math, not from this CPU: float64 rounding is ~1e-16
relative; Adam turns a difference in a gradient into a step difference of at most ``lr / eps`` times it (5e4 here).
That matters once, on the policy head at the first auxiliary step, where pi = pi_old, so that the cloning loss's
gradient is zero in exact arithmetic and rounding noise (a few 1e-16) in both implementations: ~1e-11 at most. Any
real difference (one coefficient, one form of a loss, one of CleanRL's quirks left out) is larger by orders of
magnitude: see the ``*_detects_a_change`` cases at the end.
"""

import json
import re
from collections import deque
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from stable_baselines3.common.logger import configure
from stable_baselines3.common.vec_env import DummyVecEnv

import sb3_ppg.ppg.ppg as ppg_module
from sb3_ppg import PPG
from sb3_ppg.common import optim
from sb3_ppg.common.aux_buffer import AuxiliaryBuffer
from sb3_ppg.common.optim import clip_gradients
from sb3_ppg.common.rollout_buffers import env_minibatches, flatten_rollout_buffer
from sb3_ppg.procgen import get_procgen_preset

FIXTURES = Path(__file__).parent / "data" / "fidelity"
ORIGINAL_CASES = ["orig_dual_clip", "orig_dual_kl", "orig_detach_clip", "orig_detach_kl", "orig_dual_clip_epi2_ev3"]
TOLERANCE = 1e-10
#: A real difference (one coefficient changed by 1%-10%) moves the parameters by more than this: 1,000 x the tolerance
LARGE = 1e-7


class ImageEnv(gym.Env):
    """The fixtures' env as PPG sees it (8x8x3 uint8 frames, 15 actions); never stepped: the rollouts are recorded."""

    def __init__(self, size: int) -> None:
        self.observation_space = gym.spaces.Box(0, 255, (size, size, 3), np.uint8)
        self.action_space = gym.spaces.Discrete(15)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        return self.observation_space.sample(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        raise NotImplementedError("the replay writes recorded rollouts into the rollout buffer")


class RecordedPermutations:
    """A stand-in for a NumPy generator whose ``permutation(n)`` returns the recorded permutations, in order."""

    def __init__(self, permutations: list[np.ndarray]) -> None:
        self.queue = deque(np.asarray(permutation) for permutation in permutations)

    def permutation(self, n: int) -> np.ndarray:
        permutation = self.queue.popleft()
        assert sorted(permutation) == list(range(n)), "a recorded permutation does not fit the buffer"
        return permutation


def float64_model(n_envs: int, image_size: int, kwargs: dict[str, Any]) -> PPG:
    """A ``PPG("ProcgenCnn")`` trained in float64 (``model.policy.to(th.float64)``), whose buffers hold float64."""
    env = DummyVecEnv([partial(ImageEnv, image_size)] * n_envs)
    model = PPG("ProcgenCnn", env, precision="fp32", micro_batch_size=None, device="cpu", seed=0, **kwargs)
    model.policy.to(th.float64)
    model.set_logger(configure(None, []))
    return model


# ---------------------------------------------------------------------------------------------------------------------
# Parameter names: PPG's -> the reference's
# ---------------------------------------------------------------------------------------------------------------------

ORIGINAL_NAMES = [
    (r"^stacks\.(\d)\.conv\.", r"stacks.\1.firstconv."),
    (r"\.conv_a\.", ".conv0."),
    (r"\.conv_b\.", ".conv1."),
]
CLEANRL_NAMES = [
    (r"^stacks\.(\d)\.conv\.", r"network.\1.conv."),
    (r"^stacks\.(\d)\.blocks\.(\d)\.conv_a\.", r"network.\1.res_block\2.conv0."),
    (r"^stacks\.(\d)\.blocks\.(\d)\.conv_b\.", r"network.\1.res_block\2.conv1."),
    (r"^dense\.", "network.5."),
]


def original_name(name: str, arch: str) -> str:
    """The original code's name of a PPG parameter (``pi_enc`` / ``vf_enc`` encoders, ``pi_head``, ...)."""
    value_head = "vf_vhead" if arch == "dual" else "pi_vhead"
    heads = {"action_net": "pi_head", "aux_value_net": "aux_vf_head", "value_net": value_head}
    module, rest = name.split(".", 1)
    if module in heads:
        return f"{heads[module]}.{rest}"
    for pattern, replacement in ORIGINAL_NAMES:
        rest = re.sub(pattern, replacement, rest)
    encoder = "vf_enc" if module == "vf_features_extractor" and arch == "dual" else "pi_enc"
    return f"{encoder}.cnn.{rest}"


def cleanrl_name(name: str, arch: str) -> str:
    """CleanRL's name of a PPG parameter (``network.*``, ``actor``, ``critic``, ``aux_critic``)."""
    heads = {"action_net": "actor", "aux_value_net": "aux_critic", "value_net": "critic"}
    module, rest = name.split(".", 1)
    if module in heads:
        return f"{heads[module]}.{rest}"
    for pattern, replacement in CLEANRL_NAMES:
        rest = re.sub(pattern, replacement, rest)
    return rest


NameMap = Callable[[str, str], str]


def load_parameters(model: PPG, data: np.lib.npyio.NpzFile, prefix: str, name_map: NameMap, arch: str) -> None:
    """Copy the recorded parameters ``<prefix>/<reference name>`` into the model; every recorded one must be used."""
    used = set()
    for name, tensor in model.policy.state_dict(keep_vars=True).items():
        key = f"{prefix}/{name_map(name, arch)}"
        tensor.data.copy_(th.from_numpy(data[key]))
        used.add(key)
    assert used == {key for key in data.files if key.startswith(prefix + "/")}


def max_difference(model: PPG, data: np.lib.npyio.NpzFile, prefix: str, name_map: NameMap, arch: str) -> float:
    """The largest absolute difference between the model's parameters and the recorded ones."""
    return max(
        float(np.abs(parameter.detach().numpy() - data[f"{prefix}/{name_map(name, arch)}"]).max())
        for name, parameter in model.policy.named_parameters()
    )


# ---------------------------------------------------------------------------------------------------------------------
# The replay
# ---------------------------------------------------------------------------------------------------------------------


def write_rollout(model: PPG, observations: np.ndarray, arrays: dict[str, np.ndarray], last_values, last_dones) -> None:
    """
    Write a recorded rollout into the rollout buffer in float64 and compute SB3's returns and advantages from it.

    :param observations: (step, env, H, W, C) uint8 frames (SB3's buffer holds them transposed, as VecTransposeImage)
    :param arrays: ``actions``, ``rewards``, ``episode_starts``, ``values``, ``log_probs``, each (step, env)
    :param last_values: the value of the observation after the rollout, per env
    :param last_dones: whether that observation starts an episode, per env
    """
    buffer = model.rollout_buffer
    buffer.reset()
    buffer.observations = np.ascontiguousarray(observations.transpose(0, 1, 4, 2, 3))
    buffer.actions = arrays["actions"].astype(np.float64)[..., None]
    for name in ("rewards", "episode_starts", "values", "log_probs"):
        setattr(buffer, name, arrays[name].astype(np.float64))
    buffer.advantages = np.zeros_like(buffer.rewards)
    buffer.returns = np.zeros_like(buffer.rewards)
    buffer.pos, buffer.full = buffer.buffer_size, True
    buffer.compute_returns_and_advantage(th.as_tensor(last_values, dtype=th.float64), np.asarray(last_dones, np.float64))


def record_phases(model: PPG, results: dict[str, float], compare: Callable[[str], float], old_logits: np.ndarray) -> None:
    """
    Compare the parameters right before the auxiliary phase (after the policy phase), pi_old once it is computed, and
    the parameters after the auxiliary phase, into ``results`` (``"policy"``, ``"pi_old"``, ``"aux"``).

    :param compare: the largest parameter difference from the recorded ``"policy"`` / ``"aux"`` parameters
    :param old_logits: the recorded pi_old, laid out as the auxiliary buffer's rows (row, step, action)
    """
    train_aux_phase = model._train_aux_phase

    def compared_aux_phase() -> None:
        results["policy"] = compare("policy")
        results["pi_old"] = float(np.abs(model.aux_buffer.old_distribution_params.numpy() - old_logits).max())
        train_aux_phase()
        results["aux"] = compare("aux")

    model._train_aux_phase = compared_aux_phase


def inject_aux_permutations(model: PPG, permutations: list[np.ndarray]) -> None:
    """Make the auxiliary buffer's minibatches follow the recorded permutations of its rows (one per epoch)."""
    aux_buffer = model.aux_buffer
    aux_buffer.get = partial(AuxiliaryBuffer.get, aux_buffer, generator=RecordedPermutations(permutations))


def replay_original(name: str, monkeypatch: pytest.MonkeyPatch, **changes: Any) -> dict[str, float]:
    """
    Replay a case of the original code through ``PPG`` with the paper's preset and ``policy_minibatches="envs"``.

    :param name: the case
    :param changes: PPG arguments that replace the replay's (the negative cases)
    :return: the largest differences: value targets (``"returns"``), ``"policy"``, ``"pi_old"``, ``"aux"``, and
        ``"final"`` (after one more policy phase, which checks that the policy phase's Adam survives the aux phase);
        ``"unused_orders"``: the recorded minibatch orders that the policy phases did not draw
    """
    data = np.load(FIXTURES / f"{name}.npz")
    meta = json.loads((FIXTURES / f"{name}.json").read_text())
    settings, arch = meta["settings"], meta["arch"]
    n_envs, n_steps = settings["num_envs"], settings["nstep"]
    kwargs = get_procgen_preset("paper").ppg_kwargs(n_envs)
    # The original code's coefficients are the paper preset's (train.py's defaults); the settings below are the case's
    assert (settings["lr"], settings["aux_lr"], settings["gamma"], settings["lam"]) == (
        kwargs["learning_rate"],
        kwargs["learning_rate"],
        kwargs["gamma"],
        kwargs["gae_lambda"],
    )
    assert (meta["entcoef"], meta["vfcoef"], settings["beta_clone"], settings["vf_true_weight"]) == (
        kwargs["ent_coef"],
        kwargs["vf_coef"],
        kwargs["beta_clone"],
        kwargs["vf_true_coef"],
    )
    assert kwargs["policy_minibatches"] == "envs" and kwargs["clip_range_vf"] is None and kwargs["max_grad_norm"] is None
    kwargs.update(
        n_steps=n_steps,
        batch_size=n_envs * n_steps // settings["nminibatch"],
        n_epochs=meta["n_epoch_pi"],
        n_value_epochs=meta["n_epoch_vf"],
        clip_range=meta["clip_param"] or None,  # ppgkl: clip_param 0 is no clipping
        kl_coef=meta["kl_penalty"],
        n_policy_iters=settings["n_pi"],
        n_aux_epochs=settings["n_aux_epochs"],
        aux_batch_rollouts=settings["aux_mbsize"],
        policy_kwargs=dict(
            arch=arch,
            features_extractor_kwargs=dict(channels=tuple(settings["chans"]), features_dim=settings["outsize"]),
        ),
    )
    kwargs.update(changes)
    model = float64_model(n_envs, settings["image_size"], kwargs)
    load_parameters(model, data, "init", original_name, arch)
    results: dict[str, float] = {"returns": 0.0, "unused_orders": 0}
    n_iterations = settings["n_pi"]
    # pi_old: (iteration, env, step, action) -> the auxiliary buffer's rows, iteration * n_envs + env
    old_logits = data["old_logits"].reshape(n_iterations * n_envs, n_steps, -1)
    record_phases(model, results, partial(max_difference, model, data, name_map=original_name, arch=arch), old_logits)
    # Auxiliary minibatches: permutations of the (env, iteration) pairs -> of the rows
    pairs = np.array(meta["aux_pairs_env_iteration"])
    inject_aux_permutations(model, [pairs[order, 1] * n_envs + pairs[order, 0] for order in data["aux_perms"]])
    for iteration in range(meta["n_iterations"]):

        def recorded(key: str, iteration: int = iteration) -> np.ndarray:
            """A recorded (env, step) array of this iteration, as (step, env)."""
            return data[f"it{iteration}/{key}"].swapaxes(0, 1)

        arrays = dict(
            actions=recorded("ac"),
            rewards=recorded("reward"),
            episode_starts=recorded("first"),
            values=recorded("vpred"),
            log_probs=recorded("logp"),
        )
        observations = data[f"it{iteration}/ob"].swapaxes(0, 1)
        write_rollout(model, observations, arrays, data[f"it{iteration}/vpredfinal"], data[f"it{iteration}/finalfirst"])
        results["returns"] = max(results["returns"], float(np.abs(model.rollout_buffer.returns - recorded("vtarg")).max()))
        # The policy phase's minibatches: one recorded permutation of the envs per epoch, value epochs first
        permutations = [*data.get(f"it{iteration}/vf_perms", []), *data[f"it{iteration}/pi_perms"]]
        generator = RecordedPermutations(permutations)
        monkeypatch.setattr(ppg_module, "env_minibatches", partial(env_minibatches, generator=generator))
        model.train()
        results["unused_orders"] += len(generator.queue)
    results["final"] = max_difference(model, data, "final", original_name, arch)
    return results


class CleanRLGradientLeak:
    """
    CleanRL's aux phase zeroes the gradients only after each step (``ppg_procgen.py:462-467``), so the last policy
    minibatch's clipped gradient is still in ``.grad`` and adds to the first auxiliary minibatch's gradient (clipped
    together). PPG zeroes them before the phase (as the original code does); this stand-in for ``clip_gradients``
    puts the leak back, test-side, to replay CleanRL.
    """

    def __init__(self) -> None:
        self.policy_gradient: list[th.Tensor | None] = []
        self.leaked = False

    def __call__(self, module: th.nn.Module, max_grad_norm: float | None, phase: str, timestep: int) -> None:
        if phase == "auxiliary" and not self.leaked:
            for parameter, gradient in zip(module.parameters(), self.policy_gradient, strict=True):
                if gradient is not None:
                    parameter.grad = gradient.clone() if parameter.grad is None else parameter.grad + gradient
            self.leaked = True
        clip_gradients(module, max_grad_norm, phase, timestep)
        if phase == "policy":
            self.policy_gradient = [None if p.grad is None else p.grad.clone() for p in module.parameters()]


def replay_cleanrl(
    monkeypatch: pytest.MonkeyPatch, bessel_std: bool = True, gradient_leak: bool = True, **changes: Any
) -> dict[str, float]:
    """
    Replay CleanRL's case through ``PPG`` with the ``"cleanrl"`` preset (``value_clipping="max"``), with CleanRL's two
    documented differences put back test-side: the advantages normalized with torch's Bessel-corrected std (PPG uses
    the population std, as the original code), and the policy phase's gradient leaking into the first auxiliary step.

    :param bessel_std: normalize the advantages as CleanRL (else PPG's own ``normalize_advantage="batch"``)
    :param gradient_leak: add CleanRL's leaked gradient to the first auxiliary step
    :param changes: PPG arguments that replace the replay's (the negative cases)
    :return: the largest differences: ``"returns"`` (value targets), ``"advantages"`` (normalized, with
        ``bessel_std``), ``"policy"``, ``"pi_old"``, ``"aux"``
    """
    data = np.load(FIXTURES / "cleanrl.npz")
    meta = json.loads((FIXTURES / "cleanrl.json").read_text())
    args = meta["args"]
    n_envs, n_steps = args["num_envs"], args["num_steps"]
    kwargs = get_procgen_preset("cleanrl").ppg_kwargs(n_envs)
    # CleanRL's coefficients are the cleanrl preset's; its value loss 0.5 * max(...) times vf_coef is vf_coef / 2
    assert (args["learning_rate"], args["gamma"], args["gae_lambda"], args["ent_coef"], args["beta_clone"]) == (
        kwargs["learning_rate"],
        kwargs["gamma"],
        kwargs["gae_lambda"],
        kwargs["ent_coef"],
        kwargs["beta_clone"],
    )
    assert (args["clip_coef"], args["clip_coef"], 0.5 * args["vf_coef"], args["max_grad_norm"], args["e_policy"]) == (
        kwargs["clip_range"],
        kwargs["clip_range_vf"],
        kwargs["vf_coef"],
        kwargs["max_grad_norm"],
        kwargs["n_epochs"],
    )
    assert args["clip_vloss"] and args["adv_norm_fullbatch"] and kwargs["value_clipping"] == "max"
    assert not kwargs["separate_aux_optimizer"] and kwargs["policy_kwargs"]["arch"] == "detach"
    kwargs.update(
        n_steps=n_steps,
        batch_size=args["minibatch_size"],
        n_policy_iters=args["n_iteration"],
        n_aux_epochs=args["e_auxiliary"],
        aux_batch_rollouts=args["num_aux_rollouts"],
        normalize_advantage="none" if bessel_std else "batch",
    )
    kwargs.update(changes)
    model = float64_model(n_envs, meta["image_size"], kwargs)
    load_parameters(model, data, "init", cleanrl_name, "detach")
    results: dict[str, float] = {"returns": 0.0, "advantages": 0.0}
    # pi_old: (step, column) -> (column, step): column k is the auxiliary buffer's row k
    old_logits = data["old_logits"].swapaxes(0, 1)
    record_phases(model, results, partial(max_difference, model, data, name_map=cleanrl_name, arch="detach"), old_logits)
    inject_aux_permutations(model, list(data["aux_inds"]))
    if gradient_leak:
        monkeypatch.setattr(optim, "clip_gradients", CleanRLGradientLeak())
    for iteration in range(meta["n_iterations"]):
        recorded = {key: data[f"it{iteration}/{key}"] for key in ("obs", "actions", "rewards", "dones", "values", "logprobs")}
        arrays = dict(
            actions=recorded["actions"],
            rewards=recorded["rewards"],
            episode_starts=recorded["dones"],
            values=recorded["values"],
            log_probs=recorded["logprobs"],
        )
        write_rollout(model, recorded["obs"], arrays, data[f"it{iteration}/next_value"], data[f"it{iteration}/next_done"])
        buffer = model.rollout_buffer
        results["returns"] = max(results["returns"], float(np.abs(buffer.returns - data[f"it{iteration}/returns"]).max()))
        if bessel_std:
            advantages = buffer.advantages
            buffer.advantages = (advantages - advantages.mean()) / (advantages.std(ddof=1) + 1e-8)
            # CleanRL's flat index is step * n_envs + env, as numpy's reshape of (step, env)
            difference = np.abs(buffer.advantages.reshape(-1) - data[f"it{iteration}/b_advantages"]).max()
            results["advantages"] = max(results["advantages"], float(difference))
        # The policy phase's minibatches: CleanRL's shuffled flat indices, consecutive slices of minibatch_size
        epochs = deque(
            (order % n_envs) * n_steps + order // n_envs  # CleanRL's step * n_envs + env -> SB3's env * n_steps + step
            for order in data[f"it{iteration}/b_inds"]
        )
        buffer.get = partial(recorded_minibatches, buffer, epochs)
        model.train()
        assert not epochs, "the policy phase drew fewer minibatch orders than CleanRL"
    return results


def recorded_minibatches(buffer, epochs: deque, batch_size: int) -> Iterator:
    """The rollout buffer's ``get``, with the next recorded order of the transitions (SB3's flat indices)."""
    order = epochs.popleft()
    flatten_rollout_buffer(buffer)
    for start in range(0, len(order), batch_size):
        yield buffer._get_samples(order[start : start + batch_size])


# ---------------------------------------------------------------------------------------------------------------------
# The tests
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ORIGINAL_CASES)
def test_original_code(name, monkeypatch):
    """dual and detach, the clipped and the KL-penalty objectives, E_V != E_pi: every phase to float64 precision."""
    results = replay_original(name, monkeypatch)
    assert results["unused_orders"] == 0, results  # PPG drew one permutation of the envs per epoch, as the original
    assert results["returns"] <= 1e-12, results  # SB3's GAE gives the original code's value targets
    for phase in ("policy", "pi_old", "aux", "final"):
        assert results[phase] <= TOLERANCE, (phase, results)


def test_cleanrl(monkeypatch):
    """
    CleanRL with the cleanrl preset, to float64 precision, once its two documented differences (Bessel-corrected
    advantage std, gradient leak into the first auxiliary step) are reproduced test-side.
    """
    results = replay_cleanrl(monkeypatch)
    assert results["returns"] <= 1e-12 and results["advantages"] <= 1e-12, results
    for phase in ("policy", "pi_old", "aux"):
        assert results[phase] <= TOLERANCE, (phase, results)


@pytest.mark.parametrize(
    "name, changes, phase",
    [
        ("orig_dual_clip", dict(ent_coef=0.011), "policy"),
        ("orig_dual_kl", dict(kl_coef=1.1), "policy"),
        ("orig_detach_kl", dict(beta_clone=1.01), "aux"),
        ("orig_dual_clip_epi2_ev3", dict(vf_coef=0.55), "policy"),
        ("orig_dual_clip", dict(policy_minibatches="transitions"), "policy"),
    ],
)
def test_original_code_detects_a_change(name, changes, phase, monkeypatch):
    """
    One coefficient changed, or SB3's minibatches of shuffled transitions (drawn from NumPy's generator, seeded by PPG)
    instead of the original code's whole env rows: the same replay misses the original code by far.
    """
    results = replay_original(name, monkeypatch, **changes)
    assert results[phase] > LARGE, results


@pytest.mark.parametrize(
    "options, phase",
    [
        (dict(ent_coef=0.011), "policy"),
        (dict(value_clipping="sb3"), "policy"),  # SB3's form of the clipped value loss
        (dict(bessel_std=False), "policy"),  # PPG's population std
        (dict(gradient_leak=False), "aux"),  # PPG zeroes the gradients before the auxiliary phase
    ],
)
def test_cleanrl_detects_a_change(options, phase, monkeypatch):
    """One coefficient or one of the three differences named in docs/fidelity.md: far from CleanRL's update."""
    results = replay_cleanrl(monkeypatch, **options)
    assert results[phase] > LARGE, results
