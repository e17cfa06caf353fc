"""
Reading and writing model zips: the policy class a PPG zip stores, what a zip holds (read without unpickling), the file
SB3's ``save`` writes for a path.
"""

import io
import json
import os
import pathlib
import warnings
import zipfile
from typing import Any, NoReturn

from stable_baselines3.common.save_util import json_to_data, open_path


def class_name(cls: Any) -> str:
    """``<module>.<qualified name>`` of a class (what a model zip pickles it as)."""
    return f"{getattr(cls, '__module__', '?')}.{getattr(cls, '__qualname__', repr(cls))}"


class SavedPolicyClass:
    """
    The policy class as a PPG model zip stores it. ``PPG.load`` unwraps it. Any other algorithm's ``load()`` (SB3's
    ``PPO.load``, ...) takes it for the policy class, and building the policy with it raises a ``ValueError`` saying
    that the file holds a PPG model, instead of a cryptic error or a PPG model trained by another algorithm. Model
    zips name this class by its import path (``sb3_ppg.common.save_util.SavedPolicyClass``): it must stay importable
    there.

    :param policy_class: the model's policy class
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
    """
    Refuse a model zip of another algorithm (its policy is not an ``expected`` one), naming the algorithm when known.

    :param where: the file, for the message
    :param data: the zip's ``data`` (plain JSON)
    :param policy_class: the policy class it names (``saved_policy_class``); None: unknown, not refused here
    :param expected: the policy base class of the algorithm loading it
    """
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
