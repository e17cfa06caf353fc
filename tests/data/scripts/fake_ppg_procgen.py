"""
A stand-in for CleanRL's ``ppg_procgen.py`` in the tests of ``benchmarks/procgen_vs_cleanrl.py``: the same command line
arguments (the ones the benchmark passes) and the same env (``procgen.ProcgenEnv``, easy, all levels), random actions
instead of training. ``benchmarks/cleanrl_episodes.py`` logs its episodes as it logs CleanRL's.
"""

import argparse

import numpy as np
from procgen import ProcgenEnv

parser = argparse.ArgumentParser()
parser.add_argument("--env-id", default="starpilot")
parser.add_argument("--seed", type=int, default=1)
parser.add_argument("--total-timesteps", type=int, default=1000)
parser.add_argument("--num-envs", type=int, default=2)
parser.add_argument("--num-steps", type=int, default=16)
args = parser.parse_args()

envs = ProcgenEnv(num_envs=args.num_envs, env_name=args.env_id, num_levels=0, start_level=0, distribution_mode="easy")
rng = np.random.default_rng(args.seed)
envs.reset()
for _ in range(args.total_timesteps // args.num_envs):
    envs.step(rng.integers(0, 15, size=args.num_envs))
envs.close()
