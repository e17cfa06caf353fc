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

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch.distributed
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.vec_env import VecMonitor

from sb3_ppg.cli.run_folders import RESUME_LATEST
from sb3_ppg.cli.zoo import run_zoo
from sb3_ppg.common import distributed
from sb3_ppg.ppg import PPG
from sb3_ppg.procgen import ProcgenVecEnv

HYPERPARAMS_DIR = Path(__file__).parent / "hyperparams"
# sb3_ppg's own options: flags, options with a value, the option with an optional value
OWN_FLAGS = ("--quickstart", "--traceback", "--global-n-envs")
OWN_OPTIONS = ("--preset", "--keep-checkpoints")
OWN_OPTIONAL_VALUE = ("--resume",)
#: The zoo's flags for a hyperparameter search (refused under torchrun)
OPTIMIZE_FLAGS = frozenset(("-optimize", "--optimize-hyperparameters"))

# The same settings as make_procgen_env(preset=...) / sb3_ppg.procgen.presets ("easy" is CleanRL's, as "cleanrl")
PRESETS = {"paper": "ppg.yml", "cleanrl": "ppg_easy.yml", "easy": "ppg_easy.yml"}

# Quick start: a CPU-sized run (a few minutes on 2 cores) on Procgen StarPilot, easy mode, with the packaged easy
# preset shrunk to 8 envs, 256-step rollouts and short auxiliary phases (N_pi 4, E_aux 2: two auxiliary phases), with
# small minibatches to keep the memory of the CPU backward passes low (~1.5 GB).
QUICKSTART_ENV = "procgen/starpilot-v0"
QUICKSTART_TIMESTEPS = 16_384
QUICKSTART_PARAMS = (
    "n_envs:8",
    "n_steps:256",
    "batch_size:256",
    "n_policy_iters:4",
    "n_aux_epochs:2",
    "aux_batch_rollouts:2",
)
QUICKSTART_EVAL_EPISODES = 32
QUICKSTART_OUTPUT = "quickstart_output"

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
"""


def hyperparams_file(preset: str = "paper") -> str:
    """
    Path of a packaged hyperparameter file.

    :param preset: ``"paper"`` (``ppg.yml``) or ``"cleanrl"`` / ``"easy"`` (``ppg_easy.yml``)
    :return: The path
    """
    if preset not in PRESETS:
        raise ValueError(f"Unknown preset {preset!r}, expected one of {', '.join(PRESETS)}")
    return str(HYPERPARAMS_DIR / PRESETS[preset])


def _sb3_ppg_parser() -> argparse.ArgumentParser:
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
    known, _ = _sb3_ppg_parser().parse_known_args(argv)
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
    return zoo_argv


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


def quickstart(argv: list[str]) -> dict[str, str | float]:
    """
    The quick start: train PPG on Procgen StarPilot (easy) for a CPU-sized budget with a progress bar, save the model,
    evaluate it (sampled actions) and write its learning curve.

    :param argv: Extra zoo ``train`` options (override the quick start's)
    :return: Paths of what was written (``run_folder``, ``model``, ``best_model``, ``evaluations``, ``monitor``,
        ``learning_curve``) and the evaluation (``mean_reward``, ``std_reward``)
    """
    # Only the quick start plots: the other commands do not import plot.py (and pandas)
    from sb3_ppg.cli.plot import plot_learning_curves

    known, _ = _sb3_ppg_parser().parse_known_args(argv)
    env_id = known.env or QUICKSTART_ENV
    log_folder = known.log_folder or os.path.join(QUICKSTART_OUTPUT, "logs")
    output_folder = os.path.dirname(os.path.abspath(log_folder))
    zoo_argv = [
        "--algo",
        "ppg",
        "--env",
        env_id,
        "-conf",
        hyperparams_file("easy"),
        "-n",
        str(QUICKSTART_TIMESTEPS),
        "-params",
        *QUICKSTART_PARAMS,
        "--eval-freq",
        str(QUICKSTART_TIMESTEPS // 2),
        "--eval-episodes",
        "8",
        "--n-eval-envs",
        "4",
        "-f",
        log_folder,
        "--seed",
        "0",
        "--device",
        "cpu",
        "-P",
        *[arg for arg in argv if arg != "--quickstart"],
    ]
    print("Quick start: PPG on Procgen StarPilot (easy mode), a CPU-sized run of a few minutes.")
    print("Same as: python -m sb3_ppg.train " + " ".join(zoo_argv))
    start_time = time.time()
    run_zoo("train", zoo_argv)
    train_time = time.time() - start_time

    run_folder = latest_run_folder(log_folder, env_id)
    env_name = os.path.basename(run_folder).rsplit("_", 1)[0]
    model_path = os.path.join(run_folder, f"{env_name}.zip")
    model = PPG.load(model_path, device="cpu")

    game = env_id.split("/")[-1].rsplit("-v", 1)[0]
    # Evaluation on unseen levels (num_levels=0: the full level distribution), raw rewards, sampled actions
    eval_env = VecMonitor(ProcgenVecEnv(8, game, distribution_mode="easy", num_levels=0, start_level=0, rand_seed=12345))
    episode_rewards, _ = evaluate_policy(
        model, eval_env, n_eval_episodes=QUICKSTART_EVAL_EPISODES, deterministic=False, return_episode_rewards=True
    )
    eval_env.close()
    mean_reward, std_reward = float(np.mean(episode_rewards)), float(np.std(episode_rewards))

    curve_path = os.path.join(output_folder, "learning_curve.png")
    title = f"PPG on {env_id} (easy), quick start"
    try:
        plot_learning_curves([run_folder], output=curve_path, smoothing=20, title=title)
    except ValueError:
        # No training episode finished (very short run): plot the evaluations instead
        plot_learning_curves([run_folder], output=curve_path, curve_type="eval", title=title)

    results: dict[str, str | float] = {
        "run_folder": os.path.abspath(run_folder),
        "model": os.path.abspath(model_path),
        "best_model": os.path.abspath(os.path.join(run_folder, "best_model.zip")),
        "evaluations": os.path.abspath(os.path.join(run_folder, "evaluations.npz")),
        "monitor": os.path.abspath(os.path.join(run_folder, "0.monitor.csv")),
        "learning_curve": os.path.abspath(curve_path),
        "mean_reward": mean_reward,
        "std_reward": std_reward,
    }
    print()
    print(f"Quick start: trained in {train_time / 60:.1f} min.")
    print(
        f"Mean evaluation return over {len(episode_rewards)} episodes (sampled actions, unseen levels): "
        f"{mean_reward:.2f} +/- {std_reward:.2f}"
    )
    print(f"  run folder:       {results['run_folder']}")
    print(f"  trained model:    {results['model']}")
    print(f"  best model:       {results['best_model']}")
    print(f"  evaluations:      {results['evaluations']}")
    print(f"  episode log:      {results['monitor']}")
    print(f"  learning curve:   {results['learning_curve']}")
    print(f"Watch it play: python -m sb3_ppg.enjoy --env {env_id} -f {log_folder} --no-render -n 2000")
    return results


def main(argv: list[str] | None = None) -> None:
    """
    Command line entry point (``python -m sb3_ppg.train`` / ``sb3_ppg_train``).

    :param argv: Command line arguments (None: ``sys.argv[1:]``)
    """
    argv = list(sys.argv[1:] if argv is None else argv)
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
        manager_kwargs["resume"] = known.resume
    if known.keep_checkpoints is not None:
        manager_kwargs["keep_checkpoints"] = known.keep_checkpoints
    if known.global_n_envs:
        manager_kwargs["global_n_envs"] = True
    try:
        # Under torchrun, the ranks join now: they share rank 0's run folder, and only rank 0 prints
        started = known.algo in (None, "ppg") and distributed.init_if_launched("gloo" if known.device == "cpu" else None)
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
