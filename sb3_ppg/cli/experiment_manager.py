"""
The RL Zoo's ``ExperimentManager`` adjusted for PPG (:class:`PPGExperimentManager`): what ``python -m sb3_ppg.train``
runs (native Procgen envs, PPG's checkpoints and evaluations, ``--resume``, atomic writes, torchrun; see
docs/command_line.md). This module imports ``rl_zoo3``; :mod:`sb3_ppg.cli.zoo` imports it only once it is installed.
"""

import copy
import datetime
import os
import pathlib
import pickle
import warnings
from collections import OrderedDict
from pprint import pprint
from typing import Any, NamedTuple

import torch
from rl_zoo3.callbacks import SaveVecNormalizeCallback
from rl_zoo3.exp_manager import ExperimentManager
from rl_zoo3.utils import get_latest_run_id
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback, CheckpointCallback, EvalCallback, ProgressBarCallback
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecEnv

from sb3_ppg.cli.algorithms import PPG_ALGORITHMS
from sb3_ppg.cli.curves import cut_monitor_log
from sb3_ppg.cli.run_folders import (
    CHECKPOINT_PREFIX,
    CHECKPOINTS_FOLDER,
    INTERRUPTED_SUFFIX,
    RESUME_LATEST,
    RUN_ARGS,
    RUN_CONFIG,
    TrainingInterrupted,
    read_run_file,
)
from sb3_ppg.cli.threads import threads_for_resume
from sb3_ppg.cli.vec_env import ProcgenVecEnvFactory, is_procgen_env_id
from sb3_ppg.common import distributed
from sb3_ppg.common.array_files import atomic_write
from sb3_ppg.common.callbacks import PPGEvalCallback, env_step_calls
from sb3_ppg.common.checkpoints import (
    MANIFEST,
    CheckpointDamagedError,
    PPGCheckpointCallback,
    complete_checkpoints,
    find_checkpoint,
    lock_folder,
    rank_folder,
    read_monitor_log_sizes,
    read_torch_threads,
)
from sb3_ppg.common.data_parallel import GlobalProgressBarCallback
from sb3_ppg.common.hyperparameters import is_integer
from sb3_ppg.common.progress_bar import AuxPhaseLinesCallback, PPGProgressBarCallback
from sb3_ppg.ppg_mask.callbacks import MaskablePPGEvalCallback

#: How long the ranks of a torchrun job wait for rank 0's evaluation (instead of the training collectives' timeout)
EVALUATION_TIMEOUT = datetime.timedelta(days=1)


def find_resume_point(path: str) -> tuple[pathlib.Path, pathlib.Path | None]:
    """
    The run folder and the checkpoint that ``--resume <path>`` names, the run's checkpoints folder locked first and the
    checkpoint verified completely (damaged ones skipped with a warning; see docs/command_line.md).

    :param path: A checkpoint folder, a run's ``checkpoints`` folder, or a run folder
    :return: (run folder, the newest complete checkpoint that verifies, or None when the run has none yet)
    """
    folder = pathlib.Path(path)
    if (folder / MANIFEST).is_file():
        lock_folder(folder.parent)
        find_checkpoint(folder)  # raises when it is damaged
        return folder.parent.parent, folder
    if folder.name == CHECKPOINTS_FOLDER and folder.is_dir():
        folder = folder.parent
    if not folder.is_dir():
        raise FileNotFoundError(f"--resume {path}: no such run or checkpoint folder.")
    checkpoints = folder / CHECKPOINTS_FOLDER
    if not checkpoints.is_dir():
        if not list(folder.glob("*.monitor.csv")):
            raise FileNotFoundError(
                f"--resume {path}: not a run folder of python -m sb3_ppg.train (it has no {CHECKPOINTS_FOLDER}/ folder "
                "and no episode log), nor a checkpoint."
            )
        return folder, None
    lock_folder(checkpoints)
    found, skipped = find_checkpoint(checkpoints)
    if found is None and not skipped:  # no complete checkpoint yet
        return folder, None
    if found is None:
        raise CheckpointDamagedError(
            f"--resume {path}: no checkpoint of {str(checkpoints)!r} verifies, every one is damaged: {'; '.join(skipped)}"
        )
    if skipped:
        warnings.warn(
            f"--resume: continuing from {found[0].name}, the newest checkpoint that verifies; skipped the damaged "
            f"newer ones: {'; '.join(skipped)}",
            stacklevel=2,
        )
    return folder, found[0]


def warn_one_minibatch(n_envs: int, n_steps: int, batch_size: int, policy_minibatches: str) -> None:
    """
    Warn when ``-params n_envs:N`` leaves the config's ``batch_size`` covering the whole rollout: one minibatch per
    epoch, whose gradient step starts from the policy that collected the rollout (approx_kl and clip_fraction 0 with
    one epoch), naming a ``batch_size`` that gives 8 minibatches.

    :param n_envs: The envs of this process
    :param n_steps: Steps per env and rollout
    :param batch_size: The config's policy-phase minibatch size
    :param policy_minibatches: ``"transitions"`` or ``"envs"`` (minibatches of whole env rollouts)
    """
    rollout_size = n_envs * n_steps
    if batch_size < rollout_size:
        return
    if policy_minibatches == "envs":  # minibatches of whole env rollouts: one env's is the smallest
        suggested = -(-n_envs // 8) * n_steps if n_envs > 1 else None
    else:
        suggested = max(1, rollout_size // 8)
    fix = "" if suggested is None else f"-params batch_size:{suggested} ({rollout_size // suggested} minibatches) or "
    warnings.warn(
        f"-params n_envs:{n_envs} leaves the config's batch_size={batch_size}, which covers the whole rollout (n_steps "
        f"* n_envs = {n_steps} * {n_envs} = {rollout_size}): each epoch makes one gradient step, from the policy that "
        f"collected the rollout, so with n_epochs=1 approx_kl and clip_fraction stay 0 in the logs. Add {fix}"
        "-params batch_size:None (8 minibatches per rollout, following n_envs).",
        stacklevel=2,
    )


class ResumedRun(NamedTuple):
    """What a run resumed from a checkpoint used: read from its ``config.yml`` and ``args.yml``."""

    #: The run's hyperparameters (its ``config.yml``: the hyperparameter file's entry with its ``-params``)
    hyperparams: dict[str, Any]
    #: The command line options of its first start (its ``args.yml``)
    args: dict[str, Any]
    #: The folder of both files, ``<run folder>/<env name>``
    params_path: pathlib.Path


def _same_value(a: Any, b: Any) -> bool:
    """Whether two hyperparameter values are equal (False where comparing them fails)."""
    try:
        return bool(a == b)
    except Exception:
        return False


def changed_settings(given: dict[str, Any], used: dict[str, Any]) -> list[str]:
    """The settings a resumed command gives that differ from its run's, as ``<key> (run: ..., command: ...)``."""
    return [
        f"{key} (run: {used[key]!r}, command: {value!r})" if key in used else f"{key} (run: not set, command: {value!r})"
        for key, value in given.items()
        if key not in used or not _same_value(used[key], value)
    ]


def save_vec_normalize(vec_normalize: Any, path: str) -> None:
    """``VecNormalize.save`` (the same pickle), written to a temporary file renamed over ``path``."""
    atomic_write(path, lambda file: pickle.dump(vec_normalize, file))


class AtomicSaveVecNormalizeCallback(SaveVecNormalizeCallback):
    """The zoo's ``SaveVecNormalizeCallback`` (run on each new best evaluation), writing with :func:`save_vec_normalize`."""

    def _on_step(self) -> bool:
        if self.n_calls % self.save_freq == 0:
            vec_normalize = self.model.get_vec_normalize_env()
            if self.name_prefix is not None:
                path = os.path.join(self.save_path, f"{self.name_prefix}_{self.num_timesteps}_steps.pkl")
            else:
                path = os.path.join(self.save_path, "vecnormalize.pkl")
            if vec_normalize is not None:
                save_vec_normalize(vec_normalize, path)
                if self.verbose > 1:
                    print(f"Saving VecNormalize to {path}")
        return True


class WaitForEvaluation(BaseCallback):
    """
    Under torchrun, every rank waits at each evaluation step until rank 0 has evaluated, in a process group of its own
    with ``EVALUATION_TIMEOUT``.

    :param eval_freq: Evaluation frequency, in calls to ``env.step()``
    :param group: A process group of all ranks (``sb3_ppg.common.distributed.new_gloo_group``)
    """

    def __init__(self, eval_freq: int, group: Any):
        super().__init__()
        self.eval_freq = eval_freq
        self.group = group

    def _on_training_start(self) -> None:
        self.n_calls = env_step_calls(self.model)

    def _on_step(self) -> bool:
        if self.n_calls % self.eval_freq == 0:
            distributed.barrier(self.group, "waiting for rank 0's evaluation")
        return True


class PPGExperimentManager(ExperimentManager):
    """
    The zoo's ``ExperimentManager`` (same arguments, plus the three below) with PPG's adjustments (see the module
    docstring).

    :param resume: ``None`` (a new run), ``"latest"`` or the path of a run folder, checkpoints folder or checkpoint: the
        run continues from its newest complete checkpoint, with its own settings (see docs/command_line.md)
    :param keep_checkpoints: Number of complete checkpoints kept (``None``: all)
    :param global_n_envs: Whether the config's ``n_envs`` is the total over the ranks of a torchrun job
    """

    def __init__(
        self,
        *args: Any,
        resume: str | None = None,
        keep_checkpoints: int | None = None,
        global_n_envs: bool = False,
        **kwargs: Any,
    ):
        super().__init__(*args, **kwargs)
        vec_env_type = kwargs.get("vec_env_type", "dummy")
        self.vec_env_class = ProcgenVecEnvFactory(SubprocVecEnv if vec_env_type == "subproc" else DummyVecEnv)  # type: ignore[assignment]
        if is_procgen_env_id(self.env_name.gym_id):
            self.deterministic_eval = False
        self.keep_checkpoints = keep_checkpoints
        self.global_n_envs = global_n_envs
        self.resume_checkpoint: pathlib.Path | None = None
        self.resumed_run: ResumedRun | None = None
        # Whether Ctrl-C stopped training, and whether a resumed run had nothing left to train
        self.interrupted = False
        self.already_complete = False
        # Data-parallel PPG (torchrun): the ranks share rank 0's run folder
        self.data_parallel = distributed.is_active() and self.algo in PPG_ALGORITHMS
        self.rank = distributed.get_rank() if self.data_parallel else 0
        self.world_size = distributed.get_world_size() if self.data_parallel else 1
        if self.data_parallel:
            self._share_run_folder(resume)
        elif resume is not None:
            self._apply_resume(*self._resume_point(resume))

    @property
    def monitor_folder(self) -> str:
        """Where this process writes its episode log: the run folder (rank 0), ``<run folder>/rank_<r>`` (rank r)."""
        return self.save_path if self.rank == 0 else os.path.join(self.save_path, rank_folder(self.rank))

    def _share_run_folder(self, resume: str | None) -> None:
        """Rank 0 chooses the run folder (a new one, or the one to resume) and the other ranks take it."""
        choice: Any = None
        if self.rank == 0:
            try:
                choice = (self.save_path, *(self._resume_point(resume) if resume is not None else (None, None, None)))
            except Exception as error:
                choice = error
        choice = distributed.broadcast_object(choice)
        if isinstance(choice, Exception):
            raise choice
        self.save_path, run_folder, checkpoint, resumed_run = choice
        self.params_path = f"{self.save_path}/{self.env_name}"
        self._apply_resume(run_folder, checkpoint, resumed_run)

    def _find_resume_point(self, resume: str) -> tuple[pathlib.Path | None, pathlib.Path | None]:
        """The run folder to continue (None: a new run) and its newest complete checkpoint (None: none yet)."""
        if self.algo not in PPG_ALGORITHMS:
            raise ValueError(f"--resume continues PPG runs (PPGCheckpointCallback checkpoints), not --algo {self.algo}.")
        if self.continue_training:
            raise ValueError("--resume and -i/--trained-agent both say where to start from: pass only one.")
        if resume == RESUME_LATEST:
            run_id = get_latest_run_id(self.log_path, self.env_name)
            if run_id == 0:
                print(f"--resume: no run of {self.env_name} in {self.log_path} yet, starting a new one.")
                return None, None
            return find_resume_point(os.path.join(self.log_path, f"{self.env_name}_{run_id}"))
        return find_resume_point(resume)

    def _resume_point(self, resume: str) -> tuple[pathlib.Path | None, pathlib.Path | None, ResumedRun | None]:
        """The run folder to continue (None: a new run), its checkpoint (None: none yet) and what the run used."""
        run_folder, checkpoint = self._find_resume_point(resume)
        if run_folder is None:
            return None, None, None
        return run_folder, checkpoint, self._check_resumed_run(resume, run_folder, checkpoint)

    def _check_resumed_run(self, resume: str, run_folder: pathlib.Path, checkpoint: pathlib.Path | None) -> ResumedRun | None:
        """
        Check that the command continues the run it names, as it started: the same ``--env``, and the same ``-params`` and
        ``--env-kwargs`` as far as the command gives them (``-n`` may change).

        :return: What the run used (None when it starts over)
        """
        option = "--resume" if resume == RESUME_LATEST else f"--resume {resume}"
        gym_id = self.env_name.gym_id
        params_path = run_folder / str(self.env_name)
        # The run's args.yml: in <run>/<env name>/, or that of another env
        args_files = sorted(run_folder.glob(f"*/{RUN_ARGS}"), key=lambda path: (path.parent != params_path, path))
        run_args: dict[str, Any] = read_run_file(args_files[0]) if args_files else {}
        if args_files and run_args.get("env") != gym_id:
            raise ValueError(
                f"{option}: {run_folder} is a run of {run_args.get('env')!r} ({args_files[0]}), not of "
                f"--env {gym_id}. Pass --env {run_args.get('env')} to continue it, or leave out --resume to start a new "
                f"{gym_id} run."
            )
        if not args_files and checkpoint is None and not run_folder.name.startswith(f"{self.env_name}_"):
            raise ValueError(
                f"{option}: {run_folder} is not a run folder of --env {gym_id} (the command line names them "
                f"{self.env_name}_<id>). Leave out --resume to start a new run."
            )
        if checkpoint is None:
            return None
        if not args_files or checkpoint.parent != run_folder / CHECKPOINTS_FOLDER:
            raise ValueError(
                f"{option}: {checkpoint} is not a checkpoint of a python -m sb3_ppg.train run (those are in "
                f"<run folder>/{CHECKPOINTS_FOLDER}/, next to <run folder>/<env>/{RUN_ARGS}), and the command line writes "
                "only into its own run folders. Continue it from Python: model = PPG.load_checkpoint(path, env=env), "
                "then model.learn(total_timesteps - model.num_timesteps, reset_num_timesteps=False, "
                "callback=PPGCheckpointCallback(...)) (see docs/checkpoints.md)."
            )
        config_file = params_path / RUN_CONFIG
        if not config_file.is_file():
            raise ValueError(
                f"{option}: {config_file} is missing: the run's hyperparameters are unknown, so the command "
                f"cannot continue it as it started (restore the file, or continue {checkpoint} from Python with "
                "PPG.load_checkpoint, see docs/checkpoints.md)."
            )
        resumed_run = ResumedRun(read_run_file(config_file), run_args, params_path)
        # The seed too: evaluations are seeded with it (without --seed, the command passes the run's: see train.py)
        run_seed = run_args.get("seed")
        other_seed = [f"(run: {run_seed}, command: {self.seed})"] if is_integer(run_seed) and run_seed != self.seed else []
        changes = [
            f"{option} {', '.join(changed)}"
            for option, changed in (
                ("-params", changed_settings(self.custom_hyperparams or {}, resumed_run.hyperparams)),
                ("--env-kwargs", changed_settings(self.env_kwargs, run_args.get("env_kwargs") or {})),
                ("--seed", other_seed),
            )
            if changed
        ]
        if changes:
            raise ValueError(
                f"{option}: a resumed run continues with the settings it started with ({config_file}, "
                f"{RUN_ARGS}), and this command changes them: {'; '.join(changes)}. Pass the run's values (or leave "
                "these options out) to continue the run, or leave out --resume to start a new run with these settings."
            )
        return resumed_run

    def _apply_resume(
        self, run_folder: pathlib.Path | None, checkpoint: pathlib.Path | None, resumed_run: ResumedRun | None = None
    ) -> None:
        """
        Make the resumed run's folder this run's folder, take the run's env settings, and cut this process's
        episode log at the checkpoint.
        """
        if run_folder is None:
            return
        self.save_path = str(run_folder)
        self.params_path = f"{self.save_path}/{self.env_name}"
        if checkpoint is None:
            final_model = run_folder / f"{self.env_name}.zip"
            if final_model.is_file():
                # Starting over would overwrite a finished run's model and episode log
                raise ValueError(
                    f"--resume: the run {run_folder} is finished (its final model {final_model} is saved) and has no "
                    "checkpoint to continue from, so --resume would start it over and overwrite it. Leave out --resume "
                    f"to start a new run (with --save-freq to make it resumable), or train this model further from "
                    f"Python: PPG.load({str(final_model)!r}, env=env).learn(..., reset_num_timesteps=False)."
                )
            print(f"--resume: {run_folder} has no complete checkpoint yet, starting its run over.")
            return
        print(f"--resume: continuing {run_folder} from {checkpoint.name}")
        if resumed_run is not None:
            # The run's settings, as its first start had them (the command's agree where it gives them)
            self.resumed_run = resumed_run
            run_timesteps = resumed_run.args.get("n_timesteps")
            if self.n_timesteps <= 0 and is_integer(run_timesteps) and run_timesteps > 0:
                self.n_timesteps = run_timesteps
            self.env_kwargs = dict(resumed_run.args.get("env_kwargs") or {})
            if self._eval_env_kwargs_args is None:
                self._eval_env_kwargs_args = resumed_run.args.get("eval_env_kwargs")
        self.resume_checkpoint = checkpoint
        num_threads = threads_for_resume(read_torch_threads(checkpoint), getattr(self.args, "num_threads", None))
        if num_threads is not None:
            chosen = torch.get_num_threads()
            torch.set_num_threads(num_threads)  # command_line_threads puts torch's back afterwards
            instead = f" instead of {chosen}" if chosen != num_threads else ""
            print(f"torch and procgen threads: {num_threads}{instead} (the run's own, for an exact resume)")
        # The zoo then loads the model instead of creating one (see _load_pretrained_agent)
        self.continue_training = True
        self.trained_agent = str(checkpoint / "model.zip")
        # Episodes logged after the checkpoint are played again: cut the logs where the checkpoint left them
        for name, size in read_monitor_log_sizes(checkpoint).items():
            log = pathlib.Path(self.monitor_folder) / os.path.basename(name)
            if log.is_file():
                cut_monitor_log(log, size, checkpoint)

    def read_hyperparameters(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """
        The zoo's, with ``--env-kwargs`` set over the file's ``env_kwargs`` instead of replacing them; a run resumed from a
        checkpoint reads its own ``config.yml``.
        """
        if self.resumed_run is None:
            command_env_kwargs, self.env_kwargs = self.env_kwargs, {}
            try:
                hyperparams, saved_hyperparams = super().read_hyperparameters()
            finally:
                self.env_kwargs = command_env_kwargs
            if command_env_kwargs and isinstance(hyperparams.get("env_kwargs"), dict):
                self.env_kwargs = {**hyperparams["env_kwargs"], **command_env_kwargs}
                hyperparams["env_kwargs"] = saved_hyperparams["env_kwargs"] = self.env_kwargs
            return hyperparams, saved_hyperparams
        # The env_kwargs the run used are in its config.yml (those of a file without env_kwargs: self.env_kwargs,
        # the run's --env-kwargs, see _apply_resume)
        hyperparams = copy.deepcopy(self.resumed_run.hyperparams)
        saved_hyperparams = OrderedDict([(key, hyperparams[key]) for key in sorted(hyperparams)])
        print(f"--resume: the run's hyperparameters, from {self.resumed_run.params_path / RUN_CONFIG}:")
        pprint(saved_hyperparams)
        return hyperparams, saved_hyperparams

    def _preprocess_hyperparams(self, hyperparams: dict[str, Any]) -> Any:
        """
        The zoo's, with a clear error for an ``n_envs`` that is not a positive integer, and the evaluation env's
        settings completed with the training env's; with ``global_n_envs``, ``n_envs`` becomes this rank's share of
        the config's.
        """
        n_envs = hyperparams.get("n_envs", 1)
        if not is_integer(n_envs) or n_envs < 1:
            raise ValueError(
                f"n_envs must be an integer >= 1 (the number of environments trained on), got {n_envs!r}: fix "
                f"-params n_envs:... or the n_envs of {self.env_name.gym_id} in {self.config}."
            )
        n_steps, batch_size = hyperparams.get("n_steps"), hyperparams.get("batch_size")
        policy_minibatches = hyperparams.get("policy_minibatches", "transitions")
        processed = super()._preprocess_hyperparams(hyperparams)
        # The evaluation env: the training env's settings with --eval-env-kwargs over them (the zoo evaluated with
        # none when the file sets env_kwargs and the command does not: the easy preset in hard mode)
        self.eval_env_kwargs = {**self.env_kwargs, **(self._eval_env_kwargs_args or {})}
        if self.global_n_envs:
            try:
                self.n_envs = distributed.local_n_envs(self.n_envs)
            except ValueError as error:
                raise ValueError(f"--global-n-envs: {error}") from None
            if self.verbose > 0:
                print(f"--global-n-envs: {self.n_envs} environments on each of the {self.world_size} ranks")
        overrides = self.custom_hyperparams or {}
        if "n_envs" in overrides and "batch_size" not in overrides and is_integer(n_steps) and is_integer(batch_size):
            warn_one_minibatch(self.n_envs, n_steps, batch_size, policy_minibatches)
        return processed

    def create_log_folder(self) -> None:
        """The zoo's; under torchrun, rank 0 alone writes the run folder's files."""
        if self.rank == 0:
            super().create_log_folder()

    def _save_config(self, saved_hyperparams: dict[str, Any]) -> None:
        """
        The zoo's; under torchrun, on rank 0 only. A run resumed from a checkpoint keeps the files of its first start
        (``config.yml``, ``args.yml``, ``command.txt``), which describe it.
        """
        if self.resumed_run is not None:
            print(f"Log path: {self.save_path} (resumed: its {RUN_CONFIG} and {RUN_ARGS} are kept)")
        elif self.rank == 0:
            # args.yml records the env_kwargs the run used (--env-kwargs set over the file's), which enjoy then uses
            if getattr(self.args, "env_kwargs", None) is not None:
                self.args.env_kwargs = self.env_kwargs
            super()._save_config(saved_hyperparams)

    def save_trained_model(self, model: BaseAlgorithm) -> None:
        """
        The zoo's, ``vecnormalize.pkl`` written atomically, on rank 0 only; nothing for a resumed run already complete.
        After Ctrl-C, ``<env>_interrupted.zip`` and :class:`~sb3_ppg.cli.run_folders.TrainingInterrupted`.
        """
        if self.already_complete:
            return
        if self.interrupted:
            self._save_interrupted_model(model)
        if self.rank != 0:
            return
        normalize, self.normalize = self.normalize, False
        try:
            # The zoo's, without its in-place VecNormalize.save
            super().save_trained_model(model)
        finally:
            self.normalize = normalize
        vec_normalize = model.get_vec_normalize_env()
        if self.normalize and vec_normalize is not None:
            save_vec_normalize(vec_normalize, os.path.join(self.params_path, "vecnormalize.pkl"))
        # A model saved by an earlier Ctrl-C of this run is superseded by the final one
        interrupted_model = pathlib.Path(self.save_path) / f"{self.env_name}{INTERRUPTED_SUFFIX}.zip"
        interrupted_model.unlink(missing_ok=True)

    def _save_interrupted_model(self, model: BaseAlgorithm) -> None:
        """
        Save the model as Ctrl-C left it (rank 0), as ``<run folder>/<env>_interrupted.zip``, and raise
        :class:`~sb3_ppg.cli.run_folders.TrainingInterrupted`.
        """
        saved_model = None
        if self.rank == 0:
            saved_model = os.path.join(self.save_path, f"{self.env_name}{INTERRUPTED_SUFFIX}.zip")
            model.save(saved_model)
        checkpoints = complete_checkpoints(pathlib.Path(self.save_path) / CHECKPOINTS_FOLDER)
        raise TrainingInterrupted(
            run_folder=self.save_path,
            num_timesteps=model.num_timesteps,
            total_timesteps=self.n_timesteps,
            saved_model=saved_model,
            newest_checkpoint=str(checkpoints[-1]) if checkpoints else None,
        )

    def create_envs(self, n_envs: int, eval_env: bool = False, no_log: bool = False) -> VecEnv:
        """
        The zoo's ``create_envs``; a resumed run's episode logs are appended to instead of started anew, and rank
        ``r > 0`` of a torchrun job logs its episodes into ``<run folder>/rank_<r>/``.
        """
        if self.resume_checkpoint is not None and not (eval_env or no_log):
            self.monitor_kwargs = {**self.monitor_kwargs, "override_existing": False}
        if self.rank == 0 or eval_env or no_log:
            return super().create_envs(n_envs, eval_env=eval_env, no_log=no_log)
        # The zoo logs the training envs into save_path
        run_folder = self.save_path
        self.save_path = self.monitor_folder
        try:
            return super().create_envs(n_envs, eval_env=eval_env, no_log=no_log)
        finally:
            self.save_path = run_folder

    def create_callbacks(self) -> None:
        """
        The zoo's callbacks, with PPG's checkpoint and evaluation callbacks in place of SB3's. Under torchrun, every
        rank gets the checkpoint callback, rank 0 alone the evaluation callback and the progress bar (which counts
        the steps of all ranks), and the frequencies count the env steps of all ranks.
        """
        save_freq, eval_freq = self.save_freq, self.eval_freq
        if self.rank > 0:
            self.eval_freq = 0
            self.show_progress = False
        super().create_callbacks()
        if self.algo not in PPG_ALGORITHMS:
            return
        # MaskablePPG is evaluated with the eval env's action masks
        eval_callback_class = MaskablePPGEvalCallback if self.algo == "maskable_ppg" else PPGEvalCallback
        # Calls to env.step() per frequency: the env steps of all ranks, as the zoo counts them in one process
        steps_per_call = self.n_envs * self.world_size
        eval_calls = max(eval_freq // steps_per_call, 1)
        for index, callback in enumerate(self.callbacks):
            if type(callback) is CheckpointCallback:
                self.callbacks[index] = PPGCheckpointCallback(
                    save_freq=max(save_freq // steps_per_call, 1),
                    save_path=os.path.join(self.save_path, CHECKPOINTS_FOLDER),
                    name_prefix=CHECKPOINT_PREFIX,
                    verbose=2 if self.verbose > 0 else 0,
                    keep_last=self.keep_checkpoints,
                )
            elif type(callback) is EvalCallback:
                on_new_best = callback.callback_on_new_best
                if type(on_new_best) is SaveVecNormalizeCallback:
                    on_new_best = AtomicSaveVecNormalizeCallback(
                        on_new_best.save_freq, on_new_best.save_path, on_new_best.name_prefix, on_new_best.verbose
                    )
                self.callbacks[index] = eval_callback_class(
                    callback.eval_env,
                    callback_on_new_best=on_new_best,
                    callback_after_eval=callback.callback,
                    n_eval_episodes=callback.n_eval_episodes,
                    eval_freq=eval_calls,
                    log_path=os.path.dirname(callback.log_path) if callback.log_path else None,
                    best_model_save_path=callback.best_model_save_path,
                    deterministic=callback.deterministic,
                    render=callback.render,
                    verbose=callback.verbose,
                    warn=callback.warn,
                    seed=self.seed,
                )
            elif type(callback) is ProgressBarCallback:
                # PPG's, which shows the auxiliary phases (all ranks' steps under torchrun)
                self.callbacks[index] = GlobalProgressBarCallback() if self.data_parallel else PPGProgressBarCallback()
        if not self.show_progress and self.verbose > 0 and self.rank == 0:
            # Without the progress bar, a line per auxiliary phase and epoch (no table is printed meanwhile)
            self.callbacks.append(AuxPhaseLinesCallback())
        if self.data_parallel and eval_freq > 0 and not self.optimize_hyperparameters:
            group = distributed.new_gloo_group(EVALUATION_TIMEOUT)
            self.callbacks.append(WaitForEvaluation(eval_calls, group))

    def _load_pretrained_agent(self, hyperparams: dict[str, Any], env: VecEnv) -> BaseAlgorithm:
        """
        Resuming: the model of the checkpoint, with its run state. The run's own hyperparameters are kept (those
        of the config are not applied over them: a resumed run continues the same run).
        """
        if self.resume_checkpoint is None:
            return super()._load_pretrained_agent(hyperparams, env)
        return PPG_ALGORITHMS[self.algo].load_checkpoint(
            self.resume_checkpoint, env=env, device=self.device, tensorboard_log=self.tensorboard_log, verbose=self.verbose
        )

    def learn(self, model: BaseAlgorithm) -> None:
        """
        The zoo's ``learn`` for PPG, which remembers a Ctrl-C (:meth:`save_trained_model` then saves the model as
        interrupted); a resumed run trains the timesteps it has left, continuing its step count (and TensorBoard run)
        instead of starting from 0.
        """
        if self.algo not in PPG_ALGORITHMS:
            super().learn(model)
            return
        kwargs: dict[str, Any] = {}
        remaining = self.n_timesteps
        if self.resume_checkpoint is not None:
            remaining = self.n_timesteps - model.num_timesteps
            if remaining <= 0:
                print(f"The run is already complete ({model.num_timesteps} of {self.n_timesteps} timesteps): nothing to train")
                self.already_complete = True
                if model.env is not None:
                    model.env.close()
                return
            kwargs["reset_num_timesteps"] = False
        if self.log_interval > -1:
            kwargs["log_interval"] = self.log_interval
        elif self.log_interval < -1:
            kwargs["log_interval"] = None
        if self.callbacks:
            kwargs["callback"] = self.callbacks
        try:
            model.learn(remaining, **kwargs)
        except KeyboardInterrupt:
            # The zoo then saves the model: as an interrupted one (save_trained_model)
            self.interrupted = True
        finally:
            if self.callbacks:
                self.callbacks[0].on_training_end()
            if model.env is not None:
                model.env.close()
