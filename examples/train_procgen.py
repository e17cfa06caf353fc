"""Train PPG on a Procgen game with the paper's network and wrappers, evaluating on unseen levels as it goes."""

import argparse

from stable_baselines3.common.callbacks import EvalCallback

from sb3_ppg import PPG, make_procgen_env

parser = argparse.ArgumentParser()
parser.add_argument("--game", default="starpilot")
parser.add_argument("--timesteps", type=int, default=25_000_000)
parser.add_argument("--n-envs", type=int, default=64)
parser.add_argument("--n-steps", type=int, default=256)
parser.add_argument("--n-policy-iters", type=int, default=32)
parser.add_argument("--device", default="auto")
args = parser.parse_args()

# 200 training levels, evaluation on the full level distribution (generalization), easy mode
env = make_procgen_env(args.game, n_envs=args.n_envs, num_levels=200, seed=0)
eval_env = make_procgen_env(args.game, n_envs=8, num_levels=0, seed=1, training=False)
model = PPG(
    "ProcgenCnn",
    env,
    n_steps=args.n_steps,
    n_policy_iters=args.n_policy_iters,
    aux_batch_rollouts=min(4, args.n_envs * args.n_policy_iters),
    device=args.device,
    verbose=1,
)
eval_callback = EvalCallback(eval_env, eval_freq=max(100_000 // args.n_envs, 1), n_eval_episodes=16, deterministic=False)
model.learn(total_timesteps=args.timesteps, callback=eval_callback, progress_bar=True)
model.save(f"ppg_{args.game}")
env.save(f"ppg_{args.game}_vecnormalize.pkl")
