"""
Train PPG on CartPole-v1 data-parallel over several processes:

    torchrun --nproc_per_node=2 examples/torchrun_cartpole.py --timesteps 100000

(``python examples/torchrun_cartpole.py`` runs the same training in one process). Every rank runs its share of the
``--n-envs`` envs and a copy of the model; gradients are averaged over the ranks, so the run optimizes the same global
batch whatever the number of processes. Rank 0 logs, saves and evaluates. See docs/scaling_out.md.
"""

import argparse
import time

from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.vec_env import VecNormalize

from sb3_ppg import PPG
from sb3_ppg.cli.threads import choose_torch_threads
from sb3_ppg.common import distributed

parser = argparse.ArgumentParser()
parser.add_argument("--timesteps", type=int, default=100_000, help="env steps of all ranks together")
parser.add_argument("--n-envs", type=int, default=8, help="envs of all ranks together")
parser.add_argument("--aux-batch-rollouts", type=int, default=8, help="rollouts per aux minibatch, all ranks together")
parser.add_argument("--output", default="ppg_cartpole_torchrun")
args = parser.parse_args()
# torch's threads: this process's share of the idle CPUs (OMP_NUM_THREADS, where set, wins)
choose_torch_threads()

# PPG joins torchrun's process group by itself; initializing it first tells us the world size before building the envs
if distributed.launched_by_torchrun():
    distributed.init_from_torchrun()
rank, world_size = distributed.get_rank(), distributed.get_world_size()

# Per-rank sizes: the envs and the aux minibatch are split over the ranks (a clear error if they do not divide);
# batch_size=None gives 8 policy minibatches per epoch on every rank, so the global minibatch is 1/8 of the global batch
env = VecNormalize(make_vec_env("CartPole-v1", n_envs=distributed.local_n_envs(args.n_envs)), norm_obs=False, gamma=0.98)
if args.aux_batch_rollouts % world_size != 0:
    raise ValueError(f"--aux-batch-rollouts {args.aux_batch_rollouts} is not a multiple of the world size {world_size}")
model = PPG("MlpPolicy", env, n_steps=32, n_epochs=4, gamma=0.98, gae_lambda=0.8, ent_coef=0.0, n_policy_iters=8,
            n_aux_epochs=4, aux_batch_rollouts=args.aux_batch_rollouts // world_size, seed=0, verbose=1)  # fmt: skip
start = time.perf_counter()
model.learn(total_timesteps=args.timesteps)  # every rank must call learn() with the same arguments
elapsed = time.perf_counter() - start
model.save(args.output)  # rank 0 writes, the other ranks do nothing

if rank == 0:
    steps = model.num_timesteps
    print(f"world size {world_size}: {steps} env steps in {elapsed:.1f} s = {steps / elapsed:.0f} steps/s")
    # The saved model is an ordinary PPG model: it loads in one process
    model = PPG.load(args.output)
    mean_reward, std_reward = evaluate_policy(model, make_vec_env("CartPole-v1", n_envs=1, seed=1), n_eval_episodes=10)
    print(f"mean evaluation return: {mean_reward:.1f} +- {std_reward:.1f}")
