"""Child process of test_checkpoints.py's SIGKILL test: train with a checkpoint every iteration, resuming if it can."""

import os
import pathlib
import signal
import sys

import numpy as np
from helpers import small_ppg  # tests/: this script's folder
from stable_baselines3.common.env_util import make_vec_env

import sb3_ppg.common.array_files
import sb3_ppg.common.checkpoints.manifest
import sb3_ppg.common.checkpoints.run_state
from sb3_ppg import PPG, PPGCheckpointCallback

folder, total = pathlib.Path(sys.argv[1]), int(sys.argv[2])
kill_at = os.environ.get("KILL_AT", "")  # "write:N" (inside the N-th file write) or "aux:N" (N-th aux minibatch)


def kill_on(count: int):
    calls = [0]

    def should_kill() -> bool:
        calls[0] += 1
        return calls[0] == count

    return should_kill


if kill_at.startswith("write:"):
    should_kill = kill_on(int(kill_at.split(":")[1]))
    original_atomic_write = sb3_ppg.common.array_files.atomic_write

    def atomic_write(path, write):
        if should_kill():
            # Half-way: the temporary file is written, not yet renamed into place
            with open(path.with_name(f".{path.name}.tmp-{os.getpid()}"), "wb") as file:
                write(file)
            os.kill(os.getpid(), signal.SIGKILL)
        original_atomic_write(path, write)

    sb3_ppg.common.array_files.atomic_write = atomic_write
    sb3_ppg.common.checkpoints.manifest.atomic_write = atomic_write
    sb3_ppg.common.checkpoints.run_state.atomic_write = atomic_write
elif kill_at.startswith("aux:"):
    should_kill = kill_on(int(kill_at.split(":")[1]))
    original_aux_loss = PPG._aux_loss

    def aux_loss(self, batch):
        if should_kill():
            os.kill(os.getpid(), signal.SIGKILL)
        return original_aux_loss(self, batch)

    PPG._aux_loss = aux_loss

env = make_vec_env("CartPole-v1", n_envs=2, seed=0)
callback = PPGCheckpointCallback(16, str(folder / "checkpoints"), name_prefix="ppg", keep_last=3)
try:
    model = PPG.load_checkpoint(folder / "checkpoints", env=env)
    print(f"resumed at {model.num_timesteps}", flush=True)
except FileNotFoundError:
    model = small_ppg(env, n_policy_iters=3, n_aux_epochs=2)
    print("started", flush=True)
model.learn(total - model.num_timesteps, reset_num_timesteps=False, callback=callback)
params = {name: tensor.numpy() for name, tensor in model.policy.state_dict().items()}
np.savez(folder / "final_params.npz", **params)
print("done", flush=True)
