"""
PPG with a continuous (Box) action space: Pendulum-v1, with generalized State-Dependent Exploration (gSDE).
The settings are the packaged zoo entry (sb3_ppg/cli/hyperparams/ppg.yml): about -160 after 100k steps.

    python examples/continuous_control.py
"""

import argparse

from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.utils import LinearSchedule

from sb3_ppg import PPG
from sb3_ppg.cli.threads import choose_torch_threads

parser = argparse.ArgumentParser()
parser.add_argument("--timesteps", type=int, default=100_000)
parser.add_argument("--n-steps", type=int, default=1024)
parser.add_argument("--output", default="ppg_pendulum")
args = parser.parse_args()
# torch's threads: this process's share of the idle CPUs (OMP_NUM_THREADS, where set, wins)
choose_torch_threads()

env = make_vec_env("Pendulum-v1", n_envs=4, seed=0)
model = PPG(
    "MlpPolicy",
    env,
    learning_rate=LinearSchedule(1e-3, 0.0, 1.0),  # decays linearly to 0 over the run
    n_steps=args.n_steps,
    batch_size=64,
    n_epochs=10,
    gamma=0.9,
    ent_coef=0.0,
    max_grad_norm=0.5,
    use_sde=True,  # gSDE: the auxiliary phase's KL uses the state-dependent Gaussian's mean and std
    sde_sample_freq=4,
    n_policy_iters=4,
    aux_batch_rollouts=2,
    seed=0,
    verbose=1,
)
model.learn(total_timesteps=args.timesteps)
model.save(args.output)

mean_reward, std_reward = evaluate_policy(model, make_vec_env("Pendulum-v1", n_envs=1, seed=1), n_eval_episodes=10)
print(f"mean evaluation return: {mean_reward:.1f} +- {std_reward:.1f}")
