"""
What a run folder of the command line (``<log folder>/ppg/<env>_<id>/``) holds, by name, and the error for a run file
that sb3_ppg does not read. Nothing here imports the zoo.
"""

#: ``--resume`` without a path: the latest run of this algorithm and env in the log folder
RESUME_LATEST = "latest"
#: Sub-folder of a run folder that holds its checkpoints, and their name prefix
CHECKPOINTS_FOLDER = "checkpoints"
CHECKPOINT_PREFIX = "ppg"
#: The files the zoo writes into ``<run folder>/<env name>/``: the hyperparameters, the command line's options
RUN_CONFIG = "config.yml"
RUN_ARGS = "args.yml"


class UnsafeRunFileError(ValueError):
    """
    A run folder's ``config.yml`` or ``args.yml`` holds a YAML tag that sb3_ppg does not construct, as it reads run
    files without running code (see :class:`sb3_ppg.cli.experiment_manager.RunFileLoader`).
    """


#: Name of the model saved when Ctrl-C stops training (``<run folder>/<env name>_interrupted.zip``): not a final model
INTERRUPTED_SUFFIX = "_interrupted"


class TrainingInterrupted(KeyboardInterrupt):
    """
    Ctrl-C stopped training: the step it stopped at, what was saved, and where the run can continue from.

    :param run_folder: The run folder
    :param num_timesteps: The step training stopped at
    :param total_timesteps: The steps the run was to train
    :param saved_model: The model as it was at the interruption (``None``: not saved)
    :param newest_checkpoint: The run's newest complete checkpoint (``None``: none)
    """

    def __init__(
        self,
        run_folder: str,
        num_timesteps: int,
        total_timesteps: int,
        saved_model: str | None,
        newest_checkpoint: str | None,
    ) -> None:
        super().__init__(run_folder)
        self.run_folder = run_folder
        self.num_timesteps = num_timesteps
        self.total_timesteps = total_timesteps
        self.saved_model = saved_model
        self.newest_checkpoint = newest_checkpoint

    def describe(self, resume_command: str) -> str:
        """
        :param resume_command: The command that continues the run (with ``--resume``)
        :return: What happened and what to do next, in a few lines
        """
        lines = [f"Interrupted (Ctrl-C) at step {self.num_timesteps:,} of {self.total_timesteps:,}."]
        if self.saved_model is not None:
            lines.append(
                f"Saved the model as it was to {self.saved_model}: an interrupted model (possibly mid-update), "
                "not the run's final model."
            )
        if self.newest_checkpoint is not None:
            lines.append(f"Newest checkpoint: {self.newest_checkpoint}. Continue the run exactly from it with:")
            lines.append(f"  {resume_command}")
        else:
            lines.append(
                "The run has no checkpoint to continue from (--save-freq N writes them): run the command again to start over."
            )
        return "\n".join(lines)
