"""Stop a run in the middle of a phase and resume it exactly where it was, auxiliary buffer included."""

import argparse

from stable_baselines3.common.env_util import make_vec_env

from sb3_ppg import PPG
from sb3_ppg.cli.threads import choose_torch_threads

parser = argparse.ArgumentParser()
parser.add_argument("--timesteps", type=int, default=20_000)
parser.add_argument("--output", default="ppg_resume")
args = parser.parse_args()
# torch's threads: this process's share of the idle CPUs (OMP_NUM_THREADS, where set, wins)
choose_torch_threads()

env = make_vec_env("CartPole-v1", n_envs=4, seed=0)
# 6 rollouts of 4 x 64 steps per phase: the first half (a multiple of 4 rollouts) stops in the middle of a phase
model = PPG("MlpPolicy", env, n_steps=64, n_policy_iters=6, seed=0)
model.learn(total_timesteps=args.timesteps // 2)
print(f"stopping with {model.aux_buffer.n_iterations} of {model.n_policy_iters} iterations in the aux buffer")
model.save(args.output)
model.save_aux_buffer(f"{args.output}_aux_buffer.npz")  # not part of the zip: it can be many GB

model = PPG.load(args.output, env=env)
model.load_aux_buffer(f"{args.output}_aux_buffer.npz")
print(f"resuming with {model.aux_buffer.n_iterations} iterations in the aux buffer")
model.learn(total_timesteps=args.timesteps // 2, reset_num_timesteps=False)
print(f"done: {model.num_timesteps} steps, {model.n_aux_phases} auxiliary phases")
