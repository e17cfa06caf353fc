"""
Child process of the SIGKILL tests (test_checkpoints.py, test_recurrent_checkpoints.py): train with a checkpoint every
iteration, resuming if it can. ALGO=recurrent trains a small RecurrentPPG instead of PPG.
"""

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
from sb3_ppg import PPG, PPGCheckpointCallback, RecurrentPPG

folder, total = pathlib.Path(sys.argv[1]), int(sys.argv[2])
recurrent = os.environ.get("ALGO") == "recurrent"
model_class = RecurrentPPG if recurrent else PPG
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
    original_aux_loss = model_class._aux_loss

    def aux_loss(self, batch):
        if should_kill():
            os.kill(os.getpid(), signal.SIGKILL)
        return original_aux_loss(self, batch)

    model_class._aux_loss = aux_loss

env = make_vec_env("CartPole-v1", n_envs=2, seed=0)
callback = PPGCheckpointCallback(16, str(folder / "checkpoints"), name_prefix="ppg", keep_last=3)
try:
    model = model_class.load_checkpoint(folder / "checkpoints", env=env)
    print(f"resumed at {model.num_timesteps}", flush=True)
except FileNotFoundError:
    if recurrent:
        lstm = dict(lstm_hidden_size=8, net_arch=[8])
        model = RecurrentPPG(
            "MlpLstmPolicy", env, seed=0, n_steps=16, batch_size=16, n_policy_iters=3, n_aux_epochs=2, policy_kwargs=lstm
        )
    else:
        model = small_ppg(env, n_policy_iters=3, n_aux_epochs=2)
    print("started", flush=True)
model.learn(total - model.num_timesteps, reset_num_timesteps=False, callback=callback)
params = {name: tensor.numpy() for name, tensor in model.policy.state_dict().items()}
np.savez(folder / "final_params.npz", **params)
print("done", flush=True)
