"""
RecurrentPPG (IMPALA CNN + LSTM) and PPG (the same IMPALA CNN without the LSTM) on a Procgen game in
``distribution_mode="memory"``, at the packaged Procgen settings (``procgen/<game>-v0`` in
sb3_ppg/cli/hyperparams/recurrent_ppg.yml: the PPG paper's, with an LSTM of 256 units in each network) and the same
seed, so that the two runs' returns show whether the LSTM helps at the budget run.

CPU-sized (a shared 2-core CPU: 13 to 20 minutes for the two runs side by side, one process each, more under heavy
load; 35 rollouts of 2 envs x 256 steps, an auxiliary phase after the 32nd; results in docs/recurrent.md):

    nice -n 10 python benchmarks/recurrent_procgen.py --algorithms RecurrentPPG --n-envs 2 --timesteps 17920 --out rppg.json &
    nice -n 10 python benchmarks/recurrent_procgen.py --algorithms PPG --n-envs 2 --timesteps 17920 --out ppg.json &
    python benchmarks/recurrent_procgen.py --report rppg.json ppg.json

GPU-sized (the packaged settings: 64 envs, the PPG paper's 100M env steps, each algorithm in a process of its own;
``--device`` is SB3's ``"auto"`` by default, the GPU where there is one):

    python benchmarks/recurrent_procgen.py --algorithms RecurrentPPG --n-envs 64 --timesteps 100000000 --out rppg.json
    python benchmarks/recurrent_procgen.py --algorithms PPG --n-envs 64 --timesteps 100000000 --out ppg.json

``--n-envs`` scales the packaged 64 envs: ``batch_size`` stays 8 policy minibatches per rollout (``n_envs / 8`` whole
env rollouts each, at least one), ``aux_batch_rollouts`` 4 per 64 envs (at least one). Each run writes its JSON after
every rollout (episodes so far, env steps/s): a run stopped early still reports. The report gives the mean return of
the first and the last 100 training episodes (raw rewards; the two halves of a run of fewer than 200 episodes) and env
steps/s (env steps / wall time of ``learn``).
"""

import argparse
import json
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch as th
import yaml
from stable_baselines3.common.callbacks import BaseCallback
from torch import nn

from sb3_ppg import PPG, RecurrentPPG
from sb3_ppg.procgen import make_procgen_env

HYPERPARAMS = Path(__file__).resolve().parents[1] / "sb3_ppg" / "cli" / "hyperparams" / "recurrent_ppg.yml"
ALGORITHMS = ("RecurrentPPG", "PPG")
#: Keys of the packaged entry that are not the algorithm's keyword arguments
ENV_KEYS = ("env_kwargs", "n_envs", "n_timesteps", "policy", "policy_kwargs")
#: The packaged number of envs, which batch_size and aux_batch_rollouts are given for
PACKAGED_N_ENVS = 64


def packaged_settings(game: str, n_envs: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """
    The packaged entry of ``procgen/<game>-v0`` for RecurrentPPG, scaled to ``n_envs``.

    :param game: Procgen game
    :param n_envs: Number of envs
    :return: (the algorithms' shared keyword arguments, RecurrentPPG's policy keyword arguments)
    """
    with open(HYPERPARAMS) as file:
        entry = yaml.safe_load(file)[f"procgen/{game}-v0"]
    kwargs = {key: value for key, value in entry.items() if key not in ENV_KEYS}
    n_steps = kwargs["n_steps"]
    rollouts_per_minibatch = kwargs["batch_size"] // n_steps * n_envs // PACKAGED_N_ENVS
    kwargs["batch_size"] = n_steps * max(1, rollouts_per_minibatch)
    kwargs["aux_batch_rollouts"] = max(1, kwargs["aux_batch_rollouts"] * n_envs // PACKAGED_N_ENVS)
    # The zoo evaluates the entry's policy_kwargs string with torch.nn in scope; this one holds literals only
    policy_kwargs = eval(entry["policy_kwargs"], {"dict": dict, "nn": nn})
    return kwargs, policy_kwargs


class EpisodeLog(BaseCallback):
    """Keep every training episode's raw return and length, and write the run's JSON after each rollout."""

    def __init__(self, record: dict[str, Any], path: str | None):
        super().__init__()
        self.record = record
        self.path = path
        self.start = time.perf_counter()

    def _on_step(self) -> bool:
        for info in self.locals["infos"]:
            if "episode" in info:
                self.record["returns"].append(float(info["episode"]["r"]))
                self.record["lengths"].append(int(info["episode"]["l"]))
        return True

    def _on_rollout_end(self) -> None:
        elapsed = time.perf_counter() - self.start
        self.record["curve"].append([self.num_timesteps, round(elapsed, 1), len(self.record["returns"])])
        self.record["timesteps"] = self.num_timesteps
        self.record["seconds"] = elapsed
        write(self.record, self.path)


def write(record: dict[str, Any], path: str | None) -> None:
    """Write a run's record to ``path`` (nothing for None)."""
    if path is not None:
        Path(path).write_text(json.dumps(record))


def train(args: argparse.Namespace, algorithm: str) -> dict[str, Any]:
    """Train one algorithm from a fresh model; return its record."""
    kwargs, policy_kwargs = packaged_settings(args.game, args.n_envs)
    env = make_procgen_env(
        args.game, n_envs=args.n_envs, distribution_mode=args.distribution_mode, seed=args.seed, preset="paper"
    )
    if algorithm == "RecurrentPPG":
        model = RecurrentPPG("ProcgenCnnLstm", env, policy_kwargs=policy_kwargs, seed=args.seed, device=args.device, **kwargs)
    else:
        ppg_policy_kwargs = {key: value for key, value in policy_kwargs.items() if "lstm" not in key}
        model = PPG("ProcgenCnn", env, policy_kwargs=ppg_policy_kwargs, seed=args.seed, device=args.device, **kwargs)
    record: dict[str, Any] = dict(
        algorithm=algorithm,
        game=args.game,
        distribution_mode=args.distribution_mode,
        seed=args.seed,
        n_envs=args.n_envs,
        settings={key: value for key, value in kwargs.items()},
        policy_kwargs={key: repr(value) for key, value in model.policy_kwargs.items()},
        precision=model.precision,
        cpu=cpu_name(),
        torch_threads=th.get_num_threads(),
        date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        returns=[],
        lengths=[],
        curve=[],
        timesteps=0,
        seconds=0.0,
    )
    callback = EpisodeLog(record, args.out)
    model.learn(args.timesteps, callback=callback)
    record["seconds"] = time.perf_counter() - callback.start
    record["timesteps"] = model.num_timesteps
    record["complete"] = True
    write(record, args.out)
    env.close()
    return record


def cpu_name() -> str:
    """``lscpu``'s model name (the platform's processor where lscpu is missing)."""
    try:
        output = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor()
    for line in output.splitlines():
        if line.startswith("Model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def summary(record: dict[str, Any]) -> dict[str, Any]:
    """First and last 100 episodes' mean return, episodes, env steps/s of one run."""
    returns = record["returns"]
    n_episodes = max(1, min(100, len(returns) // 2))  # halves of a run of fewer than 200 episodes
    return dict(
        algorithm=record["algorithm"],
        seed=record.get("seed"),
        timesteps=record["timesteps"],
        episodes=len(returns),
        compared=n_episodes,
        first=float(np.mean(returns[:n_episodes])) if returns else float("nan"),
        last=float(np.mean(returns[-n_episodes:])) if returns else float("nan"),
        steps_per_second=record["timesteps"] / record["seconds"] if record["seconds"] else float("nan"),
        complete=record.get("complete", False),
    )


def report(paths: list[str]) -> str:
    """A Markdown table of the saved runs."""
    lines = [
        "| algorithm | seed | env steps | episodes | episodes compared | first episodes: mean return | last episodes |"
        " env steps/s | complete |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for path in paths:
        row = summary(json.loads(Path(path).read_text()))
        lines.append(
            f"| {row['algorithm']} | {row['seed']} | {row['timesteps']:,} | {row['episodes']} | {row['compared']} | "
            f"{row['first']:.2f} | {row['last']:.2f} | {row['steps_per_second']:.1f} | {'yes' if row['complete'] else 'no'} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """
    :param argv: Command-line arguments (``None``: ``sys.argv[1:]``)
    :return: The parsed arguments
    """
    parser = argparse.ArgumentParser(description="RecurrentPPG and PPG on Procgen in distribution_mode='memory'")
    parser.add_argument("--game", default="miner")
    parser.add_argument("--distribution-mode", default="memory")
    parser.add_argument("--algorithms", nargs="+", choices=ALGORITHMS, default=list(ALGORITHMS))
    parser.add_argument("--n-envs", type=int, default=2)
    parser.add_argument("--timesteps", type=int, default=17_920)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--out", default=None, help="JSON of the run (one algorithm)")
    parser.add_argument("--report", nargs="+", default=None, help="Print the table of saved runs instead of training")
    args = parser.parse_args(argv)
    if args.out is not None and len(args.algorithms) > 1:
        parser.error("--out holds one run: pass one algorithm with --algorithms")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.report is not None:
        print(report(args.report))
        return
    th.set_num_threads(args.threads)
    for algorithm in args.algorithms:
        row = summary(train(args, algorithm))
        print(
            f"{algorithm}: {row['timesteps']:,} env steps, {row['episodes']} episodes, mean return of the first "
            f"{row['compared']} {row['first']:.2f}, of the last {row['compared']} {row['last']:.2f}, "
            f"{row['steps_per_second']:.1f} env steps/s"
        )


if __name__ == "__main__":
    main()
