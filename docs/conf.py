"""Sphinx configuration: MyST markdown pages; the reference tables are generated from the code
(`_ext/msprobe_reference.py`). Build: `sphinx-build -W --keep-going -n docs docs/_build/html`."""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE / "_ext"), str(HERE.parent)]  # the extension, and this checkout's package

project = "pytest-msprobe"
author = "pytest-msprobe contributors"
copyright = "pytest-msprobe contributors"
extensions = ["myst_parser", "msprobe_directives"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
myst_heading_anchors = 4  # `page.md#a-heading` links resolve, and a missing one fails the build
myst_enable_extensions = ["colon_fence"]
# furo (the docs extra pins it): navigation in a sidebar beside the content down to laptop widths, a collapsible
# menu below that, and inline code readable in its light and dark modes (alabaster put the navigation below the
# content at 1,300 px and drew inline code dark on dark)
html_theme = "furo"
html_title = "pytest-msprobe"
html_static_path: list[str] = []
html_theme_options: dict[str, str] = {}
suppress_warnings: list[str] = []
