"""Sphinx extension: ```{msprobe-generated} NAME``` puts a table of `msprobe_reference.py` into a page.

The markdown is parsed in place (MyST parses a directive's nested content as markdown), so the tables
render as any hand-written table would and a broken link inside them fails the `-W` build.
"""
from __future__ import annotations

from typing import Any

import msprobe_reference
from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective


class Generated(SphinxDirective):
    required_arguments = 1
    has_content = False

    def run(self) -> list[nodes.Node]:
        name = self.arguments[0]
        if name not in msprobe_reference.GENERATORS:
            raise self.error(f"msprobe-generated: unknown table {name!r}; known: "
                             f"{', '.join(msprobe_reference.GENERATORS)}")
        text = msprobe_reference.GENERATORS[name]()
        # With headings, MyST puts the sections into the page itself as it parses them (returned nodes
        # come after them), so a generated table with headings has no text before its first heading.
        titled = text.lstrip().startswith("## ")
        container = nodes.section() if titled else nodes.container()
        container.document = self.state.document
        self.state.nested_parse(StringList(text.splitlines(), source=f"<generated {name}>"), self.content_offset,
                                container, match_titles=titled)
        return list(container.children)


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("msprobe-generated", Generated)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
