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
    ("api_specs", "pytest_msprobe.settings", "pytest_msprobe.npu_import", "pytest_msprobe.compiled",
     "pytest_msprobe.helper"),     # data, options
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
    ("pytest_msprobe.inprocess",),  # a training step's calls captured and checked as it runs
    ("pytest_msprobe.session",),   # the pytest layer: items, devices, scheduling, journal, summary
    ("pytest_msprobe", "pytest_msprobe.plugin", "pytest_msprobe.hookspecs", "pytest_msprobe.__main__",
     "pytest_msprobe.backends"),   # entry points (the package's `checking`); backends: the public path of runs.backends
)
PYTEST_LAYER = "pytest_msprobe.session"
PYTEST_MODULES = ("pytest", "_pytest", "xdist")


def module_files(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the packages (a package is its __init__; a package
    may also be one file, `conftest.py`, or absent, and `""` is every file under `root`)."""
    out: dict[str, Path] = {}
    for package in packages:
        where = root / package
        for path in [where] if where.is_file() else sorted(where.rglob("*.py")):
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


def import_graph(root: Path, packages: Iterable[str], known: Mapping[str, Path] | None = None) -> dict[str, dict[str, int]]:
    """module -> {imported module of the same packages (or of `known`): first line}."""
    known = module_files(root, packages) if known is None else known
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
ORCHESTRATORS = {("pytest_msprobe/check/protocol.py", "run_item"), ("pytest_msprobe/check/protocol.py", "check_entry")}
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


# ----------------------------------------------------------------------------- the whole repository

# (sys.path entry, what is importable under it): every Python file of the checkout, named as Python imports it.
# `evals` counts once it exists; docs/_ext is on sys.path itself (docs/conf.py puts it there).
REPOSITORY = (("", "pytest_msprobe"), ("", "bench_functions"), ("", "api_specs"), ("", "tests"),
              ("", "benchmarks"), ("", "evals"), ("docs/_ext", ""), ("", "conftest.py"))
# The library's layers, then the evaluations, then the benchmarks that run them: the library never imports
# either, and evals never imports benchmarks. tests and docs/_ext import anything and have no layer.
REPOSITORY_LAYERS = LAYERS + (("evals",), ("benchmarks",))


def repository_files(root: Path) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for base, package in REPOSITORY:
        out.update(module_files(root / base, [package]))
    return out


def import_circles(graph: Mapping[str, Iterable[str]]) -> list[str]:
    """Every set of modules that import each other round a circle (a strongly connected component of more
    than one module, Tarjan's algorithm), as 'import circle: a, b, ...' in name order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in graph:
                continue
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                out.append("import circle: " + ", ".join(sorted(component)))

    for start in sorted(graph):
        if start not in index:
            visit(start)
    return sorted(out)


def test_no_import_circle_in_the_repository() -> None:
    assert sorted(set(import_circles(import_graph(ROOT, (), repository_files(ROOT))))) == []


def test_the_library_imports_neither_evals_nor_benchmarks() -> None:
    assert upward_imports(import_graph(ROOT, (), repository_files(ROOT)), REPOSITORY_LAYERS) == []


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _module_names(name: str, tree: ast.AST, known: Mapping[str, Path]) -> dict[str, str]:
    """Local name -> the known module it is bound to by an import anywhere in the file (`import a.b` binds
    `a`, `import a.b as m` and `from a import b`, b a module, bind the module)."""
    package = name.split(".") if known[name].name == "__init__.py" else name.split(".")[:-1]
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = alias.name if alias.asname else alias.name.split(".")[0]
                if target in known:
                    bound[alias.asname or target] = target
        elif isinstance(node, ast.ImportFrom):
            module = _from_module(node, package)
            for alias in node.names:
                if f"{module}.{alias.name}" in known:
                    bound[alias.asname or alias.name] = f"{module}.{alias.name}"
    return bound


def _from_module(node: ast.ImportFrom, package: list[str]) -> str:
    if not node.level:
        return node.module or ""
    base = package[:len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _attribute_chain(node: ast.Attribute) -> list[str] | None:
    """`a.b.c` -> ["a", "b", "c"]; None when the chain does not start at a name."""
    chain: list[str] = []
    current: ast.expr = node
    while isinstance(current, ast.Attribute):
        chain.append(current.attr)
        current = current.value
    if not isinstance(current, ast.Name):
        return None
    return [current.id] + chain[::-1]


def private_imports(root: Path, packages: Iterable[str]) -> list[str]:
    """`from X import _name` and `X._name` on an imported module X, X another module of the packages."""
    known = module_files(root, packages)
    out = set()
    for name, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        modules = _module_names(name, tree, known)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                module = _from_module(node, package)
                if module in known and module != name:
                    out.update(f"{name} imports {module}.{a.name}" for a in node.names if _is_private(a.name))
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                chain = _attribute_chain(node)
                if not chain or chain[0] not in modules:
                    continue
                module, rest = modules[chain[0]], chain[1:]
                while rest and f"{module}.{rest[0]}" in known:
                    module, rest = f"{module}.{rest[0]}", rest[1:]
                if rest and _is_private(rest[0]) and module != name:
                    out.add(f"{name} imports {module}.{rest[0]}")
    return sorted(out)


PRIVATE_CHECKED = ("pytest_msprobe", "bench_functions", "evals", "benchmarks")  # tests may reach into what they test


def test_no_module_imports_private_names_of_another() -> None:
    assert sorted(set(private_imports(ROOT, PRIVATE_CHECKED))) == []


MAX_PARAMETERS = 6  # more is a record of options that wants a name of its own


def wide_functions(root: Path, packages: Iterable[str]) -> dict[str, int]:
    """'path:Class.function' -> parameters (self and cls not counted, *args and **kwargs counted), for every
    function over MAX_PARAMETERS whose docstring does not say why (EXEMPT)."""
    found: dict[str, int] = {}

    def visit(node: ast.AST, rel: str, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, rel, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = child.args
                positional = [x.arg for x in a.posonlyargs + a.args]
                if positional[:1] in (["self"], ["cls"]):
                    positional = positional[1:]
                n = len(positional) + len(a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)
                if n > MAX_PARAMETERS and not any(w in (ast.get_docstring(child) or "") for w in EXEMPT):
                    found[f"{rel}:{prefix}{child.name}"] = n
                visit(child, rel, f"{prefix}{child.name}.")
            else:
                visit(child, rel, prefix)

    for path in module_files(root, packages).values():
        visit(ast.parse(path.read_text(encoding="utf-8")), path.relative_to(root).as_posix(), "")
    return found


def test_functions_take_at_most_six_parameters() -> None:
    """bench_functions is left out: each mirrors the signature of the device API it stands in for."""
    wide = wide_functions(ROOT, ["pytest_msprobe"])
    assert wide == {}


def protocol_violations(root: Path) -> list[str]:
    """The device sources and the output kinds are listed once each, in check/protocol.py and check/kinds.py:
    both tuples of distinct classes (or names), and no other module holds a literal listing of all of them."""
    import importlib

    out = []
    if not (root / "pytest_msprobe" / "check" / "protocol.py").is_file():
        out.append("pytest_msprobe/check/protocol.py: missing")
    listings: dict[str, tuple[str, ...]] = {}
    for module, attr in (("pytest_msprobe.check.protocol", "SOURCES"), ("pytest_msprobe.check.kinds", "KINDS")):
        try:
            value = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError):
            out.append(f"{module}.{attr}: missing")
            continue
        names = tuple(v if isinstance(v, str) else getattr(v, "__name__", None) for v in value) \
            if isinstance(value, tuple) else ()
        if not (names and all(isinstance(n, str) for n in names) and len(set(names)) == len(names)):
            out.append(f"{module}.{attr}: not a tuple of distinct classes or names")
            continue
        listings[f"{module}.{attr}"] = names  # type: ignore[assignment]  # all str, checked above
    return out + second_listings(root, listings)


def second_listings(root: Path, listings: Mapping[str, tuple[str, ...]]) -> list[str]:
    """A literal tuple, list or set that holds every name of a listing, in a module other than the listing's."""
    out = []
    for name, path in module_files(root, ["pytest_msprobe"]).items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                continue
            strings = {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
            strings |= {e.id for e in node.elts if isinstance(e, ast.Name)}
            strings |= {e.attr for e in node.elts if isinstance(e, ast.Attribute)}
            for where, value in listings.items():
                if name != where.rsplit(".", 1)[0] and len(value) > 1 and strings >= set(value):
                    out.append(f"{name} (line {node.lineno}) lists {where} again")
    return out


def test_one_protocol_module_lists_sources_and_kinds() -> None:
    assert sorted(set(protocol_violations(ROOT))) == []


# ----------------------------------------------------------------------------- the checks can fail


@pytest.fixture
def toy(tmp_path: Path) -> Path:
    """A package with a cycle through a function-level and a TYPE_CHECKING import and the upward import,
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


def test_private_names_of_another_module_are_found(tmp_path: Path) -> None:
    pkg = tmp_path / "toy"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("_hidden = 1\n__version__ = '1'\ndef _own(): return _hidden\n")
    (pkg / "b.py").write_text("from .a import _hidden, __version__\nfrom . import a\nimport toy.a as alias\n"
                              "def f():\n    return a._own(), alias.__version__, alias._hidden, a.public\n")
    (pkg / "c.py").write_text("import toy.a\nx = toy.a._own\n")
    assert private_imports(tmp_path, ["toy"]) == [
        "toy.b imports toy.a._hidden", "toy.b imports toy.a._own", "toy.c imports toy.a._own"]


def test_a_function_over_six_parameters_is_found_unless_it_says_why(tmp_path: Path) -> None:
    (tmp_path / "toy").mkdir()
    (tmp_path / "toy" / "m.py").write_text(
        "def wide(a, b, c, d, e, f, *, g): pass\n"
        "def starred(a, b, c, d, e, *args, **kwargs): pass\n"
        "def six(a, b, c, d, e, f): pass\n"
        "class C:\n    def method(self, a, b, c, d, e, f): pass\n"
        "    def inner(self):\n        def nested(a, b, c, d, e, f, g): pass\n"
        "def kernel(a, b, c, d, e, f, g):\n    \"\"\"A compiled kernel.\"\"\"\n")
    assert wide_functions(tmp_path, ["toy"]) == {
        "toy/m.py:wide": 7, "toy/m.py:starred": 7, "toy/m.py:C.inner.nested": 7}


def test_every_circle_is_named_once(toy: Path) -> None:
    circles = import_circles({**import_graph(toy, ["toy"]), "x": {"y"}, "y": {"x"}})
    assert circles == ["import circle: toy.high.top, toy.low.a, toy.low.b, toy.low.c", "import circle: x, y"]


def test_the_library_importing_benchmarks_or_evals_importing_benchmarks_is_reported() -> None:
    graph = {"pytest_msprobe.check.calls": {"evals.run": 1}, "evals.run": {"benchmarks.bench_ops": 2},
             "benchmarks.bench_ops": {"evals.run": 3, "pytest_msprobe.check.calls": 4}, "tests.t": {"benchmarks.x": 5}}
    assert upward_imports(graph, REPOSITORY_LAYERS) == [
        "evals.run (line 2) imports benchmarks.bench_ops, a higher stage",
        "pytest_msprobe.check.calls (line 1) imports evals.run, a higher stage"]


def test_a_second_listing_of_the_sources_is_found(tmp_path: Path) -> None:
    (tmp_path / "pytest_msprobe" / "check").mkdir(parents=True)
    (tmp_path / "pytest_msprobe" / "check" / "protocol.py").write_text("SOURCES = ('torch', 'npu')\n")
    (tmp_path / "pytest_msprobe" / "copy.py").write_text("AGAIN = ['npu', 'torch', 'other']\nONE = ('npu',)\n")
    listings = {"pytest_msprobe.check.protocol.SOURCES": ("torch", "npu")}
    assert second_listings(tmp_path, listings) == [
        "pytest_msprobe.copy (line 1) lists pytest_msprobe.check.protocol.SOURCES again"]
    assert "pytest_msprobe/check/protocol.py: missing" in protocol_violations(tmp_path / "elsewhere")
