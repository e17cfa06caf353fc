"""
Train PPG on CartPole-v1 with SB3's callbacks: evaluation on a separate env, early stop at a reward threshold, and
PPG's checkpoints (from which an interrupted run resumes exactly, see docs/checkpoints.md).

    python examples/cartpole_callbacks.py
"""

import argparse

from stable_baselines3.common.callbacks import EvalCallback, StopTrainingOnRewardThreshold
from stable_baselines3.common.env_util import make_vec_env

from sb3_ppg import PPG, PPGCheckpointCallback
from sb3_ppg.cli.threads import choose_torch_threads

parser = argparse.ArgumentParser()
parser.add_argument("--timesteps", type=int, default=200_000)
parser.add_argument("--eval-freq", type=int, default=2_000, help="env steps between evaluations")
parser.add_argument("--checkpoint-freq", type=int, default=10_000, help="env steps between checkpoints")
parser.add_argument("--reward-threshold", type=float, default=475.0)
parser.add_argument("--output", default="ppg_cartpole_callbacks", help="folder for the best model and the checkpoints")
args = parser.parse_args()
# torch's threads: this process's share of the idle CPUs (OMP_NUM_THREADS, where set, wins)
choose_torch_threads()

n_envs = 8
env = make_vec_env("CartPole-v1", n_envs=n_envs, seed=0)
eval_env = make_vec_env("CartPole-v1", n_envs=1, seed=1)
model = PPG("MlpPolicy", env, n_steps=32, batch_size=256, n_epochs=10, gamma=0.98, gae_lambda=0.8, ent_coef=0.0,
            max_grad_norm=0.5, n_policy_iters=8, aux_batch_rollouts=8, seed=0, verbose=0)  # fmt: skip

# Callback frequencies count calls to env.step(), i.e. n_envs env steps each
stop = StopTrainingOnRewardThreshold(reward_threshold=args.reward_threshold, verbose=1)
evaluation = EvalCallback(eval_env, callback_on_new_best=stop, eval_freq=max(args.eval_freq // n_envs, 1),
                          n_eval_episodes=10, best_model_save_path=args.output, verbose=1)  # fmt: skip
# PPGCheckpointCallback is SB3's CheckpointCallback plus the auxiliary buffer, the RNGs and the envs' state;
# keep_last=2 deletes the older checkpoints once a new one is complete
checkpoints = PPGCheckpointCallback(
    save_freq=max(args.checkpoint_freq // n_envs, 1), save_path=f"{args.output}/checkpoints", keep_last=2
)
model.learn(total_timesteps=args.timesteps, callback=[evaluation, checkpoints])

print(f"stopped after {model.num_timesteps} steps; best mean evaluation return: {evaluation.best_mean_reward:.1f}")
# An interrupted run would continue with: PPG.load_checkpoint(f"{args.output}/checkpoints", env=env)
