"""
Train PPG on a Procgen game with the paper's network and wrappers, on 200 training levels, and measure how it
generalizes: evaluation on unseen levels during training (EvalCallback), then on the training levels and on unseen
levels at the end. The defaults are CleanRL's setting (``--preset cleanrl``: easy mode, 64 envs, 25M steps, a GPU job);
``--preset paper`` is the paper's (hard mode, reward normalization with gamma 0.99, separate networks, ...).

    python examples/train_procgen.py --game starpilot
"""

import argparse

from stable_baselines3.common.callbacks import EvalCallback
from stable_baselines3.common.evaluation import evaluate_policy

from sb3_ppg import PPG, make_procgen_env
from sb3_ppg.cli.threads import choose_torch_threads
from sb3_ppg.procgen import get_procgen_preset, save_reward_statistics

parser = argparse.ArgumentParser()
parser.add_argument("--game", default="starpilot")
parser.add_argument("--preset", default="cleanrl", choices=["cleanrl", "paper"])
parser.add_argument("--timesteps", type=int, default=25_000_000)
parser.add_argument("--n-envs", type=int, default=64)
parser.add_argument("--n-steps", type=int, default=256)
parser.add_argument("--n-policy-iters", type=int, default=32)
parser.add_argument("--eval-episodes", type=int, default=16)
parser.add_argument("--eval-envs", type=int, default=8)
parser.add_argument("--device", default="auto")
args = parser.parse_args()
# torch's threads: this process's share of the idle CPUs (OMP_NUM_THREADS, where set, wins)
choose_torch_threads()

# Training levels 0..199; num_levels=0 means the full level distribution: levels the agent has (almost surely) not seen
# (the preset sets the mode and the reward normalization; the arguments given here override it)
env = make_procgen_env(args.game, n_envs=args.n_envs, preset=args.preset, num_levels=200, start_level=0, seed=0)
unseen_env = make_procgen_env(args.game, n_envs=args.eval_envs, preset=args.preset, num_levels=0, seed=1, training=False)
ppg_kwargs = get_procgen_preset(args.preset).ppg_kwargs(args.n_envs)  # the preset's PPG arguments for this many envs
ppg_kwargs.update(n_steps=args.n_steps, n_policy_iters=args.n_policy_iters)
model = PPG("ProcgenCnn", env, device=args.device, verbose=1, **ppg_kwargs)
# Procgen policies are evaluated with sampled actions (deterministic=False), as in the paper
eval_callback = EvalCallback(
    unseen_env, eval_freq=max(100_000 // args.n_envs, 1), n_eval_episodes=args.eval_episodes, deterministic=False
)
model.learn(total_timesteps=args.timesteps, callback=eval_callback, progress_bar=True)
model.save(f"ppg_{args.game}")
save_reward_statistics(env, f"ppg_{args.game}_reward_statistics.npz")  # to continue training later

# The generalization gap: training levels vs unseen levels (raw rewards: evaluation envs do not normalize them)
train_levels_env = make_procgen_env(
    args.game, n_envs=args.eval_envs, preset=args.preset, num_levels=200, start_level=0, seed=2, training=False
)
for name, eval_env in (("training levels", train_levels_env), ("unseen levels", unseen_env)):
    mean_reward, std_reward = evaluate_policy(model, eval_env, n_eval_episodes=args.eval_episodes, deterministic=False)
    print(f"{name}: mean return {mean_reward:.2f} +- {std_reward:.2f}")
