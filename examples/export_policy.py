"""
Export a trained PPG policy for inference without SB3 (nor sb3_ppg): the policy network's deterministic action as a
``torch.export`` program (a ``.pt2`` file that plain PyTorch loads and runs, and that ``torch.onnx`` or AOTInductor
can convert further). TorchScript (``torch.jit.trace``) would work too, but PyTorch deprecates it. The program
holds the network only: an env trained under ``VecNormalize(norm_obs=True)`` needs its observations normalized the
same way (``vec_normalize.normalize_obs(obs)``) before they go in.

    python examples/export_policy.py
    # elsewhere, with only torch installed:
    #   actor = torch.export.load("ppg_cartpole_actor.pt2").module()
    #   action = actor(torch.as_tensor(obs, dtype=torch.float32)[None])
"""

import argparse

import numpy as np
import torch as th
from stable_baselines3.common.env_util import make_vec_env

from sb3_ppg import PPG
from sb3_ppg.cli.threads import choose_torch_threads


class DeterministicActor(th.nn.Module):
    """What ``model.predict(obs, deterministic=True)`` computes, as a plain module: policy network -> action."""

    def __init__(self, model: PPG):
        super().__init__()
        policy = model.policy
        self.features_extractor = policy.pi_features_extractor  # the policy network's own (arch "dual")
        self.policy_net = policy.mlp_extractor.policy_net
        self.action_net = policy.action_net
        self.normalize_images = policy.normalize_images and len(model.observation_space.shape) == 3

    def forward(self, obs: th.Tensor) -> th.Tensor:
        obs = obs.float() / 255.0 if self.normalize_images else obs.float()  # SB3's preprocess_obs for Box
        logits = self.action_net(self.policy_net(self.features_extractor(obs)))
        return logits.argmax(dim=1)  # Discrete actions; for Box: the mean, clipped to the action bounds


parser = argparse.ArgumentParser()
parser.add_argument("--timesteps", type=int, default=50_000)
parser.add_argument("--output", default="ppg_cartpole_actor.pt2")
args = parser.parse_args()
# torch's threads: this process's share of the idle CPUs (OMP_NUM_THREADS, where set, wins)
choose_torch_threads()

env = make_vec_env("CartPole-v1", n_envs=8, seed=0)
model = PPG("MlpPolicy", env, n_steps=32, n_epochs=4, gamma=0.98, gae_lambda=0.8, ent_coef=0.0, n_policy_iters=8,
            aux_batch_rollouts=8, seed=0)  # fmt: skip
model.learn(total_timesteps=args.timesteps)

# Export with a variable batch size, on the CPU
actor = DeterministicActor(model).to("cpu").eval()
example = th.zeros((2, *model.observation_space.shape), dtype=th.float32)
program = th.export.export(actor, (example,), dynamic_shapes=({0: th.export.Dim("batch")},))
th.export.save(program, args.output)

# Check: the exported program, loaded back, gives model.predict's deterministic actions on states the policy visits
exported = th.export.load(args.output).module()
obs, n_checked = env.reset(), 0
for _ in range(100):
    expected, _ = model.predict(obs, deterministic=True)
    with th.no_grad():
        actions = exported(th.as_tensor(obs)).numpy()
    assert np.array_equal(actions, expected), (actions, expected)
    n_checked += len(obs)
    obs, _, _, _ = env.step(actions)
print(f"exported to {args.output}: same actions as model.predict(deterministic=True) on {n_checked} observations")
