"""
The objects of a model zip that SB3 pickles (its ``data`` holds them cloudpickled: spaces, the policy class,
schedules, policy keyword arguments with classes, ...), described in plain JSON for a checkpoint's run state, so that
``load_checkpoint(..., allow_pickle=False)`` can give them to ``load`` as ``custom_objects`` and nothing is unpickled.

Only what can be rebuilt without running code from the file is described: JSON values, tuples, the spaces PPG takes,
SB3's constant and linear schedules, and classes of :data:`SAFE_CLASS_MODULES` (imported by name, looked up as
attributes, never called). Anything else (a lambda or a closure, such as the zoo's ``lin_`` schedules, an instance of
another class) is recorded as such: such a checkpoint loads only with pickles allowed.
"""

import importlib
import json
from typing import Any

import numpy as np
from gymnasium import spaces
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.utils import ConstantSchedule, FloatSchedule, LinearSchedule

#: Attributes put back by the checkpoint's run state (``RunState``) after ``load``
RESTORED_BY_RUN_STATE = ("_last_obs", "_last_original_obs", "_last_episode_starts", "ep_info_buffer", "ep_success_buffer")
#: Attributes that ``_setup_model`` builds again from the hyperparameters
REBUILT_BY_SETUP = ("lr_schedule", "_phase_dtypes")
#: The packages whose classes a description may name (looked up by module and qualified name, never called)
SAFE_CLASS_MODULES = ("sb3_ppg", "stable_baselines3", "sb3_contrib", "torch.nn", "torch.optim", "gymnasium.spaces")


class NotDescribable(ValueError):
    """A value that a plain description cannot hold (it needs a pickle)."""


def _is_json(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError, OverflowError):
        return False
    return True


def pickled_attributes(model: BaseAlgorithm) -> dict[str, Any]:
    """
    The attributes of a model that SB3's ``save`` writes cloudpickled into the zip's ``data`` (what it saves, less
    the JSON values, which it writes as they are).

    :param model: the model
    :return: ``{name: value}``
    """
    excluded = set(model._excluded_save_params())
    state_dicts, torch_variables = model._get_torch_save_params()
    excluded.update(name.split(".")[0] for name in [*state_dicts, *torch_variables])
    return {name: value for name, value in vars(model).items() if name not in excluded and not _is_json(value)}


def _numbers(array: np.ndarray) -> Any:
    """An array's values as JSON: one number when they are all equal, else a nested list (non-finite as strings)."""
    flat = np.asarray(array).ravel()
    values = [value if np.isfinite(value) else str(value) for value in flat.astype(np.float64).tolist()]
    if values and all(value == values[0] for value in values):
        return values[0]
    return np.asarray(values, dtype=object).reshape(np.shape(array)).tolist()


def _class_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def describe(value: Any) -> Any:
    """
    A plain JSON description of a value, for :func:`rebuild`.

    :param value: the value
    :return: its description
    :raises NotDescribable: naming what cannot be described
    """
    if isinstance(value, FloatSchedule):
        return {"float_schedule": describe(value.value_schedule)}
    if isinstance(value, ConstantSchedule):
        return {"constant_schedule": float(value.val)}
    if isinstance(value, LinearSchedule):
        return {"linear_schedule": [float(value.start), float(value.end), float(value.end_fraction)]}
    if isinstance(value, spaces.Space):
        return {"space": _describe_space(value)}
    if isinstance(value, type):
        if not _safe_module(value.__module__):
            raise NotDescribable(f"the class {_class_name(value)} (not one of {', '.join(SAFE_CLASS_MODULES)})")
        return {"class": _class_name(value)}
    if type(value).__name__ == "SavedPolicyClass":
        return {"saved_policy_class": describe(value.policy_class)}
    if isinstance(value, tuple):
        return {"tuple": [describe(item) for item in value]}
    if isinstance(value, list):
        return [describe(item) for item in value]
    if isinstance(value, dict):
        if not all(isinstance(key, str) for key in value):
            raise NotDescribable(f"a dict with keys that are not strings ({list(value)})")
        return {"dict": {key: describe(item) for key, item in value.items()}}
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise NotDescribable(f"a {type(value).__module__}.{type(value).__qualname__} ({value!r:.80})")


def _describe_space(space: spaces.Space) -> dict[str, Any]:
    if isinstance(space, spaces.Box):
        return {"type": "Box", "low": _numbers(space.low), "high": _numbers(space.high), "shape": list(space.shape),
                "dtype": str(space.dtype)}  # fmt: skip
    if isinstance(space, spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start), "dtype": str(space.dtype)}
    if isinstance(space, spaces.MultiDiscrete):
        return {"type": "MultiDiscrete", "nvec": space.nvec.tolist(), "start": space.start.tolist(), "dtype": str(space.dtype)}
    if isinstance(space, spaces.MultiBinary):
        return {"type": "MultiBinary", "n": np.asarray(space.n).tolist()}
    if isinstance(space, spaces.Dict):
        return {"type": "Dict", "spaces": {key: _describe_space(subspace) for key, subspace in space.spaces.items()}}
    raise NotDescribable(f"the space {space}")


def rebuild(description: Any) -> Any:
    """
    The value a :func:`describe` description stands for; nothing is unpickled, no class named in it is called but
    the spaces and schedules above.

    :param description: the description
    :return: the value
    :raises ValueError: for a description that :func:`describe` does not write
    """
    if isinstance(description, list):
        return [rebuild(item) for item in description]
    if not isinstance(description, dict):
        return description
    if len(description) != 1:
        raise ValueError(f"not a description of a model object: {description!r:.80}")
    ((kind, value),) = description.items()
    if kind == "float_schedule":
        return FloatSchedule(rebuild(value))
    if kind == "constant_schedule":
        return ConstantSchedule(float(value))
    if kind == "linear_schedule":
        return LinearSchedule(*(float(item) for item in value))
    if kind == "space":
        return _rebuild_space(value)
    if kind == "class":
        return _safe_class(value)
    if kind == "saved_policy_class":
        return rebuild(value)  # PPG.load unwraps a SavedPolicyClass, and takes the class itself as well
    if kind == "tuple":
        return tuple(rebuild(item) for item in value)
    if kind == "dict":
        return {key: rebuild(item) for key, item in value.items()}
    raise ValueError(f"not a description of a model object: {kind!r}")


def _safe_module(module_name: str) -> bool:
    return any(module_name == module or module_name.startswith(module + ".") for module in SAFE_CLASS_MODULES)


def _safe_class(name: str) -> type:
    module_name, _, qualname = name.partition(":")
    if not _safe_module(module_name):
        raise ValueError(f"the class {name} is not one of {', '.join(SAFE_CLASS_MODULES)}")
    value: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        value = getattr(value, part)
    if not isinstance(value, type):
        raise ValueError(f"{name} is not a class")
    return value


def _rebuild_space(description: dict[str, Any]) -> spaces.Space:
    kind = description["type"]
    if kind == "Box":
        shape = tuple(description["shape"])
        dtype = np.dtype(description["dtype"])

        def bound(value: Any) -> np.ndarray:
            return np.broadcast_to(np.asarray(value, dtype=np.float64), shape).astype(dtype)

        return spaces.Box(bound(description["low"]), bound(description["high"]), shape, dtype)
    if kind == "Discrete":
        return spaces.Discrete(description["n"], start=description["start"], dtype=np.dtype(description["dtype"]))
    if kind == "MultiDiscrete":
        nvec, start = np.asarray(description["nvec"]), np.asarray(description["start"])
        return spaces.MultiDiscrete(nvec, dtype=np.dtype(description["dtype"]), start=start)
    if kind == "MultiBinary":
        return spaces.MultiBinary(description["n"])
    if kind == "Dict":
        return spaces.Dict({key: _rebuild_space(subspace) for key, subspace in description["spaces"].items()})
    raise ValueError(f"unknown space type {kind!r}")


def describe_model_objects(model: BaseAlgorithm) -> dict[str, Any]:
    """
    The description of a model's pickled attributes (see :func:`pickled_attributes`) that a checkpoint's run state
    stores: ``{"objects": {name: description}, "not_described": {name: why}}``. The attributes the run state puts back
    and those ``_setup_model`` builds again are described as ``None``.

    :param model: the model, when its checkpoint is written
    :return: the description (JSON)
    """
    objects: dict[str, Any] = {}
    not_described: dict[str, str] = {}
    for name, value in pickled_attributes(model).items():
        if name in RESTORED_BY_RUN_STATE or name in REBUILT_BY_SETUP:
            objects[name] = None
            continue
        try:
            objects[name] = describe(value)
        except NotDescribable as error:
            not_described[name] = str(error)
    return {"objects": objects, "not_described": not_described}
