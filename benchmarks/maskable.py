"""
MaskablePPG against sb3-contrib's MaskablePPO and against PPG without masks, on sb3-contrib's invalid-action envs and
on gymnasium's Taxi with its action masks.

    python benchmarks/maskable.py --seeds 0 1 2 --out maskable.json --plot maskable.png

Each run trains for its env's budget (``--timesteps`` sets one for every env) and is evaluated every ``--eval-freq``
env steps (``--eval-episodes`` episodes, deterministic actions) with sb3-contrib's ``MaskableEvalCallback``: with the
env's masks for the maskable algorithms, without for PPG (which does not know them). The envs:

- sb3-contrib's identity envs with invalid actions (``sb3_contrib.common.envs``: the state is the right action;
  reward 1 for it, 100 steps per episode: the best return is 100);
- gymnasium's ``Taxi-v4`` (Dietterich 2000, ``gymnasium.envs.toy_text.taxi``: drive to the passenger, pick them up,
  drive to their destination, drop them off; -1 per step, +20 for the drop-off, -10 for a pickup or drop-off in the
  wrong place, 200 steps at most) with the masks that the env itself computes (``env.unwrapped.action_mask``: no
  move into a wall, pickup only at the passenger, drop-off only at the destination), through sb3-contrib's
  ``ActionMasker``. A long-horizon task with a sparse reward (gamma 0.99), where the value function matters.

The report prints the mean evaluation return at each evaluation step (mean over seeds, with the min and max), the wall
time, and the rate of invalid actions of the final models; ``--plot`` draws the curves.
"""

import argparse
import json
import platform
import subprocess
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import torch as th
from gymnasium import spaces
from sb3_contrib import MaskablePPO
from sb3_contrib.common.envs import InvalidActionEnvDiscrete, InvalidActionEnvMultiBinary, InvalidActionEnvMultiDiscrete
from sb3_contrib.common.maskable.callbacks import MaskableEvalCallback
from sb3_contrib.common.wrappers import ActionMasker
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env

from sb3_ppg import PPG, MaskablePPG


def taxi_action_masks(env: gym.Env) -> np.ndarray:
    """Taxi's own masks of its current state (``Taxi.action_mask``: int8 0 / 1 per action), as booleans."""
    taxi = env.unwrapped
    return taxi.action_mask(taxi.s).astype(bool)  # type: ignore[attr-defined]


def make_masked_taxi() -> gym.Env:
    """gymnasium's Taxi-v4 with an ``action_masks()`` method giving the env's own masks."""
    return ActionMasker(gym.make("Taxi-v4"), taxi_action_masks)


class BenchmarkEnv(NamedTuple):
    """One env of the benchmark and the settings of its runs."""

    #: Makes one env with an ``action_masks()`` method
    make_env: Callable[[], gym.Env]
    #: Envs per run
    n_envs: int
    #: Env steps per run (``--timesteps`` overrides it)
    timesteps: int
    #: Env steps between evaluations (``--eval-freq`` overrides it)
    eval_freq: int
    #: MaskablePPG's (and PPG's) settings
    ppg_settings: dict[str, Any]
    #: MaskablePPO's settings
    maskable_ppo_settings: dict[str, Any]


#: The identity envs' MaskablePPG settings: the packaged maskable_ppg.yml (an auxiliary phase every 4 rollouts of 256)
IDENTITY_PPG_SETTINGS = dict(
    n_steps=256,
    batch_size=64,
    n_epochs=4,
    gamma=0.4,
    learning_rate=3e-4,
    n_policy_iters=4,
    n_aux_epochs=2,
    aux_batch_rollouts=1,
)
#: The identity envs' MaskablePPO settings: sb3-contrib's test_identity (its defaults, n_steps 2048, 10 epochs, with
#: gamma 0.4)
IDENTITY_MASKABLE_PPO_SETTINGS = dict(gamma=0.4)
#: Taxi: the same policy-phase settings for both algorithms (8 envs x 128 steps, 4 epochs of minibatches of 256,
#: gamma 0.99, entropy 0.01); MaskablePPG adds an auxiliary phase every 8 rollouts (6 epochs, PPG's default)
TAXI_COMMON_SETTINGS = dict(n_steps=128, batch_size=256, n_epochs=4, gamma=0.99, gae_lambda=0.95, ent_coef=0.01)
TAXI_PPG_SETTINGS = dict(TAXI_COMMON_SETTINGS, learning_rate=3e-4, n_policy_iters=8, n_aux_epochs=6, aux_batch_rollouts=2)

ENVS: dict[str, BenchmarkEnv] = {
    # sb3-contrib's performance test (Discrete), and larger MultiDiscrete / MultiBinary versions of its tests'
    "Discrete(70), 55 invalid": BenchmarkEnv(
        lambda: InvalidActionEnvDiscrete(dim=70, n_invalid_actions=55),
        1,
        5000,
        1000,
        IDENTITY_PPG_SETTINGS,
        IDENTITY_MASKABLE_PPO_SETTINGS,
    ),
    "MultiDiscrete([8, 8, 8]), 15 invalid": BenchmarkEnv(
        lambda: InvalidActionEnvMultiDiscrete(dims=[8, 8, 8], n_invalid_actions=15),
        1,
        5000,
        1000,
        IDENTITY_PPG_SETTINGS,
        IDENTITY_MASKABLE_PPO_SETTINGS,
    ),
    "MultiBinary(10), 6 invalid": BenchmarkEnv(
        lambda: InvalidActionEnvMultiBinary(dims=10, n_invalid_actions=6),
        1,
        5000,
        1000,
        IDENTITY_PPG_SETTINGS,
        IDENTITY_MASKABLE_PPO_SETTINGS,
    ),
    "Taxi-v4 (gymnasium), its action masks": BenchmarkEnv(
        make_masked_taxi, 8, 500_000, 25_000, TAXI_PPG_SETTINGS, dict(TAXI_COMMON_SETTINGS, learning_rate=3e-4)
    ),
}

#: The algorithms: class, whether it uses the masks, and its settings from the env's (``"ppg"`` or ``"maskable_ppo"``)
ALGORITHMS: dict[str, tuple[type[BaseAlgorithm], bool, Callable[[BenchmarkEnv], dict[str, Any]]]] = {
    "MaskablePPG": (MaskablePPG, True, lambda spec: spec.ppg_settings),
    # The same without auxiliary phase (PPO's updates with PPG's settings): what the auxiliary phase itself changes
    "MaskablePPG, no aux phase": (MaskablePPG, True, lambda spec: {**spec.ppg_settings, "n_aux_epochs": 0}),
    "MaskablePPO (sb3-contrib)": (MaskablePPO, True, lambda spec: spec.maskable_ppo_settings),
    "PPG, no masks": (PPG, False, lambda spec: spec.ppg_settings),
    # An ablation (not run by default): the auxiliary phase without its epochs on the value network (vf_true_coef=0),
    # so that it only trains the policy network (its auxiliary value head and the behaviour-cloning term)
    "MaskablePPG, aux phase without value net": (
        MaskablePPG,
        True,
        lambda spec: {**spec.ppg_settings, "vf_true_coef": 0.0},
    ),
}
#: The algorithms run when ``--algorithms`` is not given
DEFAULT_ALGORITHMS = ["MaskablePPG", "MaskablePPG, no aux phase", "MaskablePPO (sb3-contrib)", "PPG, no masks"]


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
        obs, _, terminated, truncated, _ = env.step(int(action) if isinstance(space, spaces.Discrete) else action)
        if terminated or truncated:
            obs, _ = env.reset()
    return invalid / n_steps


def run(env_name: str, algorithm: str, seed: int, timesteps: int, eval_freq: int, eval_episodes: int) -> dict[str, Any]:
    """One training run of ``timesteps`` env steps, evaluated every ``eval_freq`` env steps."""
    algorithm_class, masked, settings = ALGORITHMS[algorithm]
    spec = ENVS[env_name]
    env = make_vec_env(spec.make_env, n_envs=spec.n_envs, seed=seed)
    eval_env = make_vec_env(spec.make_env, n_envs=1, seed=seed + 1000)
    evaluations = RecordEvaluations()
    callback = MaskableEvalCallback(
        eval_env,
        eval_freq=max(eval_freq // spec.n_envs, 1),  # in calls of the callback, one per step of the n_envs envs
        n_eval_episodes=eval_episodes,
        use_masking=masked,
        warn=False,
        verbose=0,
        callback_after_eval=evaluations,
    )
    model = algorithm_class("MlpPolicy", env, seed=seed, device="cpu", **settings(spec))
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
        invalid_action_rate=invalid_action_rate(model, spec.make_env(), masked),
    )


def table_columns(n_evaluations: int, most: int = 5) -> list[int]:
    """The evaluations shown in a table: all of them up to ``most``, else ``most`` evenly spaced ones ending at the last."""
    every = -(-n_evaluations // most)
    return list(range(n_evaluations - 1, -1, -every))[::-1]


def report(results: list[dict[str, Any]], command: str) -> str:
    """A markdown report: evaluation returns by step (mean [min, max] over seeds), wall time, invalid actions."""
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model_name = next((line.split(":", 1)[1].strip() for line in cpu.splitlines() if line.startswith("Model name")), "?")
    lines = [f"Command: `{command}`", "", f"CPU: {model_name} ({platform.machine()}), torch {th.__version__}", ""]
    for env_name in ENVS:
        runs = [result for result in results if result["env"] == env_name]
        if not runs:
            continue
        columns = table_columns(len(runs[0]["timesteps"]))
        steps = [runs[0]["timesteps"][column] for column in columns]
        lines += [f"### {env_name}", ""]
        lines.append("| algorithm | " + " | ".join(f"{step:,} steps" for step in steps) + " | time (s) | invalid actions |")
        lines.append("|---" * (len(steps) + 3) + "|")
        for algorithm in ALGORITHMS:
            algorithm_runs = [result for result in runs if result["algorithm"] == algorithm]
            if not algorithm_runs:
                continue
            returns = np.array([result["returns"] for result in algorithm_runs])[:, columns]
            statistics = zip(returns.mean(axis=0), returns.min(axis=0), returns.max(axis=0), strict=True)
            cells = [f"{mean:.1f} [{low:.0f}, {high:.0f}]" for mean, low, high in statistics]
            seconds = np.mean([result["seconds"] for result in algorithm_runs])
            invalid = np.mean([result["invalid_action_rate"] for result in algorithm_runs])
            lines.append(f"| {algorithm} | " + " | ".join(cells) + f" | {seconds:.1f} | {100 * invalid:.1f}% |")
        lines.append("")
    seeds = sorted({result["seed"] for result in results})
    lines.append(f"Mean [min, max] over {len(seeds)} seeds ({', '.join(map(str, seeds))}) of the mean evaluation return.")
    return "\n".join(lines)


def plot(results: list[dict[str, Any]], path: str) -> None:
    """The learning curves: one panel per env, the mean evaluation return over seeds of each algorithm and its range."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    env_names = [name for name in ENVS if any(result["env"] == name for result in results)]
    columns = min(len(env_names), 2)
    rows = -(-len(env_names) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(6 * columns, 4 * rows), squeeze=False)
    for axis, env_name in zip(axes.flat, env_names, strict=False):
        for algorithm in ALGORITHMS:
            runs = [result for result in results if result["env"] == env_name and result["algorithm"] == algorithm]
            if not runs:
                continue
            returns = np.array([run["returns"] for run in runs])
            steps = runs[0]["timesteps"]
            axis.plot(steps, returns.mean(axis=0), marker=".", label=f"{algorithm} ({len(runs)} seeds)")
            axis.fill_between(steps, returns.min(axis=0), returns.max(axis=0), alpha=0.15)
        axis.set(title=env_name, xlabel="env steps", ylabel="evaluation return")
        axis.legend(fontsize="small")
    for axis in list(axes.flat)[len(env_names) :]:
        axis.set_visible(False)
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2], help="none: only report --merge's results")
    parser.add_argument("--timesteps", type=int, default=None, help="env steps per run (default: the env's budget)")
    parser.add_argument("--eval-freq", type=int, default=None, help="env steps between evaluations (default: the env's)")
    parser.add_argument("--eval-episodes", type=int, default=5)
    parser.add_argument("--envs", nargs="+", choices=list(ENVS), default=list(ENVS))
    parser.add_argument("--algorithms", nargs="+", choices=list(ALGORITHMS), default=DEFAULT_ALGORITHMS)
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    parser.add_argument("--merge", nargs="*", default=[], help="JSON results of earlier runs to report with these")
    parser.add_argument("--plot", default=None, help="draw the learning curves into this image (PNG)")
    args = parser.parse_args()
    th.set_num_threads(1)
    results = []
    for env_name in args.envs:
        spec = ENVS[env_name]
        timesteps = spec.timesteps if args.timesteps is None else args.timesteps
        eval_freq = spec.eval_freq if args.eval_freq is None else args.eval_freq
        for algorithm in args.algorithms:
            for seed in args.seeds:
                result = run(env_name, algorithm, seed, timesteps, eval_freq, args.eval_episodes)
                print(f"{env_name} | {algorithm} | seed {seed}: {result['returns']} ({result['seconds']:.1f} s)", flush=True)
                results.append(result)
    for path in args.merge:
        with open(path) as file:
            results = json.load(file) + results
    if args.out:
        with open(args.out, "w") as file:
            json.dump(results, file, indent=1)
    if args.plot:
        plot(results, args.plot)
    seeds = sorted({result["seed"] for result in results})
    options = [f"--seeds {' '.join(map(str, seeds))}", f"--eval-episodes {args.eval_episodes}"]
    if args.timesteps is not None:
        options.append(f"--timesteps {args.timesteps}")
    if args.eval_freq is not None:
        options.append(f"--eval-freq {args.eval_freq}")
    print(report(results, "python benchmarks/maskable.py " + " ".join(options)))


if __name__ == "__main__":
    main()
