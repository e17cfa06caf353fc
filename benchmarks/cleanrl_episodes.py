"""
Run a Procgen training script (CleanRL's ``ppg_procgen.py``) unmodified and log every episode it finishes.

Usage (with the Python environment the script needs; for CleanRL's, gym 0.23.1: see docs/fidelity.md):

    python benchmarks/cleanrl_episodes.py /path/to/cleanrl/cleanrl/ppg_procgen.py --episodes episodes.csv -- \
        --env-id starpilot --seed 1 --total-timesteps 2000000

The script runs as ``__main__`` with the arguments after ``--``. Before it starts, ``procgen.ProcgenEnv`` is replaced by
the same env (procgen's own ``ProcgenEnv``) whose ``step_wait`` appends a row ``env steps, raw return, length`` to the
episodes file at each episode end, where ``env steps`` counts the steps of all envs so far (CleanRL's ``global_step``;
``benchmarks/procgen_learning.py`` logs sb3-ppg's episodes in the same format). CleanRL itself logs only the first
episode that ends at each step; this log has all of them. Nothing else of the script changes. The file is written
anew; a line ``# complete`` is appended when the script returns.
"""

import argparse
import os
import runpy
import sys
from typing import Any

import numpy as np

COMPLETE = "# complete"


class EpisodeLog:
    """
    Accumulates raw returns and lengths per env and appends a CSV row at each episode end.

    :param path: the episodes file (written anew)
    :param num_envs: number of envs
    """

    def __init__(self, path: str, num_envs: int) -> None:
        self.file = open(path, "w")
        self.returns = np.zeros(num_envs)
        self.lengths = np.zeros(num_envs, dtype=np.int64)
        self.env_steps = 0

    def step(self, rewards: np.ndarray, dones: np.ndarray) -> None:
        self.env_steps += len(self.returns)
        self.returns += rewards
        self.lengths += 1
        for index in np.flatnonzero(dones):
            self.file.write(f"{self.env_steps},{self.returns[index]:.6g},{self.lengths[index]}\n")
            self.returns[index] = 0.0
            self.lengths[index] = 0
        if dones.any():
            self.file.flush()

    def close(self, complete: bool) -> None:
        if complete:
            self.file.write(COMPLETE + "\n")
        self.file.close()


def logging_procgen_env(path: str, logs: list[EpisodeLog]) -> Any:
    """A ``procgen.ProcgenEnv`` that logs its episodes to ``path`` (one file per script run: one env expected)."""
    import procgen

    make_env = procgen.ProcgenEnv

    def procgen_env(num_envs: int, env_name: str, **kwargs: Any) -> Any:
        if logs:
            raise RuntimeError("the script built a second ProcgenEnv: only the training env is expected")
        venv = make_env(num_envs=num_envs, env_name=env_name, **kwargs)
        log = EpisodeLog(path, num_envs)
        logs.append(log)
        step_wait = venv.step_wait

        def logging_step_wait() -> Any:
            observations, rewards, dones, infos = step_wait()
            log.step(np.asarray(rewards, dtype=np.float64), np.asarray(dones, dtype=bool))
            return observations, rewards, dones, infos

        venv.step_wait = logging_step_wait
        return venv

    return procgen_env


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    script_argv: list[str] = []
    if "--" in argv:
        index = argv.index("--")
        argv, script_argv = argv[:index], argv[index + 1 :]
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("script", help="the training script (CleanRL's cleanrl/ppg_procgen.py)")
    parser.add_argument("--episodes", required=True, help="the episodes CSV file to write")
    args = parser.parse_args(argv)
    import procgen

    logs: list[EpisodeLog] = []
    procgen.ProcgenEnv = logging_procgen_env(args.episodes, logs)
    os.makedirs(os.path.dirname(os.path.abspath(args.episodes)), exist_ok=True)
    sys.argv = [args.script, *script_argv]
    complete = False
    try:
        runpy.run_path(args.script, run_name="__main__")
        complete = True
    finally:
        for log in logs:
            log.close(complete)


if __name__ == "__main__":
    main()
