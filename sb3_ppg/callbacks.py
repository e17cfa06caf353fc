"""``PPGCheckpointCallback``: SB3's ``CheckpointCallback`` for PPG, writing checkpoints that resume a run exactly."""

import os
import pathlib
import shutil
import warnings

from stable_baselines3.common.callbacks import CheckpointCallback

from sb3_ppg import distributed
from sb3_ppg.array_files import fsync_directory
from sb3_ppg.checkpoints import MANIFEST, checkpoint_steps, complete_checkpoints, read_manifest, write_checkpoint
from sb3_ppg.env_state import get_vec_env_state, unsaved_parts


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
        # Count env steps from the run's start, so that a resumed run saves at the same steps as an uninterrupted one
        # (num_timesteps counts the steps of all ranks under torchrun, n_calls this rank's calls to env.step())
        self.n_calls = self.model.num_timesteps // (self.model.n_envs * distributed.get_world_size())
        self._pending = False

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

    def _prune(self, newest: pathlib.Path) -> None:
        """Delete checkpoints beyond ``keep_last``, incomplete ones, and stored rollouts no checkpoint uses."""
        folder = pathlib.Path(self.save_path)
        complete = [d for d in complete_checkpoints(folder) if checkpoint_steps(d, self.name_prefix) is not None]
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
