"""The documentation builds with Sphinx, warnings as errors (what `sphinx-build -W -b html docs docs/_build/html` does)."""

import importlib.util
import os
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
