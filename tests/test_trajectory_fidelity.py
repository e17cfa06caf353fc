"""
Trajectory-level equivalence with CleanRL's ``ppg_procgen.py`` (issue 28, docs/fidelity.md "Trajectory level"): the same
run, not only the same updates. From the same initial weights, the same procgen level seed and the same uniform numbers
behind every action sample, ``PPG`` with the ``"cleanrl"`` preset and its own env stack (``make_procgen_env``: procgen,
``VecMonitor``, ``VecNormalize``) collects the rollouts CleanRL collected with its gym 0.23.1 stack, iteration by
iteration: observations, actions, raw and normalized rewards, dones, values, the bootstrap value, advantages, returns,
the reward normalizer's statistics, the parameters after each policy phase, pi_old and the parameters after the
auxiliary phase, on a real game (starpilot, easy, 2 envs x 16 steps, 3 iterations and one auxiliary phase, float64).

The fixture ``tests/data/fidelity/cleanrl_trajectory.*`` was recorded by running CleanRL's own script
(``benchmarks/fidelity/record_cleanrl_trajectory.py``). The replay puts back, test-side, CleanRL's two update-level
quirks that PPG does not copy (its Bessel-corrected advantage std and its gradient leak into the first auxiliary step:
``tests/test_fidelity.py``), the recorded minibatch orders, and the same inverse-CDF action sampling.

Tolerances: the env side (frames, actions, raw rewards, dones) is compared exactly; the normalized rewards, the reward
statistics, values, advantages and returns to 1e-12 (float64 rounding of the same operations); the parameters to 1e-10
(tests/test_fidelity.py's bound, from Adam's lr / eps).
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
from test_fidelity import TOLERANCE, CleanRLGradientLeak, cleanrl_name, inject_aux_permutations, recorded_minibatches

import sb3_ppg.ppg.ppg as ppg_module
from sb3_ppg import PPG
from sb3_ppg.procgen import get_procgen_preset, make_procgen_env

FIXTURES = Path(__file__).parent / "data" / "fidelity"
fixtures = load_script("fidelity/fixtures")
#: float64 rounding of the same operations on both sides
EXACT = 1e-12


class Float64RolloutBuffer(RolloutBuffer):
    """SB3's rollout buffer in float64 (SB3's is float32), which also keeps the bootstrap values it is given."""

    def reset(self) -> None:
        super().reset()
        for name in ("rewards", "returns", "episode_starts", "values", "log_probs", "advantages", "actions"):
            setattr(self, name, getattr(self, name).astype(np.float64))

    def compute_returns_and_advantage(self, last_values: th.Tensor, dones: np.ndarray) -> None:
        self.last_values = last_values.detach().cpu().numpy().reshape(-1).copy()
        self.last_dones = np.asarray(dones).copy()
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


def fingerprint_difference(model: PPG, data: Any, prefix: str) -> float:
    """The largest difference between the model's parameters and the recorded fingerprints ``<prefix>/<name>``."""
    differences = []
    for name, parameter in model.policy.named_parameters():
        reference = cleanrl_name(name, "detach")
        ours = fixtures.fingerprint(reference, parameter.detach().cpu().numpy())
        # The sum adds up to 500k values: its rounding scales with their number
        scale = np.ones_like(ours)
        scale[-1] = parameter.numel()
        differences.append(float((np.abs(ours - data[f"{prefix}/{reference}"]) / scale).max()))
    return max(differences)


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
    model = PPG(
        "ProcgenCnn",
        env,
        precision="fp32",
        micro_batch_size=None,
        device="cpu",
        seed=meta["rand_seed"],
        rollout_buffer_class=Float64RolloutBuffer,
        **kwargs,
    )
    model.policy.to(th.float64)
    model.set_logger(configure(None, []))
    # The recorded initial weights: seeded, with CleanRL's row norms; its biases are zero
    with th.no_grad():
        for name, parameter in model.policy.named_parameters():
            reference = cleanrl_name(name, "detach")
            if reference.endswith(".bias"):
                parameter.zero_()
            else:
                scale = meta["weight_scales"][reference]
                weight = fixtures.seeded_normed_weight(reference, tuple(parameter.shape), scale, meta["weight_seed"])
                parameter.copy_(th.from_numpy(weight))
    sample, uniforms = uniform_sampling(data["uniforms"])
    monkeypatch.setattr(CategoricalDistribution, "sample", sample)
    monkeypatch.setattr(ppg_module, "clip_gradients", CleanRLGradientLeak())
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
            results[f"params_{iteration - 1}"] = fingerprint_difference(model, data, f"it{iteration - 1}/params")
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
        results[f"params_{iteration - 1}"] = fingerprint_difference(model, data, f"it{iteration - 1}/params")
        worst("pi_old", np.abs(model.aux_buffer.old_distribution_params - data["old_logits"].swapaxes(0, 1)).max())
        worst("aux_returns", np.abs(model.aux_buffer.returns - data["aux_returns"].swapaxes(0, 1)).max())
        train_aux_phase()
        results["params_aux"] = fingerprint_difference(model, data, "aux/params")

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
    for name in ("observations", "actions", "raw_rewards", "dones"):
        assert results[name] == 0, (name, results)
    for name in ("rewards", "reward_statistics", "log_probs", "values", "bootstrap", "advantages", "returns", "aux_returns"):
        assert results[name] <= EXACT, (name, results)
    for name in ("params_0", "params_1", "params_2", "pi_old", "params_aux"):
        assert results[name] <= TOLERANCE, (name, results)


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
