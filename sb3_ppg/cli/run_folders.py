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
