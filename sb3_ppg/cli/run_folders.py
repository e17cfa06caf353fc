"""
What a run folder of the command line (``<log folder>/ppg/<env>_<id>/``) holds, by name, and how its YAML files are
read without running code (:class:`RunFileLoader`). Nothing here imports the zoo but
:func:`zoo_reads_run_files_safely`, when it is called.
"""

import contextlib
import importlib
import os
import sys
from collections.abc import Iterator
from typing import Any

import yaml

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
    files without running code (see :class:`RunFileLoader`).
    """


class RunFileLoader(yaml.SafeLoader):
    """
    YAML loader for the files the zoo writes into a run folder (``config.yml``, ``args.yml``), which runs no code:
    YAML's safe types plus the three Python tags the zoo's ``yaml.dump`` writes, read without calling or importing
    anything:

    - ``!!python/object/apply:collections.OrderedDict`` (the zoo saves both files as an ``OrderedDict``): a ``dict``
      in the same order;
    - ``!!python/tuple``: a tuple (``-params`` values are Python expressions);
    - ``!!python/name:<module>.<class>`` (a class given in ``-params``, e.g. ``policy_kwargs:dict(activation_fn=nn.ReLU)``):
      the class, taken from the module only if that module is already imported, and only if it is a class.

    Any other tag raises :class:`UnsafeRunFileError` naming the file and the tag (the zoo's
    own loader, ``yaml.UnsafeLoader``, would construct any Python object a tampered file names, running its code).
    """

    def _refuse(self, node: yaml.Node, tag: str | None = None) -> Any:
        """
        Refuse a tag this loader does not construct.

        :param node: The YAML node
        :param tag: What to call the tag in the message (default: the node's tag)
        :raises UnsafeRunFileError: always
        """
        tag = (tag or node.tag).replace("tag:yaml.org,2002:", "!!")
        raise UnsafeRunFileError(
            f"{node.start_mark.name}, line {node.start_mark.line + 1}: refused the YAML tag {tag}: "
            "sb3_ppg reads run files without running code, and the zoo only writes OrderedDicts, tuples and the names "
            "of loaded classes there. Was this file written by python -m sb3_ppg.train? Trust only your own run files."
        )

    def _construct_ordered_dict(self, node: yaml.Node) -> dict[Any, Any]:
        """``!!python/object/apply:collections.OrderedDict [[[key, value], ...]]``: a dict."""
        if not isinstance(node, yaml.SequenceNode):
            return self._refuse(node)
        arguments = self.construct_sequence(node, deep=True)
        pairs = arguments[0] if len(arguments) == 1 and isinstance(arguments[0], list) else None
        try:
            if pairs is None or not all(isinstance(pair, list) and len(pair) == 2 for pair in pairs):
                raise TypeError("not a list of [key, value] pairs")
            return dict(pairs)
        except TypeError as error:
            return self._refuse(node, f"{node.tag} ({error})")

    def _construct_tuple(self, node: yaml.Node) -> tuple[Any, ...]:
        """``!!python/tuple [...]``: a tuple."""
        if not isinstance(node, yaml.SequenceNode):
            return self._refuse(node)
        return tuple(self.construct_sequence(node, deep=True))

    def _construct_class_name(self, suffix: str, node: yaml.Node) -> type:
        """``!!python/name:<module>.<class>``: the class, from an already imported module."""
        module_name, _, name = suffix.rpartition(".")
        module = sys.modules.get(module_name or "builtins")
        value = getattr(module, name, None) if module is not None else None
        if not isinstance(value, type):
            return self._refuse(node, f"{node.tag} (not a class of an already imported module)")
        return value


RunFileLoader.add_constructor(
    "tag:yaml.org,2002:python/object/apply:collections.OrderedDict", RunFileLoader._construct_ordered_dict
)
RunFileLoader.add_constructor("tag:yaml.org,2002:python/tuple", RunFileLoader._construct_tuple)
RunFileLoader.add_multi_constructor("tag:yaml.org,2002:python/name:", RunFileLoader._construct_class_name)
RunFileLoader.add_constructor(None, RunFileLoader._refuse)


def read_run_file(path: str | os.PathLike) -> dict[str, Any]:
    """
    Read a run folder's ``config.yml`` or ``args.yml`` with :class:`RunFileLoader` (no code runs).

    :param path: The file
    :return: Its content
    :raises UnsafeRunFileError: for a tag the loader refuses
    :raises ValueError: for a file that is not a YAML mapping
    """
    with open(path) as file:
        try:
            content = yaml.load(file, Loader=RunFileLoader)
        except yaml.YAMLError as error:
            raise ValueError(f"{path} is not valid YAML: {error}") from None
    if not isinstance(content, dict):
        raise ValueError(f"{path} holds {type(content).__name__}, not the mapping the zoo writes: not a zoo run file.")
    return content


class _ZooYaml:
    """
    The ``yaml`` module as the zoo's ``enjoy`` sees it under :func:`zoo_reads_run_files_safely`: the same module,
    except that ``yaml.UnsafeLoader`` (what the zoo reads ``config.yml`` and ``args.yml`` with) is
    :class:`RunFileLoader`.
    """

    UnsafeLoader = RunFileLoader

    def __getattr__(self, name: str) -> Any:
        return getattr(yaml, name)


@contextlib.contextmanager
def zoo_reads_run_files_safely() -> Iterator[None]:
    """
    Within the context, the zoo's ``enjoy`` (``rl_zoo3.enjoy``, and ``rl_zoo3.utils.get_saved_hyperparams``) and its
    ``record_video`` script read the run folder's YAML files with :class:`RunFileLoader` instead of
    ``yaml.UnsafeLoader``.
    """
    modules = [importlib.import_module(name) for name in ("rl_zoo3.enjoy", "rl_zoo3.utils")]
    saved = [module.yaml for module in modules]  # type: ignore[attr-defined]
    for module in modules:
        module.yaml = _ZooYaml()  # type: ignore[attr-defined]
    # The zoo's record_video script imports yaml anew when it runs: it reads yaml.UnsafeLoader at its call
    unsafe_loader = yaml.UnsafeLoader
    yaml.UnsafeLoader = RunFileLoader  # type: ignore[misc]
    try:
        yield
    finally:
        yaml.UnsafeLoader = unsafe_loader  # type: ignore[misc]
        for module, original in zip(modules, saved, strict=True):
            module.yaml = original  # type: ignore[attr-defined]


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
