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
