"""
Callbacks for runs that are checkpointed and resumed: ``PPGCheckpointCallback`` (SB3's ``CheckpointCallback``,
writing checkpoints that resume a run exactly) and ``PPGEvalCallback`` (SB3's ``EvalCallback``, evaluating without
disturbing training's random generators and continuing its evaluation log after a resume); callbacks told of rollout
boundaries (:class:`RolloutBoundaryCallback`).
"""

import os
import pathlib
import random
import re
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch as th
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback, CallbackList, CheckpointCallback, EvalCallback, EventCallback

from sb3_ppg.common import distributed
from sb3_ppg.common.array_files import TEMPORARY_NAME, fsync_directory
from sb3_ppg.common.checkpoints.checkpoint import CHECKPOINT_FILES, write_checkpoint
from sb3_ppg.common.checkpoints.env_state import get_vec_env_state, unsaved_parts
from sb3_ppg.common.checkpoints.lock import lock_folder, release_folder
from sb3_ppg.common.checkpoints.manifest import MANIFEST, RANK_FOLDER, checkpoint_name, checkpoint_steps, list_checkpoints
from sb3_ppg.common.checkpoints.rollouts import ROLLOUT_NAME
from sb3_ppg.common.run_state import ResumableModel


class RolloutBoundaryCallback(BaseCallback):
    """
    A callback that is told of rollout boundaries: ``PPG.collect_rollouts()`` calls :meth:`on_rollout_boundary` of
    every such callback (nested ones included) before a rollout draws anything, once ``train()`` has consumed the
    previous rollout. Under torchrun, every rank must be given the same ones (``learn()`` checks their settings).
    """

    def on_rollout_boundary(self) -> None:
        """Called at a rollout boundary (see the class docstring)."""


def iter_callbacks(callback: BaseCallback | None) -> Iterator[BaseCallback]:
    """The callback and every callback nested in it (``CallbackList``, ``EventCallback``)."""
    if callback is None:
        return
    yield callback
    if isinstance(callback, CallbackList):
        for child in callback.callbacks:
            yield from iter_callbacks(child)
    if isinstance(callback, EventCallback):
        yield from iter_callbacks(callback.callback)


def rollout_boundary_callbacks(callback: BaseCallback | None) -> list[RolloutBoundaryCallback]:
    """The :class:`RolloutBoundaryCallback` s in ``callback`` (itself, or nested in it)."""
    return [child for child in iter_callbacks(callback) if isinstance(child, RolloutBoundaryCallback)]


def env_step_calls(model: BaseAlgorithm) -> int:
    """
    The calls to ``env.step()`` this process has made since the run's start, from ``model.num_timesteps`` (which
    counts the env steps of all ranks under torchrun): what callbacks count their frequencies in, so that a resumed
    run saves and evaluates at the same steps as an uninterrupted one.

    :param model: The model being trained
    :return: The number of calls
    """
    return model.num_timesteps // (model.n_envs * distributed.get_world_size())


class PPGCheckpointCallback(CheckpointCallback, RolloutBoundaryCallback):
    """
    Save a checkpoint every ``save_freq`` calls to ``env.step()`` (as SB3's ``CheckpointCallback``), from which
    ``PPG.load_checkpoint()`` continues the run exactly: on CPU with a seed, a run killed at any moment and resumed
    from its newest checkpoint ends with the same parameters, bit for bit, as one never interrupted.

    A checkpoint is written at the first **rollout boundary** after the ``save_freq``-th call (once ``train()`` has
    consumed the rollout, before the next one draws anything: the only point where resuming can be exact), into the
    folder ``<save_path>/<name_prefix>_<num_timesteps>_steps/``: ``model.zip`` (the policy and every optimizer), the
    run state (counters, last observations, random generators, episode statistics, ``VecNormalize`` / ``VecMonitor``
    statistics, the envs' states) and, written last, ``manifest.json``, which lists every file with its SHA-256. The
    auxiliary buffer's rollouts are stored once each in ``<save_path>/<name_prefix>_rollouts/``, shared by the
    checkpoints. Every file is written atomically. While it trains, the run holds a lock on ``save_path``; pruning
    (``keep_last``) deletes only this package's own files, never through a symbolic link. Under torchrun give the
    callback to every rank, with the same arguments: each checkpoint then holds every rank's part, and ``save_path``
    must be shared by the ranks. Checkpoints hold pickles (the model zip, the envs): load only trusted ones. The files,
    the pruning rules and what cannot be saved (e.g. ``SubprocVecEnv`` envs) are in docs/checkpoints.md.

    :param save_freq: Save a checkpoint every ``save_freq`` calls to ``env.step()`` (``n_envs`` steps each); it
        is written at the next rollout boundary. The count follows ``model.num_timesteps``, so a resumed run
        writes its checkpoints at the same steps as an uninterrupted one.
    :param save_path: Folder of the checkpoints
    :param name_prefix: Common prefix of the checkpoint folders (a name, not a path)
    :param save_replay_buffer: Accepted for compatibility with SB3; the auxiliary buffer is always saved (an exact
        resume needs it)
    :param save_vecnormalize: Accepted for compatibility with SB3; ``VecNormalize`` statistics are always saved
    :param verbose: Verbosity level: 0 for no output, 2 for a line per checkpoint
    :param keep_last: Number of complete checkpoints kept (older ones are deleted); ``None`` (default) keeps all
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
        save_path = os.path.expanduser(save_path)  # "~/runs": the home folder's runs, not a folder named "~"
        super().__init__(save_freq, save_path, name_prefix, save_replay_buffer, save_vecnormalize, verbose)
        if not isinstance(save_freq, int) or isinstance(save_freq, bool) or save_freq < 1:
            raise ValueError(f"save_freq must be an integer >= 1, got {save_freq!r}")
        if keep_last is not None and (not isinstance(keep_last, int) or isinstance(keep_last, bool) or keep_last < 1):
            raise ValueError(f"keep_last must be an integer >= 1 or None (keep all), got {keep_last!r}")
        if not isinstance(name_prefix, str) or re.search(r"[/\\\x00]", name_prefix):
            raise ValueError(
                f"name_prefix must be a name, without '/' or '\\', got {name_prefix!r}: the checkpoints go into "
                "save_path (give the folder as save_path, e.g. save_path=os.path.join(save_path, 'sub'))"
            )
        self.keep_last = keep_last
        self._pending = False
        self._warned_unsaved = False
        self._warned: set[str] = set()
        self.last_checkpoint: pathlib.Path | None = None

    @property
    def rollouts_path(self) -> pathlib.Path:
        """The folder of the auxiliary buffer's stored rollouts, shared by the checkpoints."""
        return pathlib.Path(self.save_path) / f"{self.name_prefix}_rollouts"

    def _init_callback(self) -> None:
        # Before SB3's, which creates save_path: a wrong model leaves nothing behind
        if not isinstance(self.model, ResumableModel):
            name = type(self.model).__name__
            raise TypeError(
                f"PPGCheckpointCallback checkpoints PPG models (sb3_ppg.PPG), not {name}: its checkpoints hold PPG's "
                f"auxiliary buffer and resume PPG's training loop. For {name}, use SB3's CheckpointCallback."
            )
        super()._init_callback()

    def _on_training_start(self) -> None:
        self.n_calls = env_step_calls(self.model)
        self._pending = False
        # Rank 0 writes the manifests and prunes: it holds the folder's lock (the other ranks write their parts when
        # rank 0 tells them to). Under torchrun, every rank learns whether rank 0 could start.
        error = None
        try:
            if distributed.get_rank() == 0:
                self._start()
        except Exception as caught:
            if not distributed.is_active():
                raise
            error = caught
        if distributed.is_active():
            failures = distributed.gather_errors(error)
            if failures:
                reasons = "; ".join(f"rank {failed}: {reason}" for failed, reason in failures.items())
                raise RuntimeError(f"PPGCheckpointCallback could not start ({reasons})") from error

    def _start(self) -> None:
        """Lock ``save_path``; a resumed run then tidies what a kill may have left (see ``_prune``)."""
        lock_folder(self.save_path)
        if self.model.num_timesteps > 0:
            resume_point = pathlib.Path(self.save_path) / checkpoint_name(self.name_prefix, self.model.num_timesteps)
            self._prune(resume_point=resume_point)

    def _on_step(self) -> bool:
        if self.n_calls % self.save_freq == 0:
            self._pending = True
        return True

    def on_rollout_boundary(self) -> None:
        """Called by ``PPG.collect_rollouts()`` before a rollout starts: write the checkpoint that is due."""
        if self._pending:
            self.save_checkpoint()

    def _on_training_end(self) -> None:
        # After the last train(): a boundary. Not when the rollout was cut short (a callback stopped training; under
        # torchrun, on any rank: the other ranks' rollouts were not trained on either), nor when an exception (Ctrl-C)
        # interrupted a rollout or train() and the RL Zoo calls this anyway: the model is then half-way
        try:
            due = self._pending and self.model.at_rollout_boundary  # type: ignore[attr-defined]
            if distributed.is_active():
                due = all(distributed.all_gather_object(due))
            if due:
                self.save_checkpoint()
        finally:
            if distributed.get_rank() == 0:
                release_folder(self.save_path)

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
        directory = pathlib.Path(self.save_path) / checkpoint_name(self.name_prefix, self.model.num_timesteps)
        # Pruned once the checkpoint is complete, by the process that completed it (rank 0 under torchrun)
        write_checkpoint(self.model, directory, self.rollouts_path, finish=lambda: self._prune(directory))  # type: ignore[arg-type]
        self.last_checkpoint = directory
        if self.verbose >= 2 and distributed.get_rank() == 0:
            print(f"Saving PPG checkpoint to {directory}")
        return directory

    def _prune(self, newest: pathlib.Path | None = None, resume_point: pathlib.Path | None = None) -> None:
        """
        Delete what the run no longer needs: complete checkpoints beyond ``keep_last`` and those of an abandoned
        branch, incomplete checkpoints, stored rollouts no checkpoint uses, temporary files of interrupted writes.
        Only the files this package writes are deleted, by their names, never through a symbolic link out of
        ``save_path``; a folder is removed once empty. Other files and folders stay (with a warning inside a
        checkpoint or the rollouts folder), as do checkpoints whose manifest cannot be read (with a warning).

        :param newest: The checkpoint this run has just written (complete; kept whatever happens); None: the start of
            a resumed run
        :param resume_point: At the start of a resumed run, the checkpoint of ``save_path`` it continues from: it and
            every checkpoint written after it are kept (the run has not written a checkpoint of its own yet)
        """
        folder = pathlib.Path(self.save_path)
        checkpoints = list_checkpoints(folder)
        own = []
        for directory, manifest in checkpoints:
            if checkpoint_steps(directory, self.name_prefix) is None:
                continue
            if directory.is_symlink() or self._outside(directory):
                self._warn_once(directory, "is a symbolic link: pruning leaves it (and what it links to) alone")
            else:
                own.append((directory, manifest))
        removed = self._checkpoints_to_remove(own, newest, resume_point)
        for directory in removed:
            self._remove_checkpoint(directory)
        for directory in sorted(folder.iterdir()):
            # Incomplete checkpoints (no manifest): a kill during a write
            incomplete = not os.path.lexists(directory / MANIFEST)
            if checkpoint_steps(directory, self.name_prefix) is not None and incomplete and directory != newest:
                if directory.is_dir() and not directory.is_symlink() and not self._outside(directory):
                    self._remove_checkpoint(directory)
        for directory, _ in own:
            if directory.is_dir():
                for part in (directory, *self._rank_folders(directory)):
                    self._remove_files(part, keep=CHECKPOINT_FILES)
        used = set()
        for directory, manifest in checkpoints:
            if directory not in removed and manifest["rollouts_folder"] == self.rollouts_path.name:
                used.update(manifest["aux_rollout_files"])
        self._prune_rollouts(used)
        fsync_directory(folder)

    def _checkpoints_to_remove(
        self,
        checkpoints: list[tuple[pathlib.Path, dict[str, Any]]],
        newest: pathlib.Path | None,
        resume_point: pathlib.Path | None,
    ) -> list[pathlib.Path]:
        """
        The complete checkpoints (this callback's, oldest first) that pruning deletes: with ``keep_last``, those
        superseded by a newer one with fewer steps (an abandoned branch, or the first ``learn()`` before one that
        counts from 0 again), then all but the ``keep_last`` newest; never ``newest``, nor the resume point and what
        was written after it.
        """
        if self.keep_last is None:
            return []
        directories = [directory for directory, _ in checkpoints]
        steps = [manifest["num_timesteps"] for _, manifest in checkpoints]
        protected = {newest}
        if newest is None and resume_point in directories:
            protected.update(directories[directories.index(resume_point) :])
        superseded = {directory for i, directory in enumerate(directories) if any(s <= steps[i] for s in steps[i + 1 :])}
        remove = [directory for directory in directories if directory in superseded and directory not in protected]
        kept = [directory for directory in directories if directory not in remove]
        return remove + [directory for directory in kept[: -self.keep_last] if directory not in protected]

    def _remove_checkpoint(self, directory: pathlib.Path) -> None:
        """Delete a checkpoint's files (the manifest first: a checkpoint half deleted by a kill is incomplete)."""
        manifest = directory / MANIFEST
        if manifest.is_file() and not manifest.is_symlink():
            manifest.unlink()
            fsync_directory(directory)
        for part in (*self._rank_folders(directory), directory):
            self._remove_files(part)
            try:
                part.rmdir()
            except OSError:
                if part == directory:
                    others = sorted(path.name for path in directory.rglob("*"))
                    self._warn_once(directory, f"holds files sb3_ppg does not write ({', '.join(others)}): left in place")

    @staticmethod
    def _rank_folders(directory: pathlib.Path) -> list[pathlib.Path]:
        """The ``rank_<r>/`` folders of a checkpoint written under torchrun (real folders, not links)."""
        return [
            path
            for path in sorted(directory.iterdir())
            if RANK_FOLDER.fullmatch(path.name) and path.is_dir() and not path.is_symlink()
        ]

    @staticmethod
    def _remove_files(folder: pathlib.Path, keep: tuple[str, ...] = ()) -> None:
        """
        Delete the checkpoint files in ``folder`` (those of ``CHECKPOINT_FILES`` not in ``keep``) and the temporary
        files of interrupted writes of other processes (this one's may be in progress); plain files only.
        """
        for path in folder.iterdir():
            if path.is_symlink() or not path.is_file():
                continue
            temporary = TEMPORARY_NAME.fullmatch(path.name)
            if temporary is not None:
                # The file it was to become; a temporary of a temporary (..model.zip.tmp-<pid>.tmp-<pid>, which a kill
                # while a checkpoint's model.zip was written could leave with earlier versions) also counts
                name = temporary["name"]
                while (inner := TEMPORARY_NAME.fullmatch(name)) is not None:
                    name = inner["name"]
                if name in CHECKPOINT_FILES and int(temporary["pid"]) != os.getpid():
                    path.unlink(missing_ok=True)
            elif path.name in CHECKPOINT_FILES and path.name not in keep:
                path.unlink(missing_ok=True)

    def _prune_rollouts(self, used: set[str]) -> None:
        """Delete the stored rollouts no complete checkpoint uses, and temporary files of interrupted writes."""
        rollouts = self.rollouts_path
        if not rollouts.is_dir():
            return
        if self._outside(rollouts):
            self._warn_once(
                rollouts,
                "leads out of save_path (a symbolic link): pruning deletes nothing there, so stored rollouts no "
                "checkpoint uses stay (delete them yourself, or make it a folder of save_path)",
            )
            return
        for path in sorted(rollouts.iterdir()):
            temporary = TEMPORARY_NAME.fullmatch(path.name)
            if path.is_symlink() or not path.is_file():
                self._warn_once(path, "is not a stored rollout of sb3_ppg (a folder or a link): left alone")
            elif ROLLOUT_NAME.fullmatch(path.name):
                if path.name not in used:
                    path.unlink(missing_ok=True)
            elif temporary is not None and ROLLOUT_NAME.fullmatch(temporary["name"]):
                if int(temporary["pid"]) != os.getpid():
                    path.unlink(missing_ok=True)
            else:
                self._warn_once(path, "is not a stored rollout of sb3_ppg: left alone")
        fsync_directory(rollouts)

    def _outside(self, path: pathlib.Path) -> bool:
        """Whether ``path`` leads out of ``save_path`` (through a symbolic link)."""
        return not pathlib.Path(os.path.realpath(path)).is_relative_to(os.path.realpath(self.save_path))

    def _warn_once(self, path: pathlib.Path, problem: str) -> None:
        if str(path) not in self._warned:
            self._warned.add(str(path))
            warnings.warn(f"PPGCheckpointCallback: {str(path)!r} {problem}.", stacklevel=2)


class PPGEvalCallback(EvalCallback):
    """
    SB3's ``EvalCallback`` (same arguments) for runs that are checkpointed and resumed: an evaluation draws from its
    own random streams (training's torch, numpy and Python generators are saved before it and put back after it), it
    happens every ``eval_freq`` calls counted from the run's start (``model.num_timesteps``), a resumed run keeps the
    evaluations of ``<log_path>/evaluations.npz`` up to its ``num_timesteps`` (a log that cannot be read is moved
    aside to ``evaluations.npz.damaged``, with a warning), and the log is replaced atomically. So a run trains exactly
    as it would without evaluations, and a resumed run evaluates at the same steps as an uninterrupted one. The RL Zoo
    command line uses it, with the run's ``--seed``, for every PPG run with ``--eval-freq``.

    :param args: The arguments of SB3's ``EvalCallback``
    :param seed: Seed the evaluation env with ``seed + num_timesteps`` before each evaluation, so that an evaluation
        depends only on the policy and the step; ``None`` (default): as ``EvalCallback``, the evaluation env continues
        from where the previous evaluation left it
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
