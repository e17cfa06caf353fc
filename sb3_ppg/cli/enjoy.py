"""
Run a trained PPG agent with the RL Baselines3 Zoo: ``python -m sb3_ppg.enjoy [zoo enjoy options]``
(console script ``sb3_ppg_enjoy``).

This is the zoo's own ``enjoy`` (``rl_zoo3.enjoy.enjoy()``) with PPG registered (see :mod:`sb3_ppg.cli.zoo`) and these
defaults:

- ``--algo ppg``;
- ``-f logs`` (where ``python -m sb3_ppg.train`` writes; the zoo's default, ``rl-trained-agents``, has no PPG agents);
- ``--algo maskable_ppg``: the model plays with the masks of its env (:mod:`sb3_ppg.cli.masked_play`);
- Procgen ids: sampled actions (``--stochastic``, pass ``--deterministic`` for greedy actions) and ``--no-render``
  (procgen only renders ``rgb_array`` frames); they run on the native vectorized env;
- ``--record``: a video of ``-n`` steps (default 1000) instead of playing, with the zoo's ``record_video``
  (``-o FOLDER``; default: ``<run folder>/videos/``);
- without ``--exp-id``: the newest run that has the model asked for (the final model, ``--load-best``,
  ``--load-checkpoint N``, ``--load-last-checkpoint``), not merely the newest run (which may have failed or still be
  training): a line names the run and model file picked and the newer runs skipped.

Errors end the command with one line (``--traceback`` shows the zoo's traceback instead).

Example::

    python -m sb3_ppg.enjoy --env procgen/starpilot-v0 -f quickstart_output/logs -n 5000
    python -m sb3_ppg.enjoy --env CartPole-v1 --no-render --load-best
"""

import argparse
import glob
import os
import re
import sys

from sb3_ppg.cli.run_folders import UnsafeRunFileError
from sb3_ppg.cli.vec_env import is_procgen_env_id
from sb3_ppg.cli.zoo import ZooNotInstalledError, command_line_threads, import_zoo, run_zoo

#: sb3_ppg's own flag (not passed to the zoo): show the traceback of an error instead of its one-line message
TRACEBACK_FLAG = "--traceback"
#: sb3_ppg's own flag: record a video of ``-n`` steps with the zoo's ``record_video`` instead of playing
RECORD_FLAG = "--record"


class NoModelError(ValueError):
    """No run folder of the log folder holds the model that ``enjoy`` was asked to play."""


def build_zoo_argv(argv: list[str]) -> list[str]:
    """
    The zoo's ``enjoy`` arguments: add ``--algo ppg``, ``-f logs`` and, for Procgen ids, ``--stochastic`` and
    ``--no-render``, unless given.

    :param argv: sb3_ppg's command line arguments
    :return: The zoo's command line arguments
    """
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--algo", default=None)
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("-f", "--folder", default=None)
    parser.add_argument("--stochastic", action="store_true", default=False)
    parser.add_argument("--deterministic", action="store_true", default=False)
    parser.add_argument("--no-render", dest="no_render", action="store_true", default=False)
    known, _ = parser.parse_known_args(argv)

    zoo_argv = list(argv)
    if known.algo is None:
        zoo_argv += ["--algo", "ppg"]
    if known.folder is None:
        zoo_argv += ["-f", "logs"]
    if is_procgen_env_id(known.env):
        if not known.stochastic and not known.deterministic:
            zoo_argv.append("--stochastic")
        if not known.no_render:
            print("Procgen envs cannot render to a window: running with --no-render")
            zoo_argv.append("--no-render")
    return zoo_argv


def model_file_pattern(env_name: str, load_best: bool, load_checkpoint: int | None, load_last_checkpoint: bool) -> str:
    """
    The file name (a glob pattern for ``--load-last-checkpoint``) of the model the zoo's ``enjoy`` loads from a run
    folder (as ``rl_zoo3.utils.get_model_path`` names it).

    :param env_name: The env's name in file names (``procgen-starpilot-v0`` for ``procgen/starpilot-v0``)
    :param load_best: ``--load-best``
    :param load_checkpoint: ``--load-checkpoint``
    :param load_last_checkpoint: ``--load-last-checkpoint``
    :return: The file name or pattern
    """
    if load_best:
        return "best_model.zip"
    if load_checkpoint is not None:
        return f"rl_model_{load_checkpoint}_steps.zip"
    if load_last_checkpoint:
        return "rl_model_*_steps.zip"
    return f"{env_name}.zip"


def checkpoint_steps(path: str) -> int:
    """The steps of a zoo checkpoint ``rl_model_<steps>_steps.zip`` (0 for another model file)."""
    match = re.search(r"_(\d+)_steps\.zip$", path)
    return int(match.group(1)) if match else 0


def pick_run(zoo_argv: list[str]) -> list[str]:
    """
    Without ``--exp-id`` (or with ``--exp-id 0``, the zoo's "latest"), choose the newest run of the log folder that
    holds the model asked for, print a line naming it (and the newer runs skipped for lack of that model), and give
    its id to the zoo. The zoo alone would take the newest run, and fail with a traceback when it has no model (a run
    that failed or is still training). With another ``--exp-id``, or the zoo's download folder
    (``rl-trained-agents``), the arguments are left as they are.

    :param zoo_argv: The zoo's ``enjoy`` arguments (from :func:`build_zoo_argv`)
    :return: The arguments, with ``--exp-id <id>`` of the run chosen
    :raises NoModelError: when no run of the algorithm and env in the log folder holds the model
    """
    from huggingface_sb3 import EnvironmentName

    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--algo", default="ppg")
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("-f", "--folder", default="logs")
    parser.add_argument("--exp-id", dest="exp_id", type=int, default=0)
    parser.add_argument("--load-best", dest="load_best", action="store_true", default=False)
    parser.add_argument("--load-checkpoint", dest="load_checkpoint", type=int, default=None)
    parser.add_argument("--load-last-checkpoint", dest="load_last_checkpoint", action="store_true", default=False)
    known, _ = parser.parse_known_args(zoo_argv)
    if known.exp_id != 0 or "rl-trained-agents" in known.folder:
        return zoo_argv
    env_name = str(EnvironmentName(known.env))
    algo_folder = os.path.join(known.folder, known.algo)
    pattern = model_file_pattern(env_name, known.load_best, known.load_checkpoint, known.load_last_checkpoint)
    run_ids = []
    if os.path.isdir(algo_folder):
        for name in os.listdir(algo_folder):
            match = re.fullmatch(rf"{re.escape(env_name)}_(\d+)", name)
            if match and int(match.group(1)) > 0 and os.path.isdir(os.path.join(algo_folder, name)):
                run_ids.append(int(match.group(1)))
    train_command = f"python -m sb3_ppg.train --env {known.env} -f {known.folder}"
    if not run_ids:
        raise NoModelError(
            f"no run of {known.algo} on {known.env} in {algo_folder}{os.sep} (no {env_name}_<id> folder): train one with "
            f"`{train_command}`, or give the log folder it was trained into with -f"
        )
    skipped = []
    for run_id in sorted(run_ids, reverse=True):
        run_folder = os.path.join(algo_folder, f"{env_name}_{run_id}")
        # --load-last-checkpoint: the zoo takes the checkpoint with the most steps
        models = sorted(glob.glob(os.path.join(glob.escape(run_folder), pattern)), key=checkpoint_steps)
        if models:
            skipped_note = f"; skipped the newer {', '.join(skipped)}: no {pattern} (failed or unfinished runs?)"
            print(f"Playing run {run_folder}, model {os.path.basename(models[-1])}{skipped_note if skipped else ''}")
            return [*zoo_argv, "--exp-id", str(run_id)]
        skipped.append(f"{env_name}_{run_id}")
    hint = "" if known.load_best else "; --load-best plays the best model of a run that evaluated during training"
    raise NoModelError(
        f"no run of {known.algo} on {known.env} in {algo_folder}{os.sep} has a model {pattern} (runs "
        f"{', '.join(reversed(skipped))}: failed or unfinished?){hint}; or train one with `{train_command}`"
    )


def main(argv: list[str] | None = None) -> None:
    """
    Command line entry point (``python -m sb3_ppg.enjoy`` / ``sb3_ppg_enjoy``).

    A run folder's ``config.yml`` / ``args.yml`` are read without running code: a file holding a Python object other
    than what the zoo writes ends the command with a one-line error naming it. (The zoo still evaluates some
    hyperparameter strings as Python, e.g. ``normalize: "dict(...)"``: run only agents from folders you trust.)
    Any other error (no model, a bad option value, an env that fails) ends it with a one-line message too, unless
    ``--traceback`` is given.

    :param argv: Command line arguments (None: ``sys.argv[1:]``)
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    show_traceback = TRACEBACK_FLAG in argv
    record = RECORD_FLAG in argv
    argv = [arg for arg in argv if arg not in (TRACEBACK_FLAG, RECORD_FLAG)]
    try:
        import_zoo()
    except ZooNotInstalledError as error:
        sys.exit(str(error))
    try:
        with command_line_threads(argv):
            run_zoo("record_video" if record else "enjoy", pick_run(build_zoo_argv(argv)))
    except UnsafeRunFileError as error:
        sys.exit(f"error: {error}")
    except NoModelError as error:
        sys.exit(f"error: {error}")
    except Exception as error:
        # The zoo's own errors (a model it cannot find with --exp-id, a bad env id) come from deep inside it
        if show_traceback:
            raise
        message = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
        sys.exit(f"error: {type(error).__name__}: {message} ({TRACEBACK_FLAG} shows where)")


if __name__ == "__main__":
    main()
