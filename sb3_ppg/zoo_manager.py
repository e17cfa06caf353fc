"""
The RL Zoo's ``ExperimentManager`` adjusted for PPG (:class:`PPGExperimentManager`): what ``python -m sb3_ppg.train``
runs. This module imports ``rl_zoo3``; :mod:`sb3_ppg.zoo` imports it only once the zoo is known to be installed.

On top of the zoo's behaviour:

- Procgen envs run on the native ``ProcgenVecEnv`` and are evaluated with sampled actions, as in the paper;
- ``--save-freq N`` writes :class:`~sb3_ppg.PPGCheckpointCallback` checkpoints (model, auxiliary buffer, run state)
  into ``<run folder>/checkpoints/`` instead of bare model zips, and evaluations use
  :class:`~sb3_ppg.PPGEvalCallback`, which leaves training's random generators alone;
- ``--resume`` continues a run from its newest checkpoint, in its own run folder: the same parameters, bit for bit
  on CPU, as if the run had never stopped, with its episode log, evaluation log and TensorBoard run continued;
- under torchrun (data-parallel PPG, see docs/scaling_out.md) the job has one run folder, chosen by rank 0: rank 0
  writes the usual files, rank ``r > 0`` its episode log into ``<run folder>/rank_<r>/``, every rank its part of the
  checkpoints; rank 0 alone evaluates (the other ranks wait for it without the training timeout); ``--eval-freq`` and
  ``--save-freq`` count the env steps of all ranks, as ``-n`` does; with ``global_n_envs``, ``n_envs`` is the total
  over the ranks.
"""

import datetime
import os
import pathlib
import warnings
from typing import Any

from rl_zoo3.exp_manager import ExperimentManager
from rl_zoo3.utils import get_latest_run_id
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback, CheckpointCallback, EvalCallback, ProgressBarCallback
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecEnv

from sb3_ppg import distributed
from sb3_ppg.callbacks import PPGCheckpointCallback, PPGEvalCallback, env_step_calls
from sb3_ppg.checkpoints import MANIFEST, CheckpointDamagedError, lock_folder, rank_folder, read_manifest
from sb3_ppg.data_parallel import GlobalProgressBarCallback
from sb3_ppg.ppg import PPG
from sb3_ppg.resume import damaged_error, newest_verified, read_monitor_log_sizes, verify_files
from sb3_ppg.zoo import RESUME_LATEST, ProcgenVecEnvFactory, is_procgen_env_id

#: Sub-folder of a run folder that holds its checkpoints, and their name prefix
CHECKPOINTS_FOLDER = "checkpoints"
CHECKPOINT_PREFIX = "ppg"
#: How long the ranks of a torchrun job wait for rank 0's evaluation (instead of the training collectives' timeout)
EVALUATION_TIMEOUT = datetime.timedelta(days=1)


def find_resume_point(path: str) -> tuple[pathlib.Path, pathlib.Path | None]:
    """
    The run folder and the checkpoint that ``--resume <path>`` names. The run's checkpoints folder is locked first
    (see :func:`~sb3_ppg.checkpoints.lock_folder`): nothing changes it while it is read, and a second job resuming
    the same run stops here. The checkpoint is verified completely (every file against the manifest, every stored
    rollout read); given a run or checkpoints folder, damaged checkpoints are skipped with a warning naming them,
    so that a requeued job continues from the newest checkpoint that verifies instead of failing on every start.

    :param path: A checkpoint folder (``<run>/checkpoints/ppg_<steps>_steps``), a run's ``checkpoints`` folder, or a
        run folder (``<log folder>/ppg/<env>_<id>``)
    :return: (run folder, the newest complete checkpoint that verifies, or None when the run has none yet)
    :raises FileNotFoundError: when ``path`` is none of these
    :raises RuntimeError: when another run is writing into the run's checkpoints folder
    :raises ValueError: when the checkpoint ``path`` is damaged (naming the newest older one that verifies), or no
        checkpoint of the run verifies
    """
    folder = pathlib.Path(path)
    if (folder / MANIFEST).is_file():
        lock_folder(folder.parent)
        try:
            verify_files(folder, read_manifest(folder), full=True)  # type: ignore[arg-type]
        except ValueError as error:
            raise damaged_error(folder, str(error)) from error
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
    found, skipped = newest_verified(checkpoints)
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


class WaitForEvaluation(BaseCallback):
    """
    Under torchrun, at every evaluation step (every ``eval_freq`` calls, as :class:`~sb3_ppg.PPGEvalCallback`),
    every rank waits until rank 0 has evaluated, in a process group of its own whose timeout is
    ``EVALUATION_TIMEOUT`` (the training collectives would otherwise wait for rank 0 within the training timeout).
    Given to every rank, after rank 0's evaluation callback.

    :param eval_freq: Evaluation frequency, in calls to ``env.step()``
    :param group: A process group of all ranks (``sb3_ppg.distributed.new_gloo_group``)
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

    :param resume: ``None`` (a new run), ``"latest"`` (the latest run of this algorithm and env in the log folder) or
        the path of a run folder, checkpoints folder or checkpoint. The run continues from its newest complete
        checkpoint, in its run folder, up to the same total number of timesteps (``-n`` or the config's
        ``n_timesteps``). A run folder without a checkpoint yet (the job stopped before the first one) starts over
        in that folder; ``"latest"`` with no run at all starts a new one, so that a requeued job can always pass
        ``--resume``.
    :param keep_checkpoints: Number of complete checkpoints kept (``None``: all)
    :param global_n_envs: Whether the config's ``n_envs`` is the total over the ranks of a torchrun job (each rank
        runs ``n_envs / world_size`` envs) instead of the number of envs of each rank
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
        # Data-parallel PPG (torchrun): the ranks share rank 0's run folder
        self.data_parallel = distributed.is_active() and self.algo == "ppg"
        self.rank = distributed.get_rank() if self.data_parallel else 0
        self.world_size = distributed.get_world_size() if self.data_parallel else 1
        if self.data_parallel:
            self._share_run_folder(resume)
        elif resume is not None:
            self._apply_resume(*self._find_resume_point(resume))

    @property
    def monitor_folder(self) -> str:
        """Where this process writes its episode log: the run folder (rank 0), ``<run folder>/rank_<r>`` (rank r)."""
        return self.save_path if self.rank == 0 else os.path.join(self.save_path, rank_folder(self.rank))

    def _share_run_folder(self, resume: str | None) -> None:
        """Rank 0 chooses the run folder (a new one, or the one to resume) and the other ranks take it."""
        choice: Any = None
        if self.rank == 0:
            try:
                choice = (self.save_path, *(self._find_resume_point(resume) if resume is not None else (None, None)))
            except Exception as error:
                choice = error
        choice = distributed.broadcast_object(choice)
        if isinstance(choice, Exception):
            raise choice
        self.save_path, run_folder, checkpoint = choice
        self.params_path = f"{self.save_path}/{self.env_name}"
        self._apply_resume(run_folder, checkpoint)

    def _find_resume_point(self, resume: str) -> tuple[pathlib.Path | None, pathlib.Path | None]:
        """The run folder to continue (None: a new run) and its newest complete checkpoint (None: none yet)."""
        if self.algo != "ppg":
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

    def _apply_resume(self, run_folder: pathlib.Path | None, checkpoint: pathlib.Path | None) -> None:
        """Make the resumed run's folder this run's folder and cut this process's episode log at the checkpoint."""
        if run_folder is None:
            return
        self.save_path = str(run_folder)
        self.params_path = f"{self.save_path}/{self.env_name}"
        if checkpoint is None:
            print(f"--resume: {run_folder} has no complete checkpoint yet, starting its run over.")
            return
        print(f"--resume: continuing {run_folder} from {checkpoint.name}")
        self.resume_checkpoint = checkpoint
        # The zoo then loads the model instead of creating one (see _load_pretrained_agent)
        self.continue_training = True
        self.trained_agent = str(checkpoint / "model.zip")
        # Episodes logged after the checkpoint are played again: cut the logs where the checkpoint left them
        for name, size in read_monitor_log_sizes(checkpoint).items():
            log = pathlib.Path(self.monitor_folder) / os.path.basename(name)
            if log.is_file() and log.stat().st_size > size:
                with open(log, "r+b") as file:
                    file.truncate(size)

    def _preprocess_hyperparams(self, hyperparams: dict[str, Any]) -> Any:
        """The zoo's; with ``global_n_envs``, ``n_envs`` becomes this rank's share of the config's."""
        processed = super()._preprocess_hyperparams(hyperparams)
        if self.global_n_envs:
            try:
                self.n_envs = distributed.local_n_envs(self.n_envs)
            except ValueError as error:
                raise ValueError(f"--global-n-envs: {error}") from None
            if self.verbose > 0:
                print(f"--global-n-envs: {self.n_envs} environments on each of the {self.world_size} ranks")
        return processed

    def create_log_folder(self) -> None:
        """The zoo's; under torchrun, rank 0 alone writes the run folder's files."""
        if self.rank == 0:
            super().create_log_folder()

    def _save_config(self, saved_hyperparams: dict[str, Any]) -> None:
        """The zoo's; under torchrun, on rank 0 only."""
        if self.rank == 0:
            super()._save_config(saved_hyperparams)

    def save_trained_model(self, model: BaseAlgorithm) -> None:
        """The zoo's; under torchrun, on rank 0 only (the ranks hold the same model and VecNormalize statistics)."""
        if self.rank == 0:
            super().save_trained_model(model)

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
        if self.algo != "ppg":
            return
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
                self.callbacks[index] = PPGEvalCallback(
                    callback.eval_env,
                    callback_on_new_best=callback.callback_on_new_best,
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
            elif type(callback) is ProgressBarCallback and self.data_parallel:
                self.callbacks[index] = GlobalProgressBarCallback()
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
        return PPG.load_checkpoint(
            self.resume_checkpoint, env=env, device=self.device, tensorboard_log=self.tensorboard_log, verbose=self.verbose
        )

    def learn(self, model: BaseAlgorithm) -> None:
        """
        The zoo's ``learn``; a resumed run trains the timesteps it has left, continuing its step count (and
        TensorBoard run) instead of starting from 0.
        """
        if self.resume_checkpoint is None:
            super().learn(model)
            return
        remaining = self.n_timesteps - model.num_timesteps
        if remaining <= 0:
            print(f"The run is already complete ({model.num_timesteps} of {self.n_timesteps} timesteps).")
            if model.env is not None:
                model.env.close()
            return
        kwargs: dict[str, Any] = {"reset_num_timesteps": False}
        if self.log_interval > -1:
            kwargs["log_interval"] = self.log_interval
        elif self.log_interval < -1:
            kwargs["log_interval"] = None
        if self.callbacks:
            kwargs["callback"] = self.callbacks
        try:
            model.learn(remaining, **kwargs)
        except KeyboardInterrupt:
            # As the zoo: an interrupted run still saves its model
            pass
        finally:
            if self.callbacks:
                self.callbacks[0].on_training_end()
            if model.env is not None:
                model.env.close()
