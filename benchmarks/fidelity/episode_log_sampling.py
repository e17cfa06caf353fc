"""
Does CleanRL's episode log bias the mean return or length? Its ``ppg_procgen.py`` logs only the first episode that
ends at each step (``for item in info: ... break``); ``VecMonitor`` logs all of them.

Usage: ``python benchmarks/fidelity/episode_log_sampling.py --game starpilot --steps 250000``

Uniform random actions on ``envs`` procgen games (easy mode, CleanRL's) for ``steps`` env steps; prints the count, mean
return and mean length of all finished episodes and of the ones CleanRL's rule would log.
"""

import argparse

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--game", default="starpilot")
    parser.add_argument("--envs", type=int, default=64)
    parser.add_argument("--steps", type=int, default=250_000, help="env steps, all envs together")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    from procgen import ProcgenGym3Env

    env = ProcgenGym3Env(num=args.envs, env_name=args.game, distribution_mode="easy", rand_seed=args.seed)
    rng = np.random.default_rng(args.seed)
    returns, lengths = np.zeros(args.envs), np.zeros(args.envs, dtype=np.int64)
    every, logged = [], []
    for _ in range(args.steps // args.envs):
        env.act(rng.integers(0, 15, size=args.envs))
        reward, _, done = env.observe()
        returns += reward
        lengths += 1
        ended = np.flatnonzero(done)
        every += [(returns[index], lengths[index]) for index in ended]
        logged += [(returns[index], lengths[index]) for index in ended[:1]]
        returns[ended], lengths[ended] = 0.0, 0
    for name, episodes in (("all episodes (VecMonitor)", every), ("first per step (CleanRL's log)", logged)):
        array = np.array(episodes).reshape(-1, 2)
        print(f"{name}: {len(array)}, mean return {array[:, 0].mean():.3f}, mean length {array[:, 1].mean():.1f}")


if __name__ == "__main__":
    main()
