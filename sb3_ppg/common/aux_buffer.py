"""
PPG's auxiliary buffer: the last ``n_policy_iters`` rollouts, kept as whole per-env rollouts in torch tensors (CPU
memory, page-locked CPU memory or the model's device), with its file format, its memory check and where it lives.
"""

import io
import pathlib
import warnings
from collections.abc import Callable, Generator
from typing import Any, NamedTuple

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.preprocessing import get_obs_shape
from stable_baselines3.common.utils import get_device

from sb3_ppg.common.array_files import read_array_file, space_from_json, space_to_json, write_array_file
from sb3_ppg.common.distributions import distribution_param_dim
from sb3_ppg.common.hyperparameters import AUX_BUFFER_DEVICES
from sb3_ppg.common.rollout_buffers import DeviceRollout, TensorObs

AUX_BUFFER_FORMAT = "sb3_ppg.aux_buffer"
#: The versions of the auxiliary buffer's files: 1 without action masks, 2 with them (MaskablePPG's)
AUX_BUFFER_VERSIONS = (1, 2)


class AuxiliaryBufferSamples(NamedTuple):
    """
    One auxiliary-phase minibatch: ``n`` whole rollouts of ``n_steps`` consecutive steps, flattened rollout-major.

    :param observations: observations, shape ``(n * n_steps, *obs_shape)`` (a dict of those for Dict spaces)
    :param returns: value targets, shape (n * n_steps,)
    :param old_distribution_params: old-policy distribution parameters, shape (n * n_steps, n_params)
    :param rollout_indices: the buffer rows the rollouts came from, shape (n,)
    :param action_masks: the valid actions of each state, shape (n * n_steps, mask_dims); ``None`` without masks
    """

    observations: TensorObs
    returns: th.Tensor
    old_distribution_params: th.Tensor
    rollout_indices: np.ndarray
    action_masks: th.Tensor | None = None


def memory_info() -> tuple[int | None, int | None]:
    """
    The memory available now and the memory this process can have in all, in bytes (None where unknown):
    ``MemAvailable`` and ``MemTotal`` of ``/proc/meminfo``, the total capped by a cgroup memory limit.
    """
    values = {}
    try:
        with open("/proc/meminfo") as file:
            for line in file:
                name, _, rest = line.partition(":")
                values[name] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    total = values.get("MemTotal")
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(limit_file) as file:
                limit = int(file.read().strip())
        except (OSError, ValueError):  # absent, or "max" (no limit)
            continue
        total = limit if total is None else min(total, limit)
    return values.get("MemAvailable"), total


def check_aux_buffer_memory(nbytes: int, n_policy_iters: int, n_envs: int, n_steps: int) -> None:
    """
    Check that the auxiliary buffer fits in memory before allocating it: a warning above the memory available now, a
    ``ValueError`` above the memory this process can have (see docs/ppg.md, Memory).

    :param nbytes: the buffer's size (``AuxiliaryBuffer.estimate_nbytes``); the other parameters are for the message
    """
    available, total = memory_info()
    gib = 1024**3
    size = (
        f"The auxiliary buffer needs {nbytes / gib:.3g} GiB (n_policy_iters * n_envs * n_steps = {n_policy_iters} * "
        f"{n_envs} * {n_steps} steps of {nbytes // max(1, n_policy_iters * n_envs * n_steps)} bytes)"
    )
    fix = "reduce n_policy_iters, n_steps or the number of envs (or the observations' size)"
    if total is not None and nbytes > total:
        raise ValueError(f"{size}, more than this machine's {total / gib:.3g} GiB of memory: {fix}.")
    if available is not None and nbytes > available:
        warnings.warn(
            f"{size}, more than the {available / gib:.3g} GiB of memory available now: the machine may swap or the "
            f"process be killed. If so, {fix}."
        )


#: ``aux_buffer_device="auto"`` keeps the buffer on the GPU when it takes at most this share of the GPU's free memory
#: (the rest is left to the networks' activations, the rollout buffer and the allocator's cache)
AUX_BUFFER_DEVICE_MEMORY_SHARE = 0.5


def resolve_aux_buffer_storage(
    aux_buffer_device: str,
    device: th.device,
    nbytes: int,
    device_memory_info: Callable[[th.device], tuple[int, int]] | None = None,
) -> tuple[str, str]:
    """
    Where the auxiliary buffer's arrays live (``"host"``, ``"pinned"`` or ``"device"``, see docs/ppg.md, Memory) and
    why, for the log.

    :param aux_buffer_device: ``"cpu"``, ``"pinned"``, ``"device"`` or ``"auto"``
    :param device: the model's device
    :param nbytes: the buffer's size (``AuxiliaryBuffer.estimate_nbytes``)
    :param device_memory_info: ``(free, total)`` bytes of a CUDA device; ``None``: ``torch.cuda.mem_get_info``
    :return: the storage and the reason
    """
    if aux_buffer_device not in AUX_BUFFER_DEVICES:
        raise ValueError(f"aux_buffer_device must be one of {AUX_BUFFER_DEVICES}, got {aux_buffer_device!r}.")
    gib = 1024**3
    if aux_buffer_device == "cpu":
        return "host", "aux_buffer_device='cpu'"
    if device.type != "cuda":
        if aux_buffer_device == "device":
            return "device", f"aux_buffer_device='device' (the model is on {device})"
        return "host", f"aux_buffer_device={aux_buffer_device!r} and the model is on {device}, not a CUDA device"
    if aux_buffer_device == "pinned":
        return "pinned", "aux_buffer_device='pinned'"
    free, _ = (device_memory_info or th.cuda.mem_get_info)(device)
    fits = nbytes <= AUX_BUFFER_DEVICE_MEMORY_SHARE * free
    if aux_buffer_device == "device":
        if nbytes > free:
            raise ValueError(
                f"aux_buffer_device='device': the auxiliary buffer needs {nbytes / gib:.3g} GiB, more than the "
                f"{free / gib:.3g} GiB free on {device}: use aux_buffer_device='auto' or 'pinned' (host memory)."
            )
        return "device", "aux_buffer_device='device'"
    share = f"{AUX_BUFFER_DEVICE_MEMORY_SHARE:.0%} of the {free / gib:.3g} GiB free on {device}"
    if fits:
        return "device", f"aux_buffer_device='auto': {nbytes / gib:.3g} GiB fit in {share}"
    return "pinned", f"aux_buffer_device='auto': {nbytes / gib:.3g} GiB do not fit in {share}"


def torch_dtype(dtype: Any) -> th.dtype:
    """The torch dtype of a NumPy dtype."""
    return th.from_numpy(np.zeros(0, dtype=dtype)).dtype


class AuxiliaryBuffer:
    """
    Storage for PPG's auxiliary phase: each row is one env's rollout of one policy iteration, ``n_steps`` observations
    (in the space's dtype) with their value targets and old-policy distribution parameters (see docs/ppg.md, Memory).
    Its arrays are torch tensors wherever they live.

    :param n_policy_iters: policy iterations per auxiliary phase (N_pi)
    :param n_steps: steps per rollout
    :param n_envs: number of parallel environments
    :param observation_space: observation space
    :param action_space: action space (sets the number of distribution parameters per step)
    :param device: where minibatches are sent
    :param n_distribution_params: floats per step of the old policy's distribution; ``None``: PPG's for ``action_space``
    :param mask_dims: booleans per step of the action masks to store (``MaskablePPG``'s); 0: no masks
    :param storage: where the arrays live: ``"host"``, ``"pinned"`` or ``"device"`` (see :func:`resolve_aux_buffer_storage`)
    """

    observations: th.Tensor | dict[str, th.Tensor]
    returns: th.Tensor
    old_distribution_params: th.Tensor
    action_masks: th.Tensor | None

    def __init__(
        self,
        n_policy_iters: int,
        n_steps: int,
        n_envs: int,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        device: th.device | str = "auto",
        n_distribution_params: int | None = None,
        mask_dims: int = 0,
        storage: str = "host",
    ) -> None:
        if storage not in ("host", "pinned", "device"):
            raise ValueError(f"storage must be 'host', 'pinned' or 'device', got {storage!r}.")
        self.n_policy_iters = n_policy_iters
        self.n_steps = n_steps
        self.n_envs = n_envs
        self.observation_space = observation_space
        self.action_space = action_space
        self.device = get_device(device)
        self.buffer_size = n_policy_iters * n_envs  # number of rollouts (rows)
        if n_distribution_params is None:
            n_distribution_params = distribution_param_dim(action_space)
        self.n_distribution_params = n_distribution_params
        self.mask_dims = mask_dims
        self.storage = storage
        # Where the tensors are, and whether they are page-locked (storage "pinned" where pinning succeeded)
        self.storage_device = self.device if storage == "device" else th.device("cpu")
        self.pinned = storage == "pinned"
        # Same per-step shapes as SB3's rollout buffer (a Discrete observation is stored with shape (1,))
        obs_shape = get_obs_shape(observation_space)
        if isinstance(observation_space, spaces.Dict):
            assert isinstance(obs_shape, dict)
            self.observations = {
                key: self._zeros((self.buffer_size, n_steps, *obs_shape[key]), torch_dtype(space.dtype))
                for key, space in observation_space.spaces.items()
            }
        else:
            assert isinstance(obs_shape, tuple)
            self.observations = self._zeros((self.buffer_size, n_steps, *obs_shape), torch_dtype(observation_space.dtype))
        self.returns = self._zeros((self.buffer_size, n_steps), th.float32)
        self.old_distribution_params = self._zeros((self.buffer_size, n_steps, self.n_distribution_params), th.float32)
        # One boolean per action and step (a byte each: masks are small next to the observations)
        self.action_masks = None
        if mask_dims > 0:
            self.action_masks = self._zeros((self.buffer_size, n_steps, mask_dims), th.bool)
            self.action_masks[:] = True
        self.pos = 0
        # How many times reset() emptied the buffer: a row holds the same rollout while this count stays
        self.n_resets = 0

    def _zeros(self, shape: tuple[int, ...], dtype: th.dtype) -> th.Tensor:
        """A zero tensor of the buffer's storage (a pinned one falls back to pageable memory, see ``pinned``)."""
        if self.pinned:
            try:
                return th.zeros(shape, dtype=dtype, pin_memory=True)
            except RuntimeError:  # no CUDA, or page-locking refused
                self.pinned = False
        return th.zeros(shape, dtype=dtype, device=self.storage_device)

    def _with_dtype(self, array: th.Tensor, dtype: th.dtype) -> th.Tensor:
        """``array`` itself, or a new zero tensor of its shape and of the buffer's storage when its dtype is not ``dtype``."""
        return array if array.dtype == dtype else self._zeros(tuple(array.shape), dtype)

    @staticmethod
    def _write(target: th.Tensor, rows: slice, values: np.ndarray | th.Tensor) -> None:
        """Copy ``values`` (host arrays or tensors anywhere) into some rows of a stored tensor."""
        target[rows] = th.as_tensor(values).to(target.device, target.dtype)

    @staticmethod
    def estimate_nbytes(
        n_policy_iters: int,
        n_steps: int,
        n_envs: int,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        n_distribution_params: int | None = None,
        mask_dims: int = 0,
    ) -> int:
        """The memory the arrays of a buffer with these arguments take (its ``nbytes``), computed without allocating."""
        obs_shape = get_obs_shape(observation_space)
        if isinstance(observation_space, spaces.Dict):
            assert isinstance(obs_shape, dict)
            obs_bytes = sum(
                int(np.prod(obs_shape[key])) * np.dtype(space.dtype).itemsize
                for key, space in observation_space.spaces.items()
            )
        else:
            obs_bytes = int(np.prod(obs_shape)) * np.dtype(observation_space.dtype).itemsize
        if n_distribution_params is None:
            n_distribution_params = distribution_param_dim(action_space)
        float_bytes = np.dtype(np.float32).itemsize * (1 + n_distribution_params)
        mask_bytes = np.dtype(bool).itemsize * mask_dims
        return n_policy_iters * n_envs * n_steps * (obs_bytes + float_bytes + mask_bytes)

    @property
    def n_rollouts(self) -> int:
        """Number of rollouts (rows) stored."""
        return self.pos

    @property
    def n_iterations(self) -> int:
        """Number of policy iterations stored."""
        return self.pos // self.n_envs

    def full(self) -> bool:
        """Whether the buffer holds ``n_policy_iters`` iterations (time for the auxiliary phase)."""
        return self.pos == self.buffer_size

    def reset(self) -> None:
        """Forget the stored rollouts (the arrays are reused)."""
        self.pos = 0
        self.n_resets += 1

    def _arrays(self) -> list[th.Tensor]:
        """Every stored tensor: the observations, returns, old-policy parameters and action masks (if any)."""
        obs_arrays = list(self.observations.values()) if isinstance(self.observations, dict) else [self.observations]
        masks = [self.action_masks] if self.action_masks is not None else []
        return [*obs_arrays, self.returns, self.old_distribution_params, *masks]

    @property
    def nbytes(self) -> int:
        """Memory held by the buffer's arrays (action masks included), in bytes."""
        return sum(array.nbytes for array in self._arrays())

    def _write_env_major(self, target: th.Tensor, rows: slice, array: np.ndarray | th.Tensor, flattened: bool) -> None:
        """
        Copy a rollout array into some rows of a stored tensor as ``(n_envs, n_steps, ...)``: a rollout buffer's,
        ``(n_steps, n_envs, ...)`` or flattened by its ``get()``, or one of a ``DeviceRollout`` (``(n_samples, ...)``
        rows, flattened where not ``step_major``). One contiguous copy, the axes swapped where the target lives.
        """
        step_shape = tuple(target.shape[2:])
        source = th.as_tensor(array)
        if flattened:
            target[rows] = source.reshape(self.n_envs, self.n_steps, *step_shape).to(target.device, target.dtype)
        else:
            step_major = source.reshape(self.n_steps, self.n_envs, *step_shape)
            target[rows] = step_major.to(target.device, target.dtype).swapaxes(0, 1)

    def add(self, rollout_buffer: RolloutBuffer, device_rollout: DeviceRollout | None = None) -> None:
        """
        Copy a full rollout buffer's observations, value targets (and action masks) into the next ``n_envs`` rows.

        :param rollout_buffer: the rollout buffer
        :param device_rollout: its arrays already copied to a device: a buffer stored on that device takes its
            observations and value targets from there instead of copying them from the host
        """
        if self.full():
            raise RuntimeError("The auxiliary buffer is full: run the auxiliary phase and reset() it before adding more.")
        if rollout_buffer.buffer_size != self.n_steps or rollout_buffer.n_envs != self.n_envs:
            raise ValueError(
                f"Rollout buffer of {rollout_buffer.buffer_size} steps x {rollout_buffer.n_envs} envs does not fit an "
                f"auxiliary buffer of {self.n_steps} steps x {self.n_envs} envs."
            )
        flattened = rollout_buffer.generator_ready
        if self.pos == 0:
            self.returns = self._with_dtype(self.returns, torch_dtype(rollout_buffer.returns.dtype))
        rows = slice(self.pos, self.pos + self.n_envs)
        # The observations and value targets from the device copy where the buffer lives on its device, else the host
        observations: Any = rollout_buffer.observations
        returns: np.ndarray | th.Tensor = rollout_buffer.returns
        source_flattened = flattened
        if self.storage == "device" and device_rollout is not None and device_rollout.returns.device == self.returns.device:
            device_rollout.check(self.n_steps, self.n_envs)
            observations, returns = device_rollout.observations, device_rollout.returns
            source_flattened = not device_rollout.step_major
        if isinstance(self.observations, dict):
            for key, array in self.observations.items():
                self._write_env_major(array, rows, observations[key], source_flattened)
        else:
            self._write_env_major(self.observations, rows, observations, source_flattened)
        self._write_env_major(self.returns, rows, returns, source_flattened)
        if self.action_masks is not None:
            masks = rollout_buffer.action_masks.astype(bool)  # type: ignore[attr-defined]
            self._write_env_major(self.action_masks, rows, masks, flattened)
        self.pos += self.n_envs

    def _gather(self, array: th.Tensor, rows: th.Tensor | slice) -> th.Tensor:
        """Some rows of a stored tensor (``rows``: a slice, or indices where it lives), flat, on ``self.device``."""
        # index_select: several times faster than indexing with a tensor for the CPU's uint8 images (docs/throughput.md)
        taken = array[rows] if isinstance(rows, slice) else array.index_select(0, rows)
        return taken.reshape(-1, *array.shape[2:]).to(self.device)

    def _observations_to_tensor(self, rows: th.Tensor | slice) -> TensorObs:
        """Observations of some rows, flattened to (n_rows * n_steps, ...), as tensor(s) on ``self.device``."""
        if isinstance(self.observations, dict):
            return {key: self._gather(array, rows) for key, array in self.observations.items()}
        return self._gather(self.observations, rows)

    def iter_rollout_chunks(self, batch_rollouts: int) -> Generator[tuple[slice, TensorObs], None, None]:
        """The stored observations in order, ``batch_rollouts`` rollouts at a time, as (rows, observations)."""
        for start in range(0, self.pos, batch_rollouts):
            rows = slice(start, min(start + batch_rollouts, self.pos))
            yield rows, self._observations_to_tensor(rows)

    def store_old_distribution_params(self, rows: slice, params: th.Tensor) -> None:
        """
        Store the old policy's distribution parameters of some rows (float64 ones in float64, others in float32).

        :param rows: the rows, as yielded by ``iter_rollout_chunks``
        :param params: tensor of shape (n_rows * n_steps, n_distribution_params), on any device
        """
        params = params.to(th.float64 if params.dtype == th.float64 else th.float32)
        if rows.start == 0:
            self.old_distribution_params = self._with_dtype(self.old_distribution_params, params.dtype)
        self._write(self.old_distribution_params, rows, params.reshape(-1, self.n_steps, self.n_distribution_params))

    def get(
        self, batch_rollouts: int, generator: np.random.Generator | None = None
    ) -> Generator[AuxiliaryBufferSamples, None, None]:
        """
        One epoch of minibatches of whole rollouts, shuffled across envs and iterations.

        :param batch_rollouts: rollouts per minibatch (the last minibatch may hold fewer)
        :param generator: random generator for the shuffle (NumPy's global one if None, which SB3 seeds)
        """
        permutation = generator.permutation(self.pos) if generator is not None else np.random.permutation(self.pos)
        # Copied once per epoch to where the tensors live, each minibatch's rows sliced there
        stored_permutation = th.as_tensor(permutation, device=self.storage_device)
        for start in range(0, self.pos, batch_rollouts):
            rows = slice(start, start + batch_rollouts)
            yield self._minibatch(permutation[rows], stored_permutation[rows])

    def _minibatch(self, rows: np.ndarray, stored_rows: th.Tensor) -> AuxiliaryBufferSamples:
        """The auxiliary minibatch of some rows (``stored_rows``: the same indices where the tensors live)."""
        masks = None if self.action_masks is None else self._gather(self.action_masks, stored_rows)
        return AuxiliaryBufferSamples(
            observations=self._observations_to_tensor(stored_rows),
            returns=self._gather(self.returns, stored_rows),
            old_distribution_params=self._gather(self.old_distribution_params, stored_rows),
            rollout_indices=rows,
            action_masks=masks,
        )

    def layout_metadata(self) -> dict[str, Any]:
        """
        The buffer's layout and spaces, in JSON: what a saved buffer must match to be loaded (``mask_dims`` only for a
        buffer that stores action masks, so that the files of PPG's buffers are those of earlier versions).
        """
        layout = {
            "n_policy_iters": self.n_policy_iters,
            "n_steps": self.n_steps,
            "n_envs": self.n_envs,
            "n_distribution_params": self.n_distribution_params,
            "observation_space": space_to_json(self.observation_space),
            "action_space": space_to_json(self.action_space),
        }
        if self.mask_dims > 0:
            layout["mask_dims"] = self.mask_dims
        return layout

    @property
    def file_version(self) -> int:
        """The version of this buffer's files (its own and the checkpoints' rollouts): 2 with action masks, else 1."""
        return 2 if self.action_masks is not None else 1

    def iteration_arrays(self, iteration: int, with_old_distributions: bool = False) -> dict[str, np.ndarray]:
        """
        The arrays of one stored policy iteration (its ``n_envs`` rows), as plain arrays by name.

        :param with_old_distributions: include the old-policy distribution parameters (meaningful during a phase only)
        """
        return self._rows_arrays(slice(iteration * self.n_envs, (iteration + 1) * self.n_envs), with_old_distributions)

    @staticmethod
    def _to_numpy(array: th.Tensor) -> np.ndarray:
        """A stored tensor as a NumPy array (a view in CPU memory, a copy from a device)."""
        return array.cpu().numpy()

    def _rows_arrays(self, rows: slice, with_old_distributions: bool) -> dict[str, np.ndarray]:
        """The arrays of some rows by name, as NumPy arrays (views in CPU memory, copies from a device)."""
        if isinstance(self.observations, dict):
            arrays = {f"observations.{key}": self._to_numpy(array[rows]) for key, array in self.observations.items()}
        else:
            arrays = {"observations": self._to_numpy(self.observations[rows])}
        arrays["returns"] = self._to_numpy(self.returns[rows])
        if self.action_masks is not None:
            arrays["action_masks"] = self._to_numpy(self.action_masks[rows])
        if with_old_distributions:
            arrays["old_distribution_params"] = self._to_numpy(self.old_distribution_params[rows])
        return arrays

    def _set_rows_arrays(self, start: int, arrays: dict[str, np.ndarray], source: object) -> int:
        """Copy arrays made by ``_rows_arrays`` into the rows from ``start``; return the number of rows."""
        expected = self._rows_arrays(slice(0, 0), "old_distribution_params" in arrays)
        if set(arrays) != set(expected):
            raise ValueError(f"{source!r} holds arrays {sorted(arrays)}, expected {sorted(expected)}.")
        n_rows = len(arrays["returns"])
        if start + n_rows > self.buffer_size:
            raise ValueError(f"{source!r} holds {n_rows} rollouts: more than fit in the auxiliary buffer.")
        for name, target in expected.items():
            array = arrays[name]
            if array.dtype != target.dtype or array.shape[1:] != target.shape[1:] or len(array) != n_rows:
                raise ValueError(
                    f"Array {name!r} of {source!r} is {array.dtype} {array.shape}, expected {target.dtype} "
                    f"({n_rows}, {', '.join(map(str, target.shape[1:]))})."
                )
        rows = slice(start, start + n_rows)
        if isinstance(self.observations, dict):
            for key, array in self.observations.items():
                self._write(array, rows, arrays[f"observations.{key}"])
        else:
            self._write(self.observations, rows, arrays["observations"])
        self._write(self.returns, rows, arrays["returns"])
        if self.action_masks is not None:
            self._write(self.action_masks, rows, arrays["action_masks"])
        if "old_distribution_params" in arrays:
            self._write(self.old_distribution_params, rows, arrays["old_distribution_params"])
        return n_rows

    def copy_from(self, other: "AuxiliaryBuffer", source: object) -> None:
        """Replace the stored rollouts with those of ``other`` (a buffer of the same layout), checked first."""
        other.check_compatible(self, source)
        self.reset()
        self._set_rows_arrays(0, other._rows_arrays(slice(0, other.pos), with_old_distributions=True), source)
        self.pos = other.pos

    def add_iteration_arrays(self, arrays: dict[str, np.ndarray], source: object) -> None:
        """Add one policy iteration saved from ``iteration_arrays`` after the stored ones, checked first."""
        if self.full():
            raise ValueError(f"{source!r}: the auxiliary buffer is full already.")
        if self._set_rows_arrays(self.pos, arrays, source) != self.n_envs:
            raise ValueError(f"{source!r} does not hold one policy iteration of {self.n_envs} envs.")
        self.pos += self.n_envs

    def save(self, path: str | pathlib.Path | io.BufferedIOBase, verbose: int = 0) -> None:
        """
        Save the stored rollouts as plain arrays (``.npz`` with JSON metadata and checksums), atomically; nothing is pickled.

        :param path: Path to the file; ".npz" is appended to a str path without a suffix
        :param verbose: print where the buffer was saved when >= 2
        """
        if isinstance(path, str) and not pathlib.Path(path).suffix:
            path = path + ".npz"
        metadata = {"format": AUX_BUFFER_FORMAT, "version": self.file_version, **self.layout_metadata(), "pos": self.pos}
        write_array_file(path, self._rows_arrays(slice(0, self.pos), with_old_distributions=True), metadata)  # type: ignore[arg-type]
        if verbose >= 2:
            print(f"Saved the auxiliary buffer ({self.n_iterations} policy iterations) to {path}")

    def check_compatible(self, other: "AuxiliaryBuffer", source: object) -> None:
        """Raise a ``ValueError`` naming every difference in layout or spaces from ``other``."""
        names = ("n_policy_iters", "n_steps", "n_envs", "observation_space", "action_space", "mask_dims")
        mismatches = [
            f"{name}: buffer {getattr(self, name)} != model {getattr(other, name)}"
            for name in names
            if getattr(self, name) != getattr(other, name)
        ]
        if mismatches:
            raise ValueError(f"The auxiliary buffer in {source!r} does not fit this model ({'; '.join(mismatches)}).")

    @classmethod
    def load(cls, path: str | pathlib.Path | io.BufferedIOBase, verbose: int = 0) -> "AuxiliaryBuffer":
        """
        Load a buffer saved by ``save``, every array checked against its checksum and the layout (a pickle is refused).

        :param path: Path to the file
        :param verbose: print where the buffer was loaded from when >= 2
        :return: the buffer (on the CPU device; the model moves it)
        """
        metadata, arrays = read_array_file(path, AUX_BUFFER_FORMAT)  # type: ignore[arg-type]
        try:
            if metadata.get("version") not in AUX_BUFFER_VERSIONS:
                raise ValueError(f"unsupported version {metadata.get('version')!r}")
            # Version 1 files (no action masks) have no mask_dims; their n_distribution_params is PPG's
            buffer = cls(
                int(metadata["n_policy_iters"]),
                int(metadata["n_steps"]),
                int(metadata["n_envs"]),
                space_from_json(metadata["observation_space"]),
                space_from_json(metadata["action_space"]),
                device="cpu",
                n_distribution_params=int(metadata["n_distribution_params"]),
                mask_dims=int(metadata.get("mask_dims", 0)),
            )
            if metadata["version"] != buffer.file_version:
                raise ValueError(f"version {metadata['version']} does not match its mask_dims {buffer.mask_dims}")
            pos = metadata["pos"]
            if not isinstance(pos, int) or not 0 <= pos <= buffer.buffer_size or pos % buffer.n_envs != 0:
                raise ValueError(f"position {pos!r} is not a multiple of n_envs in [0, {buffer.buffer_size}]")
            if len(arrays.get("returns", ())) != pos:
                raise ValueError(f"position {pos} does not match the {len(arrays.get('returns', ()))} stored rollouts")
            buffer._set_rows_arrays(0, arrays, path)
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"{path!r} is not a valid auxiliary buffer file: {error}.") from error
        buffer.pos = pos
        if verbose >= 2:
            print(f"Loaded an auxiliary buffer ({buffer.n_iterations} policy iterations) from {path}")
        return buffer


def aux_buffer_storage(
    n_policy_iters: int,
    n_steps: int,
    n_envs: int,
    observation_space: spaces.Space,
    action_space: spaces.Space,
    aux_buffer_device: str,
    device: th.device,
    buffer_class: type["AuxiliaryBuffer"] | None = None,
    **buffer_kwargs: Any,
) -> tuple[str, str]:
    """
    Where an auxiliary buffer (of ``buffer_class``, default :class:`AuxiliaryBuffer`) lives and why, its fit in host
    memory checked before it is allocated there.
    """
    layout = dict(n_policy_iters=n_policy_iters, n_steps=n_steps, n_envs=n_envs)
    nbytes = (buffer_class or AuxiliaryBuffer).estimate_nbytes(
        **layout, observation_space=observation_space, action_space=action_space, **buffer_kwargs
    )
    storage, reason = resolve_aux_buffer_storage(aux_buffer_device, device, nbytes)
    if storage != "device":
        check_aux_buffer_memory(nbytes, **layout)
    return storage, reason


def make_aux_buffer(
    n_policy_iters: int,
    n_steps: int,
    n_envs: int,
    observation_space: spaces.Space,
    action_space: spaces.Space,
    device: th.device,
    storage: tuple[str, str],
    buffer_class: type["AuxiliaryBuffer"] | None = None,
    **buffer_kwargs: Any,
) -> tuple["AuxiliaryBuffer", tuple[str, str]]:
    """
    A new auxiliary buffer (of ``buffer_class``, default :class:`AuxiliaryBuffer`), and where it lives and why
    (pageable memory where page-locking failed).
    """
    where, reason = storage
    layout = (n_policy_iters, n_steps, n_envs, observation_space, action_space)
    buffer = (buffer_class or AuxiliaryBuffer)(*layout, device=device, storage=where, **buffer_kwargs)
    if where == "pinned" and not buffer.pinned:
        where, reason = "host", f"{reason}; page-locking failed, so pageable memory"
    return buffer, (where, reason)


def aux_buffer_summary(buffer: "AuxiliaryBuffer", next_aux_step: int, storage: str, reason: str, device: th.device) -> str:
    """The auxiliary buffer's size, the step of its next phase and where it lives, for the log."""
    n_buffer_steps = buffer.n_policy_iters * buffer.n_envs * buffer.n_steps
    nbytes = buffer.nbytes
    size = f"{nbytes / 1e6:,.1f} MB" if nbytes >= 100_000 else f"{nbytes / 1e3:,.1f} kB"
    observations = buffer.observations
    obs_nbytes = sum(array.nbytes for array in (observations.values() if isinstance(observations, dict) else [observations]))
    places = {"host": "CPU memory", "pinned": "page-locked CPU memory", "device": f"{device} memory"}
    return (
        f"Auxiliary buffer: n_policy_iters * n_envs * n_steps = {buffer.n_policy_iters} * {buffer.n_envs} * "
        f"{buffer.n_steps} steps of {nbytes // n_buffer_steps:,} bytes ({obs_nbytes // n_buffer_steps:,} of "
        f"observations), {size}, taken as rollouts arrive; next auxiliary phase at step {next_aux_step:,}. "
        f"It lives in {places[storage]} ({reason})."
    )
