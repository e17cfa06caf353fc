"""
Train PPG with the RL Baselines3 Zoo: ``python -m sb3_ppg.train [zoo train options]`` (console script ``sb3_ppg_train``).

This is the zoo's own ``train`` (``rl_zoo3.train.train()``) with PPG registered (see :mod:`sb3_ppg.cli.zoo`) and these
defaults:

- ``--algo ppg``;
- ``-conf``: the packaged hyperparameters, ``sb3_ppg/cli/hyperparams/ppg.yml`` (Procgen: the paper's settings, hard mode),
  or ``ppg_easy.yml`` (Procgen: CleanRL-equivalent settings, easy mode) with ``--preset easy``;
- Procgen ids run on the native vectorized env and are evaluated with sampled actions.

Every other zoo option works as usual (``--env``, ``-n``, ``--seed``, ``--eval-freq``, ``--tensorboard-log``,
``-params``, ``--env-kwargs``, ``-optimize``, ...).

``python -m sb3_ppg.train`` without arguments (or with ``--quickstart``) runs the quick start: a few minutes of PPG on
Procgen StarPilot (easy) on the CPU, then an evaluation and a learning-curve PNG, all under ``quickstart_output/``.
"""

import contextlib
import os
import shlex
import sys

import torch
import torch.distributed

from sb3_ppg.cli.algorithms import PPG_ALGORITHMS
from sb3_ppg.cli.arguments import build_zoo_argv, split_argv
from sb3_ppg.cli.host_memory import command_line_memory
from sb3_ppg.cli.quickstart import quickstart
from sb3_ppg.cli.run_folders import TrainingInterrupted
from sb3_ppg.cli.zoo import command_line_threads, run_zoo
from sb3_ppg.common import distributed

#: The zoo's flags for a hyperparameter search (refused under torchrun)
OPTIMIZE_FLAGS = frozenset(("-optimize", "--optimize-hyperparameters"))
#: Exit status of a run stopped by Ctrl-C (128 + SIGINT, as a shell reports a program killed by it)
INTERRUPTED_EXIT_CODE = 130

EPILOG = """
sb3_ppg options (the RL Zoo's train options are listed below):
  --preset {paper,cleanrl,easy}
                         packaged hyperparameters: paper (ppg.yml, default: Procgen hard, 256 envs, 100M steps) or
                         cleanrl, also called easy (ppg_easy.yml: Procgen easy, CleanRL-equivalent, 64 envs, 25M steps).
                         Refused with -conf.
  --quickstart           CPU-sized demo run on procgen/starpilot-v0 (same as no arguments at all); other options
                         given with it are passed on to the zoo (e.g. -n 50000, --seed 1, -f other_folder).
  --save-freq N          (the zoo's option) write a PPG checkpoint (model, auxiliary buffer, run state) every N
                         env steps into <run folder>/checkpoints/, at the next rollout boundary.
  --resume [PATH]        continue a run from its newest complete checkpoint, bit for bit as if it had never
                         stopped: the latest run of this --env and -f (no PATH), or the run folder, checkpoints
                         folder or checkpoint PATH. Same command as the first start, plus --resume; a run without a
                         checkpoint yet starts over, so a requeued cluster job can always pass it.
  --keep-checkpoints K   keep only the K newest checkpoints (default: all).
  --global-n-envs        under torchrun: the config's n_envs (or -params n_envs:N) is the number of envs of all
                         ranks together, each rank running n_envs / world size (default: n_envs per rank).
  --traceback            show the full traceback of an error instead of a one-line message.
  --num-threads N        (the zoo's option) torch's and procgen's threads; default: this process's share of the idle
                         CPUs (OMP_NUM_THREADS, where set, is kept). See docs/command_line.md#threads.
"""


def main(argv: list[str] | None = None) -> None:
    """
    Command line entry point (``python -m sb3_ppg.train`` / ``sb3_ppg_train``).

    :param argv: Command line arguments (None: ``sys.argv[1:]``)
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        with command_line_threads(argv), command_line_memory(argv):
            run_train_command(argv)
    except TrainingInterrupted as interrupted:
        # Ctrl-C: exit as an interrupted program does (128 + SIGINT), saying where the run can continue from
        print(interrupted.describe(resume_command(argv, interrupted.run_folder)), file=sys.stderr)
        sys.exit(INTERRUPTED_EXIT_CODE)
    except KeyboardInterrupt:
        print("Interrupted (Ctrl-C).", file=sys.stderr)
        sys.exit(INTERRUPTED_EXIT_CODE)


def resume_command(argv: list[str], run_folder: str) -> str:
    """
    The command that continues a run: this one with ``--resume <run folder>`` (in place of its own ``--resume``).

    :param argv: The command's arguments
    :param run_folder: The run folder
    :return: The command line, quoted for a POSIX shell
    """
    kept = []
    index = 0
    while index < len(argv):
        name = argv[index].split("=", 1)[0]
        if name == "--resume":
            has_value = "=" in argv[index] or (index + 1 < len(argv) and not argv[index + 1].startswith("-"))
            index += 2 if has_value and "=" not in argv[index] else 1
            continue
        kept.append(argv[index])
        index += 1
    return shlex.join(["python", "-m", "sb3_ppg.train", *kept, "--resume", run_folder])


def run_train_command(argv: list[str]) -> None:
    """
    The command: the quick start, or the zoo's ``train`` with sb3_ppg's options.

    :param argv: Command line arguments
    """
    if len(argv) == 0 or "--quickstart" in argv:
        quickstart(argv)
        return
    if "-h" in argv or "--help" in argv:
        print(EPILOG)
    try:
        zoo_argv = build_zoo_argv(argv)
    except ValueError as error:
        sys.exit(f"error: {error}")
    known, _ = split_argv(argv)
    if distributed.launched_by_torchrun() and OPTIMIZE_FLAGS.intersection(argv):
        sys.exit(
            "error: -optimize does not run under torchrun (each rank would run its own trials): run the search in one "
            "process (--n-jobs runs trials in parallel), then train with the best hyperparameters under torchrun."
        )
    manager_kwargs = {}
    if known.resume is not None:
        manager_kwargs["resume"] = os.path.expanduser(known.resume)
    if known.keep_checkpoints is not None:
        manager_kwargs["keep_checkpoints"] = known.keep_checkpoints
    if known.global_n_envs:
        manager_kwargs["global_n_envs"] = True
    try:
        # Under torchrun, the ranks join now: they share rank 0's run folder, and only rank 0 prints
        backend = "gloo" if known.device == "cpu" else None
        started = known.algo in (None, *PPG_ALGORITHMS) and distributed.init_if_launched(backend)
        with (
            open(os.devnull, "w") as devnull,
            contextlib.redirect_stdout(devnull if started and distributed.get_rank() > 0 else sys.stdout),
        ):
            run_zoo("train", zoo_argv, **manager_kwargs)
        if started:
            torch.distributed.destroy_process_group()
    except Exception as error:
        # Bad input (hyperparameters, env ids, paths, checkpoints) fails somewhere inside the zoo: one line, not a
        # traceback through it
        if known.traceback:
            raise
        message = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
        sys.exit(f"error: {type(error).__name__}: {message} (--traceback shows where)")


if __name__ == "__main__":
    main()
