"""
Helpers shared by the fidelity recording scripts: run a reference's own code in float64, and write a recorded case.

- ``Float64Torch``: a stand-in for the ``torch`` module, given to a reference module (or script) in place of its
  ``torch`` / ``th`` name: everything is torch's, except that ``float32`` means ``float64`` (the references cast
  observations, advantages or targets to float32 in a few places, which would round float64 data) and, optionally,
  ``randperm`` records the permutations it draws (the original code's minibatches).
- ``save_case``: one recorded case as ``<name>.npz`` (compressed arrays) and ``<name>.json`` (settings, shapes,
  reference commit).
"""

import json
import os
import subprocess
import types
import zlib
from typing import Any

import numpy as np
import torch


class Float64Torch(types.ModuleType):
    """
    ``torch``, with ``float32`` read as ``float64`` and ``randperm`` optionally recorded.

    :param randperm_log: when a list, every permutation drawn with ``randperm`` is appended to it (as numpy)
    :param overrides: further attributes to replace (e.g. ``optim``)
    """

    def __init__(self, randperm_log: list | None = None, **overrides: Any) -> None:
        super().__init__("torch")
        self._randperm_log = randperm_log
        self._overrides = overrides

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            return getattr(torch, name)
        if name in self._overrides:
            return self._overrides[name]
        if name == "float32":
            return torch.float64
        if name == "randperm" and self._randperm_log is not None:
            return self._recorded_randperm
        return getattr(torch, name)

    def _recorded_randperm(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        permutation = torch.randperm(*args, **kwargs)
        self._randperm_log.append(permutation.numpy().copy())
        return permutation


def state_arrays(prefix: str, module: torch.nn.Module) -> dict[str, np.ndarray]:
    """The module's parameters as float64 arrays named ``<prefix>/<parameter name>``."""
    return {f"{prefix}/{name}": param.detach().cpu().double().numpy().copy() for name, param in module.named_parameters()}


def git_commit(repository: str) -> str:
    """The commit of a reference checkout: ``git rev-parse HEAD`` there, else the ``--commit`` the caller gives."""
    try:
        output = subprocess.run(
            ["git", "-C", repository, "rev-parse", "HEAD"], check=True, capture_output=True, text=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""
    return output


def save_case(output_dir: str, name: str, arrays: dict[str, np.ndarray], metadata: dict[str, Any]) -> str:
    """
    Write ``<output_dir>/<name>.npz`` and ``<output_dir>/<name>.json``.

    :param output_dir: the fixtures folder (``tests/data/fidelity``)
    :param name: the case's name
    :param arrays: the recorded arrays by name
    :param metadata: settings and provenance (JSON-serializable)
    :return: the path of the ``.npz``
    """
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, f"{name}.npz")
    np.savez_compressed(path, **arrays)
    metadata = dict(metadata, arrays={key: [list(value.shape), str(value.dtype)] for key, value in sorted(arrays.items())})
    with open(os.path.join(output_dir, f"{name}.json"), "w") as file:
        json.dump(metadata, file, indent=1, sort_keys=True)
        file.write("\n")
    return path


# ---------------------------------------------------------------------------------------------------------------------
# Trajectory fixtures (issue 28): weights, action samples and parameter fingerprints that both sides compute alike
# ---------------------------------------------------------------------------------------------------------------------


def _generator(seed: int, name: str) -> np.random.Generator:
    """A NumPy generator for one named tensor, independent of the order in which the tensors are visited."""
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def seeded_normed_weight(name: str, shape: tuple[int, ...], scale: float, seed: int) -> np.ndarray:
    """
    A weight in the references' "normed" initialization (every output row has the L2 norm ``scale``), drawn from
    NumPy's generator seeded by ``(seed, crc32(name))``: the same float64 values in any process, so that a fixture
    need not store a network's initial weights (4 MB for CleanRL's on 64x64 frames).

    :param name: the parameter's name in the reference (the generator's second seed)
    :param shape: its shape; rows are the first dimension (output channels or features)
    :param scale: the norm of every row
    :param seed: the first seed
    :return: float64 array of ``shape``
    """
    weight = _generator(seed, name).standard_normal(shape)
    rows = weight.reshape(shape[0], -1)
    rows *= scale / np.sqrt((rows**2).sum(axis=1, keepdims=True))
    return weight


def fingerprint(name: str, array: np.ndarray, size: int = 64) -> np.ndarray:
    """
    A small record of a large parameter tensor: the values at ``size`` positions drawn from a generator seeded by the
    name (all values of a smaller tensor), then the sum of all values. Two tensors whose fingerprints agree to 1e-10
    agree everywhere an update touches (an update moves every entry of a trained tensor).

    :param name: the parameter's name (seeds the positions)
    :param array: the tensor's values
    :param size: number of sampled positions
    :return: float64 array of ``min(size, array.size) + 1`` values
    """
    flat = np.asarray(array, dtype=np.float64).reshape(-1)
    if flat.size <= size:
        positions = np.arange(flat.size)
    else:
        positions = np.sort(_generator(0, name).choice(flat.size, size=size, replace=False))
    return np.concatenate([flat[positions], [flat.sum()]])


def inverse_cdf_sample(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """
    Categorical samples from given uniform numbers (inverse CDF): the first action whose cumulative probability
    exceeds ``u``. The trajectory fixtures replace each side's ``Categorical.sample`` by it, so that the same recorded
    ``u`` gives the same action (up to a ``u`` within float64 rounding of a boundary: never, in practice).

    :param probs: (batch, n) probabilities
    :param uniforms: (batch,) numbers in [0, 1)
    :return: (batch,) int64 actions
    """
    cumulative = probs.cumsum(-1)
    actions = (cumulative < uniforms.to(cumulative.dtype).unsqueeze(-1)).sum(-1)
    return actions.clamp(max=probs.shape[-1] - 1)


def frame_checksums(frames: np.ndarray) -> np.ndarray:
    """
    CRC-32 of each ``H x W x C`` uint8 frame (channel last), so that a fixture proves the observations equal without
    storing them.

    :param frames: (..., H, W, C) uint8
    :return: (...) int64 checksums
    """
    frames = np.ascontiguousarray(frames, dtype=np.uint8)
    flat = frames.reshape(-1, *frames.shape[-3:])
    return np.array([zlib.crc32(frame.tobytes()) for frame in flat], dtype=np.int64).reshape(frames.shape[:-3])
