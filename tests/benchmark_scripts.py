"""The scripts of benchmarks/ (not a package), loaded as modules by the tests that check them."""

import importlib.util
import os
from types import ModuleType

BENCHMARKS = os.path.join(os.path.dirname(__file__), "..", "benchmarks")


def load_script(name: str) -> ModuleType:
    """
    Import ``benchmarks/<name>.py`` as a module.

    :param name: the script's name, without ``.py``
    :return: the module
    """
    spec = importlib.util.spec_from_file_location(name, os.path.join(BENCHMARKS, f"{name}.py"))
    assert spec is not None and spec.loader is not None, name
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
