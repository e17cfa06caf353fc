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
