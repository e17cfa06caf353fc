"""
RecurrentPPG against sb3-contrib's RecurrentPPO, side by side in one process, at rl-zoo3's tuned ``CartPoleNoVel-v1``
settings (hyperparams/ppo_lstm.yml: 8 envs, n_steps 32, batch 256, 20 epochs, LSTM 64 with a critic LSTM, VecNormalize).

    python benchmarks/recurrent.py --rounds 3 --timesteps 8192 --out recurrent.json

Each round trains each algorithm once for ``--timesteps`` env steps from a fresh model (after ``--warmup`` steps that
are not timed), in turns A B A B..., so that the load of other processes on a shared machine hits both. RecurrentPPG
runs its auxiliary phase every ``n_policy_iters`` = 8 rollouts (``--n-policy-iters``), 6 epochs of minibatches of 8
rollouts (256 steps, the policy minibatch's size; ``--aux-batch-rollouts``). One torch thread by default
(``--threads``). The report prints env steps/s of every run, the median of each algorithm and the ratio.

    python benchmarks/recurrent.py --learn 0 1 2 --out recurrent_learning.json

trains each algorithm for the zoo's 100k steps (``--learn-timesteps``) once per seed, the two in turns, and reports the
mean return of each run's last 100 training episodes, and the mean and std over the seeds. ``--env PendulumNoVel-v1``
or ``MountainCarContinuousNoVel-v0`` runs the zoo's settings for those tasks instead (``ZOO``; RecurrentPPG's there:
sb3_ppg/cli/hyperparams/recurrent_ppg.yml), ``--algorithms`` one of the two alone, for instance RecurrentPPG with
``--aux-start-states recomputed``.
"""

import argparse
import json
import platform
import statistics
import subprocess
import time
import warnings
from typing import Any

import gymnasium as gym
import numpy as np
import torch as th
from sb3_contrib import RecurrentPPO
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.utils import LinearSchedule
from stable_baselines3.common.vec_env import VecNormalize
from torch import nn

from sb3_ppg import RecurrentPPG

#: rl-zoo3's tuned RecurrentPPO settings (hyperparams/ppo_lstm.yml) per env: the settings both algorithms share (with
#: RecurrentPPO's default max_grad_norm of 0.5 set for RecurrentPPG too), RecurrentPPO's n_steps and batch_size, and
#: RecurrentPPG's whole-rollout minibatches and auxiliary phase (sb3_ppg/cli/hyperparams/recurrent_ppg.yml): where the
#: zoo's rollouts are longer than RecurrentPPO's batch_size, RecurrentPPG's rollouts are that batch_size long, so that
#: both make as many updates per env step on sequences of the same length
ZOO: dict[str, dict[str, Any]] = {
    "CartPoleNoVel-v1": dict(
        base_env="CartPole-v1",
        n_envs=8,
        timesteps=100_000,
        shared=dict(
            n_steps=32,
            gae_lambda=0.8,
            gamma=0.98,
            n_epochs=20,
            ent_coef=0.0,
            max_grad_norm=0.5,
            learning_rate=LinearSchedule(1e-3, 0.0, 1.0),
            clip_range=LinearSchedule(0.2, 0.0, 1.0),
        ),
        recurrent_ppo=dict(batch_size=256),
        recurrent_ppg=dict(batch_size=256, n_policy_iters=8, aux_batch_rollouts=8),
        policy_kwargs=dict(lstm_hidden_size=64, net_arch=dict(pi=[64], vf=[64]), activation_fn=nn.ReLU),
    ),
    "PendulumNoVel-v1": dict(
        base_env="Pendulum-v1",
        n_envs=4,
        timesteps=100_000,
        shared=dict(
            gae_lambda=0.95,
            gamma=0.9,
            n_epochs=10,
            ent_coef=0.0,
            max_grad_norm=0.5,
            learning_rate=1e-3,
            clip_range=0.2,
            use_sde=True,
            sde_sample_freq=4,
        ),
        recurrent_ppo=dict(n_steps=1024, batch_size=128),  # RecurrentPPO's default batch_size: the zoo sets none
        # Minibatches of whole env rollouts: rollouts of RecurrentPPO's batch_size, as many updates per env step
        recurrent_ppg=dict(n_steps=128, batch_size=128, n_policy_iters=32, aux_batch_rollouts=4),
        policy_kwargs=dict(lstm_hidden_size=64, net_arch=dict(pi=[64], vf=[64]), activation_fn=nn.ReLU),
    ),
    "MountainCarContinuousNoVel-v0": dict(
        base_env="MountainCarContinuous-v0",
        n_envs=8,
        timesteps=300_000,
        shared=dict(
            gae_lambda=0.9,
            gamma=0.9999,
            n_epochs=10,
            ent_coef=0.00429,
            max_grad_norm=5.0,
            vf_coef=0.19,
            learning_rate=7.77e-05,
            clip_range=0.1,
            use_sde=True,
            sde_sample_freq=8,
        ),
        recurrent_ppo=dict(n_steps=1024, batch_size=256),
        recurrent_ppg=dict(n_steps=256, batch_size=256, n_policy_iters=16, aux_batch_rollouts=4),
        policy_kwargs=dict(lstm_hidden_size=32, net_arch=dict(pi=[64], vf=[64]), log_std_init=0.0),
    ),
}
ALGORITHMS = ["RecurrentPPG", "RecurrentPPO"]


def make_no_velocity_env(base_env: str) -> gym.Env:
    """``base_env`` with its velocities masked (zeros): rl-zoo3's ``<name>NoVel-v<version>`` envs."""
    from rl_zoo3.wrappers import MaskVelocityWrapper

    return MaskVelocityWrapper(gym.make(base_env))


def make_model(
    algorithm: str,
    seed: int,
    env_id: str = "CartPoleNoVel-v1",
    n_policy_iters: int | None = None,
    aux_batch_rollouts: int | None = None,
    aux_start_states: str = "stored",
) -> BaseAlgorithm:
    """
    A fresh model at the zoo's settings for ``env_id`` (``normalize: True``: VecNormalize on observations and rewards);
    RecurrentPPG's ``n_policy_iters`` and ``aux_batch_rollouts`` default to the env's entry in ``ZOO``.
    """
    zoo = ZOO[env_id]
    env = VecNormalize(
        make_vec_env(make_no_velocity_env, n_envs=zoo["n_envs"], seed=seed, env_kwargs=dict(base_env=zoo["base_env"]))
    )
    policy_kwargs = dict(ortho_init=False, enable_critic_lstm=True, **zoo["policy_kwargs"])
    if algorithm == "RecurrentPPO":
        return RecurrentPPO(
            "MlpLstmPolicy", env, **zoo["shared"], **zoo["recurrent_ppo"], policy_kwargs=policy_kwargs, seed=seed, device="cpu"
        )
    ppg_settings = dict(zoo["recurrent_ppg"], aux_start_states=aux_start_states)
    if n_policy_iters is not None:
        ppg_settings["n_policy_iters"] = n_policy_iters
    if aux_batch_rollouts is not None:
        ppg_settings["aux_batch_rollouts"] = aux_batch_rollouts
    return RecurrentPPG(
        "MlpLstmPolicy", env, **zoo["shared"], **ppg_settings, policy_kwargs=policy_kwargs, seed=seed, device="cpu"
    )


def timed_run(
    algorithm: str, seed: int, timesteps: int, warmup: int, env_id: str = "CartPoleNoVel-v1", **ppg_settings: Any
) -> dict:
    """Train a fresh model for ``warmup`` steps (untimed), then ``timesteps`` more: its env steps/s over the latter."""
    model = make_model(algorithm, seed, env_id, **ppg_settings)
    if warmup:
        model.learn(warmup)
    start = time.perf_counter()
    model.learn(timesteps, reset_num_timesteps=False)
    seconds = time.perf_counter() - start
    result = {"algorithm": algorithm, "seed": seed, "timesteps": timesteps, "seconds": seconds}
    result["steps_per_second"] = timesteps / seconds
    if isinstance(model, RecurrentPPG):
        result["aux_phases"] = model.n_aux_phases
    return result


class EpisodeReturns(BaseCallback):
    """Records each finished training episode's return (raw rewards) with the env steps trained when it ended."""

    def __init__(self) -> None:
        super().__init__()
        self.curve: list[tuple[int, float]] = []

    def _on_step(self) -> bool:
        self.curve += [(self.num_timesteps, float(info["episode"]["r"])) for info in self.locals["infos"] if "episode" in info]
        return True


def learning_run(algorithm: str, seed: int, timesteps: int, env_id: str = "CartPoleNoVel-v1", **ppg_settings: Any) -> dict:
    """
    Train a fresh model on ``env_id`` for ``timesteps`` env steps (the zoo's budget): the mean return of its last 100
    training episodes (raw rewards, before VecNormalize), the wall time and the curve: (env steps, return) per episode.
    """
    model = make_model(algorithm, seed, env_id, **ppg_settings)
    episode_returns = EpisodeReturns()
    start = time.perf_counter()
    model.learn(timesteps, callback=episode_returns)
    seconds = time.perf_counter() - start
    returns = [info["r"] for info in model.ep_info_buffer]
    result = {"algorithm": algorithm, "env": env_id, "seed": seed, "timesteps": timesteps, "seconds": seconds,
              "mean_return": float(np.mean(returns)), "episodes": len(returns), "curve": episode_returns.curve}  # fmt: skip
    if isinstance(model, RecurrentPPG):
        result["aux_start_states"] = model.aux_start_states
    return result


def run_label(result: dict) -> str:
    """The run's algorithm, with RecurrentPPG's ``aux_start_states`` where the run recorded it."""
    if "aux_start_states" in result:
        return f"{result['algorithm']} ({result['aux_start_states']})"
    return result["algorithm"]


def learning_report(results: list[dict], command: str, threads: int | None = None) -> str:
    """
    The mean return of the last 100 training episodes of each run, and per algorithm the mean and std over seeds.

    :param threads: The torch threads the runs trained with, where this process ran them
    """
    lines = [f"`{command}` on {cpu_name()}" + (f", {threads} torch thread(s)" if threads else ""), ""]
    lines += ["| algorithm | seed | env steps | mean return (last 100 episodes) | seconds | env steps/s |"]
    lines.append("|---|---:|---:|---:|---:|---:|")
    several_envs = len({result.get("env") for result in results}) > 1

    def label(result: dict) -> str:
        return f"{run_label(result)} on {result.get('env')}" if several_envs else run_label(result)

    for result in results:
        lines.append(
            f"| {label(result)} | {result['seed']} | {result['timesteps']:,} | {result['mean_return']:.1f} "
            f"| {result['seconds']:.0f} | {result['timesteps'] / result['seconds']:,.0f} |"
        )
    lines.append("")
    for name in dict.fromkeys(label(result) for result in results):
        returns = [r["mean_return"] for r in results if label(r) == name]
        lines.append(f"- {name}: {np.mean(returns):.1f} +- {np.std(returns):.1f} over {len(returns)} seed(s)")
    return "\n".join(lines)


def plot_learning(results: list[dict], path: str, points: int = 50) -> None:
    """
    The learning curves of the runs that recorded one, a panel per env: per algorithm the mean over seeds of the mean
    return of the last 100 training episodes at each env step, and the seeds' range.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = [result for result in results if result.get("curve")]
    env_ids = list(dict.fromkeys(result.get("env", "CartPoleNoVel-v1") for result in results))
    figure, axes = plt.subplots(1, len(env_ids), figsize=(6 * len(env_ids), 4), squeeze=False)
    for axis, env_id in zip(axes.flat, env_ids, strict=True):
        runs = [result for result in results if result.get("env", "CartPoleNoVel-v1") == env_id]
        grid = np.linspace(0, max(run["timesteps"] for run in runs), points)
        for label in dict.fromkeys(run_label(run) for run in runs):
            curves = []
            for run in (run for run in runs if run_label(run) == label):
                steps, returns = np.array(run["curve"], dtype=np.float64).T
                last_100 = [returns[max(0, index - 99) : index + 1].mean() for index in range(len(returns))]
                curves.append(np.interp(grid, steps, last_100, left=np.nan))
            curves = np.array(curves)
            axis.plot(grid, curves.mean(axis=0), label=f"{label} ({len(curves)} seeds)")
            axis.fill_between(grid, curves.min(axis=0), curves.max(axis=0), alpha=0.15)
        axis.set(title=env_id, xlabel="env steps", ylabel="mean return, last 100 training episodes")
        axis.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    plt.close(figure)


def cpu_name() -> str:
    """The CPU's model name (``lscpu``), or the platform's processor string."""
    try:
        output = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor()
    return next((line.split(":", 1)[1].strip() for line in output.splitlines() if line.startswith("Model name")), "")


def report(results: list[dict], command: str) -> str:
    """The table of the runs (in their order) and the medians, in Markdown."""
    lines = [f"`{command}` on {cpu_name()}, {th.get_num_threads()} torch thread(s)", ""]
    lines += ["| run | algorithm | env steps/s | aux phases |", "|---:|---|---:|---:|"]
    for index, result in enumerate(results, 1):
        aux = result.get("aux_phases", "")
        lines.append(f"| {index} | {result['algorithm']} | {result['steps_per_second']:,.0f} | {aux} |")
    medians = {}
    for algorithm in dict.fromkeys(result["algorithm"] for result in results):
        medians[algorithm] = statistics.median(r["steps_per_second"] for r in results if r["algorithm"] == algorithm)
    lines.append("")
    lines += [f"- median {algorithm}: {median:,.0f} env steps/s" for algorithm, median in medians.items()]
    if "RecurrentPPG" in medians and "RecurrentPPO" in medians:
        lines.append(f"- RecurrentPPG / RecurrentPPO: {medians['RecurrentPPG'] / medians['RecurrentPPO']:.2f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of one run per algorithm (A B, A B, ...)")
    parser.add_argument("--timesteps", type=int, default=8192, help="timed env steps per run")
    parser.add_argument("--warmup", type=int, default=512, help="untimed env steps before each timed run")
    parser.add_argument("--env", default="CartPoleNoVel-v1", choices=list(ZOO), help="the task, at the zoo's settings")
    parser.add_argument("--n-policy-iters", type=int, help="RecurrentPPG's N_pi (default: the env's in ZOO, 8 on CartPole)")
    parser.add_argument("--aux-batch-rollouts", type=int, help="RecurrentPPG's rollouts per aux minibatch (default: ZOO's)")
    parser.add_argument("--aux-start-states", default="stored", choices=("stored", "recomputed"))
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the zoo's runs: 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--learn", type=int, nargs="+", metavar="SEED", help="learning runs instead: these seeds")
    parser.add_argument("--learn-timesteps", type=int, help="env steps of each learning run (default: the zoo's budget)")
    parser.add_argument("--algorithms", nargs="+", default=ALGORITHMS, choices=ALGORITHMS, help="the algorithms to run")
    parser.add_argument("--out", help="write the runs as JSON (learning runs: after each run)")
    parser.add_argument("--report", nargs="+", metavar="JSON", help="no runs: the learning report of these --out files")
    parser.add_argument("--plot", help="with --learn or --report: plot the learning curves to this image file")
    args = parser.parse_args(argv)
    if args.report:
        runs = []
        for path in args.report:
            with open(path) as file:
                saved = json.load(file)
            print(f"`{saved['command']}` on {saved['cpu']}")
            runs += saved["runs"]
        print(learning_report(runs, "python benchmarks/recurrent.py --report " + " ".join(args.report)))
        if args.plot:
            plot_learning(runs, args.plot)
        return
    if args.learn_timesteps is None:
        args.learn_timesteps = ZOO[args.env]["timesteps"]
    th.set_num_threads(args.threads)
    # The untimed warm-up ends before the first auxiliary phase, on purpose
    warnings.filterwarnings("ignore", message=r"learn\(total_timesteps=")
    command = "python benchmarks/recurrent.py " + " ".join(
        f"--{name.replace('_', '-')} {value if not isinstance(value, list) else ' '.join(map(str, value))}"
        for name, value in vars(args).items()
        if value is not None and name not in ("out", "plot") and (args.learn or name != "learn_timesteps")
    )
    ppg_settings = dict(
        n_policy_iters=args.n_policy_iters, aux_batch_rollouts=args.aux_batch_rollouts, aux_start_states=args.aux_start_states
    )
    if args.learn:
        # Seed by seed, the algorithms in turns; each finished run is printed and saved at once (a run takes minutes)
        runs = []
        for seed in args.learn:
            for algorithm in args.algorithms:
                runs.append(learning_run(algorithm, seed, args.learn_timesteps, args.env, **ppg_settings))
                print(json.dumps({key: value for key, value in runs[-1].items() if key != "curve"}), flush=True)
                if args.out:
                    with open(args.out, "w") as file:
                        json.dump({"command": command, "cpu": cpu_name(), "runs": runs}, file, indent=1)
        print(learning_report(runs, command, th.get_num_threads()))
        if args.plot:
            plot_learning(runs, args.plot)
        return
    results = []
    for _ in range(args.rounds):
        for algorithm in args.algorithms:
            result = timed_run(algorithm, args.seed, args.timesteps, args.warmup, args.env, **ppg_settings)
            print(f"{algorithm}: {result['steps_per_second']:,.0f} env steps/s", flush=True)
            results.append(result)
    print(report(results, command))
    if args.out:
        with open(args.out, "w") as file:
            json.dump({"command": command, "cpu": cpu_name(), "runs": results}, file, indent=1)


if __name__ == "__main__":
    main()
