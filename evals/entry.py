"""One entry point per package: `python -m PACKAGE NAME [args]` runs the script NAME as `python SCRIPT [args]`
ran it (same arguments, same output); with no name, the scripts and their one-line descriptions.

The list is read from the scripts' source (their docstrings), so listing imports none of them: most import
torch, and some run in environments without this package's dependencies."""
from __future__ import annotations

import ast
import runpy
import sys
from pathlib import Path


def describe(path: Path) -> str:
    """The first sentence of the module's docstring, read without importing it."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    paragraph = " ".join(doc.strip().split("\n\n", 1)[0].split())
    return paragraph.split(". ", 1)[0].rstrip(".")


def runnable(path: Path) -> bool:
    """Whether the module is a script: it has an `if __name__ == "__main__":` block."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare) and \
                isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__":
            return True
    return False


def main(package: str, root: Path, commands: dict[str, str], argv: list[str]) -> int:
    """Run `commands[argv[0]]` (a module name under `root`'s parent) with argv[1:] as its arguments."""
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: python -m {package} NAME [args]   (python -m {package} NAME --help: its own arguments)\n")
        width = max(map(len, commands))
        for name, module in commands.items():
            path = root.parent.joinpath(*module.split(".")).with_suffix(".py")
            print(f"  {name:{width}}  {describe(path)}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in commands:
        print(f"python -m {package}: no command {name!r}; one of: {', '.join(commands)}", file=sys.stderr)
        return 2
    sys.argv = [name, *rest]  # run_module sets sys.argv[0] to the script's file, as `python SCRIPT` did
    runpy.run_module(commands[name], run_name="__main__", alter_sys=True)
    return 0
