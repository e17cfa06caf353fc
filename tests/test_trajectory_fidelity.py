"""
Trajectory-level equivalence with CleanRL's ``ppg_procgen.py`` and the original code (issue 28, docs/fidelity.md
"Trajectory level"): the same run, not only the same updates. From the same initial weights, the same procgen level
seed and the same uniform numbers behind every action sample, ``PPG`` with the matching preset (``"cleanrl"``,
``"paper"``) and its own env stack (``make_procgen_env``: procgen, ``VecMonitor``, ``VecNormalize``) collects the
rollouts the reference collected with its own, iteration by iteration: observations, actions, raw and normalized
rewards, dones, values, the bootstrap value, advantages, returns, the reward normalizer's statistics, the parameters
after each policy phase, pi_old and the parameters after the auxiliary phase, on a real game (starpilot, 2 envs x 16
steps, 3 iterations and one auxiliary phase, float64).

The fixtures ``tests/data/fidelity/cleanrl_trajectory.*`` and ``orig_trajectory.*`` were recorded by running each
reference's own code (``benchmarks/fidelity/record_cleanrl_trajectory.py``, ``record_reference_trajectory.py``). The
replays put back, test-side, what PPG does not copy: CleanRL's two update-level quirks (its Bessel-corrected advantage
std and its gradient leak into the first auxiliary step: ``tests/test_fidelity.py``) and the original code's
per-rollout reward normalization (``OriginalRewardNormalizer``; ``test_original_code_reward_normalization`` shows the
preset's own), with the recorded minibatch orders and the same inverse-CDF action sampling.

Tolerances: the env side (frames, actions, raw rewards, dones) is compared exactly; the normalized rewards, the reward
statistics, values, advantages and returns to 1e-12 (float64 rounding of the same operations); the parameters to 1e-10
(tests/test_fidelity.py's bound, from Adam's lr / eps), but for the policy head after the auxiliary phase
(``test_original_code_trajectory`` says why).
"""

import json
from collections import deque
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch as th
from benchmark_scripts import load_script  # tests/ is on sys.path
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.distributions import CategoricalDistribution
from stable_baselines3.common.logger import configure
from test_fidelity import (
    TOLERANCE,
    CleanRLGradientLeak,
    NameMap,
    RecordedPermutations,
    cleanrl_name,
    inject_aux_permutations,
    original_name,
    recorded_minibatches,
)

import sb3_ppg.ppg.ppg as ppg_module
from sb3_ppg import PPG
from sb3_ppg.common import optim
from sb3_ppg.common.rollout_buffers import env_minibatches
from sb3_ppg.procgen import get_procgen_preset, make_procgen_env

FIXTURES = Path(__file__).parent / "data" / "fidelity"
fixtures = load_script("fidelity/fixtures")
#: float64 rounding of the same operations on both sides
EXACT = 1e-12
#: The policy head after the auxiliary phase: lr / eps = 5e4 times rounding noise of up to 1e-14 in its first gradient
POLICY_HEAD_AFTER_AUX = 5e4 * 1e-14
#: Rollout quantities of the iteration after the auxiliary phase: the policy head's difference times the features
AFTER_AUX = 1e-7
#: CleanRL's fixture was recorded under numpy 1, where gym 0.23.1's NormalizeReward divides procgen's float32 rewards
#: in float32 (value-based casting); numpy 2 (Python 3.13's procgen-gym) divides them in float64 (NEP 50). Normalized
#: rewards (clipped to 10) then differ by float32 rounding, at most 10 * 2**-23, advantages and returns by at most the
#: sum of that over the 16 steps; what is trained on them by much less than 1e-6 (seen: 3e-9), four orders of
#: magnitude below the smallest change test_cleanrl_trajectory_detects_a_change must see (9e-3)
NUMPY_2 = int(np.__version__.split(".")[0]) >= 2
FLOAT32_REWARDS = 10 * 2**-23
TRAINED_ON_FLOAT32_REWARDS = 1e-6


class OriginalRewardNormalizer:
    """
    The original code's ``RewardNormalizer`` (``reward_normalizer.py:66-104``), as the replay puts it back test-side:
    each rollout's discounted returns (gamma 0.99, reset where an episode starts) update one running mean and variance
    at once, then every reward of the rollout is divided by the standard deviation after that update and clipped.

    :param n_envs: number of envs
    """

    def __init__(self, n_envs: int, gamma: float = 0.99, clip: float = 10.0, epsilon: float = 1e-8) -> None:
        self.running_return = np.zeros(n_envs)
        self.mean, self.var, self.count = 0.0, 1.0, 1e-4
        self.gamma, self.clip, self.epsilon = gamma, clip, epsilon

    def __call__(self, rewards: np.ndarray, episode_starts: np.ndarray) -> np.ndarray:
        """:param rewards: (step, env) raw rewards; :param episode_starts: (step, env); :return: normalized rewards"""
        returns = np.zeros_like(rewards)
        for step in range(len(rewards)):
            self.running_return = rewards[step] + (1.0 - episode_starts[step]) * self.gamma * self.running_return
            returns[step] = self.running_return
        batch_mean, batch_var, batch_count = returns.mean(), returns.var(), returns.size
        delta, total = batch_mean - self.mean, self.count + batch_count
        self.mean = self.mean + delta * batch_count / total
        self.var = (self.var * self.count + batch_var * batch_count + delta**2 * self.count * batch_count / total) / total
        self.count = total
        return np.clip(rewards / np.sqrt(self.var + self.epsilon), -self.clip, self.clip)


class Float64RolloutBuffer(RolloutBuffer):
    """
    SB3's rollout buffer in float64 (SB3's is float32), which also keeps the bootstrap values it is given and, with a
    ``reward_normalizer``, normalizes each rollout's rewards with it before GAE (the original code's rule).
    """

    def __init__(self, *args: Any, reward_normalizer: OriginalRewardNormalizer | None = None, **kwargs: Any) -> None:
        self.reward_normalizer = reward_normalizer
        self.raw_rewards: np.ndarray | None = None
        super().__init__(*args, **kwargs)

    def reset(self) -> None:
        super().reset()
        for name in ("rewards", "returns", "episode_starts", "values", "log_probs", "advantages", "actions"):
            setattr(self, name, getattr(self, name).astype(np.float64))

    def compute_returns_and_advantage(self, last_values: th.Tensor, dones: np.ndarray) -> None:
        self.last_values = last_values.detach().cpu().numpy().reshape(-1).copy()
        self.last_dones = np.asarray(dones).copy()
        if self.reward_normalizer is not None:
            self.raw_rewards = self.rewards.copy()
            self.rewards = self.reward_normalizer(self.rewards, self.episode_starts)
        super().compute_returns_and_advantage(last_values, dones)


class EnvRecorder(BaseCallback):
    """Records, per step, the raw rewards and dones as they leave ``VecNormalize``, and its statistics per rollout."""

    def __init__(self) -> None:
        super().__init__()
        self.raw_rewards: list[np.ndarray] = []
        self.dones: list[np.ndarray] = []
        self.statistics: list[tuple[np.ndarray, np.ndarray]] = []

    def _on_step(self) -> bool:
        self.raw_rewards.append(self.training_env.get_original_reward().astype(np.float64))
        self.dones.append(np.asarray(self.locals["dones"], dtype=bool).copy())
        return True

    def _on_rollout_end(self) -> None:
        rms = self.training_env.ret_rms
        running_return = np.asarray(self.training_env.returns, dtype=np.float64).copy()
        self.statistics.append((running_return, np.array([rms.mean, rms.var, rms.count], dtype=np.float64)))


def uniform_sampling(uniforms: np.ndarray) -> Any:
    """``CategoricalDistribution.sample`` drawing, as CleanRL's recording did, the inverse-CDF sample of the next row."""
    rows = deque(th.from_numpy(row) for row in uniforms)

    def sample(self: CategoricalDistribution) -> th.Tensor:
        return fixtures.inverse_cdf_sample(self.distribution.probs, rows.popleft())

    return sample, rows


def fingerprint_difference(
    model: PPG, data: Any, prefix: str, name_map: NameMap = cleanrl_name, arch: str = "detach"
) -> tuple[float, float]:
    """
    The largest differences between the model's parameters and the recorded fingerprints ``<prefix>/<name>``.

    :return: over all parameters but the policy head, and over the policy head (``action_net``)
    """
    body, head = 0.0, 0.0
    for name, parameter in model.policy.named_parameters():
        reference = name_map(name, arch)
        ours = fixtures.fingerprint(reference, parameter.detach().cpu().numpy())
        # The sum adds up to 500k values: its rounding scales with their number
        scale = np.ones_like(ours)
        scale[-1] = parameter.numel()
        difference = float((np.abs(ours - data[f"{prefix}/{reference}"]) / scale).max())
        if name.startswith("action_net."):
            head = max(head, difference)
        else:
            body = max(body, difference)
    return body, head


def compare_parameters(results: dict[str, float], key: str, differences: tuple[float, float]) -> None:
    """Store :func:`fingerprint_difference`'s two differences as ``results[key]`` and ``results[key + "_policy_head"]``."""
    results[key], results[f"{key}_policy_head"] = differences


def load_seeded_weights(model: PPG, meta: dict[str, Any], name_map: NameMap, arch: str) -> None:
    """The recorded initial weights: seeded, with the reference's row norms (``fixtures.seeded_normed_weight``); biases 0."""
    references = set()
    with th.no_grad():
        for name, parameter in model.policy.named_parameters():
            reference = name_map(name, arch)
            references.add(reference)
            if reference.endswith(".bias"):
                parameter.zero_()
            else:
                scale = meta["weight_scales"][reference]
                weight = fixtures.seeded_normed_weight(reference, tuple(parameter.shape), scale, meta["weight_seed"])
                parameter.copy_(th.from_numpy(weight))
    assert set(meta["weight_scales"]) <= references, "a recorded weight has no PPG parameter"


def seeded_float64_model(
    env: Any,
    meta: dict[str, Any],
    name_map: NameMap,
    arch: str,
    kwargs: dict[str, Any],
    reward_normalizer: OriginalRewardNormalizer | None = None,
) -> PPG:
    """PPG in float64 on ``env`` with the reference's seeded initial weights, its rollouts in float64, logging nothing."""
    model = PPG(
        "ProcgenCnn",
        env,
        precision="fp32",
        micro_batch_size=None,
        device="cpu",
        seed=meta["rand_seed"],
        rollout_buffer_class=Float64RolloutBuffer,
        rollout_buffer_kwargs=dict(reward_normalizer=reward_normalizer),
        **kwargs,
    )
    model.policy.to(th.float64)
    model.set_logger(configure(None, []))
    load_seeded_weights(model, meta, name_map, arch)
    return model


def replay_cleanrl_trajectory(
    monkeypatch: pytest.MonkeyPatch, n_iterations: int | None = None, **changes: Any
) -> dict[str, float]:
    """
    Run ``PPG`` on starpilot with the ``"cleanrl"`` preset and the fixture's settings, as CleanRL's recorded run.

    :param n_iterations: stop after this many rollouts (``None``: all of the recorded run, the auxiliary phase included)
    :param changes: PPG arguments or ``make_procgen_env`` arguments (``env_*``) that replace the replay's
    :return: the largest differences per quantity over the iterations (``params`` per iteration as ``params_<i>``)
    """
    data = np.load(FIXTURES / "cleanrl_trajectory.npz")
    meta = json.loads((FIXTURES / "cleanrl_trajectory.json").read_text())
    args = meta["args"]
    n_envs, n_steps = args["num_envs"], args["num_steps"]
    preset = get_procgen_preset("cleanrl")
    # CleanRL's env stack is the preset's: easy, all levels, NormalizeReward(gamma), clip 10
    assert meta["procgen_kwargs"] == {
        key: preset.env_kwargs[key] for key in ("distribution_mode", "num_levels", "start_level")
    }
    assert preset.env_kwargs["reward_gamma"] == args["gamma"] and preset.env_kwargs["clip_reward"] == 10.0
    env_kwargs = {key[4:]: value for key, value in changes.items() if key.startswith("env_")}
    env = make_procgen_env(args["env_id"], n_envs=n_envs, preset="cleanrl", seed=meta["rand_seed"], **env_kwargs)
    kwargs = preset.ppg_kwargs(n_envs)
    kwargs.update(
        n_steps=n_steps,
        batch_size=args["minibatch_size"],
        n_policy_iters=args["n_iteration"],
        n_aux_epochs=args["e_auxiliary"],
        aux_batch_rollouts=args["num_aux_rollouts"],
        normalize_advantage="none",  # CleanRL's Bessel-corrected normalization is put back below
    )
    kwargs.update({key: value for key, value in changes.items() if not key.startswith("env_")})
    model = seeded_float64_model(env, meta, cleanrl_name, "detach", kwargs)
    sample, uniforms = uniform_sampling(data["uniforms"])
    monkeypatch.setattr(CategoricalDistribution, "sample", sample)
    monkeypatch.setattr(optim, "clip_gradients", CleanRLGradientLeak())
    inject_aux_permutations(model, list(data["aux_inds"]))
    recorder = EnvRecorder()
    results: dict[str, float] = {}

    def worst(name: str, value: float) -> None:
        results[name] = max(results.get(name, 0.0), float(value))

    iteration = 0
    policy_phase = model.train

    def train() -> None:
        """Compare the rollout and the parameters so far, then CleanRL's advantage normalization and minibatches."""
        nonlocal iteration
        if iteration > 0:
            compare_parameters(
                results, f"params_{iteration - 1}", fingerprint_difference(model, data, f"it{iteration - 1}/params")
            )
        it = f"it{iteration}"
        buffer = model.rollout_buffer
        frames = buffer.observations.transpose(0, 1, 3, 4, 2)  # (step, env, C, H, W) -> CleanRL's H, W, C
        worst("observations", (fixtures.frame_checksums(frames) != data[f"{it}/obs_crc"]).sum())
        next_frames = np.asarray(model._last_obs).transpose(0, 2, 3, 1)
        worst("observations", (fixtures.frame_checksums(next_frames) != data[f"{it}/next_obs_crc"]).sum())
        worst("actions", np.abs(buffer.actions[..., 0] - data[f"{it}/actions"]).max())
        steps = slice(iteration * n_steps, (iteration + 1) * n_steps)
        worst("raw_rewards", np.abs(np.stack(recorder.raw_rewards[steps]) - data[f"{it}/rewards_raw"]).max())
        worst("dones", (np.stack(recorder.dones[steps]) != data[f"{it}/dones_raw"]).sum())
        # CleanRL's dones[0] of the first rollout is 0 where SB3's episode start is 1; GAE never reads either
        first = 1 if iteration == 0 else 0
        worst("dones", (buffer.episode_starts[first:] != data[f"{it}/dones"][first:]).sum())
        worst("rewards", np.abs(buffer.rewards - data[f"{it}/rewards"]).max())
        running_return, statistics = recorder.statistics[iteration]
        worst("reward_statistics", np.abs(running_return - data[f"{it}/reward_running_return"]).max())
        worst("reward_statistics", np.abs(statistics - data[f"{it}/reward_statistics"]).max())
        worst("log_probs", np.abs(buffer.log_probs - data[f"{it}/logprobs"]).max())
        worst("values", np.abs(buffer.values - data[f"{it}/values"]).max())
        worst("bootstrap", np.abs(buffer.last_values - data[f"{it}/next_value"]).max())
        worst("bootstrap", (buffer.last_dones != data[f"{it}/next_done"]).sum())
        worst("advantages", np.abs(buffer.advantages - data[f"{it}/advantages"]).max())
        worst("returns", np.abs(buffer.returns - data[f"{it}/returns"]).max())
        advantages = buffer.advantages
        buffer.advantages = (advantages - advantages.mean()) / (advantages.std(ddof=1) + 1e-8)
        worst("advantages", np.abs(buffer.advantages.reshape(-1) - data[f"{it}/b_advantages"]).max())
        epochs = deque((order % n_envs) * n_steps + order // n_envs for order in data[f"{it}/b_inds"])
        buffer.get = partial(recorded_minibatches, buffer, epochs)
        iteration += 1
        policy_phase()
        assert not epochs, "the policy phase drew fewer minibatch orders than CleanRL"

    train_aux_phase = model._train_aux_phase

    def compared_aux_phase() -> None:
        compare_parameters(
            results, f"params_{iteration - 1}", fingerprint_difference(model, data, f"it{iteration - 1}/params")
        )
        worst("pi_old", np.abs(model.aux_buffer.old_distribution_params.numpy() - data["old_logits"].swapaxes(0, 1)).max())
        worst("aux_returns", np.abs(model.aux_buffer.returns.numpy() - data["aux_returns"].swapaxes(0, 1)).max())
        train_aux_phase()
        compare_parameters(results, "params_aux", fingerprint_difference(model, data, "aux/params"))

    model.train = train
    model._train_aux_phase = compared_aux_phase
    if n_iterations is None:
        model.learn(args["total_timesteps"], callback=recorder)
        assert iteration == meta["n_iterations"] and not uniforms, (iteration, len(uniforms))
        assert "params_aux" in results, "no auxiliary phase ran"
    else:
        with pytest.warns(UserWarning, match="auxiliary"):
            model.learn(n_iterations * n_envs * n_steps, callback=recorder)
    env.close()
    return results


def test_cleanrl_trajectory(monkeypatch):
    """
    Starpilot, easy, 2 envs x 16 steps, 3 iterations and an auxiliary phase: PPG's run with the cleanrl preset is
    CleanRL's, step by step (an episode ends in the recorded run, rewards are normalized and clipped as gym 0.23.1 does).
    """
    results = replay_cleanrl_trajectory(monkeypatch)
    rewards, summed, trained = (FLOAT32_REWARDS, 16 * FLOAT32_REWARDS, TRAINED_ON_FLOAT32_REWARDS) if NUMPY_2 else (EXACT,) * 3
    for name in ("observations", "actions", "raw_rewards", "dones"):
        assert results[name] == 0, (name, results)
    assert results["reward_statistics"] <= EXACT, results
    assert results["rewards"] <= rewards, results
    for name in ("advantages", "returns", "aux_returns"):
        assert results[name] <= summed, (name, results)
    for name in ("log_probs", "values", "bootstrap"):
        assert results[name] <= trained, (name, results)
    trained = trained if NUMPY_2 else TOLERANCE
    for name in ("params_0", "params_1", "params_2", "params_aux"):
        assert results[name] <= trained, (name, results)
        assert results[f"{name}_policy_head"] <= trained, (name, results)
    assert results["pi_old"] <= trained, results


@pytest.mark.parametrize(
    "changes, name",
    [
        (dict(env_distribution_mode="hard"), "observations"),  # the paper's levels
        # the paper preset's reward-normalization gamma (the first reward's scale is the same: its return is 1 for both)
        (dict(env_reward_gamma=0.99), "reward_statistics"),
        (dict(env_clip_reward=5.0), "rewards"),  # the first reward is normalized to 7.9
        (dict(ent_coef=0.011), "params_0"),
    ],
)
def test_cleanrl_trajectory_detects_a_change(changes, name, monkeypatch):
    """One setting of the env stack or of PPG changed: the same replay leaves CleanRL's run within two iterations."""
    results = replay_cleanrl_trajectory(monkeypatch, n_iterations=2, **changes)
    assert results[name] > 1e-7, results


def replay_original_trajectory(
    monkeypatch: pytest.MonkeyPatch, original_rewards: bool = True, n_iterations: int | None = None, **changes: Any
) -> dict[str, float]:
    """
    Run ``PPG`` on starpilot with the ``"paper"`` preset and the fixture's settings, as the original code's recorded run.

    :param original_rewards: normalize the rewards with the original code's per-rollout rule (put back test-side, the
        env's ``VecNormalize`` then passes raw rewards); ``False``: the preset's env, ``VecNormalize``'s per-step rule
    :param n_iterations: stop after this many rollouts (``None``: all of the recorded run)
    :param changes: PPG arguments or ``make_procgen_env`` arguments (``env_*``) that replace the replay's
    :return: the largest differences per quantity (``params_<i>``: after iteration i's policy phase, ``params_aux``,
        ``params_final`` after the iteration that follows the auxiliary phase)
    """
    data = np.load(FIXTURES / "orig_trajectory.npz")
    meta = json.loads((FIXTURES / "orig_trajectory.json").read_text())
    settings = meta["settings"]
    n_envs, n_steps, arch = settings["num_envs"], settings["nstep"], settings["arch"]
    preset = get_procgen_preset("paper")
    # The original code's env is the preset's: hard, all levels (procgen's defaults), rewards normalized at gamma 0.99
    assert settings["distribution_mode"] == preset.env_kwargs["distribution_mode"]
    assert (preset.env_kwargs["num_levels"], preset.env_kwargs["start_level"], preset.env_kwargs["reward_gamma"]) == (
        0,
        0,
        0.99,
    )
    kwargs = preset.ppg_kwargs(n_envs)
    assert (settings["lr"], settings["gamma"], settings["lam"], settings["clip_param"], meta["entcoef"], meta["vfcoef"]) == (
        kwargs["learning_rate"],
        kwargs["gamma"],
        kwargs["gae_lambda"],
        kwargs["clip_range"],
        kwargs["ent_coef"],
        kwargs["vf_coef"],
    )
    assert kwargs["policy_kwargs"]["arch"] == arch and kwargs["batch_size"] is None  # ceil(n_envs / 8) envs: th.chunk
    kwargs.update(
        n_steps=n_steps,
        n_policy_iters=settings["n_pi"],
        n_aux_epochs=settings["n_aux_epochs"],
        aux_batch_rollouts=settings["aux_mbsize"],
    )
    kwargs.update({key: value for key, value in changes.items() if not key.startswith("env_")})
    env_kwargs = {key[4:]: value for key, value in changes.items() if key.startswith("env_")}
    if original_rewards:
        env_kwargs["normalize_reward"] = False
    env = make_procgen_env(settings["env_name"], n_envs=n_envs, preset="paper", seed=meta["rand_seed"], **env_kwargs)
    normalizer = OriginalRewardNormalizer(n_envs) if original_rewards else None
    model = seeded_float64_model(env, meta, original_name, arch, kwargs, reward_normalizer=normalizer)
    sample, uniforms = uniform_sampling(data["uniforms"])
    monkeypatch.setattr(CategoricalDistribution, "sample", sample)
    pairs = np.array(meta["aux_pairs_env_iteration"])
    inject_aux_permutations(model, [pairs[order, 1] * n_envs + pairs[order, 0] for order in data["aux_perms"]])
    compare = partial(fingerprint_difference, model, data, name_map=original_name, arch=arch)
    recorder = EnvRecorder()
    results: dict[str, float] = {}

    def worst(name: str, value: float) -> None:
        # The iteration after the auxiliary phase runs with its parameters: see test_original_code_trajectory
        name = f"after_aux_{name}" if label_iteration >= settings["n_pi"] else name
        results[name] = max(results.get(name, 0.0), float(value))

    iteration = label_iteration = 0
    policy_phase = model.train

    def train() -> None:
        """Compare the rollout and the parameters so far, then train with the original code's minibatch orders."""
        nonlocal iteration, label_iteration
        label_iteration = iteration
        if 0 < iteration < settings["n_pi"]:
            compare_parameters(results, f"params_{iteration - 1}", compare(f"it{iteration - 1}/params"))
        it = f"it{iteration}"

        def recorded(key: str) -> np.ndarray:
            """A recorded (env, step) array of this iteration, as (step, env)."""
            return data[f"{it}/{key}"].swapaxes(0, 1)

        buffer = model.rollout_buffer
        frames = buffer.observations.transpose(0, 1, 3, 4, 2)  # (step, env, C, H, W) -> H, W, C
        worst("observations", (fixtures.frame_checksums(frames) != recorded("ob_crc")).sum())
        next_frames = np.asarray(model._last_obs).transpose(0, 2, 3, 1)
        worst("observations", (fixtures.frame_checksums(next_frames) != data[f"{it}/finalob_crc"]).sum())
        worst("actions", np.abs(buffer.actions[..., 0] - recorded("ac")).max())
        steps = slice(iteration * n_steps, (iteration + 1) * n_steps)
        worst("raw_rewards", np.abs(np.stack(recorder.raw_rewards[steps]) - recorded("reward_raw")).max())
        worst("dones", (buffer.episode_starts != recorded("first")).sum())
        worst("rewards", np.abs(buffer.rewards - recorded("reward")).max())
        if normalizer is not None:
            statistics = np.array([normalizer.mean, normalizer.var, normalizer.count])
            worst("reward_statistics", np.abs(normalizer.running_return - data[f"{it}/reward_running_return"]).max())
            worst("reward_statistics", np.abs(statistics - data[f"{it}/reward_statistics"]).max())
        worst("log_probs", np.abs(buffer.log_probs - recorded("logp")).max())
        worst("values", np.abs(buffer.values - recorded("vpred")).max())
        worst("bootstrap", np.abs(buffer.last_values - data[f"{it}/vpredfinal"]).max())
        worst("bootstrap", (buffer.last_dones != data[f"{it}/finalfirst"]).sum())
        worst("advantages", np.abs(buffer.advantages - recorded("adv_raw")).max())
        worst("returns", np.abs(buffer.returns - recorded("vtarg")).max())
        generator = RecordedPermutations(list(data[f"{it}/pi_perms"]))
        monkeypatch.setattr(ppg_module, "env_minibatches", partial(env_minibatches, generator=generator))
        iteration += 1
        policy_phase()
        # PPG normalized the advantages over the rollout with the population std, as the original code; the buffer is
        # now flat, env-major (SB3's swap_and_flatten): the original code's (env, step) order
        normalized = buffer.advantages.reshape(n_envs, n_steps)
        worst("advantages", np.abs(normalized - data[f"{it}/adv"]).max())
        assert not generator.queue, "the policy phase drew fewer minibatch orders than the original code"
        if iteration == meta["n_iterations"]:
            compare_parameters(results, "params_final", compare("final/params"))

    train_aux_phase = model._train_aux_phase

    def compared_aux_phase() -> None:
        compare_parameters(results, f"params_{iteration - 1}", compare("policy/params"))
        old_logits = data["old_logits"].reshape(-1, n_steps, data["old_logits"].shape[-1])  # rows iteration * E + env
        results["pi_old"] = float(np.abs(model.aux_buffer.old_distribution_params.numpy() - old_logits).max())
        train_aux_phase()
        compare_parameters(results, "params_aux", compare("aux/params"))

    model.train = train
    model._train_aux_phase = compared_aux_phase
    if n_iterations is None or n_iterations > settings["n_pi"]:
        model.learn((n_iterations or meta["n_iterations"]) * n_envs * n_steps, callback=recorder)
    else:
        with pytest.warns(UserWarning, match="auxiliary"):
            model.learn(n_iterations * n_envs * n_steps, callback=recorder)
    env.close()
    if n_iterations is None:
        assert iteration == meta["n_iterations"] and not uniforms, (iteration, len(uniforms))
        assert "params_aux" in results and "params_final" in results, "no auxiliary phase ran"
    return results


def test_original_code_trajectory(monkeypatch):
    """
    Starpilot, hard, 2 envs x 16 steps, 3 iterations, an auxiliary phase and one more iteration: PPG's run with the
    paper preset is the original code's, step by step, once the original code's per-rollout reward normalization is
    put back test-side (the one difference; see ``test_original_code_reward_normalization``).

    The policy head after the auxiliary phase: at its first step pi = pi_old, so the cloning loss's gradient on the
    policy head is zero in exact arithmetic and rounding noise in both codes (up to ~1e-14: sums over a minibatch of
    logit-sized terms rounded at 2e-16), which Adam's first step scales by lr / eps = 5e4 (tests/test_fidelity.py):
    up to 5e-10 (6e-11 seen). The iteration after the auxiliary phase runs with these parameters: its logits move by
    up to 5e-10 x (1 + the sum of the 256 features' magnitudes), its log-probs and values by up to 1e-7 (2e-9 seen).
    """
    results = replay_original_trajectory(monkeypatch)
    for prefix in ("", "after_aux_"):
        for name in ("observations", "actions", "raw_rewards", "dones"):
            assert results[prefix + name] == 0, (prefix + name, results)
        for name in ("rewards", "reward_statistics"):
            assert results[prefix + name] <= EXACT, (prefix + name, results)
    for name in ("log_probs", "values", "bootstrap", "advantages", "returns"):
        assert results[name] <= EXACT, (name, results)
        assert results[f"after_aux_{name}"] <= AFTER_AUX, (name, results)
    for name in ("params_0", "params_1", "params_2", "params_aux", "params_final"):
        assert results[name] <= TOLERANCE, (name, results)
    for name in ("params_0", "params_1", "params_2"):
        assert results[f"{name}_policy_head"] <= TOLERANCE, (name, results)
    assert results["pi_old"] <= TOLERANCE, results
    for name in ("params_aux", "params_final"):
        assert results[f"{name}_policy_head"] <= POLICY_HEAD_AFTER_AUX, (name, results)


def test_original_code_reward_normalization(monkeypatch):
    """
    The paper preset's env as it is (``VecNormalize``: reward statistics updated at every step) against the original
    code's ``RewardNormalizer`` (updated once per rollout with all its returns): the same frames, actions, raw rewards
    and episode ends, other normalized rewards, hence other advantages and updates. This is the one difference of
    the run (docs/fidelity.md, "Trajectory level").
    """
    # The first rollout's one reward comes at its last step, where both rules have seen the same returns
    results = replay_original_trajectory(monkeypatch, original_rewards=False, n_iterations=2)
    for name in ("observations", "actions", "raw_rewards", "dones"):
        assert results[name] == 0, (name, results)
    assert results["rewards"] > 0.01 and results["advantages"] > 0.01, results
