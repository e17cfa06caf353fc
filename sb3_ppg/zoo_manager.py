"""
The RL Zoo's ``ExperimentManager`` adjusted for PPG (:class:`PPGExperimentManager`): what ``python -m sb3_ppg.train``
runs. This module imports ``rl_zoo3``; :mod:`sb3_ppg.zoo` imports it only once the zoo is known to be installed.

On top of the zoo's behaviour:

- Procgen envs run on the native ``ProcgenVecEnv`` and are evaluated with sampled actions, as in the paper;
- ``--save-freq N`` writes :class:`~sb3_ppg.PPGCheckpointCallback` checkpoints (model, auxiliary buffer, run state)
  into ``<run folder>/checkpoints/`` instead of bare model zips, and evaluations use
  :class:`~sb3_ppg.PPGEvalCallback`, which leaves training's random generators alone;
- ``--resume`` continues a run from its newest checkpoint, in its own run folder: the same parameters, bit for bit
  on CPU, as if the run had never stopped, with its episode log, evaluation log and TensorBoard run continued.
"""

import os
import pathlib
from typing import Any

from rl_zoo3.exp_manager import ExperimentManager
from rl_zoo3.utils import get_latest_run_id
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import CheckpointCallback, EvalCallback
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecEnv

from sb3_ppg.callbacks import PPGCheckpointCallback, PPGEvalCallback
from sb3_ppg.checkpoints import MANIFEST, complete_checkpoints
from sb3_ppg.ppg import PPG
from sb3_ppg.resume import read_monitor_log_sizes
from sb3_ppg.zoo import RESUME_LATEST, ProcgenVecEnvFactory, is_procgen_env_id

#: Sub-folder of a run folder that holds its checkpoints, and their name prefix
CHECKPOINTS_FOLDER = "checkpoints"
CHECKPOINT_PREFIX = "ppg"


def find_resume_point(path: str) -> tuple[pathlib.Path, pathlib.Path | None]:
    """
    The run folder and the checkpoint that ``--resume <path>`` names.

    :param path: A checkpoint folder (``<run>/checkpoints/ppg_<steps>_steps``), a run's ``checkpoints`` folder, or a
        run folder (``<log folder>/ppg/<env>_<id>``)
    :return: (run folder, newest complete checkpoint, or None when the run has none yet)
    :raises FileNotFoundError: when ``path`` is none of these
    """
    folder = pathlib.Path(path)
    if (folder / MANIFEST).is_file():
        return folder.parent.parent, folder
    if folder.name == CHECKPOINTS_FOLDER and folder.is_dir():
        folder = folder.parent
    if not folder.is_dir():
        raise FileNotFoundError(f"--resume {path}: no such run or checkpoint folder.")
    checkpoints = complete_checkpoints(folder / CHECKPOINTS_FOLDER)
    if not checkpoints and not (folder / CHECKPOINTS_FOLDER).is_dir() and not list(folder.glob("*.monitor.csv")):
        raise FileNotFoundError(
            f"--resume {path}: not a run folder of python -m sb3_ppg.train (it has no {CHECKPOINTS_FOLDER}/ folder and "
            "no episode log), nor a checkpoint."
        )
    return folder, checkpoints[-1] if checkpoints else None


class PPGExperimentManager(ExperimentManager):
    """
    The zoo's ``ExperimentManager`` (same arguments, plus the two below) with PPG's adjustments (see the module
    docstring).

    :param resume: ``None`` (a new run), ``"latest"`` (the latest run of this algorithm and env in the log folder) or
        the path of a run folder, checkpoints folder or checkpoint. The run continues from its newest complete
        checkpoint, in its run folder, up to the same total number of timesteps (``-n`` or the config's
        ``n_timesteps``). A run folder without a checkpoint yet (the job stopped before the first one) starts over
        in that folder; ``"latest"`` with no run at all starts a new one, so that a requeued job can always pass
        ``--resume``.
    :param keep_checkpoints: Number of complete checkpoints kept (``None``: all)
    """

    def __init__(self, *args: Any, resume: str | None = None, keep_checkpoints: int | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        vec_env_type = kwargs.get("vec_env_type", "dummy")
        self.vec_env_class = ProcgenVecEnvFactory(SubprocVecEnv if vec_env_type == "subproc" else DummyVecEnv)  # type: ignore[assignment]
        if is_procgen_env_id(self.env_name.gym_id):
            self.deterministic_eval = False
        self.keep_checkpoints = keep_checkpoints
        self.resume_checkpoint: pathlib.Path | None = None
        if resume is not None:
            self._prepare_resume(resume)

    def _prepare_resume(self, resume: str) -> None:
        """Find the run to continue, make it this run's folder and cut its episode logs at the checkpoint."""
        if self.algo != "ppg":
            raise ValueError(f"--resume continues PPG runs (PPGCheckpointCallback checkpoints), not --algo {self.algo}.")
        if self.continue_training:
            raise ValueError("--resume and -i/--trained-agent both say where to start from: pass only one.")
        if resume == RESUME_LATEST:
            run_id = get_latest_run_id(self.log_path, self.env_name)
            if run_id == 0:
                print(f"--resume: no run of {self.env_name} in {self.log_path} yet, starting a new one.")
                return
            run_folder, checkpoint = find_resume_point(os.path.join(self.log_path, f"{self.env_name}_{run_id}"))
        else:
            run_folder, checkpoint = find_resume_point(resume)
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
            log = run_folder / os.path.basename(name)
            if log.is_file() and log.stat().st_size > size:
                with open(log, "r+b") as file:
                    file.truncate(size)

    def create_envs(self, n_envs: int, eval_env: bool = False, no_log: bool = False) -> VecEnv:
        """The zoo's ``create_envs``; a resumed run's episode logs are appended to instead of started anew."""
        if self.resume_checkpoint is not None and not (eval_env or no_log):
            self.monitor_kwargs = {**self.monitor_kwargs, "override_existing": False}
        return super().create_envs(n_envs, eval_env=eval_env, no_log=no_log)

    def create_callbacks(self) -> None:
        """The zoo's callbacks, with PPG's checkpoint and evaluation callbacks in place of SB3's."""
        super().create_callbacks()
        if self.algo != "ppg":
            return
        for index, callback in enumerate(self.callbacks):
            if type(callback) is CheckpointCallback:
                self.callbacks[index] = PPGCheckpointCallback(
                    save_freq=callback.save_freq,
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
                    eval_freq=callback.eval_freq,
                    log_path=os.path.dirname(callback.log_path) if callback.log_path else None,
                    best_model_save_path=callback.best_model_save_path,
                    deterministic=callback.deterministic,
                    render=callback.render,
                    verbose=callback.verbose,
                    warn=callback.warn,
                    seed=self.seed,
                )

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
