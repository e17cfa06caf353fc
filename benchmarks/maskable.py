"""
MaskablePPG against sb3-contrib's MaskablePPO and against PPG without masks, on sb3-contrib's invalid-action envs.

    python benchmarks/maskable.py --seeds 0 1 2 --timesteps 5000 --out maskable.json

Each run trains for ``--timesteps`` env steps and is evaluated every ``--eval-freq`` steps (``--eval-episodes``
episodes, deterministic actions) with sb3-contrib's ``MaskableEvalCallback``: with the env's masks for the maskable
algorithms, without for PPG (which does not know them). The envs are sb3-contrib's identity envs with invalid actions
(the state is the right action; reward 1 for it, 100 steps per episode: the best return is 100). The report prints
the mean evaluation return at each evaluation step (mean over seeds, with the min and max), the wall time, and the
rate of invalid actions of the final models.
"""

import argparse
import json
import platform
import subprocess
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from sb3_contrib import MaskablePPO
from sb3_contrib.common.envs import InvalidActionEnvDiscrete, InvalidActionEnvMultiBinary, InvalidActionEnvMultiDiscrete
from sb3_contrib.common.maskable.callbacks import MaskableEvalCallback
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback

from sb3_ppg import PPG, MaskablePPG

#: The envs: sb3-contrib's performance test (Discrete), and larger MultiDiscrete / MultiBinary versions of its tests'
ENVS: dict[str, Callable[[], Any]] = {
    "Discrete(70), 55 invalid": lambda: InvalidActionEnvDiscrete(dim=70, n_invalid_actions=55),
    "MultiDiscrete([8, 8, 8]), 15 invalid": lambda: InvalidActionEnvMultiDiscrete(dims=[8, 8, 8], n_invalid_actions=15),
    "MultiBinary(10), 6 invalid": lambda: InvalidActionEnvMultiBinary(dims=10, n_invalid_actions=6),
}

#: MaskablePPG and PPG: the packaged maskable_ppg.yml settings (an auxiliary phase every 4 rollouts of 256 steps)
PPG_SETTINGS = dict(
    n_steps=256,
    batch_size=64,
    n_epochs=4,
    gamma=0.4,
    learning_rate=3e-4,
    n_policy_iters=4,
    n_aux_epochs=2,
    aux_batch_rollouts=1,
)
#: MaskablePPO: sb3-contrib's test_identity (its defaults, n_steps 2048, 10 epochs, with gamma 0.4)
MASKABLE_PPO_SETTINGS = dict(gamma=0.4)

ALGORITHMS: dict[str, tuple[type[BaseAlgorithm], dict[str, Any], bool]] = {
    "MaskablePPG": (MaskablePPG, PPG_SETTINGS, True),
    # The same without auxiliary phase (PPO's updates with PPG's settings): what the auxiliary phase itself changes
    "MaskablePPG, no aux phase": (MaskablePPG, {**PPG_SETTINGS, "n_aux_epochs": 0}, True),
    "MaskablePPO (sb3-contrib)": (MaskablePPO, MASKABLE_PPO_SETTINGS, True),
    "PPG, no masks": (PPG, PPG_SETTINGS, False),
}


class RecordEvaluations(BaseCallback):
    """Records each evaluation's step and mean return (called by the evaluation callback after each evaluation)."""

    def __init__(self) -> None:
        super().__init__()
        self.timesteps: list[int] = []
        self.returns: list[float] = []

    def _on_step(self) -> bool:
        assert self.parent is not None
        self.timesteps.append(int(self.num_timesteps))
        self.returns.append(float(self.parent.last_mean_reward))  # type: ignore[attr-defined]
        return True


def invalid_action_rate(model: BaseAlgorithm, env: Any, use_masks: bool, n_steps: int = 500) -> float:
    """The share of ``n_steps`` stochastic actions that the env's masks forbid."""
    obs, _ = env.reset(seed=123)
    space = env.action_space
    if isinstance(space, spaces.Discrete):
        sizes = [int(space.n)]
    elif isinstance(space, spaces.MultiDiscrete):
        sizes = [int(n) for n in space.nvec]
    else:
        sizes = [2] * int(space.n)  # MultiBinary: whether 0, whether 1 are allowed
    starts = np.cumsum([0, *sizes[:-1]])
    invalid = 0
    for _ in range(n_steps):
        masks = np.asarray(env.action_masks())
        kwargs = dict(action_masks=masks) if use_masks else {}
        action, _ = model.predict(obs, **kwargs)
        choices = np.atleast_1d(action)
        invalid += not all(masks[start + int(choice)] for start, choice in zip(starts, choices, strict=True))
        obs, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            obs, _ = env.reset()
    return invalid / n_steps


def run(env_name: str, algorithm: str, seed: int, timesteps: int, eval_freq: int, eval_episodes: int) -> dict[str, Any]:
    """One training run and its evaluations."""
    algorithm_class, settings, masked = ALGORITHMS[algorithm]
    env, eval_env = ENVS[env_name](), ENVS[env_name]()
    eval_env.reset(seed=seed + 1000)
    evaluations = RecordEvaluations()
    callback = MaskableEvalCallback(
        eval_env,
        eval_freq=eval_freq,
        n_eval_episodes=eval_episodes,
        use_masking=masked,
        warn=False,
        verbose=0,
        callback_after_eval=evaluations,
    )
    model = algorithm_class("MlpPolicy", env, seed=seed, device="cpu", **settings)
    start = time.perf_counter()
    learn_kwargs = dict(use_masking=True) if masked else {}
    model.learn(timesteps, callback=callback, **learn_kwargs)
    seconds = time.perf_counter() - start
    return dict(
        env=env_name,
        algorithm=algorithm,
        seed=seed,
        # MaskablePPO's rollouts of 2048 steps run past the budget: its evaluations beyond it are left out
        timesteps=[step for step in evaluations.timesteps if step <= timesteps],
        returns=[value for step, value in zip(evaluations.timesteps, evaluations.returns, strict=True) if step <= timesteps],
        seconds=seconds,
        invalid_action_rate=invalid_action_rate(model, ENVS[env_name](), masked),
    )


def report(results: list[dict[str, Any]], command: str) -> str:
    """A markdown report: evaluation returns by step (mean [min, max] over seeds), wall time, invalid actions."""
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model_name = next((line.split(":", 1)[1].strip() for line in cpu.splitlines() if line.startswith("Model name")), "?")
    lines = [f"Command: `{command}`", "", f"CPU: {model_name} ({platform.machine()}), torch {th.__version__}", ""]
    for env_name in ENVS:
        runs = [result for result in results if result["env"] == env_name]
        if not runs:
            continue
        steps = runs[0]["timesteps"]
        lines += [f"### {env_name}", ""]
        lines.append("| algorithm | " + " | ".join(f"{step:,} steps" for step in steps) + " | time (s) | invalid actions |")
        lines.append("|---" * (len(steps) + 3) + "|")
        for algorithm in ALGORITHMS:
            algorithm_runs = [result for result in runs if result["algorithm"] == algorithm]
            if not algorithm_runs:
                continue
            returns = np.array([result["returns"] for result in algorithm_runs])
            statistics = zip(returns.mean(axis=0), returns.min(axis=0), returns.max(axis=0), strict=True)
            cells = [f"{mean:.1f} [{low:.0f}, {high:.0f}]" for mean, low, high in statistics]
            seconds = np.mean([result["seconds"] for result in algorithm_runs])
            invalid = np.mean([result["invalid_action_rate"] for result in algorithm_runs])
            lines.append(f"| {algorithm} | " + " | ".join(cells) + f" | {seconds:.1f} | {100 * invalid:.1f}% |")
        lines.append("")
    seeds = sorted({result["seed"] for result in results})
    lines.append(f"Mean [min, max] over {len(seeds)} seeds ({', '.join(map(str, seeds))}) of the mean evaluation return.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--timesteps", type=int, default=5000)
    parser.add_argument("--eval-freq", type=int, default=1000)
    parser.add_argument("--eval-episodes", type=int, default=5)
    parser.add_argument("--envs", nargs="+", choices=list(ENVS), default=list(ENVS))
    parser.add_argument("--algorithms", nargs="+", choices=list(ALGORITHMS), default=list(ALGORITHMS))
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    parser.add_argument("--merge", nargs="*", default=[], help="JSON results of earlier runs to report with these")
    args = parser.parse_args()
    th.set_num_threads(1)
    results = []
    for env_name in args.envs:
        for algorithm in args.algorithms:
            for seed in args.seeds:
                result = run(env_name, algorithm, seed, args.timesteps, args.eval_freq, args.eval_episodes)
                print(f"{env_name} | {algorithm} | seed {seed}: {result['returns']} ({result['seconds']:.1f} s)", flush=True)
                results.append(result)
    for path in args.merge:
        with open(path) as file:
            results = json.load(file) + results
    if args.out:
        with open(args.out, "w") as file:
            json.dump(results, file, indent=1)
    command = "python benchmarks/maskable.py " + " ".join(
        [f"--seeds {' '.join(map(str, args.seeds))}", f"--timesteps {args.timesteps}", f"--eval-freq {args.eval_freq}"]
    )
    print(report(results, command))


if __name__ == "__main__":
    main()
