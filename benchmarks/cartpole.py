"""
CartPole-v1 learning benchmark: PPG (MlpPolicy) against SB3's PPO with rl-baselines3-zoo's tuned CartPole settings,
on the same seeds and the same budget. Both are evaluated every ``--eval-every`` steps on a separate env
(deterministic actions). Prints a markdown table and writes it to ``docs/benchmarks.md``.

Usage: ``python benchmarks/cartpole.py [--seeds 0 1 2 3 4] [--timesteps 100000] [--workers 2]``
"""

import argparse
import datetime
import os
import platform
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import torch as th
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import EvalCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.utils import LinearSchedule

from sb3_ppg import PPG

ENV_ID = "CartPole-v1"
THRESHOLD = 475.0

# rl-baselines3-zoo's tuned PPO hyperparameters for CartPole-v1 (hyperparams/ppo.yml)
PPO_KWARGS = dict(
    n_steps=32,
    batch_size=256,
    gae_lambda=0.8,
    gamma=0.98,
    n_epochs=20,
    ent_coef=0.0,
    learning_rate=LinearSchedule(1e-3, 0.0, 1.0),
    clip_range=LinearSchedule(0.2, 0.0, 1.0),
)
PPO_N_ENVS = 8

# PPG: the same rollout shape; the auxiliary phase distills the value function every 8 iterations (2,048 steps)
PPG_KWARGS = dict(
    n_steps=32,
    batch_size=64,
    gae_lambda=0.8,
    gamma=0.98,
    n_epochs=4,
    ent_coef=0.0,
    learning_rate=LinearSchedule(1e-3, 0.0, 1.0),
    clip_range=LinearSchedule(0.2, 0.0, 1.0),
    n_policy_iters=8,
    n_aux_epochs=4,
    aux_batch_rollouts=8,
)
PPG_N_ENVS = 8


def run(algo: str, seed: int, timesteps: int, eval_every: int, n_eval_episodes: int) -> dict:
    """
    Train one algorithm on one seed and evaluate it along the way.

    :param algo: "PPG" or "PPO"
    :param seed: the seed of the model, the training env and the evaluation env
    :param timesteps: training budget in environment steps
    :param eval_every: evaluation period in environment steps
    :param n_eval_episodes: episodes per evaluation
    :return: the evaluation curve, the first step at which the threshold was reached, the final return, wall time
    """
    th.set_num_threads(1)
    algo_class, kwargs, n_envs = (PPG, PPG_KWARGS, PPG_N_ENVS) if algo == "PPG" else (PPO, PPO_KWARGS, PPO_N_ENVS)
    env = make_vec_env(ENV_ID, n_envs=n_envs, seed=seed)
    eval_env = make_vec_env(ENV_ID, n_envs=1, seed=seed + 1000)
    model = algo_class("MlpPolicy", env, seed=seed, device="cpu", **kwargs)
    with tempfile.TemporaryDirectory() as log_path:
        # EvalCallback keeps its evaluation history only when it has a log path
        callback = EvalCallback(
            eval_env,
            eval_freq=max(eval_every // n_envs, 1),
            n_eval_episodes=n_eval_episodes,
            log_path=log_path,
            deterministic=True,
            verbose=0,
        )
        start = time.perf_counter()
        model.learn(timesteps, callback=callback)
        elapsed = time.perf_counter() - start
    steps = [int(t) for t in callback.evaluations_timesteps]
    returns = [float(np.mean(r)) for r in callback.evaluations_results]
    reached = next((t for t, r in zip(steps, returns, strict=True) if r >= THRESHOLD), None)
    return dict(algo=algo, seed=seed, steps=steps, returns=returns, reached=reached, final=returns[-1], seconds=elapsed)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--timesteps", type=int, default=100_000)
    parser.add_argument("--eval-every", type=int, default=5_000)
    parser.add_argument("--n-eval-episodes", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2, help="parallel training processes (one torch thread each)")
    parser.add_argument("--algos", nargs="+", default=["PPG", "PPO"], choices=["PPG", "PPO"])
    parser.add_argument("--output", default=os.path.join(os.path.dirname(__file__), "..", "docs", "benchmarks.md"))
    args = parser.parse_args(argv)

    jobs = [(algo, seed) for seed in args.seeds for algo in args.algos]
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        futures = [pool.submit(run, algo, seed, args.timesteps, args.eval_every, args.n_eval_episodes) for algo, seed in jobs]
        results = [future.result() for future in futures]

    lines = [
        f"| algo | seed | first step with eval return >= {THRESHOLD:.0f} | best eval return | final eval return "
        "| wall time (s) |",
        "|---|---|---|---|---|---|",
    ]
    for result in results:
        reached = f"{result['reached']:,}" if result["reached"] is not None else "not reached"
        lines.append(
            f"| {result['algo']} | {result['seed']} | {reached} | {max(result['returns']):.1f} | {result['final']:.1f} | "
            f"{result['seconds']:.0f} |"
        )
    summary = []
    for algo in args.algos:
        runs = [r for r in results if r["algo"] == algo]
        n_reached = sum(r["reached"] is not None for r in runs)
        finals = [r["final"] for r in runs]
        summary.append(
            f"- **{algo}**: reached {THRESHOLD:.0f} within {args.timesteps:,} steps on {n_reached} of {len(runs)} seeds; "
            f"final eval return {np.mean(finals):.1f} +- {np.std(finals):.1f} (mean +- std over seeds)"
        )
    table = "\n".join(lines)
    command = "python benchmarks/cartpole.py " + " ".join(sys.argv[1:] if argv is None else argv)
    report = "\n".join(
        [
            "# CartPole-v1 benchmark: PPG vs PPO",
            "",
            f"Measured on {datetime.date.today().isoformat()} with `{command.strip()}` on "
            f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, torch {th.__version__} "
            f"(one torch thread per run, {args.workers} runs in parallel).",
            "",
            f"Each run trains for {args.timesteps:,} steps and is evaluated every {args.eval_every:,} steps on "
            f"{args.n_eval_episodes} episodes of a separate env (deterministic actions). PPO uses rl-baselines3-zoo's tuned "
            "CartPole settings; PPG uses the settings in `benchmarks/cartpole.py` (the same rollout shape, 4 policy epochs, "
            "an auxiliary phase of 4 epochs every 8 iterations).",
            "",
            *summary,
            "",
            table,
            "",
        ]
    )
    print(report)
    with open(args.output, "w") as file_handler:
        file_handler.write(report)


if __name__ == "__main__":
    main()
