"""
PPG with Dict observations ("MultiInputPolicy"): each key gets its own features extractor (a CNN for image keys, a
flatten for the others), concatenated before the policy and value networks. Here CartPole's state is split into
{"cart": [position, velocity], "pole": [angle, angular velocity]}.

    python examples/dict_observations.py
"""

import argparse

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy

from sb3_ppg import PPG
from sb3_ppg.cli.threads import choose_torch_threads


class DictCartPole(gym.ObservationWrapper):
    """CartPole with a Dict observation space."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        low, high = env.observation_space.low, env.observation_space.high
        self.observation_space = spaces.Dict(
            {"cart": spaces.Box(low[:2], high[:2], dtype=np.float32), "pole": spaces.Box(low[2:], high[2:], dtype=np.float32)}
        )

    def observation(self, observation):
        return {"cart": observation[:2], "pole": observation[2:]}


parser = argparse.ArgumentParser()
parser.add_argument("--timesteps", type=int, default=100_000)
parser.add_argument("--output", default="ppg_dict_cartpole")
args = parser.parse_args()
# torch's threads: this process's share of the idle CPUs (OMP_NUM_THREADS, where set, wins)
choose_torch_threads()

env = make_vec_env("CartPole-v1", n_envs=8, seed=0, wrapper_class=DictCartPole)
model = PPG("MultiInputPolicy", env, n_steps=32, batch_size=256, n_epochs=10, gamma=0.98, gae_lambda=0.8,
            ent_coef=0.0, max_grad_norm=0.5, n_policy_iters=8, aux_batch_rollouts=8, seed=0, verbose=1)  # fmt: skip
model.learn(total_timesteps=args.timesteps)
model.save(args.output)

model = PPG.load(args.output)
eval_env = make_vec_env("CartPole-v1", n_envs=1, seed=1, wrapper_class=DictCartPole)
mean_reward, std_reward = evaluate_policy(model, eval_env, n_eval_episodes=10)
print(f"mean evaluation return: {mean_reward:.1f} +- {std_reward:.1f}")
