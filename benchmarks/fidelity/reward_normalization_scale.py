"""
How far the original code's per-rollout reward normalization is from ``VecNormalize``'s per-step rule on a real game.

Usage: ``python benchmarks/fidelity/reward_normalization_scale.py --game starpilot --mode hard --rollouts 40``

Uniform random actions on ``envs x steps`` procgen games; both rules see the same rewards (discount ``gamma``, the
running return reset where an episode starts): the per-step rule (SB3's ``VecNormalize``, gym's
``NormalizeReward``) updates the return statistics at every step and scales each reward by the std after that update;
the per-rollout rule (the original ``RewardNormalizer``) updates them once per rollout with all its returns and
scales every reward of the rollout by the std after that update. Printed per rollout: over the rewarded steps, the
mean and the largest ``|per-step scale / per-rollout scale - 1|`` (before the clip at 10).
"""

import argparse

import numpy as np


class RunningMeanStd:
    """Mean, variance and count of a stream, updated with batches (count starts at 1e-4, variance at 1)."""

    def __init__(self) -> None:
        self.mean, self.var, self.count = 0.0, 1.0, 1e-4

    def update(self, values: np.ndarray) -> None:
        batch_mean, batch_var, batch_count = values.mean(), values.var(), values.size
        delta, total = batch_mean - self.mean, self.count + batch_count
        self.mean += delta * batch_count / total
        self.var = (self.var * self.count + batch_var * batch_count + delta**2 * self.count * batch_count / total) / total
        self.count = total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--game", default="starpilot")
    parser.add_argument("--mode", default="hard")
    parser.add_argument("--envs", type=int, default=64)
    parser.add_argument("--steps", type=int, default=256)
    parser.add_argument("--rollouts", type=int, default=40)
    parser.add_argument("--gamma", type=float, default=0.99)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    from procgen import ProcgenGym3Env

    env = ProcgenGym3Env(num=args.envs, env_name=args.game, distribution_mode=args.mode, rand_seed=args.seed)
    rng = np.random.default_rng(args.seed)
    per_step, per_rollout = RunningMeanStd(), RunningMeanStd()
    step_return, rollout_return = np.zeros(args.envs), np.zeros(args.envs)
    first = np.ones(args.envs, dtype=bool)
    for rollout in range(1, args.rollouts + 1):
        rewards = np.zeros((args.steps, args.envs))
        firsts = np.zeros((args.steps, args.envs), dtype=bool)
        step_scale = np.zeros((args.steps, args.envs))
        for step in range(args.steps):
            env.act(rng.integers(0, 15, size=args.envs))
            reward, _, done = env.observe()
            step_return = step_return * args.gamma + reward
            per_step.update(step_return)
            step_scale[step] = 1.0 / np.sqrt(per_step.var + 1e-8)
            step_return[done] = 0.0
            rewards[step], firsts[step], first = reward, first, done
        returns = np.zeros_like(rewards)
        for step in range(args.steps):
            rollout_return = rewards[step] + (1.0 - firsts[step]) * args.gamma * rollout_return
            returns[step] = rollout_return
        per_rollout.update(returns)
        rewarded = rewards != 0
        ratio = np.abs(step_scale[rewarded] * np.sqrt(per_rollout.var + 1e-8) - 1.0)
        steps = rollout * args.envs * args.steps
        mean, largest = (ratio.mean(), ratio.max()) if ratio.size else (float("nan"), float("nan"))
        print(
            f"rollout {rollout:3d} ({steps:>10,} env steps): {rewarded.sum():5d} rewarded steps, "
            f"mean {mean:.4f}, max {largest:.4f}"
        )


if __name__ == "__main__":
    main()
