"""
Data-parallel PPG over ``torch.distributed`` (launched with ``torchrun``): the process group, the collectives PPG
uses, merging running statistics and :class:`DistributedError` (see docs/scaling_out.md).
"""

import atexit
import datetime
import os
import time
from collections.abc import Iterable, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch as th
import torch.distributed as dist

#: Set to "0" to keep PPG from initializing torch.distributed in a process started by torchrun
AUTO_INIT_VARIABLE = "SB3_PPG_DISTRIBUTED"
#: Collective timeout in seconds for :func:`init_from_torchrun` (default ``DEFAULT_TIMEOUT_S``)
TIMEOUT_VARIABLE = "SB3_PPG_DIST_TIMEOUT"
DEFAULT_TIMEOUT_S = 600.0
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")

# The timeout given to init_process_group by init_from_torchrun, for error messages
_timeout: datetime.timedelta | None = None
# How long the exit handler releases the GIL after destroying a gloo process group (see _destroy_at_exit)
_GLOO_EXIT_GRACE_S = 0.25


class DistributedError(RuntimeError):
    """A collective operation failed: a rank died, or it did not arrive within the process group's timeout."""


# ---------------------------------------------------------------------------------------------------------------------
# Process group
# ---------------------------------------------------------------------------------------------------------------------


def is_active() -> bool:
    """Whether PPG trains data-parallel: the default process group is initialized with more than one rank."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def get_rank() -> int:
    """This process's rank (0 when torch.distributed is not initialized)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def get_world_size() -> int:
    """The number of ranks (1 when torch.distributed is not initialized)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def launched_by_torchrun() -> bool:
    """Whether torchrun's environment variables are set for a job of more than one process."""
    return all(name in os.environ for name in TORCHRUN_VARIABLES) and int(os.environ["WORLD_SIZE"]) > 1


def _timeout_from_environment() -> datetime.timedelta:
    value = os.environ.get(TIMEOUT_VARIABLE)
    seconds = DEFAULT_TIMEOUT_S if value is None else float(value)
    if seconds <= 0:
        raise ValueError(f"{TIMEOUT_VARIABLE}={value!r}: the collective timeout must be a positive number of seconds.")
    return datetime.timedelta(seconds=seconds)


def init_from_torchrun(backend: str | None = None, timeout: datetime.timedelta | float | None = None) -> int:
    """
    Initialize the default process group from torchrun's environment; with NCCL, this process's GPU is
    ``cuda:LOCAL_RANK``.

    :param backend: "nccl" or "gloo"; None: NCCL when CUDA is available, else gloo
    :param timeout: how long a collective waits for the other ranks; None: ``$SB3_PPG_DIST_TIMEOUT`` seconds, else 600 s
    :return: this process's rank
    """
    global _timeout
    missing = [name for name in TORCHRUN_VARIABLES if name not in os.environ]
    if missing:
        raise RuntimeError(f"init_from_torchrun(): {', '.join(missing)} not set; start the script with torchrun.")
    if dist.is_initialized():
        raise RuntimeError("init_from_torchrun(): torch.distributed is already initialized.")
    if timeout is None:
        timeout = _timeout_from_environment()
    elif not isinstance(timeout, datetime.timedelta):
        timeout = datetime.timedelta(seconds=float(timeout))
    if backend is None:
        backend = "nccl" if th.cuda.is_available() and dist.is_nccl_available() else "gloo"
    if backend == "nccl":
        th.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(backend=backend, init_method="env://", timeout=timeout)
    _timeout = timeout
    if backend == "gloo":
        # Let gloo's threads finish with the last collective before the interpreter's teardown (see _destroy_at_exit);
        # once per process, however often the group is initialized again
        atexit.unregister(_destroy_at_exit)
        atexit.register(_destroy_at_exit)
    return dist.get_rank()


def _destroy_at_exit() -> None:
    """
    Destroy the default process group if it is still there, then release the GIL for a moment (registered by
    :func:`init_from_torchrun` for gloo).

    A gloo worker thread frees the tensors of a collective after the caller has been told it finished (or failed).
    Freeing a tensor whose Python object is gone takes the GIL; a thread that takes the GIL once the interpreter has
    started its teardown is stopped with ``pthread_exit``, which aborts the process ("terminate called without an
    active exception", exit code 134). A rank that stopped with a :class:`DistributedError` and exited at once did
    this about one time in three. The pause lets that thread finish first.
    """
    if dist.is_initialized():
        dist.destroy_process_group()
    time.sleep(_GLOO_EXIT_GRACE_S)


def init_if_launched(backend: str | None = None) -> bool:
    """Initialize the process group when torchrun started this process, unless ``SB3_PPG_DISTRIBUTED=0`` or done."""
    if dist.is_initialized() or not launched_by_torchrun() or os.environ.get(AUTO_INIT_VARIABLE, "1") == "0":
        return False
    init_from_torchrun(backend=backend)
    return True


def auto_init(device: th.device | str) -> th.device | str:
    """
    PPG's constructor's hook: in a process started by torchrun, initialize the process group (:func:`init_if_launched`);
    data-parallel on GPUs, ``device="auto"`` or ``"cuda"`` becomes ``cuda:LOCAL_RANK``.
    """
    if not dist.is_available():
        return device
    init_if_launched()
    if is_active() and str(device) in ("auto", "cuda") and th.cuda.is_available():
        local_rank = os.environ.get("LOCAL_RANK")
        return th.device("cuda", int(local_rank) if local_rank is not None else th.cuda.current_device())
    return device


def local_n_envs(global_n_envs: int) -> int:
    """This rank's share of ``global_n_envs`` (a ``ValueError`` on every rank when the world size does not divide it)."""
    world_size = get_world_size()
    if not dist.is_initialized() and launched_by_torchrun() and os.environ.get(AUTO_INIT_VARIABLE, "1") != "0":
        world_size = int(os.environ["WORLD_SIZE"])
    if global_n_envs % world_size != 0:
        raise ValueError(
            f"{global_n_envs} envs cannot be split evenly over {world_size} ranks: choose a multiple of the world size "
            "(every rank must hold the same number of envs)."
        )
    return global_n_envs // world_size


# ---------------------------------------------------------------------------------------------------------------------
# Collectives with clear errors
# ---------------------------------------------------------------------------------------------------------------------


@contextmanager
def _collective(what: str):
    try:
        yield
    except (RuntimeError, dist.DistError) as error:
        timeout = f"{_timeout.total_seconds():g} s" if _timeout is not None else "the process group's timeout"
        raise DistributedError(
            f"Data-parallel PPG: {what} failed on rank {get_rank()} of {get_world_size()}. Another rank has probably "
            f"died (see its error) or did not reach the same point within {timeout}; this rank stops too. "
            f"Cause: {error}"
        ) from error


def _comm_device() -> th.device:
    """Where tensors must be for the default group's backend: this rank's GPU for NCCL, else the CPU."""
    if dist.get_backend() == "nccl":
        return th.device("cuda", th.cuda.current_device())
    return th.device("cpu")


def all_gather_object(obj: Any) -> list[Any]:
    """Every rank's ``obj`` (picklable), in rank order."""
    gathered: list[Any] = [None] * get_world_size()
    with _collective("gathering objects"):
        dist.all_gather_object(gathered, obj)
    return gathered


def gather_errors(error: BaseException | None) -> dict[int, str]:
    """
    Tell every rank which ranks failed at a step each runs on its own, so that all raise together.

    :return: the message of each rank that failed, by rank (empty when none failed)
    """
    messages = all_gather_object(None if error is None else f"{type(error).__name__}: {error}")
    return {rank: message for rank, message in enumerate(messages) if message is not None}


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s ``obj`` (picklable) on every rank."""
    objects = [obj]
    with _collective("broadcasting an object"):
        dist.broadcast_object_list(objects, src=src)
    return objects[0]


def new_gloo_group(timeout: datetime.timedelta) -> Any:
    """
    A process group of all ranks on gloo (CPU), with its own collective timeout (collective: every rank calls it).

    :param timeout: how long its collectives wait
    :return: the group
    """
    with _collective("creating a process group"):
        return dist.new_group(backend="gloo", timeout=timeout)


def barrier(group: Any, what: str) -> None:
    """
    Wait until every rank of ``group`` arrives here.

    :param group: a group of :func:`new_gloo_group`
    :param what: what the ranks wait for (for the error message)
    """
    with _collective(what):
        dist.barrier(group=group)


def broadcast_tensors(tensors: Iterable[th.Tensor], src: int = 0) -> None:
    """Overwrite ``tensors`` in place with rank ``src``'s (the same shapes and dtypes on every rank)."""
    device = _comm_device()
    with _collective("broadcasting the training state"), th.no_grad():
        for tensor in tensors:
            buffer = tensor.detach().to(device)
            dist.broadcast(buffer, src=src)
            if buffer is not tensor:
                tensor.copy_(buffer)


def average_gradients(parameters: Iterable[th.nn.Parameter]) -> None:
    """
    Replace each parameter's gradient with its mean over the ranks (one all-reduce per dtype). A parameter without a
    gradient counts as a zero gradient and keeps none; it must lack one on every rank (else the ranks would step
    different parameters, and :class:`DistributedError` says so).
    """
    world_size = get_world_size()
    device = _comm_device()
    by_dtype: dict[th.dtype, list[th.nn.Parameter]] = {}
    for parameter in parameters:
        by_dtype.setdefault(parameter.dtype, []).append(parameter)
    for group in by_dtype.values():
        pieces = [p.grad.reshape(-1) if p.grad is not None else p.new_zeros(p.numel()) for p in group]
        pieces.append(group[0].new_tensor([float(p.grad is not None) for p in group]))
        flat = th.cat(pieces).to(device)
        with _collective("averaging the gradients"):
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        has_grad = flat[-len(group) :].tolist()
        if any(count not in (0, world_size) for count in has_grad):
            raise DistributedError("Data-parallel PPG: some parameters have a gradient on some ranks only.")
        flat /= world_size
        offset = 0
        for parameter in group:
            size = parameter.numel()
            if parameter.grad is not None:
                parameter.grad.copy_(flat[offset : offset + size].view_as(parameter))
            offset += size


def _all_reduced(tensor: th.Tensor, op: Any, doing: str) -> th.Tensor:
    """A copy of a tensor on the communication device, all-reduced with ``op`` (``doing``: for the errors)."""
    buffer = tensor.detach().to(_comm_device(), copy=True)
    with _collective(doing):
        dist.all_reduce(buffer, op=op)
    return buffer


def all_reduce_mean(tensor: th.Tensor) -> th.Tensor:
    """The mean over the ranks of a tensor (a new tensor, on the input's device)."""
    return (_all_reduced(tensor, dist.ReduceOp.SUM, "averaging a statistic") / get_world_size()).to(tensor.device)


def all_reduce_max(tensor: th.Tensor) -> th.Tensor:
    """The maximum over the ranks of a tensor (a new tensor, on the input's device)."""
    return _all_reduced(tensor, dist.ReduceOp.MAX, "comparing a flag").to(tensor.device)


def global_mean_std(array: np.ndarray) -> tuple[float, float]:
    """
    The mean and the population standard deviation of all ranks' ``array`` values together (what ``mean()`` and
    ``std()`` give on the concatenated arrays), in float64 (two passes: the sum and count, then the squared deviations).
    """
    device = _comm_device()
    values = th.as_tensor(array, dtype=th.float64).reshape(-1)
    totals = th.tensor([values.sum().item(), float(values.numel())], dtype=th.float64, device=device)
    with _collective("normalizing the advantages"):
        dist.all_reduce(totals, op=dist.ReduceOp.SUM)
        mean = (totals[0] / totals[1]).item()
        squares = th.tensor([((values - mean) ** 2).sum().item()], dtype=th.float64, device=device)
        dist.all_reduce(squares, op=dist.ReduceOp.SUM)
    return mean, float(np.sqrt(squares.item() / totals[1].item()))


# ---------------------------------------------------------------------------------------------------------------------
# Running statistics (VecNormalize)
# ---------------------------------------------------------------------------------------------------------------------

RunningStats = tuple[np.ndarray, np.ndarray, float]  # mean, var, count


def merge_running_stats(base: RunningStats, states: Sequence[RunningStats]) -> RunningStats:
    """
    Merge running statistics that the ranks updated, each on its own data, from the same ``base``: the result is what
    one ``RunningMeanStd`` would hold after seeing ``base``'s data and then every rank's new data. Computed from
    sums of deviations from ``base``'s mean (base counted once), in float64.

    :param base: (mean, var, count) that every rank started from
    :param states: each rank's (mean, var, count) now
    :return: the merged (mean, var, count)
    """
    base_mean = np.asarray(base[0], dtype=np.float64)
    base_var = np.asarray(base[1], dtype=np.float64)
    base_count = float(base[2])
    count = base_count + sum(float(state[2]) - base_count for state in states)
    centered_sum = np.zeros_like(base_mean)
    centered_squares = -(len(states) - 1) * base_count * base_var
    for mean, var, state_count in states:
        deviation = np.asarray(mean, dtype=np.float64) - base_mean
        centered_sum = centered_sum + float(state_count) * deviation
        centered_squares = centered_squares + float(state_count) * (np.asarray(var, dtype=np.float64) + deviation**2)
    shift = centered_sum / count
    return base_mean + shift, np.maximum(centered_squares / count - shift**2, 0.0), count
