"""
Reading and writing model zips: the policy class a PPG zip stores, what a zip holds (read without unpickling), the file
SB3's ``save`` writes for a path, and the checks of ``PPG.load`` (the zip, its optimizers, ``load()``'s arguments).
"""

import difflib
import inspect
import io
import json
import os
import pathlib
import warnings
import zipfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import numpy as np
from stable_baselines3.common.save_util import json_to_data, open_path

from sb3_ppg.common.hyperparameters import (
    SAVED_HYPERPARAMETERS,
    HyperparameterError,
    is_integer,
    refuse_removed_options,
)


def class_name(cls: Any) -> str:
    """``<module>.<qualified name>`` of a class (what a model zip pickles it as)."""
    return f"{getattr(cls, '__module__', '?')}.{getattr(cls, '__qualname__', repr(cls))}"


class SavedPolicyClass:
    """
    The policy class as a PPG model zip stores it: ``PPG.load`` unwraps it, and other algorithms' ``load()`` fail on it
    with a ``ValueError`` naming PPG. Zips name it by its import path, which must stay.
    """

    def __init__(self, policy_class: type) -> None:
        self.policy_class = policy_class

    def __call__(self, *args: Any, **kwargs: Any) -> NoReturn:
        algorithm = getattr(self.policy_class, "algorithm_name", "PPG")
        raise ValueError(
            f"This model zip holds a {algorithm} model (sb3_ppg.{algorithm}, policy {class_name(self.policy_class)}), "
            f"not a model of the algorithm loading it: load it with sb3_ppg.{algorithm}.load(path) (or "
            f"{algorithm}.load_checkpoint(folder) for a checkpoint)."
        )

    def __repr__(self) -> str:
        return f"SavedPolicyClass({class_name(self.policy_class)})"


def zip_destination(path: str | pathlib.Path) -> pathlib.Path:
    """
    The file SB3's ``save`` writes for a path: ".zip" appended to a path without suffix, ``<path>_2`` when the path is
    a folder (with SB3's warning); a symbolic link is followed (the file it points to is replaced).
    """
    path = pathlib.Path(path)
    while True:
        if path.suffix == "":
            path = pathlib.Path(f"{path}.zip")
        if not path.is_dir():
            break
        warnings.warn(f"Path '{path}' is a folder. Will save instead to {path}_2")
        path = pathlib.Path(f"{path}_2")
    return pathlib.Path(os.path.realpath(path)) if path.is_symlink() else path


def read_model_zip(path: str | pathlib.Path | io.BufferedIOBase) -> tuple[dict[str, Any], set[str]] | None:
    """
    The ``data`` of a model zip as plain JSON (nothing in it is unpickled) and the names of its members; None when the
    file cannot be read as a model zip (SB3's ``load`` then says why). A file object is read from and put back at its
    position.
    """
    try:
        file = open_path(path, "r", suffix="zip")
    except (OSError, ValueError, TypeError):
        return None
    own_file = isinstance(path, (str, pathlib.Path))
    position = None if own_file else file.tell()
    try:
        with zipfile.ZipFile(file) as archive:
            data = json.loads(archive.read("data"))
            members = set(archive.namelist())
        return (data, members) if isinstance(data, dict) else None
    except (zipfile.BadZipFile, KeyError, OSError, ValueError, EOFError):
        return None
    finally:
        if own_file:
            file.close()
        else:
            file.seek(position)


def saved_policy_class(data: dict[str, Any], custom_objects: dict[str, Any] | None) -> Any:
    """The policy class a model zip's ``data`` names (unwrapped from a ``SavedPolicyClass``), or None if unreadable."""
    if custom_objects is not None and "policy_class" in custom_objects:
        policy_class = custom_objects["policy_class"]
    else:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # SB3's warning for an object that cannot be unpickled
                policy_class = json_to_data(json.dumps({"policy_class": data.get("policy_class")})).get("policy_class")
        except Exception:  # e.g. the module of another library's policy is not installed: SB3's load says so
            return None
    return policy_class.policy_class if isinstance(policy_class, SavedPolicyClass) else policy_class


def check_policy_class(where: str, data: dict[str, Any], policy_class: Any, expected: type) -> None:
    """Refuse a model zip whose policy is not an ``expected`` one, naming its algorithm when known."""
    if policy_class is None or (isinstance(policy_class, type) and issubclass(policy_class, expected)):
        return
    name = class_name(policy_class)
    if getattr(policy_class, "__module__", "") == "stable_baselines3.common.policies" and "n_steps" in data:
        algorithm = "PPO" if "clip_range" in data else "A2C"
        how = f"It is a model of SB3's {algorithm}: load it with stable_baselines3.{algorithm}.load(path)."
    else:
        how = "Load it with the class of the algorithm that saved it."
    lacks = ", and it lacks PPG's hyperparameters" if "n_policy_iters" not in data else ""
    raise ValueError(
        f"{where} does not hold a PPG model: its policy is {name}, not a PPG policy (sb3_ppg.PPGPolicy){lacks}. {how}"
    )


def check_model_zip(
    path: str | pathlib.Path | io.BufferedIOBase,
    algorithm: type,
    policy_base: type,
    custom_objects: dict[str, Any] | None,
    kwargs: dict[str, Any],
) -> dict[str, Any]:
    """
    ``PPG.load``'s checks before SB3's ``load``, on the zip read as plain JSON: the algorithm, ``load()``'s arguments and
    the saved optimizers.

    :param algorithm: the class loading it (``PPG``, ``MaskablePPG``)
    :param policy_base: the policy base class of PPG (``PPGPolicy``)
    :return: the keyword arguments to pass on to SB3's ``load`` (see :func:`load_arguments`)
    """
    saved = read_model_zip(path)
    if saved is None:
        return kwargs
    where = repr(str(path)) if isinstance(path, (str, pathlib.Path)) else "the model file"
    data, members = saved
    policy_class = saved_policy_class(data, custom_objects)
    check_policy_class(where, data, policy_class, policy_base)
    # The algorithm of the zip's policy and of this class's policies ("PPG" for PPG, "MaskablePPG" for MaskablePPG,
    # "RecurrentPPG" for RecurrentPPG): a MaskablePPG zip given to PPG.load would load, then train and predict without
    # the masks
    saved_algorithm = getattr(policy_class, "algorithm_name", None)
    aliases = algorithm.policy_aliases.values()  # type: ignore[attr-defined]
    expected_names = {getattr(alias, "algorithm_name", None) for alias in aliases} - {None}
    expected = next(iter(expected_names)) if len(expected_names) == 1 else None
    if saved_algorithm is not None and expected is not None and saved_algorithm != expected:
        raise ValueError(
            f"{where} holds a {saved_algorithm} model (policy {class_name(policy_class)}), not a {expected} one: "
            f"load it with sb3_ppg.{saved_algorithm}.load(path)."
        )
    refuse_removed_options(f"{algorithm.__name__}.load", kwargs, unknown=False)
    parameters = inspect.signature(algorithm.__init__).parameters.values()
    named = [parameter.name for parameter in parameters if parameter.kind != inspect.Parameter.VAR_KEYWORD]
    check_load_arguments(kwargs, data, named, where)
    replaced = {name: value for name, value in (custom_objects or {}).items() if name in data}
    arguments = load_arguments(kwargs, {**data, **replaced})
    check_saved_optimizers({**data, **replaced, **arguments}, members, {*replaced, *kwargs}, where)
    return arguments


@contextmanager
def load_errors(
    path: str | pathlib.Path | io.BufferedIOBase, kwargs: dict[str, Any], custom_objects: dict[str, Any] | None
) -> Iterator[None]:
    """
    Around SB3's ``load``: a ``HyperparameterError`` says where each value came from, and a truncated zip is a
    ``ValueError``.
    """
    where = repr(str(path)) if isinstance(path, (str, pathlib.Path)) else "the model file"
    try:
        yield
    except HyperparameterError as error:
        raise with_sources(error, where, kwargs, custom_objects) from None
    except AssertionError as error:
        # SB3 asserts when a truncated zip still opens (the nested policy.pth zip's directory is found)
        if "No data found" in str(error):
            raise ValueError(f"{path!r} is not a complete PPG model zip (truncated or corrupt file).") from error
        raise


def load_arguments(kwargs: dict[str, Any], saved: dict[str, Any]) -> dict[str, Any]:
    """
    ``load()``'s keyword arguments with the constructor's meaning (``batch_size=None`` follows ``n_envs``; a new
    ``n_epochs`` alone keeps joint value epochs joint); a new dict.
    """
    kwargs = dict(kwargs)
    if "batch_size" in kwargs:
        kwargs["_auto_batch_size"] = kwargs["batch_size"] is None
    n_epochs = kwargs.get("n_epochs", saved.get("n_epochs"))
    if is_integer(n_epochs):
        if "n_value_epochs" in kwargs and kwargs["n_value_epochs"] is None:
            kwargs["n_value_epochs"] = n_epochs
        elif "n_epochs" in kwargs and "n_value_epochs" not in kwargs and saved.get("n_value_epochs") == saved.get("n_epochs"):
            kwargs["n_value_epochs"] = n_epochs
    return kwargs


def check_load_arguments(kwargs: dict[str, Any], saved: dict[str, Any], parameters: Iterable[str], where: str) -> None:
    """
    Refuse ``load()`` arguments that are neither constructor parameters nor saved attributes, and a file that lacks one
    of the :data:`SAVED_HYPERPARAMETERS` unless given (a ``HyperparameterError`` naming each).
    """
    known = set(parameters) | set(saved)
    unknown = [name for name in kwargs if name not in known]
    if unknown:
        problems = []
        for name in unknown:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append((name, f"{name!r} is neither a PPG hyperparameter nor an attribute stored in the file{hint}"))
        raise HyperparameterError(problems, header=f"Unknown keyword arguments of load() for {where}:")
    missing = [name for name in SAVED_HYPERPARAMETERS if name not in saved and name not in kwargs]
    if missing:
        raise HyperparameterError(
            [(name, f"{name} is missing") for name in missing],
            header=(
                f"{where} holds no value for these PPG hyperparameters, which every PPG model zip stores (the file was "
                "edited or damaged; loading it would silently use the constructor's defaults):"
            ),
            footer=(
                f"Pass the run's values to load() (e.g. PPG.load(path, env, {missing[0]}=...)), or load an intact copy "
                "of the file."
            ),
        )


def check_saved_optimizers(values: dict[str, Any], members: set[str], changed: Iterable[str], where: str) -> None:
    """
    Refuse hyperparameters that need other optimizers than the zip holds (``load()`` can neither add nor drop one; see
    docs/differences_from_ppo.md).

    :param values: the hyperparameters the model would be loaded with
    :param members: the names of the zip's members
    :param changed: the names given to ``load()``
    :param where: the file, for the message
    """
    n_aux_epochs, separate = values.get("n_aux_epochs"), values.get("separate_aux_optimizer")
    n_epochs, n_value_epochs = values.get("n_epochs"), values.get("n_value_epochs")
    optimizers = []  # (name, needed, saved, the hyperparameters that decide it, what it is for)
    if is_integer(n_aux_epochs) and isinstance(separate, (bool, np.bool_)):
        optimizers.append(
            (
                "aux_optimizer",
                n_aux_epochs > 0 and bool(separate),
                "aux_optimizer.pth" in members,
                ("n_aux_epochs", "separate_aux_optimizer"),
                "the auxiliary phase's own optimizer (n_aux_epochs > 0 with separate_aux_optimizer=True)",
            )
        )
    if is_integer(n_epochs) and is_integer(n_value_epochs):
        optimizers.append(
            (
                "value_optimizer",
                n_epochs != n_value_epochs,
                "value_optimizer.pth" in members,
                ("n_epochs", "n_value_epochs"),
                "the optimizer of separate value epochs (n_value_epochs != n_epochs)",
            )
        )
    normalize_reward = values.get("normalize_reward", False)
    if isinstance(normalize_reward, (bool, np.bool_)):
        optimizers.append(
            (
                "reward_normalizer",
                bool(normalize_reward),
                "reward_normalizer.pth" in members,
                ("normalize_reward",),
                "the reward normalizer's statistics (normalize_reward=True)",
            )
        )
    problems = []
    for name, needed, saved, deciding, purpose in optimizers:
        if needed == saved:
            continue
        settings = ", ".join(f"{key}={values[key]!r}" for key in deciding)
        given = [key for key in deciding if key in changed]
        source = f"{', '.join(given)} given to load()" if given else "the file's own values (an edited or damaged file)"
        if saved:
            problems.append((name, f"{settings} ({source}) drops {name}: the file holds the state of {purpose}"))
        else:
            problems.append((name, f"{settings} ({source}) needs {name}, {purpose}, which the file does not hold"))
    if problems:
        raise HyperparameterError(
            problems,
            header=f"Cannot load {where} with these hyperparameters: load() restores the saved optimizers (and reward "
            "statistics), it cannot add or drop one:",
            footer=(
                "Load the file without changing these settings. To train its weights with other settings, build a model "
                "with them (and the saved policy_kwargs) and copy the policy's weights: model = PPG(policy, env, ...); "
                "model.policy.load_state_dict(PPG.load(path).policy.state_dict())."
            ),
        )


def with_sources(
    error: HyperparameterError, where: str, kwargs: dict[str, Any], custom_objects: dict[str, Any] | None
) -> HyperparameterError:
    """``check_hyperparameters``' error for a model being loaded, each value saying where it came from."""

    def source(name: str) -> str:
        if name in kwargs:
            return "given to load()"
        if custom_objects is not None and name in custom_objects:
            return "from custom_objects"
        return "stored in the file"

    problems = [(name, f"{message} ({source(name)})") for name, message in error.problems]
    return HyperparameterError(
        problems,
        header=f"Cannot load {where}: invalid PPG hyperparameters:",
        footer=(
            f"Pass valid values as keyword arguments of load() (e.g. PPG.load(path, env, {problems[0][0]}=...)): they "
            "replace the file's values."
        ),
    )


#: What ``load_checkpoint()`` cannot change: the stored rollouts and the auxiliary buffer are laid out for them
RUN_LAYOUT_HYPERPARAMETERS = ("n_steps", "n_policy_iters")


def check_run_layout(path: str | os.PathLike, layout: dict[str, Any], model: Any) -> None:
    """Refuse ``load_checkpoint()`` values of :data:`RUN_LAYOUT_HYPERPARAMETERS` that differ from the run's."""
    changed = [(name, value) for name, value in layout.items() if value != getattr(model, name)]
    if changed:
        raise HyperparameterError(
            [(name, f"{name}={value!r} given, the run has {name}={getattr(model, name)!r}") for name, value in changed],
            header=f"load_checkpoint({str(path)!r}) continues the run, whose rollouts and auxiliary buffer are laid "
            "out for its n_steps and n_policy_iters: they cannot change.",
            footer="Leave them out to resume the run, or start anew from the checkpoint's weights with other values: "
            "PPG.load('<checkpoint folder>/model.zip', env, n_steps=...).",
        )
