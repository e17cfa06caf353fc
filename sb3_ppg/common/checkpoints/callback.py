"""
``PPGCheckpointCallback``: SB3's ``CheckpointCallback`` writing checkpoints that resume a PPG run exactly (the files,
the pruning rules and what cannot be saved are in docs/checkpoints.md).
"""

import os
import pathlib
import re
import warnings

from stable_baselines3.common.callbacks import CheckpointCallback

from sb3_ppg.common import distributed
from sb3_ppg.common.callbacks import RolloutBoundaryCallback, env_step_calls
from sb3_ppg.common.checkpoints.checkpoint import write_checkpoint
from sb3_ppg.common.checkpoints.env_state import get_vec_env_state, unsaved_parts
from sb3_ppg.common.checkpoints.lock import lock_folder, release_folder
from sb3_ppg.common.checkpoints.manifest import checkpoint_name
from sb3_ppg.common.checkpoints.pruning import prune
from sb3_ppg.common.checkpoints.run_state import ResumableModel


class PPGCheckpointCallback(CheckpointCallback, RolloutBoundaryCallback):
    """
    Save a checkpoint every ``save_freq`` calls to ``env.step()`` (as SB3's ``CheckpointCallback``), from which
    ``PPG.load_checkpoint()`` continues the run exactly (bit for bit on CPU with a seed). The checkpoint is written at
    the next rollout boundary into ``<save_path>/<name_prefix>_<num_timesteps>_steps/``; the auxiliary buffer's rollouts
    go once each into ``<save_path>/<name_prefix>_rollouts/``. Under torchrun give it to every rank, with the same
    arguments and a shared ``save_path``. Checkpoints hold pickles: load only trusted ones. The files, the lock, the
    pruning rules and what cannot be saved are in docs/checkpoints.md.

    :param save_freq: Save a checkpoint every ``save_freq`` calls to ``env.step()``, counted from ``model.num_timesteps``
    :param save_path: Folder of the checkpoints
    :param name_prefix: Common prefix of the checkpoint folders (a name, not a path)
    :param save_replay_buffer: Accepted for compatibility with SB3; the auxiliary buffer is always saved
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
        """Prune ``save_path`` (see :func:`~sb3_ppg.common.checkpoints.pruning.prune`)."""
        prune(
            pathlib.Path(self.save_path),
            self.name_prefix,
            self.rollouts_path,
            self.keep_last,
            newest=newest,
            resume_point=resume_point,
            warn=self._warn_once,
        )

    def _warn_once(self, path: pathlib.Path, problem: str) -> None:
        if str(path) not in self._warned:
            self._warned.add(str(path))
            warnings.warn(f"PPGCheckpointCallback: {str(path)!r} {problem}.", stacklevel=2)
