"""
The package's layers and the rule between them: ``cli -> ppg_mask_recurrent (MaskableRecurrentPPG) -> ppg_mask
(MaskablePPG) or ppg_recurrent (RecurrentPPG) -> ppg (the algorithm) -> common`` and ``cli -> procgen -> common``, no
import cycle; inside ``common``, checkpointing has one front door, the building blocks import no run management, the
plain modules of ``common`` (``common/*.py``) import neither the GPU levers (``common/cuda/``) nor checkpointing, and
only the algorithm and its policies (``ppg/``) import the GPU levers; only the command line changes process-wide state
(malloc's settings, torch's global defaults and threads). Every module is parsed (nothing is imported) and every import
counts: ``import``, ``from ... import`` (relative ones too), inside functions and under ``if TYPE_CHECKING:``. Each
check is also run on a synthetic package that breaks it, so that it is shown to fail.
"""

import ast
import pathlib
import textwrap
from collections import deque

import pytest

ROOT = pathlib.Path(__file__).parent.parent / "sb3_ppg"

#: The layer each top-level part of the package belongs to; any other module (the package's ``__init__``, the entry
#: points ``train`` / ``enjoy`` / ``plot`` and the re-export modules kept for old model zips) is the facade
LAYERS = {
    "cli": "cli",
    "ppg_mask_recurrent": "maskable_recurrent",
    "ppg_mask": "maskable",
    "ppg_recurrent": "recurrent",
    "ppg": "algorithm",
    "procgen": "procgen",
    "common": "common",
}
#: What each layer may import: downwards only. The facade may import anything, and nothing may import it.
ALLOWED = {
    "common": {"common"},
    "procgen": {"procgen", "common"},
    "algorithm": {"algorithm", "common"},
    "maskable": {"maskable", "algorithm", "common"},
    "recurrent": {"recurrent", "algorithm", "common"},
    "maskable_recurrent": {"maskable_recurrent", "maskable", "recurrent", "algorithm", "common"},
    "cli": {"cli", "maskable_recurrent", "maskable", "recurrent", "algorithm", "procgen", "common"},
    "facade": {"facade", "cli", "maskable_recurrent", "maskable", "recurrent", "algorithm", "procgen", "common"},
}
#: The modules of ``common`` that a model is built from: they import no module of RUN_MANAGEMENT
BUILDING_BLOCKS = (
    "rollout",
    "rollout_buffers",
    "aux_buffer",
    "distributions",
    "torch_layers",
    "optim",
    "preprocessing",
    "precision",
)
#: The modules of ``common`` that run, save, resume and scale a training run (checkpoints: the package and its modules)
RUN_MANAGEMENT = ("checkpoints", "callbacks", "data_parallel", "save_util")
#: Functions that change the whole process (glibc's malloc, torch's global defaults and threads): only the command line,
#: which owns its process, may use them (issue 50)
PROCESS_WIDE_CALLS = ("mallopt", "malloc_trim", "set_default_validate_args", "set_num_threads", "set_num_interop_threads")


def module_names(root: pathlib.Path, package: str) -> dict[str, pathlib.Path]:
    """Every module of the package under ``root``, by its dotted name (a package by its own name)."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def imported_modules(tree: ast.AST, module: str, is_package: bool, modules: set[str], package: str) -> set[str]:
    """
    The package's modules that a module's source imports: every ``Import`` and ``ImportFrom`` node, wherever it stands
    (functions, ``if TYPE_CHECKING:``); ``from a import b`` counts as importing ``a.b`` where that is a module, else
    ``a``; a name that is no module (``import pkg.mod.attr``) counts as its longest module prefix.
    """
    found = set()
    current_package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level > 0:
                base_parts = current_package.split(".")[: len(current_package.split(".")) - node.level + 1]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for target in targets:
            if target != package and not target.startswith(package + "."):
                continue
            while target not in modules:
                target = target.rpartition(".")[0]
            found.add(target)
    return found


def import_graph(root: pathlib.Path, package: str) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (see ``imported_modules``)."""
    modules = module_names(root, package)
    graph = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        graph[module] = imported_modules(tree, module, path.name == "__init__.py", set(modules), package) - {module}
    return graph


def layer_of(module: str) -> str:
    """The layer of a module (``module`` without the package's name as its first part)."""
    parts = module.split(".")
    return LAYERS.get(parts[1], "facade") if len(parts) > 1 else "facade"


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """Each import against the rule, as ``importer (layer) -> imported (layer)``."""
    violations = []
    for module, imported in sorted(graph.items()):
        for target in sorted(imported):
            if layer_of(target) not in ALLOWED[layer_of(module)]:
                violations.append(f"{module} ({layer_of(module)}) -> {target} ({layer_of(target)})")
    return violations


def front_door_violations(graph: dict[str, set[str]], package: str) -> list[str]:
    """Each import of a module inside ``common/checkpoints/`` from outside it (only the package itself may be)."""
    door = f"{package}.common.checkpoints"
    violations = []
    for module, imported in sorted(graph.items()):
        if module == door or module.startswith(door + "."):
            continue
        violations += [f"{module} -> {target}" for target in sorted(imported) if target.startswith(door + ".")]
    return violations


def building_block_violations(graph: dict[str, set[str]], package: str) -> list[str]:
    """Each import of run management (:data:`RUN_MANAGEMENT`) by a building block of ``common`` (:data:`BUILDING_BLOCKS`)."""
    managers = [f"{package}.common.{name}" for name in RUN_MANAGEMENT]
    violations = []
    for name in BUILDING_BLOCKS:
        module = f"{package}.common.{name}"
        for target in sorted(graph.get(module, ())):
            if any(target == manager or target.startswith(manager + ".") for manager in managers):
                violations.append(f"{module} -> {target}")
    return violations


def is_package(graph: dict[str, set[str]], module: str) -> bool:
    """Whether a module of the graph is a package (other modules are in it)."""
    return any(other.startswith(module + ".") for other in graph)


def plain_common_violations(graph: dict[str, set[str]], package: str) -> list[str]:
    """
    Each import of the GPU levers (``common/cuda/``) or of checkpointing (``common/checkpoints/``) by a plain module of
    ``common`` (a file ``common/*.py``, not a module of those packages).
    """
    common = f"{package}.common"
    forbidden = (f"{common}.cuda", f"{common}.checkpoints")
    violations = []
    for module, imported in sorted(graph.items()):
        if module.rpartition(".")[0] != common or module in forbidden or is_package(graph, module):
            continue
        for target in sorted(imported):
            if any(target == name or target.startswith(name + ".") for name in forbidden):
                violations.append(f"{module} -> {target}")
    return violations


def cuda_importer_violations(graph: dict[str, set[str]], package: str) -> list[str]:
    """Each import of the GPU levers (``common/cuda/``) from outside them and outside the algorithm (``ppg/``)."""
    cuda, algorithm = f"{package}.common.cuda", f"{package}.ppg"
    violations = []
    for module, imported in sorted(graph.items()):
        if any(module == name or module.startswith(name + ".") for name in (cuda, algorithm)):
            continue
        violations += [
            f"{module} -> {target}" for target in sorted(imported) if target == cuda or target.startswith(cuda + ".")
        ]
    return violations


def process_wide_calls(root: pathlib.Path, package: str) -> list[str]:
    """
    Each use of a :data:`PROCESS_WIDE_CALLS` name outside ``cli/``: an attribute (``torch.set_num_threads``), a name
    (``from torch import set_num_threads``) or a string (``getattr(libc, "mallopt")``), as ``module:line name``.
    """
    found = []
    for module, path in module_names(root, package).items():
        if module == f"{package}.cli" or module.startswith(f"{package}.cli."):
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Attribute):
                name = node.attr
            elif isinstance(node, ast.Name):
                name = node.id
            elif isinstance(node, ast.alias):
                name = node.name.rpartition(".")[2]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                name = node.value
            else:
                continue
            if name in PROCESS_WIDE_CALLS:
                found.append(f"{module}:{node.lineno} {name}")
    return sorted(found)


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles: one per strongly connected group of modules (Tarjan's algorithm), as a closed path."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in sorted(graph.get(module, ())):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                cycles.append(_closed_path(sorted(group), graph))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return cycles


def _closed_path(group: list[str], graph: dict[str, set[str]]) -> list[str]:
    """The shortest path from a group's first module back to it, through modules of the group (for the message)."""
    start, members = group[0], set(group)
    previous: dict[str, str] = {}
    queue = deque([start])
    while queue:
        module = queue.popleft()
        for target in sorted(graph[module] & members):
            if target == start:
                path = [module]
                while path[-1] != start:
                    path.append(previous[path[-1]])
                return [*reversed(path), start]
            if target not in previous:
                previous[target] = module
                queue.append(target)
    raise AssertionError(f"{group} is not a cycle")


# ----------------------------------------------------------------------------------------------------------------------
# The package


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(ROOT, "sb3_ppg")


def test_every_import_goes_down_the_layers(graph):
    assert layer_violations(graph) == []


def test_only_the_command_line_changes_the_process():
    """No mallopt, malloc_trim, global distribution-validation default or thread count outside ``sb3_ppg/cli/``."""
    assert process_wide_calls(ROOT, "sb3_ppg") == []
    assert any(" set_num_threads" in use for use in process_wide_calls(ROOT / "cli", "cli")), "the rule sees no call"


def test_no_import_cycle(graph):
    assert import_cycles(graph) == []


def test_checkpointing_has_one_front_door(graph):
    """Outside ``common/checkpoints/`` only the package ``sb3_ppg.common.checkpoints`` is imported, never its modules."""
    assert front_door_violations(graph, "sb3_ppg") == []
    assert "sb3_ppg.common.checkpoints" in graph["sb3_ppg.ppg.ppg"]


def test_building_blocks_import_no_run_management(graph):
    assert building_block_violations(graph, "sb3_ppg") == []
    assert all(f"sb3_ppg.common.{name}" in graph for name in BUILDING_BLOCKS)


def test_plain_common_modules_import_neither_the_gpu_levers_nor_checkpoints(graph):
    assert plain_common_violations(graph, "sb3_ppg") == []


def test_only_the_algorithm_imports_the_gpu_levers(graph):
    assert cuda_importer_violations(graph, "sb3_ppg") == []
    assert "sb3_ppg.common.cuda" in graph["sb3_ppg.ppg.ppg"]  # the rule's subject is there
    assert "sb3_ppg.common.cuda.cuda_graphs" in graph["sb3_ppg.ppg.policies"]


def test_callbacks_do_not_import_checkpoints(graph):
    """The rollout-boundary protocol and the eval callback stand alone: data-parallel training needs no checkpoints."""
    assert not any(target.startswith("sb3_ppg.common.checkpoints") for target in graph["sb3_ppg.common.callbacks"])


def test_train_and_the_quick_start_share_their_argument_helpers(graph):
    """The quick start does not import train (train dispatches to it); both take the arguments from a third module."""
    assert "sb3_ppg.cli.train" not in graph["sb3_ppg.cli.quickstart"]
    assert "sb3_ppg.cli.arguments" in graph["sb3_ppg.cli.train"] & graph["sb3_ppg.cli.quickstart"]
    assert not {"sb3_ppg.cli.train", "sb3_ppg.cli.quickstart"} & graph["sb3_ppg.cli.arguments"]


def test_the_graph_sees_every_layer(graph):
    """The parser finds the package's real imports (a graph without edges would pass the checks above)."""
    assert "sb3_ppg.common.aux_buffer" in graph["sb3_ppg.ppg.ppg"]
    assert "sb3_ppg.ppg" in graph["sb3_ppg.cli.quickstart"]  # from sb3_ppg.ppg import PPG: the package
    assert "sb3_ppg.common.array_files" in graph["sb3_ppg.procgen.wrappers"]
    assert "sb3_ppg.cli.experiment_manager" in graph["sb3_ppg.cli.zoo"]  # imported inside functions
    assert "sb3_ppg.ppg.ppg" in graph["sb3_ppg.ppg_mask.ppg_mask"]
    assert {"sb3_ppg.ppg_mask", "sb3_ppg.ppg_recurrent"} <= graph["sb3_ppg.ppg_mask_recurrent.ppg_mask_recurrent"]
    layers = {"facade", "cli", "maskable_recurrent", "maskable", "recurrent", "algorithm", "procgen", "common"}
    assert {layer_of(module) for module in graph} == layers


def test_only_the_maskable_layer_imports_sb3_contrib():
    """sb3-contrib is a dependency of MaskablePPG only (sb3_ppg.ppg_mask): no other module imports it."""
    importers = []
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module is not None:
                names = [node.module]
            if any(name == "sb3_contrib" or name.startswith("sb3_contrib.") for name in names):
                importers.append(path.relative_to(ROOT).as_posix())
    assert importers, "the parser finds no import of sb3_contrib at all"
    assert sorted({path for path in importers if not path.startswith("ppg_mask/")}) == []


# ----------------------------------------------------------------------------------------------------------------------
# Each check fails where it should: a synthetic package "pkg" with one broken rule at a time


def synthetic_graph(tmp_path: pathlib.Path, sources: dict[str, str]) -> dict[str, set[str]]:
    """Write the modules of a package ``pkg`` (path -> source) and parse them as the real package is."""
    for name, source in {"__init__.py": "", **sources}.items():
        path = tmp_path / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.parent / "__init__.py").touch()
        path.write_text(textwrap.dedent(source))
    return import_graph(tmp_path / "pkg", "pkg")


@pytest.mark.parametrize(
    "sources, violation",
    [
        # (b) common imports the algorithm, under TYPE_CHECKING (type-only imports count)
        (
            {"common/run.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.ppg.ppg import PPG\n"},
            "pkg.common.run (common) -> pkg.ppg.ppg (algorithm)",
        ),
        # (b) common imports the command line, inside a function
        ({"common/run.py": "def f():\n    import pkg.cli.zoo\n"}, "pkg.common.run (common) -> pkg.cli.zoo (cli)"),
        # (c) the algorithm imports the command line, relatively
        ({"ppg/ppg.py": "from ..cli import zoo\n", "cli/zoo.py": ""}, "pkg.ppg.ppg (algorithm) -> pkg.cli.zoo (cli)"),
        # (d) procgen imports the algorithm, or the command line
        ({"procgen/env.py": "from pkg.ppg import losses\n"}, "pkg.procgen.env (procgen) -> pkg.ppg.losses (algorithm)"),
        ({"procgen/env.py": "from pkg.cli.zoo import run\n"}, "pkg.procgen.env (procgen) -> pkg.cli.zoo (cli)"),
        # common imports procgen; the algorithm imports procgen; a layer imports the facade
        ({"common/envs.py": "from pkg.procgen import games\n"}, "pkg.common.envs (common) -> pkg.procgen.games (procgen)"),
        ({"ppg/ppg.py": "import pkg.procgen.games.PROCGEN\n"}, "pkg.ppg.ppg (algorithm) -> pkg.procgen.games (procgen)"),
        ({"common/buffers.py": "from pkg import PPG\n"}, "pkg.common.buffers (common) -> pkg (facade)"),
    ],
)
def test_layer_check_fails_on_a_wrong_import(tmp_path, sources, violation):
    sources = {"ppg/losses.py": "", "ppg/ppg.py": "", "procgen/games.py": "", "cli/zoo.py": "", **sources}
    assert layer_violations(synthetic_graph(tmp_path, sources)) == [violation]


@pytest.mark.parametrize(
    "sources, violation",
    [
        # a module of the algorithm reaches into checkpoints/ (inside a function)
        (
            {"ppg/ppg.py": "def f():\n    from pkg.common.checkpoints.checkpoint import load_checkpoint\n"},
            "pkg.ppg.ppg -> pkg.common.checkpoints.checkpoint",
        ),
        # a module of common, relatively
        (
            {"common/callbacks.py": "from .checkpoints import manifest\n"},
            "pkg.common.callbacks -> pkg.common.checkpoints.manifest",
        ),
    ],
)
def test_front_door_check_fails_on_an_import_of_a_checkpoints_module(tmp_path, sources, violation):
    sources = {"common/checkpoints/checkpoint.py": "from . import manifest\n", "common/checkpoints/manifest.py": "", **sources}
    sources["common/checkpoints/__init__.py"] = "from pkg.common.checkpoints.checkpoint import load_checkpoint\n"
    graph = synthetic_graph(tmp_path, {"ppg/ppg.py": "from pkg.common.checkpoints import load_checkpoint\n", **sources})
    assert front_door_violations(graph, "pkg") == [violation]


@pytest.mark.parametrize(
    "sources, violation",
    [
        # the buffer imports checkpoint bookkeeping, under TYPE_CHECKING
        (
            {"common/aux_buffer.py": "import typing\nif typing.TYPE_CHECKING:\n    from pkg.common import checkpoints\n"},
            "pkg.common.aux_buffer -> pkg.common.checkpoints",
        ),
        # the optimizer step imports the callbacks; a module of a checkpoints' format; the data-parallel hooks
        ({"common/optim.py": "from pkg.common.callbacks import x\n"}, "pkg.common.optim -> pkg.common.callbacks"),
        (
            {"common/rollout_buffers.py": "from .checkpoints.manifest import x\n"},
            "pkg.common.rollout_buffers -> pkg.common.checkpoints.manifest",
        ),
        ({"common/precision.py": "import pkg.common.data_parallel\n"}, "pkg.common.precision -> pkg.common.data_parallel"),
    ],
)
def test_building_block_check_fails_on_an_import_of_run_management(tmp_path, sources, violation):
    blocks = {f"common/{name}.py": "" for name in BUILDING_BLOCKS}
    others = {f"common/{name}.py": "" for name in ("array_files", "distributed", "hyperparameters", *RUN_MANAGEMENT)}
    del others["common/checkpoints.py"]  # a package
    sources = {**blocks, **others, "common/checkpoints/__init__.py": "", "common/checkpoints/manifest.py": "", **sources}
    sources["common/optim.py"] = sources["common/optim.py"] + "from pkg.common import distributed, aux_buffer\n"
    graph = synthetic_graph(tmp_path, sources)
    assert building_block_violations(graph, "pkg") == [violation]


@pytest.mark.parametrize(
    "sources, violation",
    [
        # a building block imports a GPU lever, relatively
        ({"common/optim.py": "from .cuda import fused_adam\n"}, "pkg.common.optim -> pkg.common.cuda.fused_adam"),
        # the auxiliary buffer imports the GPU levers' package, under TYPE_CHECKING
        (
            {"common/aux_buffer.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.common.cuda\n"},
            "pkg.common.aux_buffer -> pkg.common.cuda",
        ),
        # any plain module of common imports checkpointing, inside a function
        (
            {"common/envs.py": "def f():\n    from pkg.common import checkpoints\n"},
            "pkg.common.envs -> pkg.common.checkpoints",
        ),
    ],
)
def test_plain_common_check_fails_on_an_import_of_the_gpu_levers_or_checkpoints(tmp_path, sources, violation):
    # The packages themselves may import each other and plain modules
    cuda = {"common/cuda/__init__.py": "from pkg.common.cuda import fused_adam\n", "common/cuda/fused_adam.py": ""}
    checkpoints = {"common/checkpoints/__init__.py": "from pkg.common.cuda import fused_adam\n"}
    plain = {f"common/{name}.py": "from pkg.common import distributions\n" for name in ("optim", "aux_buffer", "envs")}
    graph = synthetic_graph(tmp_path, {"common/distributions.py": "", **cuda, **checkpoints, **plain, **sources})
    assert plain_common_violations(graph, "pkg") == [violation]


@pytest.mark.parametrize(
    "sources, violation",
    [
        # MaskablePPG (a layer above the algorithm, allowed to import common) imports a GPU lever
        (
            {"ppg_mask/ppg_mask.py": "from pkg.common.cuda.cuda_graphs import x\n"},
            "pkg.ppg_mask.ppg_mask -> pkg.common.cuda.cuda_graphs",
        ),
        # the command line imports the folder, inside a function
        ({"cli/train.py": "def f():\n    import pkg.common.cuda\n"}, "pkg.cli.train -> pkg.common.cuda"),
        # checkpointing imports it, relatively
        (
            {"common/checkpoints/run_state.py": "from ..cuda import fused_adam\n"},
            "pkg.common.checkpoints.run_state -> pkg.common.cuda.fused_adam",
        ),
    ],
)
def test_gpu_lever_check_fails_on_an_import_from_outside_the_algorithm(tmp_path, sources, violation):
    allowed = {
        "ppg/ppg.py": "from pkg.common.cuda import fused_adam\n",
        "ppg/policies.py": "from pkg.common.cuda.cuda_graphs import x\n",
        "common/cuda/__init__.py": "from pkg.common.cuda import fused_adam\n",
        "common/cuda/fused_adam.py": "",
        "common/cuda/cuda_graphs.py": "from . import fused_adam\n",
        "ppg_mask/ppg_mask.py": "from pkg.ppg import ppg\n",
    }
    graph = synthetic_graph(tmp_path, {**allowed, **sources})
    assert cuda_importer_violations(graph, "pkg") == [violation]


@pytest.mark.parametrize(
    "source, violation",
    [
        ("import ctypes\nctypes.CDLL('libc.so.6').mallopt(-4, 0)\n", "pkg.common.host:2 mallopt"),
        ("def trim(libc):\n    getattr(libc, 'malloc_trim')(0)\n", "pkg.common.host:2 malloc_trim"),
        (
            "import torch\ntorch.distributions.Distribution.set_default_validate_args(False)\n",
            "pkg.common.host:2 set_default_validate_args",
        ),
        ("from torch import set_num_threads\n", "pkg.common.host:1 set_num_threads"),
        ("import torch as th\n\n\ndef f():\n    th.set_num_interop_threads(1)\n", "pkg.common.host:5 set_num_interop_threads"),
    ],
)
def test_process_wide_call_check_fails_outside_the_command_line(tmp_path, source, violation):
    allowed = "import torch\ntorch.set_num_threads(1)\n"  # the command line owns its process
    synthetic_graph(tmp_path, {"common/host.py": source, "cli/main.py": allowed, "cli/sub/deep.py": allowed})
    assert process_wide_calls(tmp_path / "pkg", "pkg") == [violation]


def test_cycle_check_fails_on_a_cycle_closed_by_a_type_only_import(tmp_path):
    graph = synthetic_graph(
        tmp_path,
        {
            "common/a.py": "from pkg.common import b\n",
            "common/b.py": "from . import c\n",
            "common/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import Thing\n",
            "common/d.py": "from pkg.common import a\n",  # imports the cycle without being in it
        },
    )
    assert layer_violations(graph) == []
    assert import_cycles(graph) == [["pkg.common.a", "pkg.common.b", "pkg.common.c", "pkg.common.a"]]


#: The largest share of the package's lines that docstrings may take (SB3's PPO files: 18%; issue 30): explanations
#: belong in docs/
MAX_DOCSTRING_SHARE = 0.21


def docstring_lines(root: pathlib.Path) -> tuple[int, int]:
    """The lines of module, class and function docstrings, and all lines, of every module under ``root``."""
    docstrings = total = 0
    for path in sorted(root.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        total += len(source.splitlines())
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
                first = node.body[0]
                if (
                    isinstance(first, ast.Expr)
                    and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)
                ):
                    docstrings += first.end_lineno - first.lineno + 1
    return docstrings, total


def test_docstrings_stay_in_sb3s_measure():
    docstrings, total = docstring_lines(ROOT)
    assert docstrings / total <= MAX_DOCSTRING_SHARE, (
        f"docstrings are {docstrings} of sb3_ppg's {total} lines ({docstrings / total:.1%}, at most "
        f"{MAX_DOCSTRING_SHARE:.0%}): keep them to a line or two per parameter and move explanations to docs/"
    )


def test_docstring_count_sees_every_kind_of_docstring(tmp_path):
    # 3 docstring lines (module, class, method) of 9; a string that is not the first statement is no docstring
    source = '"""Module."""\n\n\nclass A:\n    """Class."""\n\n    def f(self):\n        """Method."""\n        "not one"\n'
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text(source)
    assert docstring_lines(tmp_path / "pkg") == (3, 9)
