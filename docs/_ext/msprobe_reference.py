"""The reference tables of the documentation, generated from the code that is their truth.

* options and ini keys: the plugin's own `pytest_addoption`, driven with a recording parser; the former
  options of ini keys: `pytest_msprobe/session/ini_keys.py`'s table;
* hooks: the docstrings and signatures of `pytest_msprobe/hookspecs.py`;
* CSV columns: the header tuples the writers write (`records/columns.py`, `reports/results.py`,
  `verdict/ms_results.py`); JSON-lines keys: the descriptions below, which `tests/test_docs.py` holds
  against the records real runs write, in both directions;
* CLI subcommands: the argparse parser of `python -m pytest_msprobe` (`__main__.build_parser`).

Each `*_markdown()` function returns MyST markdown; `msprobe_directives.py` puts it into the pages and
`tests/test_docs.py` checks it against pytest's own `--help`, the registered hooks and written files.
Nothing here imports Sphinx, so the tests run without the docs extra.
"""
from __future__ import annotations

import argparse
import inspect
import re
import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Option:
    names: tuple[str, ...]
    kwargs: dict[str, Any]

    @property
    def name(self) -> str:
        return self.names[0]


@dataclass
class Ini:
    name: str
    help: str
    type: str | None
    default: Any


@dataclass
class _Group:
    options: list[Option]

    def addoption(self, *names: str, **kwargs: Any) -> None:
        self.options.append(Option(names, kwargs))

    _addoption = addoption


@dataclass
class RecordingParser:
    """Stands in for pytest's Parser: records what `pytest_addoption` registers, in order."""

    options: list[Option] = field(default_factory=list)
    inis: list[Ini] = field(default_factory=list)

    def getgroup(self, name: str, description: str = "", after: str | None = None) -> _Group:
        return _Group(self.options)

    def addoption(self, *names: str, **kwargs: Any) -> None:
        self.options.append(Option(names, kwargs))

    def addini(self, name: str, help: str, type: str | None = None, default: Any = None, **kw: Any) -> None:
        self.inis.append(Ini(name, help, type, default))


def recorded() -> RecordingParser:
    from pytest_msprobe import plugin

    parser = RecordingParser()
    plugin.pytest_addoption(parser)  # type: ignore[arg-type]  # duck-typed: getgroup/addoption/addini
    return parser


def _cell(text: Any) -> str:
    """One markdown table cell: pipes escaped, whitespace folded."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _code(text: str) -> str:
    return f"`{text}`" if text else ""


def _default(value: Any) -> str:
    if value in (None, "", [], False):
        return ""
    if value is True:
        return "`true`"
    if isinstance(value, (list, tuple)):
        return _code(" ".join(map(str, value)))
    return _code(str(value))


def _ini_for(option: Option, inis: Sequence[Ini]) -> Ini | None:
    """The ini key that gives the option its default: its help says `default for --option`, or its name
    is the option's with underscores."""
    stem = option.name.lstrip("-").replace("-", "_")
    for ini in inis:
        if re.search(rf"default for {re.escape(option.name)}(?![\w-])", ini.help) or ini.name == stem:
            return ini
    return None


def option_usage(option: Option) -> str:
    kw = option.kwargs
    if kw.get("action") in ("store_true", "store_false"):
        return option.name
    if "choices" in kw:
        arg = "|".join(map(str, kw["choices"]))
    else:
        arg = kw.get("metavar") or option.name.lstrip("-").upper().replace("-", "_")
    if kw.get("nargs") == "?":
        return f"{option.name} [{arg}]"
    if kw.get("nargs") in ("+", "*"):
        return f"{option.name} {arg}..."
    return f"{option.name} {arg}"


def shown(options: Iterable[Option]) -> list[Option]:
    """The options `pytest --help` shows: not the former spellings of ini keys, which parse hidden."""
    return [o for o in options if o.kwargs.get("help") != argparse.SUPPRESS]


def options_markdown() -> str:
    parser = recorded()
    rows = ["| option | ini key | default | meaning |", "|---|---|---|---|"]
    for option in shown(parser.options):
        ini = _ini_for(option, parser.inis)
        default = _default(option.kwargs.get("default"))
        if not default and ini is not None:
            default = _default(ini.default)
        rows.append(f"| {_cell(_code(option_usage(option)))} | {_cell(_code(ini.name) if ini else '')} "
                    f"| {_cell(default)} | {_cell(option.kwargs.get('help', ''))} |")
    return "\n".join(rows) + "\n"


def ini_markdown() -> str:
    parser = recorded()
    options = {o.name for o in shown(parser.options)}
    rows = ["| ini key | type | default | meaning |", "|---|---|---|---|"]
    for ini in parser.inis:
        meaning = ini.help
        for name in options:  # the option it stands for
            meaning = re.sub(rf"(?<![`\w-]){re.escape(name)}(?![\w-])", f"`{name}`", meaning)
        rows.append(f"| {_cell(_code(ini.name))} | {_cell(ini.type or 'string')} | {_cell(_default(ini.default))} "
                    f"| {_cell(meaning)} |")
    return "\n".join(rows) + "\n"


def deprecated_markdown() -> str:
    """The former options of the ini keys (session/ini_keys.py's table): each still parses for one release."""
    from pytest_msprobe.session.ini_keys import KEYS

    rows = ["| former option | now | ini key |", "|---|---|---|"]
    for key in KEYS:
        old = key.flag if key.switch else f"{key.flag} {key.metavar or '|'.join(key.choices)}"
        new = f"-o {key.name}=true" if key.switch else f"-o {key.name}={key.metavar or '|'.join(key.choices)}"
        rows.append(f"| {_cell(_code(old))} | {_cell(_code(new))} | {_cell(_code(key.name))} |")
    return "\n".join(rows) + "\n"


# ------------------------------------------------------------------------------------------------
# hooks


def hook_names() -> list[str]:
    from pytest_msprobe import hookspecs

    return [name for name, fn in inspect.getmembers(hookspecs, inspect.isfunction)
            if name.startswith("pytest_") and fn.__module__ == hookspecs.__name__]


def _rst_to_myst(doc: str) -> str:
    """The hookspecs' docstrings are reST-flavoured (`:param x:`, `.. code-block::`): MyST equivalents."""
    out: list[str] = []
    lines = doc.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        block = re.match(r"^(\s*)\.\. code-block::\s*(\w+)", line)
        if block:
            lang, i = block.group(2), i + 1
            body: list[str] = []
            while i < len(lines) and (not lines[i].strip() or lines[i].startswith(block.group(1) + "    ")):
                body.append(lines[i])
                i += 1
            out += [f"```{lang}", textwrap.dedent("\n".join(body)).strip("\n"), "```"]
            continue
        param = re.match(r"^:param (\w+):\s*(.*)$", line)
        if param:
            text = [param.group(2)]
            i += 1
            while i < len(lines) and lines[i].startswith("    "):
                text.append(lines[i].strip())
                i += 1
            out.append(f"* `{param.group(1)}`: " + " ".join(text))
            continue
        out.append(line.replace("``", "`"))
        i += 1
    return "\n".join(out)


def hooks_intro_markdown() -> str:
    """hookspecs.py's module docstring: what the hooks are for, where they run."""
    from pytest_msprobe import hookspecs

    return _rst_to_myst(inspect.cleandoc(hookspecs.__doc__ or "")) + "\n"


def hooks_markdown() -> str:
    from pytest_msprobe import hookspecs

    parts: list[str] = []
    for name in hook_names():
        fn = getattr(hookspecs, name)
        opts = getattr(fn, "pytest_spec", {})  # pluggy's marker attribute: firstresult, historic
        flags = ", ".join(k for k, v in sorted(opts.items()) if v is True)
        parts += [f"## `{name}`", "", "```python", f"def {name}{str(inspect.signature(fn)).replace(chr(39), '')}", "```", ""]
        if flags:
            parts += [f"*{flags}*", ""]
        parts += [_rst_to_myst(inspect.cleandoc(fn.__doc__ or "")), ""]
    return "\n".join(parts)


# ------------------------------------------------------------------------------------------------
# CSV columns and JSON-lines keys


def csv_files() -> list[tuple[str, str, tuple[str, ...]]]:
    """(file name, when it is written, header) of every CSV the plugin and `compare` write."""
    from pytest_msprobe.records.columns import DETAILS_HEADER
    from pytest_msprobe.reports import results
    from pytest_msprobe.verdict import ms_results

    return [
        ("accuracy_checking_result_<ts>.csv", "every run of a PyTorch dump", results.RESULT_HEADER),
        ("accuracy_checking_result_<ts>.csv", "every run of a MindSpore dump", ms_results.RESULT_HEADER),
        ("accuracy_checking_details_<ts>.csv", "every run of a PyTorch dump", DETAILS_HEADER),
        ("accuracy_checking_details_<ts>.csv", "every run of a MindSpore dump (msprobe's MindSpore layout)",
         ms_results.DETAILS_HEADER),
        ("api_precision_compare_result_<ts>.csv", "`--msprobe-standard msprobe`/`msprobe26`, and `compare`",
         results.COMPARE_RESULT_HEADER),
        ("api_precision_compare_details_<ts>.csv", "`--msprobe-standard msprobe`/`msprobe26`, and `compare`",
         results.COMPARE_DETAILS_HEADER),
    ]


def columns_markdown() -> str:
    from pytest_msprobe.records.columns import DETAILS_HEADER, METRIC_KEYS

    metric_of = dict(zip(DETAILS_HEADER[4:4 + len(METRIC_KEYS)], METRIC_KEYS))
    parts: list[str] = []
    for name, when, header in csv_files():
        parts += [f"### `{name}` ({when})", "", "| # | column | JSON-lines metric key |", "|---|---|---|"]
        for k, column in enumerate(header, 1):
            key = metric_of.get(column, "") if header == DETAILS_HEADER else ""
            parts.append(f"| {k} | {_cell(column)} | {_cell(_code(key))} |")
        parts.append("")
    return "\n".join(parts)


# Described here (the record is a dict built along the pipeline, not one schema); tests/test_docs.py
# fails when a run writes a key this table lacks, or the table names a key no module of the package writes.
RECORD_KEYS: dict[str, str] = {
    "api": "the call's name without direction, e.g. `Functional.linear.0`",
    "direction": "`forward` or `backward`",
    "status": "`pass`, `Warning`, `error` or `SKIP`: the verdict of the selected standard",
    "message": "why: the failing checks, the skip reason, or the exception",
    "seed": "the item's seed, `crc32(\"<run seed>:<API full name>\")`",
    "device": "the torch device of the device under test (`cpu`, `npu:0`, `privateuseone:0`)",
    "backend": "the device backend with its torch device (`mydev (privateuseone:0)`)",
    "contract": "the accuracy contract the strict standard held the device to (`torch`, `cuda`, `npu`: `--msprobe-contract`)",
    "bench_device": "where the bench, the third run and the magnitude run computed, and in what: `cpu (fp32)`, `cuda:0 (fp32, TF32 off)`, `cpu (fp64)` (an fp32 output's bench with `--msprobe-bench-device npu`)",
    "pieces": "an item checked a block of output rows at a time (`--msprobe-max-memory`): `rows` and `columns` per piece, `blocks` (for a backward item, its gradients' fewest rows and columns and all their blocks), the `budget` and the whole check's estimated `need` in bytes",
    "impl": "the implementation that ran on the device (`torch.nn.functional.softmax`, `<module>:<function> (substituted)`)",
    "kernel": "with `--msprobe-kernels`: the substituted kernel",
    "reference_only": "an NPU op checked without an NPU: the device side ran the bench function (counted apart)",
    "notes": "what the reader should know: planted NaN/inf, TF32/HF32 rounding, reused results, ...",
    "outputs": "one object per output or gradient (keys below)",
    "timings": "seconds per phase (`inputs_s`, `device_s`, `bench_s`, `compare_s`, ...); with the bench beside "
               "the device (a spare core) the phases overlap, and `bench_wait_s` is the item's thread's time from "
               "the end of its own runs until the bench was in (building the next item's inputs meanwhile)",
    "data": "`random` (from statistics) or `real` (saved tensors)",
    "mode": "`replay` or `overflow_check` when the item was not a re-run",
    "framework": "`mindspore` or `mindtorch` for records of such dumps",
    "reference": "what the third run was (`torch's kernel on cpu, device dtype`, a `--msprobe-reference` device)",
    "layer1_status": "msprobe's Layer-1 verdict, whatever the standard (the details CSV's Status column)",
    "standard": "the `--msprobe-standard` that judged the item",
    "traceback": "the API's exception, when it raised",
    "overflow": "overflow-check items: `normal`, `abnormal` or `not reproduced`",
    "nodeid": "the pytest node id, `<dump.json path>::<entry>`",
    "dump": "the dump.json path of the node id",
    "order": "the entry's position in its dump (files are written in dump order)",
    "rerun": "the command that reruns this item alone",
    "item_id": "the dump's resolved path and the entry: how the resume journal finds the item",
    "entry_key": "a hash of the entries and settings the item replays (a changed one reruns it on resume)",
    "error_summary": "failing outputs reduced for the HTML page: error histogram, heatmap, worst elements",
    "error_data": "with `--msprobe-save-error-data`: the saved files",
    "repro": "with `--msprobe-repro`: the script's path",
    "reused_from": "with `--msprobe-filter-api`: the entry whose result this item reports",
    "crashed": "the xdist worker died while running the item",
    "not_implemented": "the device has no kernel for this call or dtype: a skip counted apart, not an accuracy result",
    "not_checked": "in-process checks: the call was taken but never checked (a full queue, a worker that died)",
    "fuzz": "with `--msprobe-fuzz`: `true` on the record of the failing example a `[fuzz]` item found",
}

OUTPUT_KEYS: dict[str, str] = {
    "name": "the details CSV's API Name: `<api>.<direction>.output.<k>`",
    "status": "msprobe's Layer-1 verdict of this output",
    "message": "Layer 1's message",
    "bench_dtype": "dtype of the bench's result",
    "device_dtype": "dtype of the device's result",
    "shape": "the output's shape",
    "metrics": "msprobe's metrics, keyed as in the column table above",
    "ms_metrics": "MindSpore dumps: msprobe's MindSpore metrics (cosine, max abs and relative error) of the output",
    "worst": "the worst element: index, device and bench values, errors",
    "algorithm": "the msprobe algorithm of this output (benchmark, ulp_compare, ...)",
    "verdict": "the selected standard's verdict of this output",
    "verdict_message": "its reason: the check, the measured value, the limit",
    "check": "strict, an output that is not unique, or a solve's, that differs from the bench's: the check that "
             "judged it again (`ties`, `duplicate_writers`, `decomposition`, `backward_error`, `argument_backward_error`; error-model.md)",
    "compare": "the new standard's `api_precision_compare` cells (ratios, sub-verdicts)",
    "reference": "the selected standard's statistics (strict: max and mean errors, limits, torch run's)",
    "overflow": "overflow_check items: what the output's inf/NaN were on each side, and how the call was classified",
}


def _keys_table(keys: dict[str, str]) -> str:
    rows = ["| key | meaning |", "|---|---|"] + [f"| `{k}` | {_cell(v)} |" for k, v in keys.items()]
    return "\n".join(rows) + "\n"


def jsonl_markdown() -> str:
    return ("### a record (one line)\n\n" + _keys_table(RECORD_KEYS) + "\n### each of `outputs`\n\n"
            + _keys_table(OUTPUT_KEYS))


# ------------------------------------------------------------------------------------------------
# CLI


def subcommands() -> dict[str, argparse.ArgumentParser]:
    from pytest_msprobe.__main__ import build_parser

    parser = build_parser()
    for action in parser._actions:  # argparse keeps subparsers only here
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _helps(parser: argparse.ArgumentParser) -> dict[str, str]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return {a.dest: a.help or "" for a in action._choices_actions}
    return {}


def cli_markdown() -> str:
    from pytest_msprobe.__main__ import build_parser

    helps = _helps(build_parser())
    parts: list[str] = []
    for name, sub in subcommands().items():
        usage = " ".join(sub.format_usage().split()).removeprefix("usage: ")
        parts += [f"## `{name}`", "", helps.get(name, ""), "", "```text", usage, "```", "",
                  "| argument | default | meaning |", "|---|---|---|"]
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            flag = ", ".join(action.option_strings) or action.dest
            if action.choices:
                flag += " {" + ",".join(map(str, action.choices)) + "}"
            default = "" if action.required or action.default in (None, False) else _code(str(action.default))
            parts.append(f"| {_cell(_code(flag))} | {_cell(default)} | {_cell(action.help or '')} |")
        parts.append("")
    return "\n".join(parts)


# ------------------------------------------------------------------------------------------------
# api_specs keys

API_KEYED = ("forward_output_index", "bench_functions", "aliases", "output_postprocess", "unsupported_types")


def _yaml_comments(text: str) -> dict[tuple[int, str], str]:
    """{(indent, key): its comment}: the comment block right above a key, else its inline comment."""
    found: dict[tuple[int, str], str] = {}
    block: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            block.append(stripped.lstrip("#").strip())
            continue
        key = re.match(r"^( *)([\w.]+):(.*)$", line)
        if key:
            inline = re.search(r"\s#\s*(.*)$", key.group(3))
            comment = " ".join(block) or (inline.group(1) if inline else "")
            found.setdefault((len(key.group(1)), key.group(2)), comment)
        block = []
    return found


def api_specs_keys() -> list[tuple[str, str, str]]:
    """(file, dotted key, comment) for every top-level key of every api_specs/*.yaml file and the second-level
    keys of sections that are not keyed by API name."""
    import yaml

    from pytest_msprobe.specs.loader import SPEC_DIR

    rows: list[tuple[str, str, str]] = []
    for path in sorted(SPEC_DIR.glob("*.yaml")):
        text = path.read_text(encoding="utf-8")
        data = yaml.safe_load(text) or {}
        comments = _yaml_comments(text)
        for key, value in data.items():
            rows.append((path.name, key, comments.get((0, key), "")))
            if isinstance(value, dict) and key not in API_KEYED:
                for sub in value:
                    rows.append((path.name, f"{key}.{sub}", comments.get((2, str(sub)), "")))
    return rows


def api_specs_markdown() -> str:
    parts: list[str] = []
    current = ""
    for file, key, comment in api_specs_keys():
        if file != current:
            if current:
                parts.append("")
            parts += [f"## `api_specs/{file}`", "", "| key | what the file says about it |", "|---|---|"]
            current = file
        keyed = " (keys: API or op names)" if key in API_KEYED else ""
        parts.append(f"| `{key}` | {_cell(comment)}{keyed} |")
    return "\n".join(parts) + "\n"


GENERATORS = {
    "options": options_markdown,
    "ini": ini_markdown,
    "deprecated": deprecated_markdown,
    "hooks-intro": hooks_intro_markdown,
    "hooks": hooks_markdown,
    "csv-columns": columns_markdown,
    "jsonl-keys": jsonl_markdown,
    "cli": cli_markdown,
    "api-specs": api_specs_markdown,
}


def listed_options(markdown: str) -> set[str]:
    """The options a generated options table lists (first column)."""
    return {m.group(1) for m in re.finditer(r"^\| `(--[\w-]+)", markdown, re.M)}


def listed_first_column(markdown: str) -> list[str]:
    return [m.group(1) for m in re.finditer(r"^\| `([^`]+)`", markdown, re.M)]


def all_generated() -> Iterable[tuple[str, str]]:
    for name, fn in GENERATORS.items():
        yield name, fn()
