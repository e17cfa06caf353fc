"""The documentation builds with Sphinx, warnings as errors (what `sphinx-build -W -b html docs docs/_build/html` does)."""

import importlib.util
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
DOCS_PACKAGES = ("sphinx", "myst_parser", "sphinx_rtd_theme")


@pytest.mark.slow
@pytest.mark.skipif(
    any(importlib.util.find_spec(name) is None for name in DOCS_PACKAGES),
    reason='the docs packages are not installed (pip install -e ".[docs]", or ".[tests]" which includes them)',
)
def test_docs_build_without_warnings(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html", "-d", str(tmp_path / "doctrees"), "docs",
         str(tmp_path / "html")],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (ROOT, os.environ.get("PYTHONPATH"))))),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-5000:]
    for page in ("index", "ppg", "differences_from_ppo", "changelog", "guide/install", "guide/examples", "api/ppg"):
        assert (tmp_path / "html" / f"{page}.html").exists(), page
    # The API reference was generated from the docstrings (autodoc imported the package)
    api = (tmp_path / "html" / "api" / "ppg.html").read_text(encoding="utf-8")
    assert "n_policy_iters" in api and "beta_clone" in api


#: A placeholder left for a number or text to fill in (``__CPU_MEASUREMENT__``), or a note that something is missing
PLACEHOLDER = re.compile(r"(?<![\w`.])__[A-Z][A-Z0-9_]*__(?!\w)|\b(?:TODO|TBD|FIXME|XXX)\b")


def placeholders(text: str) -> list[str]:
    """The placeholder tokens in a page's text (Python's dunder names, such as ``__init__``, are lower case)."""
    return [match.group(0) for match in PLACEHOLDER.finditer(text)]


def test_the_placeholder_check_catches_one():
    assert placeholders("**Measured here (CPU)**: __CPU_MEASUREMENT__\n") == ["__CPU_MEASUREMENT__"]
    assert placeholders("takes __MINUTES__ minutes; TODO: measure") == ["__MINUTES__", "TODO"]
    assert placeholders("`PPG.__init__`, `__version__`, 2,048 steps, TODOS") == []


def test_no_placeholder_in_the_docs():
    """README.md, CHANGELOG.md and every page of docs/ say what they mean: no token left to fill in."""
    pages = [os.path.join(ROOT, name) for name in ("README.md", "CHANGELOG.md")]
    for folder, _, files in os.walk(os.path.join(ROOT, "docs")):
        if "_build" not in folder:
            pages += [os.path.join(folder, name) for name in files if name.endswith((".md", ".rst"))]
    found = {}
    for page in pages:
        with open(page, encoding="utf-8") as file:
            for number, line in enumerate(file, start=1):
                if placeholders(line):
                    found[f"{os.path.relpath(page, ROOT)}:{number}"] = placeholders(line)
    assert not found, f"placeholders left in the docs: {found}"


#: A repository path named in a page: a top-level folder of the repository, then the rest of the path
REPOSITORY_PATH = re.compile(r"(?<![\w./-])((?:sb3_ppg|benchmarks|tests|docs|examples|\.ci)/[\w./-]*\w)")
#: The target of a Markdown link, relative to its page (the anchor left out)
MARKDOWN_LINK = re.compile(r"\]\(([^)\s#]+)")
#: An option whose value is a path that the command writes, which need not exist before it runs
WRITTEN_BY_COMMAND = re.compile(r"(?:--output|--json|--folder|-o)[ =]$")
#: A gymnasium id registered by the package (``sb3_ppg/DictCartPole-v1``), not a file
PACKAGE_ENV_ID = re.compile(r"sb3_ppg/[A-Z][\w-]*")


def dead_paths(text: str, page_folder: str, root: str = ROOT) -> list[str]:
    """
    The repository paths and Markdown links of a page that name nothing in the repository.

    :param text: The page's text
    :param page_folder: The page's folder, which its relative Markdown links start from
    :param root: The repository's root, which the paths named in the text start from
    """
    dead = []
    for match in REPOSITORY_PATH.finditer(text):
        path = match.group(1)
        written = WRITTEN_BY_COMMAND.search(text[max(0, match.start() - 10) : match.start()])
        if written or path.startswith("docs/_build") or PACKAGE_ENV_ID.fullmatch(path):
            continue
        if not os.path.exists(os.path.join(root, path)):
            dead.append(path)
    for match in MARKDOWN_LINK.finditer(text):
        target = match.group(1)
        if "://" not in target and not target.startswith("mailto:"):
            if not os.path.exists(os.path.join(page_folder, target)):
                dead.append(target)
    return dead


def test_the_path_check_catches_a_dead_path(tmp_path):
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "throughput.py").write_text("")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "ppg.md").write_text("")
    text = (
        "Run `benchmarks/throughput.py` or benchmarks/no_such.py; the file sb3_ppg/hyperparams/ppg_easy.yml;\n"
        "[PPG](ppg.md), [gone](gone.md#anchor), [site](https://example.org/x.md);\n"
        "`python benchmarks/throughput.py --output docs/new_report.md`, env sb3_ppg/DictCartPole-v1,\n"
        "tests/test_x.py::test_y, docs/_build/html\n"
    )
    found = dead_paths(text, str(tmp_path / "docs"), str(tmp_path))
    assert found == ["benchmarks/no_such.py", "sb3_ppg/hyperparams/ppg_easy.yml", "tests/test_x.py", "gone.md"]


def test_every_path_in_the_docs_exists():
    """Every repository path and Markdown link in the READMEs, docs/ and the hyperparameter files names a real file."""
    pages = [os.path.join(ROOT, "README.md")]
    for folder, _, files in os.walk(os.path.join(ROOT, "sb3_ppg")):
        pages += [os.path.join(folder, name) for name in files if name == "README.md"]
    for folder, _, files in os.walk(os.path.join(ROOT, "docs")):
        if "_build" not in folder:
            pages += [os.path.join(folder, name) for name in files if name.endswith((".md", ".rst"))]
    hyperparams = os.path.join(ROOT, "sb3_ppg", "cli", "hyperparams")
    pages += [os.path.join(hyperparams, name) for name in os.listdir(hyperparams) if name.endswith(".yml")]
    assert len(pages) > 20
    found = {}
    for page in pages:
        with open(page, encoding="utf-8") as file:
            dead = dead_paths(file.read(), os.path.dirname(page))
        if dead:
            found[os.path.relpath(page, ROOT)] = dead
    assert not found, f"paths in the docs that name no file of the repository: {found}"
