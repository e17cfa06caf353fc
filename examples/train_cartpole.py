"""Train PPG on CartPole-v1, evaluate it, save it and load it back (the SB3 workflow, unchanged)."""

import argparse

from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy

from sb3_ppg import PPG
from sb3_ppg.cli.threads import choose_torch_threads

parser = argparse.ArgumentParser()
parser.add_argument("--timesteps", type=int, default=100_000)
parser.add_argument("--output", default="ppg_cartpole")
args = parser.parse_args()
# torch's threads: this process's share of the idle CPUs (OMP_NUM_THREADS, where set, wins)
choose_torch_threads()

env = make_vec_env("CartPole-v1", n_envs=8, seed=0)
model = PPG("MlpPolicy", env, n_steps=32, batch_size=64, n_epochs=4, gamma=0.98, gae_lambda=0.8, ent_coef=0.0,
            n_policy_iters=8, n_aux_epochs=4, aux_batch_rollouts=8, seed=0, verbose=1)  # fmt: skip
model.learn(total_timesteps=args.timesteps, progress_bar=True)
model.save(args.output)

model = PPG.load(args.output)
mean_reward, std_reward = evaluate_policy(model, make_vec_env("CartPole-v1", n_envs=1, seed=1), n_eval_episodes=10)
print(f"mean evaluation return: {mean_reward:.1f} +- {std_reward:.1f}")
