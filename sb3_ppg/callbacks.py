"""
Callbacks for runs that are checkpointed and resumed: ``PPGCheckpointCallback`` (SB3's ``CheckpointCallback``,
writing checkpoints that resume a run exactly) and ``PPGEvalCallback`` (SB3's ``EvalCallback``, evaluating without
disturbing training's random generators and continuing its evaluation log after a resume).
"""

import os
import pathlib
import random
import shutil
import warnings
from typing import Any

import numpy as np
import torch as th
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import CheckpointCallback, EvalCallback

from sb3_ppg import distributed
from sb3_ppg.array_files import fsync_directory
from sb3_ppg.checkpoints import MANIFEST, checkpoint_steps, complete_checkpoints, read_manifest, write_checkpoint
from sb3_ppg.env_state import get_vec_env_state, unsaved_parts


def env_step_calls(model: BaseAlgorithm) -> int:
    """
    The calls to ``env.step()`` this process has made since the run's start, from ``model.num_timesteps`` (which
    counts the env steps of all ranks under torchrun): what callbacks count their frequencies in, so that a resumed
    run saves and evaluates at the same steps as an uninterrupted one.

    :param model: The model being trained
    :return: The number of calls
    """
    return model.num_timesteps // (model.n_envs * distributed.get_world_size())


class PPGCheckpointCallback(CheckpointCallback):
    """
    Save a checkpoint every ``save_freq`` calls to ``env.step()`` (as SB3's ``CheckpointCallback``), from which
    ``PPG.load_checkpoint()`` continues the run exactly: on CPU with a seed, a run killed at any moment and resumed
    from its newest checkpoint ends with the same parameters, bit for bit, as one never interrupted.

    A checkpoint is written at the first **rollout boundary** after the ``save_freq``-th call: once ``train()``
    has consumed the rollout and before the next one starts. That is the only point where resuming can be exact:
    in the middle of a rollout the rollout buffer (hundreds of MB of observations at Procgen scale, plus the
    per-step values and log-probabilities) would have to be saved too, and during ``train()`` the state of the
    running phase (minibatch order, optimizer step in progress) cannot be saved at all. The boundary is reported by
    ``PPG.collect_rollouts()`` before it draws anything (gSDE noise included), and the end of ``learn()`` is one too.

    Each checkpoint is a folder ``<save_path>/<name_prefix>_<num_timesteps>_steps/`` holding ``model.zip`` (the
    policy and all optimizers, auxiliary and value ones included), ``run_state.npz`` (plain arrays and JSON:
    counters, the position in the N_pi cycle, the last observations and episode starts, the torch / numpy /
    Python random generators, SB3's episode info buffers, ``VecNormalize`` / ``VecMonitor`` statistics, native env
    states), ``env_states.pkl`` (the pickled envs of a ``DummyVecEnv``, with their random generators) and
    ``manifest.json``, written last, which lists every file with its SHA-256: a folder without manifest is
    incomplete and ignored. The auxiliary buffer's rollouts are stored once each, in
    ``<save_path>/<name_prefix>_rollouts/``, and shared by successive checkpoints, so a checkpoint writes only the
    rollouts collected since the previous one. Every file is written under a temporary name, fsynced and renamed
    into place. Old checkpoints are pruned (``keep_last``) only once the new one is complete.

    Under torchrun, give the callback to every rank, with the same arguments (``learn()`` checks it): each checkpoint
    then holds every rank's part (rank 0 writes ``model.zip``, rank ``r`` its run state in ``rank_<r>/`` and its
    rollouts in the shared rollouts folder), rank 0 writes the manifest once all ranks are done and alone prunes.
    ``save_path`` must be a folder all ranks share (one machine, or a shared filesystem).

    Where the envs' states cannot be saved (e.g. ``SubprocVecEnv``), a warning says so when the first checkpoint is
    written, and resuming restarts the episodes with a warning. Checkpoints hold pickles (the model zip, the envs):
    load only checkpoints from trusted sources.

    :param save_freq: Save a checkpoint every ``save_freq`` calls to ``env.step()`` (``n_envs`` steps each); it
        is written at the next rollout boundary. The count follows ``model.num_timesteps``, so a resumed run
        writes its checkpoints at the same steps as an uninterrupted one.
    :param save_path: Folder of the checkpoints
    :param name_prefix: Common prefix of the checkpoint folders
    :param save_replay_buffer: Accepted for compatibility with SB3; the auxiliary buffer is always saved (an exact
        resume needs it)
    :param save_vecnormalize: Accepted for compatibility with SB3; ``VecNormalize`` statistics are always saved
    :param verbose: Verbosity level: 0 for no output, 2 for a line per checkpoint
    :param keep_last: Number of complete checkpoints kept (older ones are deleted); ``None`` keeps all
    """

    def __init__(
        self,
        save_freq: int,
        save_path: str,
        name_prefix: str = "rl_model",
        save_replay_buffer: bool = False,
        save_vecnormalize: bool = False,
        verbose: int = 0,
        keep_last: int | None = None,
    ):
        super().__init__(save_freq, save_path, name_prefix, save_replay_buffer, save_vecnormalize, verbose)
        if not isinstance(save_freq, int) or isinstance(save_freq, bool) or save_freq < 1:
            raise ValueError(f"save_freq must be an integer >= 1, got {save_freq!r}")
        if keep_last is not None and (not isinstance(keep_last, int) or isinstance(keep_last, bool) or keep_last < 1):
            raise ValueError(f"keep_last must be an integer >= 1 or None (keep all), got {keep_last!r}")
        self.keep_last = keep_last
        self._pending = False
        self._warned_unsaved = False
        self.last_checkpoint: pathlib.Path | None = None

    @property
    def rollouts_path(self) -> pathlib.Path:
        """The folder of the auxiliary buffer's stored rollouts, shared by the checkpoints."""
        return pathlib.Path(self.save_path) / f"{self.name_prefix}_rollouts"

    def _on_training_start(self) -> None:
        self.n_calls = env_step_calls(self.model)
        self._pending = False
        # A resumed run first tidies what a kill may have left: a checkpoint completed but not yet followed by its
        # pruning, incomplete checkpoints, unused stored rollouts
        if self.model.num_timesteps > 0 and distributed.get_rank() == 0 and pathlib.Path(self.save_path).is_dir():
            self._prune()

    def _on_step(self) -> bool:
        if self.n_calls % self.save_freq == 0:
            self._pending = True
        return True

    def on_rollout_boundary(self) -> None:
        """Called by ``PPG.collect_rollouts()`` before a rollout starts: write the checkpoint that is due."""
        if self._pending:
            self.save_checkpoint()

    def _on_training_end(self) -> None:
        # After the last train(): a boundary, unless the rollout was cut short (a callback stopped training; under
        # torchrun, on any rank: the other ranks' rollouts were not trained on either)
        due = self._pending and self.model.rollout_buffer.full
        if distributed.is_active():
            due = all(distributed.all_gather_object(due))
        if due:
            self.save_checkpoint()

    def save_checkpoint(self) -> pathlib.Path:
        """Write a checkpoint now (the caller makes sure this is a rollout boundary) and prune older ones."""
        self._pending = False
        if not self._warned_unsaved and self.model.env is not None:
            self._warned_unsaved = True
            unsaved = unsaved_parts(get_vec_env_state(self.model.env)[0])
            if unsaved:
                warnings.warn(
                    "PPGCheckpointCallback cannot save the state of: " + "; ".join(unsaved) + ". A run resumed from "
                    "these checkpoints restarts its episodes, so it does not continue exactly."
                )
        directory = pathlib.Path(self.save_path) / f"{self.name_prefix}_{self.model.num_timesteps}_steps"
        # Pruned once the checkpoint is complete, by the process that completed it (rank 0 under torchrun)
        write_checkpoint(self.model, directory, self.rollouts_path, finish=lambda: self._prune(directory))  # type: ignore[arg-type]
        self.last_checkpoint = directory
        if self.verbose >= 2 and distributed.get_rank() == 0:
            print(f"Saving PPG checkpoint to {directory}")
        return directory

    def _prune(self, newest: pathlib.Path | None = None) -> None:
        """
        Delete checkpoints beyond ``keep_last``, incomplete ones, and stored rollouts no checkpoint uses.

        :param newest: The checkpoint just written (kept whatever happens); None: the newest complete one
        """
        folder = pathlib.Path(self.save_path)
        complete = [d for d in complete_checkpoints(folder) if checkpoint_steps(d, self.name_prefix) is not None]
        if newest is None:
            if not complete:
                return
            newest = complete[-1]
        remove = [d for d in complete[: -self.keep_last] if d != newest] if self.keep_last is not None else []
        for directory in folder.iterdir():
            if directory.is_dir() and checkpoint_steps(directory, self.name_prefix) is not None:
                if not (directory / MANIFEST).exists() and directory != newest:
                    remove.append(directory)
        for directory in remove:
            # The manifest first: a checkpoint half deleted by a kill is incomplete, never damaged
            (directory / MANIFEST).unlink(missing_ok=True)
            fsync_directory(directory)
            shutil.rmtree(directory, ignore_errors=True)
        used = set()
        for directory in complete_checkpoints(folder):
            manifest = read_manifest(directory)
            if manifest is not None and checkpoint_steps(directory, self.name_prefix) is not None:
                used.update(manifest["aux_rollout_files"])
        if self.rollouts_path.is_dir():
            for path in self.rollouts_path.iterdir():
                if path.name not in used:
                    path.unlink(missing_ok=True)
        fsync_directory(folder)
        for directory in (folder, newest, self.rollouts_path, *newest.glob("rank_*")):
            for path in directory.glob(".*.tmp-*") if directory.is_dir() else []:
                if not path.name.endswith(f".tmp-{os.getpid()}"):
                    path.unlink(missing_ok=True)


class PPGEvalCallback(EvalCallback):
    """
    SB3's ``EvalCallback`` (same arguments) for runs that are checkpointed and resumed:

    - an evaluation draws from its own random streams: torch's, numpy's and Python's global generators are saved
      before it and put back after it, so evaluating with sampled actions (``deterministic=False``) does not change
      what training draws. A run trains exactly as it would without evaluations, and a run resumed from a
      ``PPGCheckpointCallback`` checkpoint exactly as an uninterrupted one (its evaluations themselves start from a
      freshly built evaluation env, so their episodes can differ from the uninterrupted run's);
    - evaluations happen every ``eval_freq`` calls counted from the run's start (``model.num_timesteps``), so a
      resumed run evaluates at the same steps as an uninterrupted one;
    - when training starts from a resumed model (``num_timesteps > 0``) and ``log_path`` already holds
      ``evaluations.npz``, the evaluations up to ``num_timesteps`` are kept (later ones belong to the part of the
      run that is played again) and ``best_mean_reward`` is taken from them, so the log and ``best_model.zip``
      continue as in an uninterrupted run. A log that cannot be read (e.g. truncated by a crash of an older
      version) is moved aside to ``evaluations.npz.damaged`` with a warning, and the log starts again;
    - the log (``<log_path>/evaluations.npz``) is written to a temporary file renamed over the previous one, so a
      kill or a full disk during an evaluation leaves the previous log, never a truncated one;
    - with ``seed``, the evaluation env is seeded with ``seed + num_timesteps`` before each evaluation, so an
      evaluation depends only on the policy and the step, not on the evaluations before it: a resumed run's
      evaluations then equal an uninterrupted run's too.

    The RL Zoo command line (``python -m sb3_ppg.train``) uses it, with the run's ``--seed``, for every PPG run
    with ``--eval-freq``.

    :param args: The arguments of SB3's ``EvalCallback``
    :param seed: Seed the evaluation env before each evaluation (see above); ``None``: as ``EvalCallback``, the
        evaluation env continues from where the previous evaluation left it
    :param kwargs: The keyword arguments of SB3's ``EvalCallback``
    """

    def __init__(self, *args: Any, seed: int | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.seed = seed

    def _on_training_start(self) -> None:
        super()._on_training_start()
        self.n_calls = env_step_calls(self.model)
        if self.log_path is not None:
            # What a kill during an evaluation may have left
            log_path = pathlib.Path(self.log_path)
            for path in log_path.parent.glob(f".{log_path.name}.npz.tmp-*.npz"):
                path.unlink(missing_ok=True)
        if self.model.num_timesteps > 0 and self.log_path is not None and not self.evaluations_timesteps:
            self._restore_evaluations()

    def _restore_evaluations(self) -> None:
        """
        Keep the evaluations of ``log_path`` done up to the model's ``num_timesteps``; a log that cannot be read is
        moved aside with a warning (the log then starts again).
        """
        path = f"{self.log_path}.npz"
        if not os.path.isfile(path):
            return
        try:
            with np.load(path, allow_pickle=False) as data:
                keep = data["timesteps"] <= self.model.num_timesteps
                timesteps = [int(step) for step in data["timesteps"][keep]]
                results = [list(row) for row in data["results"][keep]]
                lengths = [list(row) for row in data["ep_lengths"][keep]]
                successes = [list(row) for row in data["successes"][keep]] if "successes" in data else []
        except Exception as error:
            os.replace(path, f"{path}.damaged")
            warnings.warn(
                f"The evaluation log {path} cannot be read ({type(error).__name__}: {error}): moved to {path}.damaged; "
                "the log starts again with the next evaluation (the best mean reward so far is unknown: the next "
                "evaluation's model becomes the best model)."
            )
            return
        self.evaluations_timesteps, self.evaluations_results, self.evaluations_length = timesteps, results, lengths
        if successes:
            self.evaluations_successes = successes
        if self.evaluations_results:
            means = [float(np.mean(results)) for results in self.evaluations_results]
            self.best_mean_reward, self.last_mean_reward = max(means), means[-1]

    def _on_step(self) -> bool:
        if not (self.eval_freq > 0 and self.n_calls % self.eval_freq == 0):
            return super()._on_step()
        devices = [self.model.device] if self.model.device.type == "cuda" else []
        if self.seed is not None:
            self.eval_env.seed(self.seed + self.model.num_timesteps)
        numpy_state, python_state = np.random.get_state(), random.getstate()
        with th.random.fork_rng(devices=devices):
            try:
                return self._evaluate()
            finally:
                np.random.set_state(numpy_state)
                random.setstate(python_state)

    def _evaluate(self) -> bool:
        """
        SB3's evaluation (``EvalCallback._on_step``), its log written atomically: SB3 writes it to a temporary file
        in the same folder (its ``log_path`` is pointed there for the call), which is fsynced and renamed over
        ``<log_path>.npz`` once the evaluation has completed (and deleted if it fails).

        :return: Whether training continues
        """
        if self.log_path is None:
            return super()._on_step()
        log_path = pathlib.Path(self.log_path)
        temporary = log_path.with_name(f".{log_path.name}.npz.tmp-{os.getpid()}.npz")
        self.log_path = str(temporary)
        try:
            continue_training = super()._on_step()
            with open(temporary, "rb") as file:
                os.fsync(file.fileno())
            os.replace(temporary, f"{log_path}.npz")
        finally:
            self.log_path = str(log_path)
            temporary.unlink(missing_ok=True)
        fsync_directory(log_path.parent)
        return continue_training
