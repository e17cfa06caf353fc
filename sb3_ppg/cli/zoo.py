"""
RL Baselines3 Zoo (``rl_zoo3``) integration: what ``python -m sb3_ppg.train`` / ``python -m sb3_ppg.enjoy`` install
in the zoo before handing over to the zoo's own ``train()`` / ``enjoy()`` (:func:`run_zoo`): PPG and MaskablePPG in
its algorithm and hyperparameter-sampler registries, the gymnasium ids of the package's envs, the native Procgen
VecEnv (:class:`~sb3_ppg.cli.vec_env.ProcgenVecEnvFactory`) and :class:`~sb3_ppg.cli.experiment_manager.PPGExperimentManager`
(see docs/command_line.md). The zoo is an optional extra: nothing here imports it at module import time, and
:func:`import_zoo` turns a missing zoo into a :class:`ZooNotInstalledError` with a one-line message.
"""

import argparse
import contextlib
import functools
import importlib
import os
import runpy
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from stable_baselines3.common.vec_env import VecEnv
from torch import nn

from sb3_ppg.cli.algorithms import PPG_ALGORITHMS
from sb3_ppg.cli.threads import choose_torch_threads
from sb3_ppg.cli.vec_env import ProcgenVecEnvFactory
from sb3_ppg.common.envs import register_dict_cartpole
from sb3_ppg.ppg_mask.envs import register_invalid_action_envs
from sb3_ppg.procgen import register_procgen_envs

if TYPE_CHECKING:
    import optuna
    from rl_zoo3.exp_manager import ExperimentManager

ZOO_EXTRA = "zoo"
# Modules of the zoo extra that ``train`` / ``enjoy`` need (``requests`` is imported by ``rl_zoo3.enjoy`` but not
# declared by rl_zoo3, see setup.py)
ZOO_MODULES = ("rl_zoo3", "optuna", "yaml", "huggingface_sb3", "sb3_contrib", "requests")


class ZooNotInstalledError(ImportError):
    """The RL Zoo (or one of the packages of the ``zoo`` extra) is not installed."""


def missing_zoo_message(missing: str | None = None) -> str:
    """
    The one-line message shown when the zoo is missing.

    :param missing: Name of the module that could not be imported
    :return: The message
    """
    what = f" (missing module: {missing})" if missing else ""
    return (
        f"sb3_ppg's train/enjoy commands need the RL Baselines3 Zoo{what}: "
        f'install the extra with `pip install -e ".[{ZOO_EXTRA}]"` in the sb3-ppg folder '
        f'(or `pip install "<path to sb3-ppg>[{ZOO_EXTRA}]"`)'
    )


def import_zoo() -> None:
    """
    Import the RL Zoo modules used by :func:`register_zoo`.

    :raises ZooNotInstalledError: when the zoo or one of its dependencies is missing
    """
    for module_name in (*ZOO_MODULES, "rl_zoo3.utils", "rl_zoo3.exp_manager", "rl_zoo3.hyperparams_opt", "rl_zoo3.train"):
        try:
            importlib.import_module(module_name)
        except ImportError as error:
            missing = error.name or module_name
            raise ZooNotInstalledError(missing_zoo_message(missing)) from error


@contextlib.contextmanager
def command_line_threads(argv: list[str]) -> Iterator[int]:
    """
    Within the context, torch uses the threads chosen for a command (``train``, ``enjoy``, the quick start), said in
    one line (by rank 0 only under torchrun): the zoo's ``--num-threads N`` where given, else ``OMP_NUM_THREADS``
    where set (a valid count; an invalid one is warned about), else
    :func:`sb3_ppg.common.threads.default_num_threads`. Procgen's worker threads follow (see
    :class:`~sb3_ppg.cli.vec_env.ProcgenVecEnvFactory`). On leaving it, torch has its previous number of threads
    (for a caller of ``main()`` in its own process). ``-h`` / ``--help`` change nothing.

    :param argv: The command's arguments
    :return: The number of torch threads
    """
    previous = torch.get_num_threads()
    if "-h" in argv or "--help" in argv:
        yield previous
        return
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--num-threads", dest="num_threads", type=int, default=None)
    known, _ = parser.parse_known_args(argv)
    num_threads, reason = choose_torch_threads(known.num_threads)
    if os.environ.get("RANK", "0") == "0":
        print(f"torch and procgen threads: {num_threads} ({reason}; --num-threads N to choose)")
    try:
        yield num_threads
    finally:
        torch.set_num_threads(previous)


# ----------------------------------------------------------------------------------------------------------------------
# Experiment manager


def make_experiment_manager(*args: Any, **kwargs: Any) -> "ExperimentManager":
    """
    Create the zoo's experiment manager adjusted for PPG (:class:`sb3_ppg.cli.experiment_manager.PPGExperimentManager`):
    Procgen evaluated with sampled actions on the native ``ProcgenVecEnv``, PPG checkpoints for ``--save-freq``,
    ``--resume``.

    :param args: Positional arguments of ``ExperimentManager``
    :param kwargs: Keyword arguments of ``ExperimentManager``, plus ``resume``, ``keep_checkpoints`` and
        ``global_n_envs`` of ``PPGExperimentManager``
    :return: The experiment manager
    """
    from sb3_ppg.cli.experiment_manager import PPGExperimentManager

    return PPGExperimentManager(*args, **kwargs)


# ----------------------------------------------------------------------------------------------------------------------
# Optuna


def convert_ppg_params(sampled_params: dict[str, Any]) -> dict[str, Any]:
    """
    Turn the values sampled by :func:`sample_ppg_params` (as stored in an Optuna study) into PPG arguments.

    :param sampled_params: Sampled values
    :return: PPG keyword arguments (``policy_kwargs`` included)
    """
    hyperparams = dict(sampled_params)
    hyperparams["gamma"] = 1.0 - hyperparams.pop("one_minus_gamma")
    hyperparams["gae_lambda"] = 1.0 - hyperparams.pop("one_minus_gae_lambda")
    for name in ("batch_size", "n_steps"):
        if f"{name}_pow" in hyperparams:
            hyperparams[name] = 2 ** hyperparams.pop(f"{name}_pow")
    net_arch = {
        "tiny": [64],
        "small": [64, 64],
        "medium": [256, 256],
    }[hyperparams.pop("net_arch")]
    activation_fn = {"tanh": nn.Tanh, "relu": nn.ReLU}[hyperparams.pop("activation_fn")]
    arch = hyperparams.pop("arch")
    hyperparams["policy_kwargs"] = {
        # "detach" and "shared" have a single network: the value head sits on the policy latent
        "net_arch": dict(pi=net_arch, vf=net_arch) if arch == "dual" else net_arch,
        "activation_fn": activation_fn,
        "arch": arch,
    }
    return hyperparams


def sample_ppg_params(trial: "optuna.Trial", n_actions: int, n_envs: int, additional_args: dict[str, Any]) -> dict[str, Any]:
    """
    Optuna sampler for PPG (``python -m sb3_ppg.train -optimize``): PPO's policy-phase search space plus the
    auxiliary phase (N_pi, E_aux, beta_clone) and the network architecture (dual / detach / shared).

    :param trial: Optuna trial
    :param n_actions: Size of a continuous action space (unused)
    :param n_envs: Number of environments (used to cap the minibatch size at the rollout size)
    :param additional_args: Extra zoo arguments (unused)
    :return: PPG keyword arguments
    """
    sampled_params = {
        # 2**5 = 32 to 2**10 = 1024
        "batch_size_pow": trial.suggest_int("batch_size_pow", 5, 10),
        # 2**5 = 32 to 2**11 = 2048 steps per env
        "n_steps_pow": trial.suggest_int("n_steps_pow", 5, 11),
        "one_minus_gamma": trial.suggest_float("one_minus_gamma", 0.0001, 0.03, log=True),
        "one_minus_gae_lambda": trial.suggest_float("one_minus_gae_lambda", 0.001, 0.1, log=True),
        "learning_rate": trial.suggest_float("learning_rate", 1e-5, 3e-3, log=True),
        "ent_coef": trial.suggest_float("ent_coef", 1e-8, 0.1, log=True),
        "clip_range": trial.suggest_categorical("clip_range", [0.1, 0.2, 0.3]),
        "n_epochs": trial.suggest_categorical("n_epochs", [1, 2, 4, 8]),
        "max_grad_norm": trial.suggest_float("max_grad_norm", 0.3, 5.0, log=True),
        "n_policy_iters": trial.suggest_categorical("n_policy_iters", [1, 2, 4, 8, 16, 32]),
        "n_aux_epochs": trial.suggest_categorical("n_aux_epochs", [1, 2, 3, 6, 9]),
        "beta_clone": trial.suggest_float("beta_clone", 0.1, 10.0, log=True),
        "net_arch": trial.suggest_categorical("net_arch", ["tiny", "small", "medium"]),
        "activation_fn": trial.suggest_categorical("activation_fn", ["tanh", "relu"]),
        "arch": trial.suggest_categorical("arch", ["dual", "detach", "shared"]),
    }
    hyperparams = convert_ppg_params(sampled_params)
    # A minibatch cannot be larger than the rollout
    hyperparams["batch_size"] = min(hyperparams["batch_size"], hyperparams["n_steps"] * max(n_envs, 1))
    trial.set_user_attr("gamma", hyperparams["gamma"])
    trial.set_user_attr("n_steps", hyperparams["n_steps"])
    trial.set_user_attr("batch_size", hyperparams["batch_size"])
    return hyperparams


def register_envs() -> None:
    """Register the Procgen ids (``procgen/<game>-v0``), ``sb3_ppg/DictCartPole-v1`` and the invalid-action envs (once)."""
    register_procgen_envs()
    register_dict_cartpole()
    register_invalid_action_envs()


# ----------------------------------------------------------------------------------------------------------------------


def register_zoo(fallback_vec_env_cls: type[VecEnv] | None = None) -> None:
    """
    Make PPG and sb3_ppg's envs available to the RL Zoo (see the module docstring), for the rest of the process (the
    command line's :func:`run_zoo` registers them for its run only: :func:`zoo_registered`). Safe to call several times.

    :param fallback_vec_env_cls: ``VecEnv`` class used by ``ExperimentManager.default_vec_env_cls`` for non-Procgen
        envs (see :class:`~sb3_ppg.cli.vec_env.ProcgenVecEnvFactory`); training overrides it with the ``--vec-env``
        choice
    :raises ZooNotInstalledError: when the zoo is not installed
    """
    import_zoo()
    import rl_zoo3.train
    from rl_zoo3 import hyperparams_opt
    from rl_zoo3.exp_manager import ExperimentManager
    from rl_zoo3.utils import ALGOS

    register_envs()
    for name, algorithm in PPG_ALGORITHMS.items():
        ALGOS[name] = algorithm
        hyperparams_opt.HYPERPARAMS_SAMPLER[name] = sample_ppg_params
        if hasattr(hyperparams_opt, "HYPERPARAMS_CONVERTER"):
            hyperparams_opt.HYPERPARAMS_CONVERTER[name] = convert_ppg_params
    # A callable instance (not a function), so no staticmethod is needed on the class attribute
    ExperimentManager.default_vec_env_cls = ProcgenVecEnvFactory(fallback_vec_env_cls)  # type: ignore[assignment]
    rl_zoo3.train.ExperimentManager = make_experiment_manager  # type: ignore[assignment, misc]


@contextlib.contextmanager
def zoo_registered(**manager_kwargs: Any) -> Iterator[None]:
    """
    Within the context, the zoo knows PPG (:func:`register_zoo`) and its ``train`` builds the experiment manager with
    ``manager_kwargs``; on leaving it, the zoo's registries hold what they held before (the gymnasium ids stay
    registered: registering them is harmless and permanent in gymnasium).

    :param manager_kwargs: extra arguments of :class:`~sb3_ppg.cli.experiment_manager.PPGExperimentManager`
    :raises ZooNotInstalledError: when the zoo is not installed
    """
    import_zoo()
    import rl_zoo3.train
    from rl_zoo3 import hyperparams_opt
    from rl_zoo3.exp_manager import ExperimentManager
    from rl_zoo3.utils import ALGOS

    registries = [ALGOS, hyperparams_opt.HYPERPARAMS_SAMPLER, getattr(hyperparams_opt, "HYPERPARAMS_CONVERTER", {})]
    saved_entries = [{name: registry.get(name) for name in PPG_ALGORITHMS} for registry in registries]
    saved_vec_env_cls, saved_manager = ExperimentManager.default_vec_env_cls, rl_zoo3.train.ExperimentManager
    try:
        register_zoo()
        if manager_kwargs:
            rl_zoo3.train.ExperimentManager = functools.partial(make_experiment_manager, **manager_kwargs)  # type: ignore[assignment, misc]
        yield
    finally:
        for registry, entries in zip(registries, saved_entries, strict=True):
            for name, entry in entries.items():
                if entry is None:
                    registry.pop(name, None)
                else:
                    registry[name] = entry
        ExperimentManager.default_vec_env_cls = saved_vec_env_cls
        rl_zoo3.train.ExperimentManager = saved_manager  # type: ignore[misc]


def run_zoo(command: str, zoo_argv: list[str], **manager_kwargs: Any) -> None:
    """
    Run one of the zoo's command line programs on the given arguments, with PPG registered in the zoo for the run
    (:func:`zoo_registered`): the zoo's registries and ``sys.argv`` (which the zoo's ``train()`` / ``enjoy()`` read)
    are put back after it. A missing zoo exits with the one-line message of :func:`missing_zoo_message`, as the zoo's
    own command line errors exit. The zoo's ``enjoy`` reads the run folder's ``config.yml`` and ``args.yml`` with
    :class:`sb3_ppg.cli.run_folders.RunFileLoader` (no code runs) instead of ``yaml.UnsafeLoader``, and plays
    MaskablePPG models with the masks of its env (:func:`sb3_ppg.cli.masked_play.zoo_plays_with_masks`).

    :param command: ``"train"`` (``rl_zoo3.train.train``), ``"enjoy"`` (``rl_zoo3.enjoy.enjoy``) or ``"record_video"``
        (the script ``rl_zoo3.record_video``, which plays as ``enjoy`` does and records a video)
    :param zoo_argv: The zoo's command line arguments (without the program name)
    :param manager_kwargs: ``train`` only: extra arguments of the experiment manager (``resume``,
        ``keep_checkpoints``, ``global_n_envs``, see :class:`sb3_ppg.cli.experiment_manager.PPGExperimentManager`)
    """
    if command not in ("train", "enjoy", "record_video"):
        raise ValueError(f"Unknown zoo command {command!r}, expected 'train', 'enjoy' or 'record_video'")
    if manager_kwargs and command != "train":
        raise ValueError(f"{', '.join(manager_kwargs)}: options of the train command only")
    try:
        import_zoo()
    except ZooNotInstalledError as error:
        sys.exit(str(error))
    from sb3_ppg.cli.masked_play import zoo_plays_with_masks
    from sb3_ppg.cli.run_folders import zoo_reads_run_files_safely

    plays = command in ("enjoy", "record_video")
    saved_argv = sys.argv
    sys.argv = [f"python -m sb3_ppg.{'enjoy' if plays else command}", *zoo_argv]
    try:
        with (
            zoo_registered(**manager_kwargs),
            zoo_reads_run_files_safely() if plays else contextlib.nullcontext(),
            zoo_plays_with_masks() if plays else contextlib.nullcontext(),
        ):
            if command == "record_video":
                # The zoo's record_video is a script (its code runs under ``if __name__ == "__main__"``)
                runpy.run_module("rl_zoo3.record_video", run_name="__main__")
            else:
                getattr(importlib.import_module(f"rl_zoo3.{command}"), command)()
    finally:
        sys.argv = saved_argv
