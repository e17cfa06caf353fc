"""
The command-line arguments that ``python -m sb3_ppg.train`` and the quick start share: sb3_ppg's own options, split
from the RL Zoo's, the zoo's ``train`` arguments built from them, the packaged hyperparameter files, the zoo's run
folders.
"""

import argparse
import os
from pathlib import Path

from sb3_ppg.cli.run_folders import CHECKPOINTS_FOLDER, RESUME_LATEST, RUN_ARGS, read_run_file
from sb3_ppg.common.checkpoints import MANIFEST

HYPERPARAMS_DIR = Path(__file__).parent / "hyperparams"
# sb3_ppg's own options: flags, options with a value, the option with an optional value
OWN_FLAGS = ("--quickstart", "--traceback", "--global-n-envs")
OWN_OPTIONS = ("--preset", "--keep-checkpoints")
OWN_OPTIONAL_VALUE = ("--resume",)
#: The zoo's options whose value is a folder the run writes to: a leading "~" is expanded, which the shell leaves in
#: "--log-folder=~/logs"
PATH_OPTIONS = ("-f", "--log-folder", "-tb", "--tensorboard-log")

# The same settings as make_procgen_env(preset=...) / sb3_ppg.procgen.presets ("easy" is CleanRL's, as "cleanrl")
PRESETS = {"paper": "ppg.yml", "cleanrl": "ppg_easy.yml", "easy": "ppg_easy.yml"}


def hyperparams_file(preset: str = "paper") -> str:
    """
    Path of a packaged hyperparameter file.

    :param preset: ``"paper"`` (``ppg.yml``) or ``"cleanrl"`` / ``"easy"`` (``ppg_easy.yml``)
    :return: The path
    """
    if preset not in PRESETS:
        raise ValueError(f"Unknown preset {preset!r}, expected one of {', '.join(PRESETS)}")
    return str(HYPERPARAMS_DIR / PRESETS[preset])


def sb3_ppg_parser() -> argparse.ArgumentParser:
    """
    Parser for the few options sb3_ppg reads itself (everything else is left to the zoo).

    :return: The parser
    """
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--preset", choices=sorted(PRESETS), default=None)
    parser.add_argument("--quickstart", action="store_true", default=False)
    parser.add_argument("--algo", default=None)
    parser.add_argument("-conf", "--conf-file", dest="conf_file", default=None)
    parser.add_argument("--env", default=None)
    parser.add_argument("-f", "--log-folder", dest="log_folder", default=None)
    parser.add_argument("-n", "--n-timesteps", dest="n_timesteps", type=int, default=None)
    parser.add_argument("--resume", nargs="?", const=RESUME_LATEST, default=None)
    parser.add_argument("--keep-checkpoints", dest="keep_checkpoints", type=int, default=None)
    parser.add_argument("--global-n-envs", dest="global_n_envs", action="store_true", default=False)
    parser.add_argument("--device", default=None)
    parser.add_argument("--traceback", action="store_true", default=False)
    return parser


def split_argv(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """
    Separate sb3_ppg's own options from the zoo's.

    :param argv: sb3_ppg's command line arguments
    :return: (sb3_ppg's options, the other arguments, in order)
    """
    known, _ = sb3_ppg_parser().parse_known_args(argv)
    rest = []
    index = 0
    while index < len(argv):
        arg = argv[index]
        name = arg.split("=", 1)[0]
        if name in OWN_FLAGS or (name in OWN_OPTIONS + OWN_OPTIONAL_VALUE and "=" in arg):
            index += 1
        elif name in OWN_OPTIONS:
            index += 2
        elif name in OWN_OPTIONAL_VALUE:
            has_value = index + 1 < len(argv) and not argv[index + 1].startswith("-")
            index += 2 if has_value else 1
        else:
            rest.append(arg)
            index += 1
    return known, rest


def build_zoo_argv(argv: list[str]) -> list[str]:
    """
    The zoo's ``train`` arguments for sb3_ppg's: remove sb3_ppg's own options (``--preset``, ``--quickstart``,
    ``--resume``, ``--keep-checkpoints``, ``--global-n-envs``, ``--traceback``), add ``--algo ppg`` and
    ``-conf <packaged yml>`` unless given.

    :param argv: sb3_ppg's command line arguments
    :return: The zoo's command line arguments
    :raises ValueError: for contradicting or out-of-range options
    """
    known, zoo_argv = split_argv(argv)
    if known.n_timesteps is not None and known.n_timesteps <= 0:
        raise ValueError(
            f"-n/--n-timesteps must be a positive number of timesteps, got {known.n_timesteps} (leave it out to train "
            "the config's n_timesteps)"
        )
    if known.keep_checkpoints is not None and known.keep_checkpoints < 1:
        raise ValueError(f"--keep-checkpoints must be at least 1, got {known.keep_checkpoints}")
    if known.algo is None:
        zoo_argv = ["--algo", "ppg", *zoo_argv]
    algo = known.algo or "ppg"
    if known.conf_file is not None and known.preset is not None:
        raise ValueError("--preset and -conf both choose the hyperparameter file: pass only one")
    if known.conf_file is None and algo == "ppg":
        zoo_argv += ["-conf", hyperparams_file(known.preset or "paper")]
    if algo in ("maskable_ppg", "recurrent_ppg"):
        if known.preset is not None:
            raise ValueError(f"--preset chooses PPG's Procgen settings (--algo ppg): leave it out with --algo {algo}")
        if known.conf_file is None:
            zoo_argv += ["-conf", str(HYPERPARAMS_DIR / f"{algo}.yml")]
    return expand_user_paths(zoo_argv)


def expand_user_paths(argv: list[str]) -> list[str]:
    """
    :param argv: The zoo's command line arguments
    :return: The same, with a leading ``~`` of the folders of ``PATH_OPTIONS`` expanded (``os.path.expanduser``)
    """
    expanded = []
    for index, arg in enumerate(argv):
        name, equals, value = arg.partition("=")
        if equals and name in PATH_OPTIONS:
            arg = f"{name}={os.path.expanduser(value)}"
        elif index > 0 and argv[index - 1] in PATH_OPTIONS:
            arg = os.path.expanduser(arg)
        expanded.append(arg)
    return expanded


def latest_run_folder(log_folder: str, env_id: str, algo: str = "ppg") -> str:
    """
    The zoo's folder of the latest run (``<log_folder>/<algo>/<env name>_<id>``).

    :param log_folder: Zoo log folder (``-f``)
    :param env_id: Gymnasium id
    :param algo: Algorithm name
    :return: The folder
    """
    from huggingface_sb3 import EnvironmentName
    from rl_zoo3.utils import get_latest_run_id

    env_name = EnvironmentName(env_id)
    algo_folder = os.path.join(log_folder, algo)
    return os.path.join(algo_folder, f"{env_name}_{get_latest_run_id(algo_folder, env_name)}")


def resumed_run_seed(resume: str, log_folder: str | None, env_id: str | None, algo: str | None) -> int | None:
    """
    The seed of the run that ``--resume`` continues (its ``args.yml``), for a command without ``--seed``: the zoo would
    otherwise print (and seed the process with) a new random one. The manager checks the run later; here a run
    that cannot be read gives None.

    :param resume: ``--resume``'s value (``"latest"`` or a path)
    :param log_folder: ``-f`` (None: the zoo's ``logs``)
    :param env_id: ``--env``
    :param algo: ``--algo`` (None: ``ppg``)
    :return: The run's seed, or None
    """
    if env_id is None:
        return None
    if resume == RESUME_LATEST:
        try:
            folder = Path(latest_run_folder(log_folder or "logs", env_id, algo or "ppg"))
        except ImportError:  # no zoo: the command says so next
            return None
    else:
        folder = Path(os.path.expanduser(resume))
        if (folder / MANIFEST).is_file():  # a checkpoint: <run folder>/checkpoints/<checkpoint>
            folder = folder.parent.parent
        elif folder.name == CHECKPOINTS_FOLDER:
            folder = folder.parent
    for args_file in sorted(folder.glob(f"*/{RUN_ARGS}")):
        try:
            run_args = read_run_file(args_file)
        except (OSError, ValueError):
            continue
        seed = run_args.get("seed")
        if run_args.get("env") == env_id and isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0:
            return seed
    return None
