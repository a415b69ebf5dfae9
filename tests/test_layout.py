"""The package's layout is the pipeline, and stays so.

Every module of `pytest_msprobe`, `bench_functions` and `api_specs` is parsed with `ast`; every import
counts: module level, inside functions, and inside `if TYPE_CHECKING:` blocks (a type-only import is
still a dependency a reader has to follow, and the next edit tends to make it a real one). Importing a
submodule (`from ..dump import reader`) is an edge to that submodule, not to the package's
`__init__`: Python runs the parent package first, but that is no dependency on what the parent holds.

Checked: no import cycle; every import points down the stage order of `LAYERS`; nothing below the
pytest layer imports pytest, _pytest or xdist; no module of the three packages over 500 lines. (Plugin load
without torch is tests/test_execution.py's test_plugin_import_and_collection_do_not_import_torch.)
"""
from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("pytest_msprobe", "bench_functions", "api_specs")
MAX_LINES = 500

# Low to high: a module may import modules of its own layer and of lower layers, never of higher ones.
# Keys are module names or package prefixes; the longest matching prefix decides a module's layer.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("api_specs", "pytest_msprobe", "pytest_msprobe.settings", "pytest_msprobe.npu_import"),  # data, options
    ("pytest_msprobe.records",),   # the record's vocabulary: metric columns, file headers, the wire format
    ("bench_functions",),          # high-precision reference implementations (torch only)
    ("pytest_msprobe.dump",),      # dump.json reading, the index, groups of identical calls
    ("pytest_msprobe.specs",),     # api_specs loading, user overrides, which API names exist
    ("pytest_msprobe.inputs",),    # arguments rebuilt from the dump, seeds
    ("pytest_msprobe.runs",),      # device and bench runs: devices, API resolution, precision, kernels
    ("pytest_msprobe.metrics",),   # vectorised numpy metrics
    ("pytest_msprobe.verdict",),   # standards and their decisions
    ("pytest_msprobe.check",),     # one entry through every stage into a record
    ("pytest_msprobe.reports",),   # records -> CSV, JSON lines, terminal lines, compare
    ("pytest_msprobe.triage",),    # red item -> saved data, repro scripts, HTML page
    ("pytest_msprobe.online",),    # online pre-check: wire format, receivers, safe loading, one-call dumps
    ("pytest_msprobe.session",),   # the pytest layer: items, devices, scheduling, journal, summary
    ("pytest_msprobe.plugin", "pytest_msprobe.hookspecs", "pytest_msprobe.__main__",
     "pytest_msprobe.backends"),   # entry points; backends is the documented public path of runs.backends
)
PYTEST_LAYER = "pytest_msprobe.session"
PYTEST_MODULES = ("pytest", "_pytest", "xdist")


def module_files(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the packages (a package is its __init__)."""
    out: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def imports_of(name: str, path: Path, known: Mapping[str, Path]) -> list[tuple[str, int]]:
    """(imported module, line) for every import statement anywhere in the file, external ones included."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                out.append((sub if sub in known else module, node.lineno))
    return out


def _owner(module: str, known: Mapping[str, Path]) -> str | None:
    """The known module an import refers to (`pytest_msprobe.dump.reader.Dump` -> the reader module)."""
    parts = module.split(".")
    while parts:
        if ".".join(parts) in known:
            return ".".join(parts)
        parts.pop()
    return None


def import_graph(root: Path, packages: Iterable[str]) -> dict[str, dict[str, int]]:
    """module -> {imported module of the same packages: first line}."""
    known = module_files(root, packages)
    graph: dict[str, dict[str, int]] = {}
    for name, path in known.items():
        edges: dict[str, int] = {}
        for module, line in imports_of(name, path, known):
            target = _owner(module, known)
            if target is not None and target != name:
                edges.setdefault(target, line)
        graph[name] = edges
    return graph


def find_cycle(graph: Mapping[str, Iterable[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in sorted(graph):
        if state.get(start):
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif not state.get(nxt) and nxt in graph:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return None


def layer_of(module: str, layers: tuple[tuple[str, ...], ...] = LAYERS) -> int | None:
    best: tuple[int, int] | None = None  # (prefix length, layer)
    for index, keys in enumerate(layers):
        for key in keys:
            if (module == key or module.startswith(key + ".")) and (best is None or len(key) > best[0]):
                best = (len(key), index)
    return None if best is None else best[1]


def upward_imports(graph: Mapping[str, Mapping[str, int]], layers: tuple[tuple[str, ...], ...] = LAYERS) -> list[str]:
    out = []
    for module, edges in sorted(graph.items()):
        mine = layer_of(module, layers)
        for target, line in sorted(edges.items()):
            theirs = layer_of(target, layers)
            if mine is not None and theirs is not None and theirs > mine:
                out.append(f"{module} (line {line}) imports {target}, a higher stage")
    return out


def pytest_imports(root: Path, packages: Iterable[str], below: str = PYTEST_LAYER,
                   layers: tuple[tuple[str, ...], ...] = LAYERS) -> list[str]:
    known = module_files(root, packages)
    limit = layer_of(below, layers)
    out = []
    for name, path in sorted(known.items()):
        layer = layer_of(name, layers)
        if layer is None or limit is None or layer >= limit:
            continue
        for module, line in imports_of(name, path, known):
            if module.split(".")[0] in PYTEST_MODULES:
                out.append(f"{name} (line {line}) imports {module}")
    return out


# ----------------------------------------------------------------------------- the package itself


def test_every_module_has_a_layer() -> None:
    missing = [name for name in module_files(ROOT, PACKAGES) if layer_of(name) is None]
    assert not missing, f"add these modules to LAYERS: {missing}"


def test_no_import_cycle() -> None:
    cycle = find_cycle(import_graph(ROOT, PACKAGES))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_imports_point_down_the_pipeline() -> None:
    assert upward_imports(import_graph(ROOT, PACKAGES)) == []


def test_stages_below_the_pytest_layer_do_not_import_pytest() -> None:
    assert pytest_imports(ROOT, PACKAGES) == []


def test_no_module_over_500_lines() -> None:
    long = {name: n for name, path in module_files(ROOT, PACKAGES).items()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert long == {}


MAX_FUNCTION_LINES = 80  # a function reads in one screen
MAX_ORCHESTRATOR_LINES = 40  # an item's check, stage by stage
ORCHESTRATORS = {("pytest_msprobe/check/rerun.py", "_run"), ("pytest_msprobe/check/replay.py", "run_external")}
EXEMPT = ("flat declaration", "compiled kernel")  # what a longer function's docstring says it is


def long_functions(root: Path, packages: Iterable[str]) -> dict[str, int]:
    """Functions over MAX_FUNCTION_LINES whose docstring does not say why (EXEMPT), and orchestrators over
    MAX_ORCHESTRATOR_LINES; 'path:name' -> lines."""
    found: dict[str, int] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                limit = MAX_ORCHESTRATOR_LINES if (rel, node.name) in ORCHESTRATORS else MAX_FUNCTION_LINES
                exempt = limit == MAX_FUNCTION_LINES and any(w in (ast.get_docstring(node) or "") for w in EXEMPT)
                if lines > limit and not exempt:
                    found[f"{rel}:{node.name}"] = lines
    return found


def test_functions_read_in_one_screen() -> None:
    assert long_functions(ROOT, PACKAGES) == {}


def test_a_long_function_is_found_unless_it_says_why(tmp_path: Path) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(90))
    (tmp_path / "toy").mkdir()
    (tmp_path / "toy" / "m.py").write_text(f"def long():\n{body}\n\ndef declared():\n"
                                           f"    \"\"\"A flat declaration of options.\"\"\"\n{body}")
    assert long_functions(tmp_path, ("toy",)) == {"toy/m.py:long": 91}


# ----------------------------------------------------------------------------- the checks can fail


@pytest.fixture
def toy(tmp_path: Path) -> Path:
    """A package with a cycle through a function-level and a TYPE_CHECKING import, an upward import
    and a low module importing pytest."""
    pkg = tmp_path / "toy"
    (pkg / "low").mkdir(parents=True)
    (pkg / "high").mkdir()
    files = {
        "__init__.py": "",
        "low/__init__.py": "",
        "low/a.py": "def f():\n    from . import b\n",
        "low/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import C\n",
        "low/c.py": "import pytest\nfrom .a import f\nfrom ..high.top import g\n",
        "high/__init__.py": "",
        "high/top.py": "from ..low import a\ndef g(): pass\n",
    }
    for rel, text in files.items():
        (pkg / rel).write_text(text)
    return tmp_path


TOY_LAYERS = (("toy",), ("toy.low",), ("toy.high",))


def test_a_cycle_is_found_and_named(toy: Path) -> None:
    graph = import_graph(toy, ["toy"])
    assert graph["toy.low.a"] == {"toy.low.b": 2}  # inside a function
    assert graph["toy.low.b"] == {"toy.low.c": 3}  # under TYPE_CHECKING
    cycle = find_cycle(graph)
    assert cycle is not None and cycle[0] == cycle[-1]
    assert set(cycle) >= {"toy.low.a", "toy.low.b", "toy.low.c"}


def test_no_cycle_once_the_edge_is_gone(toy: Path) -> None:
    (toy / "toy" / "low" / "c.py").write_text("import pytest\n")
    assert find_cycle(import_graph(toy, ["toy"])) is None


def test_an_upward_import_and_a_pytest_import_are_reported(toy: Path) -> None:
    graph = import_graph(toy, ["toy"])
    assert upward_imports(graph, TOY_LAYERS) == ["toy.low.c (line 3) imports toy.high.top, a higher stage"]
    assert pytest_imports(toy, ["toy"], below="toy.high", layers=TOY_LAYERS) == ["toy.low.c (line 1) imports pytest"]
