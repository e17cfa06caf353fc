# Sphinx configuration of the sb3-ppg documentation (same layout and theme as Stable-Baselines3's docs).
#
# Build it from the repository root:
#
#     pip install -e ".[docs]"
#     sphinx-build -W -b html docs docs/_build/html
#
# The Markdown pages (ppg.md, procgen.md, ...) are the single source: they are read as they are by myst-parser,
# and render on GitHub too.

import os
import sys

# The package, imported from this checkout (autodoc), whether or not it is installed
sys.path.insert(0, os.path.abspath(".."))

with open(os.path.join(os.path.dirname(__file__), "..", "sb3_ppg", "version.txt")) as file_handler:
    __version__ = file_handler.read().strip()

# -- Project information -----------------------------------------------------

project = "sb3-ppg"
copyright = "2026, sb3-ppg developers"
author = "sb3-ppg developers"
version = __version__
release = __version__

# -- General configuration ---------------------------------------------------

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "myst_parser",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
master_doc = "index"
language = "en"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
pygments_style = "sphinx"

# Markdown: "#section" links and ``{eval-rst}`` blocks; headings get anchors down to ###
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

# autodoc: members in source order, type hints in the description (SB3's :param: docstrings)
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"show-inheritance": True}
# The docs build without the optional extras (the zoo) and without a GPU
autodoc_mock_imports = ["rl_zoo3"]

# -- Options for HTML output -------------------------------------------------

html_theme = "sphinx_rtd_theme"
html_static_path = ["_static"]
htmlhelp_basename = "sb3ppgdoc"


def setup(app):
    app.add_css_file("css/baselines_theme.css")
