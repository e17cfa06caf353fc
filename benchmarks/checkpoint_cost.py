"""Checkpoint cost: a paper-scale stored rollout on disk, and whole checkpoints of a ProcgenCnn model (docs/checkpoints.md)."""

import argparse
import os
import pathlib
import shutil
import tempfile
import time

import numpy as np
from gymnasium import spaces
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.envs import FakeImageEnv

from sb3_ppg import PPG
from sb3_ppg.common.array_files import array_digest, read_array_file, write_array_file
from sb3_ppg.common.aux_buffer import AuxiliaryBuffer
from sb3_ppg.common.checkpoints.checkpoint import write_checkpoint


def rollout_file_cost(folder: pathlib.Path, n_envs: int, n_steps: int, repeats: int) -> None:
    """Write and read back one policy iteration of 3x64x64 uint8 frames (Procgen), as a checkpoint does."""
    buffer = AuxiliaryBuffer(1, n_steps, n_envs, spaces.Box(0, 255, (3, 64, 64), np.uint8), spaces.Discrete(15), "cpu")
    buffer.observations[:] = np.random.default_rng(0).integers(0, 255, buffer.observations.shape, dtype=np.uint8)
    buffer.pos = n_envs
    arrays = buffer.iteration_arrays(0)
    print(f"one stored iteration: {sum(a.nbytes for a in arrays.values()) / 1e6:.0f} MB")
    for index in range(repeats):
        start = time.perf_counter()
        write_array_file(folder / f"rollout{index}.npz", arrays, {"format": "benchmark"})
        written = time.perf_counter() - start
        start = time.perf_counter()
        read_array_file(folder / f"rollout{index}.npz", "benchmark")
        print(f"  write (sha256, fsync, rename) {written:.2f} s, read + verify {time.perf_counter() - start:.2f} s")
    start = time.perf_counter()
    array_digest(arrays["observations"])
    print(f"  sha256 alone {time.perf_counter() - start:.2f} s")


def checkpoint_cost(folder: pathlib.Path, n_envs: int, n_steps: int, n_policy_iters: int) -> None:
    """Whole checkpoints of an (untrained) ProcgenCnn model with a filling auxiliary buffer of random frames."""
    env = make_vec_env(
        lambda: FakeImageEnv(screen_height=64, screen_width=64, n_channels=3, discrete=True), n_envs=n_envs, seed=0
    )
    model = PPG("ProcgenCnn", env, n_steps=n_steps, n_policy_iters=n_policy_iters, seed=0, device="cpu")
    print(f"ProcgenCnn: {sum(p.numel() for p in model.policy.parameters())} parameters")
    buffer = model.aux_buffer
    buffer.observations[:] = np.random.default_rng(0).integers(0, 255, buffer.observations.shape, dtype=np.uint8)
    model._last_obs = env.reset()
    for iteration in range(1, n_policy_iters + 1):
        buffer.pos = iteration * n_envs
        start = time.perf_counter()
        write_checkpoint(model, folder / f"ppg_{iteration}_steps", folder / "ppg_rollouts")
        elapsed = time.perf_counter() - start
        sizes = ", ".join(
            f"{p.name} {p.stat().st_size / 1e6:.2f} MB" for p in sorted((folder / f"ppg_{iteration}_steps").iterdir())
        )
        rollouts = sum(p.stat().st_size for p in (folder / "ppg_rollouts").iterdir()) / 1e6
        print(f"  checkpoint {iteration}: {elapsed:.2f} s ({sizes}; rollouts {rollouts:.0f} MB)")
    start = time.perf_counter()
    PPG.load_checkpoint(folder / f"ppg_{n_policy_iters}_steps", env=env)
    print(f"  load_checkpoint: {time.perf_counter() - start:.2f} s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rollout-envs", type=int, default=64)
    parser.add_argument("--n-envs", type=int, default=8)
    parser.add_argument("--n-steps", type=int, default=256)
    parser.add_argument("--n-policy-iters", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    folder = pathlib.Path(tempfile.mkdtemp(prefix="ppg_checkpoint_cost_"))
    try:
        rollout_file_cost(folder, args.rollout_envs, args.n_steps, args.repeats)
        checkpoint_cost(folder, args.n_envs, args.n_steps, args.n_policy_iters)
    finally:
        shutil.rmtree(folder)
    print(f"(folder {folder} on {os.uname().nodename}, removed)")
