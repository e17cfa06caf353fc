"""
Run a trained PPG agent with the RL Baselines3 Zoo: ``python -m sb3_ppg.enjoy [zoo enjoy options]``
(console script ``sb3_ppg_enjoy``): the zoo's own ``enjoy`` with PPG registered (see :mod:`sb3_ppg.cli.zoo`) and
sb3_ppg's defaults (``--algo ppg``, ``-f logs``, sampled actions for Procgen, the newest run that has the model asked
for, sb3_ppg's own checkpoints for ``--load-checkpoint N``, ``--record`` for a video), described in
docs/command_line.md. Errors end the command with one line (``--traceback`` shows the zoo's traceback instead).

Example::

    python -m sb3_ppg.enjoy --env procgen/starpilot-v0 -f quickstart_output/logs -n 5000
    python -m sb3_ppg.enjoy --env CartPole-v1 --no-render --load-best
"""

import argparse
import contextlib
import glob
import os
import re
import sys
from collections.abc import Iterator
from typing import Any

from sb3_ppg.cli.run_folders import CHECKPOINT_PREFIX, CHECKPOINTS_FOLDER, UnsafeRunFileError
from sb3_ppg.cli.vec_env import is_procgen_env_id
from sb3_ppg.cli.zoo import ZooNotInstalledError, command_line_threads, import_zoo, run_zoo
from sb3_ppg.common.checkpoints import MANIFEST

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
    folder (as ``rl_zoo3.utils.get_model_path`` names it). Checkpoints are also looked for in the run's
    ``checkpoints/`` folder (see :func:`checkpoint_models`).

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


def checkpoint_models(run_folder: str) -> dict[int, str]:
    """
    The checkpoint models of a run folder by step count: the model zips of sb3_ppg's own complete checkpoints
    (``checkpoints/ppg_<steps>_steps/model.zip``, written with ``--save-freq``) and the zoo's
    ``rl_model_<steps>_steps.zip`` (sb3_ppg's own taken when both exist).

    :param run_folder: A run folder (``<log folder>/ppg/<env>_<id>``)
    :return: ``{steps: model path}``, by increasing steps
    """
    models = {
        checkpoint_steps(path): path for path in glob.glob(os.path.join(glob.escape(run_folder), "rl_model_*_steps.zip"))
    }
    for folder in glob.glob(os.path.join(glob.escape(run_folder), CHECKPOINTS_FOLDER, f"{CHECKPOINT_PREFIX}_*_steps")):
        match = re.fullmatch(rf"{CHECKPOINT_PREFIX}_(\d+)_steps", os.path.basename(folder))
        model = os.path.join(folder, "model.zip")
        if match and os.path.isfile(os.path.join(folder, MANIFEST)) and os.path.isfile(model):
            models[int(match.group(1))] = model
    return dict(sorted(models.items()))


def find_model(
    run_folder: str, env_name: str, load_best: bool, load_checkpoint: int | None, load_last_checkpoint: bool
) -> str | None:
    """
    The model file of a run folder that ``enjoy`` plays (see :func:`model_file_pattern`; checkpoints from
    :func:`checkpoint_models`), or None when the run has none.

    :param run_folder: A run folder
    :param env_name: The env's name in file names
    :param load_best: ``--load-best``
    :param load_checkpoint: ``--load-checkpoint``
    :param load_last_checkpoint: ``--load-last-checkpoint``
    :return: The model's path, or None
    """
    if not load_best and (load_checkpoint is not None or load_last_checkpoint):
        models = checkpoint_models(run_folder)
        if load_checkpoint is not None:
            return models.get(load_checkpoint)
        return models[max(models)] if models else None
    path = os.path.join(run_folder, model_file_pattern(env_name, load_best, None, False))
    return path if os.path.isfile(path) else None


def describe_checkpoints(run_folder: str) -> str:
    """The checkpoints of a run folder, for an error message: ``"checkpoints at steps 64, 128"`` or ``"no checkpoint"``."""
    steps = list(checkpoint_models(run_folder))
    return f"checkpoints at steps {', '.join(map(str, steps))}" if steps else "no checkpoint"


@contextlib.contextmanager
def zoo_finds_package_checkpoints() -> Iterator[None]:
    """
    Within the context, the zoo's ``enjoy`` finds the checkpoints of sb3_ppg's runs for ``--load-checkpoint N`` and
    ``--load-last-checkpoint`` (see :func:`checkpoint_models`; the zoo looks for its own ``rl_model_<N>_steps.zip``
    only), and a missing checkpoint is an error naming the run's checkpoints.
    """
    import rl_zoo3.enjoy

    zoo_get_model_path = rl_zoo3.enjoy.get_model_path

    def get_model_path(
        exp_id: int,
        folder: str,
        algo: str,
        env_name: Any,
        load_best: bool = False,
        load_checkpoint: Any = None,
        load_last_checkpoint: bool = False,
    ) -> tuple[str, str, str]:
        if load_best or (load_checkpoint is None and not load_last_checkpoint):
            return zoo_get_model_path(exp_id, folder, algo, env_name, load_best, load_checkpoint, load_last_checkpoint)
        # What the zoo does for the run folder: the latest run for id 0, the algorithm's folder for a negative id
        if exp_id == 0:
            exp_id = rl_zoo3.enjoy.get_latest_run_id(os.path.join(folder, algo), env_name)
        log_path = os.path.join(folder, algo, f"{env_name}_{exp_id}") if exp_id > 0 else os.path.join(folder, algo)
        if not os.path.isdir(log_path):
            raise ValueError(f"The run folder {log_path} was not found")
        steps = int(load_checkpoint) if load_checkpoint is not None else None
        model_path = find_model(log_path, str(env_name), False, steps, load_last_checkpoint)
        if model_path is None:
            asked = f"checkpoint {steps}" if steps is not None else "checkpoint"
            raise ValueError(f"The run {log_path} has no {asked} ({describe_checkpoints(log_path)})")
        found = steps if steps is not None else max(checkpoint_models(log_path))
        return f"checkpoint-{found}-{algo}-{env_name}", model_path, log_path

    rl_zoo3.enjoy.get_model_path = get_model_path
    try:
        yield
    finally:
        rl_zoo3.enjoy.get_model_path = zoo_get_model_path


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
    checkpoint = not known.load_best and (known.load_checkpoint is not None or known.load_last_checkpoint)
    if checkpoint and known.load_checkpoint is not None:
        pattern = f"checkpoint {known.load_checkpoint}"
    elif checkpoint:
        pattern = "checkpoint"
    for run_id in sorted(run_ids, reverse=True):
        run_folder = os.path.join(algo_folder, f"{env_name}_{run_id}")
        # --load-last-checkpoint: the zoo takes the checkpoint with the most steps
        model = find_model(run_folder, env_name, known.load_best, known.load_checkpoint, known.load_last_checkpoint)
        if model is not None:
            skipped_note = f"; skipped the newer {', '.join(skipped)}: no {pattern} (failed or unfinished runs?)"
            name = os.path.relpath(model, run_folder)
            print(f"Playing run {run_folder}, model {name}{skipped_note if skipped else ''}")
            return [*zoo_argv, "--exp-id", str(run_id)]
        skipped.append(f"{env_name}_{run_id}")
    if checkpoint:
        found = "; ".join(f"{name}: {describe_checkpoints(os.path.join(algo_folder, name))}" for name in reversed(skipped))
        raise NoModelError(
            f"no run of {known.algo} on {known.env} in {algo_folder}{os.sep} has a {pattern} ({found}); train with "
            f"--save-freq N to write checkpoints into <run folder>/{CHECKPOINTS_FOLDER}/"
        )
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
        with command_line_threads(argv), zoo_finds_package_checkpoints():
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
