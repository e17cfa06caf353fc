"""
Checkpoints that resume a PPG run exactly: the callback that writes them, :func:`load_checkpoint` and
:func:`find_checkpoint`, the run state they hold; one module per on-disk format, each written and read side by side.
The rest of the package imports from here, never from the modules.
"""

from sb3_ppg.common.checkpoints.callback import PPGCheckpointCallback
from sb3_ppg.common.checkpoints.checkpoint import find_checkpoint, load_checkpoint, write_checkpoint
from sb3_ppg.common.checkpoints.lock import lock_folder
from sb3_ppg.common.checkpoints.manifest import MANIFEST, CheckpointDamagedError, complete_checkpoints, rank_folder
from sb3_ppg.common.checkpoints.run_state import ResumableModel, RunState, read_monitor_log_sizes, read_torch_threads

__all__ = [
    "MANIFEST",
    "CheckpointDamagedError",
    "PPGCheckpointCallback",
    "ResumableModel",
    "RunState",
    "complete_checkpoints",
    "find_checkpoint",
    "load_checkpoint",
    "lock_folder",
    "rank_folder",
    "read_monitor_log_sizes",
    "read_torch_threads",
    "write_checkpoint",
]
