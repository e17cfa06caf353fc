"""
Trajectory-level equivalence with CleanRL's ``ppg_procgen.py`` and the original code (issue 28, docs/fidelity.md
"Trajectory level"): the same run, not only the same updates. From the same initial weights, the same procgen level
seed and the same uniform numbers behind every action sample, ``PPG`` with the matching preset (``"cleanrl"``,
``"paper"``) and its own env stack (``make_procgen_env``: procgen, ``VecMonitor``, ``VecNormalize``; the paper
preset's rewards normalized per rollout by ``PPG(normalize_reward=True)``) collects the rollouts the reference collected
with its own, iteration by iteration: observations, actions, raw and normalized
rewards, dones, values, the bootstrap value, advantages, returns, the reward normalizer's statistics, the parameters
after each policy phase, pi_old and the parameters after the auxiliary phase, on a real game (starpilot, 2 envs x 16
steps, 3 iterations and one auxiliary phase, float64). Both replays run PPG's default rollout buffer
(``PPGRolloutBuffer``, its arrays in float64: ``Float64PPGRolloutBuffer``), its default rollout (the buffer written
while the envs step) and its default advantage normalization (over the whole rollout, the population std).

The fixtures ``tests/data/fidelity/cleanrl_trajectory.*`` and ``orig_trajectory.*`` were recorded by running each
reference's own code (``benchmarks/fidelity/record_cleanrl_trajectory.py``, ``record_reference_trajectory.py``). The
replays put back, on the reference's side, what PPG does not copy: CleanRL's two update-level quirks (its
Bessel-corrected advantage std, handed to PPG's own normalization as ``bessel_scaled`` says, and its gradient leak into
the first auxiliary step: ``tests/test_fidelity.py``), with the recorded minibatch orders and the same inverse-CDF
action sampling. The original code's run needs nothing put back: the paper preset normalizes the rewards per
rollout as it does (``test_original_code_reward_normalization`` shows ``VecNormalize``'s per-step rule leaving it).

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
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.distributions import CategoricalDistribution
from stable_baselines3.common.logger import configure
from test_fidelity import (
    TOLERANCE,
    CleanRLGradientLeak,
    NameMap,
    RecordedPermutations,
    bessel_scaled,
    cleanrl_name,
    inject_aux_permutations,
    original_name,
    recorded_minibatches,
)

import sb3_ppg.ppg.ppg as ppg_module
from sb3_ppg import PPG
from sb3_ppg.common import optim
from sb3_ppg.common.rollout import writes_while_envs_step
from sb3_ppg.common.rollout_buffers import PPGRolloutBuffer, env_minibatches
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
#: sum of that over the 16 steps; what is trained on them by much less than 1e-6 (seen: 3e-9), while the changes of
#: test_cleanrl_trajectory_detects_a_change move the parameters by 2e-4 and more (ent_coef 0.02: 1.98e-4 on both numpys)
NUMPY_2 = int(np.__version__.split(".")[0]) >= 2
FLOAT32_REWARDS = 10 * 2**-23
TRAINED_ON_FLOAT32_REWARDS = 1e-6
#: A change is detected when it moves a quantity this many times past test_cleanrl_trajectory's tolerance for it
#: (ent_coef 0.011 moved the first parameters by 1.2e-6 only: within numpy 2's tolerance, hence 0.02 below)
DETECTED = 100


def cleanrl_tolerances() -> dict[str, float]:
    """test_cleanrl_trajectory's tolerance for each quantity (float64 rounding, or numpy 2's float32 rewards: above)."""
    rewards, summed, trained = (FLOAT32_REWARDS, 16 * FLOAT32_REWARDS, TRAINED_ON_FLOAT32_REWARDS) if NUMPY_2 else (EXACT,) * 3
    tolerances = dict.fromkeys(("observations", "actions", "raw_rewards", "dones"), 0.0)
    tolerances.update(reward_statistics=EXACT, rewards=rewards, pi_old=trained if NUMPY_2 else TOLERANCE)
    tolerances.update(dict.fromkeys(("advantages", "returns", "aux_returns"), summed))
    tolerances.update(dict.fromkeys(("log_probs", "values", "bootstrap"), trained))
    for name in ("params_0", "params_1", "params_2", "params_aux"):
        tolerances[name] = tolerances[f"{name}_policy_head"] = trained if NUMPY_2 else TOLERANCE
    return tolerances


class Float64PPGRolloutBuffer(PPGRolloutBuffer):
    """
    PPG's default rollout buffer with its arrays in float64 (SB3's are float32), which also keeps the bootstrap values it
    is given: the same code, the same rollout (written while the envs step), float64 numbers.
    """

    def reset(self) -> None:
        super().reset()
        for name in ("rewards", "returns", "episode_starts", "values", "log_probs", "advantages", "actions"):
            setattr(self, name, getattr(self, name).astype(np.float64))

    def compute_returns_and_advantage(self, last_values: th.Tensor, dones: np.ndarray) -> None:
        self.last_values = last_values.detach().cpu().numpy().reshape(-1).copy()
        self.last_dones = np.asarray(dones).copy()
        super().compute_returns_and_advantage(last_values, dones)


def step_major(buffer: PPGRolloutBuffer, array: np.ndarray, n_envs: int) -> np.ndarray:
    """A rollout array of the buffer as (step, env), whether SB3's ``get()`` flattened it (env-major) or not."""
    return array.reshape(n_envs, -1).T if buffer.generator_ready else array


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
) -> PPG:
    """
    PPG in float64 on ``env`` with the reference's seeded initial weights, its rollouts in float64 in PPG's default
    buffer, written while the envs step (PPG's default rollout), logging nothing.
    """
    model = PPG(
        "ProcgenCnn",
        env,
        precision="fp32",
        micro_batch_size=None,
        device="cpu",
        seed=meta["rand_seed"],
        rollout_buffer_class=Float64PPGRolloutBuffer,
        **kwargs,
    )
    assert writes_while_envs_step(model.env, model.rollout_buffer), "not PPG's default rollout"
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
    )
    assert kwargs["normalize_advantage"] == "batch"  # PPG's default; CleanRL's Bessel-corrected std: bessel_scaled
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
        buffer.advantages = bessel_scaled(buffer.advantages)
        epochs = deque((order % n_envs) * n_steps + order // n_envs for order in data[f"{it}/b_inds"])
        buffer.get = partial(recorded_minibatches, buffer, epochs)
        iteration += 1
        policy_phase()
        assert not epochs, "the policy phase drew fewer minibatch orders than CleanRL"
        # PPG's normalization of the scaled advantages is CleanRL's (its flat index is step * n_envs + env)
        normalized = step_major(buffer, buffer.advantages, n_envs).reshape(-1)
        worst("advantages", np.abs(normalized - data[f"{it}/b_advantages"]).max())

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
    tolerances = cleanrl_tolerances()
    assert set(results) == set(tolerances), set(results) ^ set(tolerances)
    for name, tolerance in tolerances.items():
        assert results[name] <= tolerance, (name, results)


@pytest.mark.parametrize(
    "changes, name",
    [
        (dict(env_distribution_mode="hard"), "observations"),  # the paper's levels
        # the paper preset's reward-normalization gamma (the first reward's scale is the same: its return is 1 for both)
        (dict(env_reward_gamma=0.99), "reward_statistics"),
        (dict(env_clip_reward=5.0), "rewards"),  # the first reward is normalized to 7.9
        (dict(ent_coef=0.02), "params_0"),  # 1.98e-4 after the first policy phase
    ],
)
def test_cleanrl_trajectory_detects_a_change(changes, name, monkeypatch):
    """
    One setting of the env stack or of PPG changed: the same replay leaves CleanRL's run within two iterations, by more
    than ``DETECTED`` times test_cleanrl_trajectory's tolerance.
    """
    results = replay_cleanrl_trajectory(monkeypatch, n_iterations=2, **changes)
    assert results[name] > DETECTED * cleanrl_tolerances()[name], results


def replay_original_trajectory(
    monkeypatch: pytest.MonkeyPatch, original_rewards: bool = True, n_iterations: int | None = None, **changes: Any
) -> dict[str, float]:
    """
    Run ``PPG`` on starpilot with the ``"paper"`` preset and the fixture's settings, as the original code's recorded run.

    :param original_rewards: the preset's per-rollout reward normalization (``PPG(normalize_reward=True)``, the env's
        ``VecNormalize`` passes raw rewards); ``False``: ``VecNormalize``'s per-step rule with the same gamma and clip
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
    # The original code's env is the preset's: hard, all levels (procgen's defaults), raw rewards that PPG normalizes
    # per rollout at gamma 0.99, clipped at 10 (RewardNormalizer's defaults)
    assert settings["distribution_mode"] == preset.env_kwargs["distribution_mode"]
    assert (preset.env_kwargs["num_levels"], preset.env_kwargs["start_level"]) == (0, 0)
    assert preset.env_kwargs["normalize_reward"] is False
    kwargs = preset.ppg_kwargs(n_envs)
    assert kwargs["normalize_reward"] is True and kwargs["reward_normalizer_kwargs"] == dict(gamma=0.99, clip_reward=10.0)
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
    if not original_rewards:
        env_kwargs.update(normalize_reward=True, reward_gamma=0.99, clip_reward=10.0)
        kwargs["normalize_reward"] = False
    env = make_procgen_env(settings["env_name"], n_envs=n_envs, preset="paper", seed=meta["rand_seed"], **env_kwargs)
    assert kwargs["normalize_advantage"] == "batch"  # PPG's default, the original code's normalization
    model = seeded_float64_model(env, meta, original_name, arch, kwargs)
    normalizer = model.reward_normalizer
    assert (normalizer is not None) == original_rewards
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
        # PPG normalized the advantages over the rollout with the population std, as the original code
        normalized = step_major(buffer, buffer.advantages, n_envs).T  # the original code's (env, step) order
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
    paper preset is the original code's, step by step, its per-rollout reward normalization included (PPG's
    ``normalize_reward``, nothing put back test-side; ``test_original_code_reward_normalization`` shows that it matters).

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
    The paper preset's rewards normalized by ``VecNormalize`` instead (the same gamma and clip, statistics updated at
    every step, as the preset did before) against the original code's ``RewardNormalizer`` (updated once per rollout with
    all its returns): the same frames, actions, raw rewards and episode ends, other normalized rewards, hence other
    advantages and updates (docs/fidelity.md, "Trajectory level").
    """
    # The first rollout's one reward comes at its last step, where both rules have seen the same returns
    results = replay_original_trajectory(monkeypatch, original_rewards=False, n_iterations=2)
    for name in ("observations", "actions", "raw_rewards", "dones"):
        assert results[name] == 0, (name, results)
    assert results["rewards"] > 0.01 and results["advantages"] > 0.01, results
