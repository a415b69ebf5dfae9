"""The documentation's reference tables list exactly what the code has.

The tables are generated from the code (`docs/_ext/msprobe_reference.py`); these tests hold each
generator against an independent view of the same thing, in both directions: pytest's own `--help`
for options and ini keys, the hooks registered in a real pytest session, the CSV headers and JSON
records real runs write, the subcommands' `--help`, and the api_specs files as YAML reads them. They
also check that each reference page uses its generated table, and build the site when Sphinx is there.
"""
from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS / "_ext"))

import msprobe_reference as ref  # noqa: E402

EXAMPLES = ROOT / "examples"
LEAN = ("-p", "no:cacheprovider")


def _page_uses(page: str, table: str) -> None:
    text = (DOCS / page).read_text(encoding="utf-8")
    assert f"```{{msprobe-generated}} {table}" in text, f"{page} does not show the generated {table} table"


def test_options_and_ini_keys_match_pytest_help(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess("--help")
    assert result.ret == 0
    text = result.stdout.str()
    in_help = set(re.findall(r"(?<![\w-])(--msprobe-[\w-]+)", text))
    ini_section = re.split(r"^\[pytest\]", text, maxsplit=1, flags=re.M)[1]  # "[pytest] ini-options" / "configuration options"
    ini_in_help = set(re.findall(r"^\s+(msprobe_\w+)\s", ini_section, re.M))
    assert len(in_help) >= 10 and len(ini_in_help) > 20  # the parse found the plugin's sections
    documented = ref.listed_options(ref.options_markdown())
    assert documented - in_help == set(), "documented options that pytest does not know"
    assert in_help - documented == set(), "options pytest knows that the docs do not list"
    ini_documented = set(ref.listed_first_column(ref.ini_markdown()))
    assert ini_documented == ini_in_help
    _page_uses("reference/options.md", "options")
    _page_uses("reference/options.md", "ini")
    hidden = {o.name for o in ref.recorded().options} - documented  # parsed, not shown: the former options
    assert {row.split("`")[1].split()[0] for row in ref.deprecated_markdown().splitlines()[2:]} == hidden
    assert not hidden & in_help
    _page_uses("reference/options.md", "deprecated")


def test_an_option_table_row_names_its_ini_key_and_default() -> None:
    rows = {re.match(r"\| (`.*?`) \|", line).group(1): line  # type: ignore[union-attr]
            for line in ref.options_markdown().splitlines()[2:]}
    device = next(v for k, v in rows.items() if k.startswith("`--msprobe-device "))
    assert "`msprobe_device`" in device and "`auto`" in device
    assert "`strict`" in next(v for k, v in rows.items() if k.startswith("`--msprobe-standard "))
    assert "strict\\|msprobe" in next(k for k in rows if k.startswith("`--msprobe-standard "))


def test_hooks_match_the_registered_hookspecs(pytester: pytest.Pytester) -> None:
    config = pytester.parseconfig()
    registered = {name for name in vars(config.pluginmanager.hook) if name.startswith("pytest_msprobe_")}
    assert registered, "the plugin registered no hooks"
    markdown = ref.hooks_markdown()
    documented = set(re.findall(r"^## `(pytest_\w+)`", markdown, re.M))
    assert documented == registered
    for name in registered:  # each with its docstring's first line
        first = (getattr(__import__("pytest_msprobe.hookspecs", fromlist=[name]), name).__doc__ or "").strip()
        assert first and first.splitlines()[0] in markdown
    assert ".. code-block" not in markdown and ":param" not in markdown  # reST turned into MyST
    assert "Two kinds" in ref.hooks_intro_markdown()
    _page_uses("reference/hooks.md", "hooks-intro")
    _page_uses("reference/hooks.md", "hooks")


def _help(*args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "pytest_msprobe", *args, "--help"], capture_output=True, text=True,
                         cwd=ROOT, check=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    return out.stdout


def test_cli_reference_matches_the_subcommands_help() -> None:
    choices = re.findall(r"^    (\w+)  ", _help().split("\ncommands:\n", 1)[1], re.M)  # the list of commands
    markdown = ref.cli_markdown()
    sections = dict(re.findall(r"^## `(\w+)`\n(.*?)(?=^## `|\Z)", markdown, re.M | re.S))
    assert list(sections) == choices
    for name in choices:
        # past the usage line ("python -m ...") and the description (which may name a pytest option)
        arguments = re.split(r"\n\n(?=positional arguments:|options:)", _help(name), maxsplit=1)[1]
        in_help = set(re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", arguments)) - {"-h", "--help"}
        documented = set(re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", sections[name].split("|---|", 1)[1]))
        assert documented == in_help, name
    _page_uses("reference/cli.md", "cli")


def _run(pytester: pytest.Pytester, out: Path, *args: str) -> None:
    result = pytester.runpytest(*LEAN, "--msprobe-out", str(out), *args)
    assert result.ret in (0, 1), result.stdout.str()[-2000:]


def test_csv_columns_and_jsonl_keys_match_what_runs_write(pytester: pytest.Pytester, tmp_path: Path) -> None:
    """Real runs: a PyTorch statistics dump with identical calls and a MindSpore tensor dump under msprobe's new
    standard (api_precision_compare files too), and a failing substituted kernel with every triage option."""
    written = tmp_path
    _run(pytester, written / "a", str(EXAMPLES / "llama_tiny_bf16_statistics"), str(EXAMPLES / "mint_mlp_fp32_tensor"),
         "--msprobe-standard", "msprobe", "-o", "msprobe_filter_api=true")
    kernels = EXAMPLES / "approximate_kernel"
    _run(pytester, written / "b", str(kernels), "--msprobe-kernels", f"{kernels / 'kernels.py'}:KERNELS",
         "--msprobe-save-error-data", str(written / "err"), "--msprobe-repro", str(written / "repro"),
         "--msprobe-html", str(written / "report.html"))
    headers: dict[str, set[tuple[str, ...]]] = {}
    for path in written.glob("[ab]/*.csv"):
        with path.open(encoding="utf-8-sig", newline="") as f:
            header = tuple(next(csv.reader(f)))
        stem = re.sub(r"_\d{14}.*$", "_<ts>.csv", path.name)
        headers.setdefault(stem, set()).add(header)
    documented: dict[str, set[tuple[str, ...]]] = {}
    for name, _when, header in ref.csv_files():
        documented.setdefault(name, set()).add(tuple(header))
    assert headers == documented, "CSV files or headers written differ from the documented ones"
    records = [json.loads(line) for path in written.glob("[ab]/msprobe_records_*.jsonl")
               for line in path.read_text(encoding="utf-8").splitlines()]
    assert len(records) > 20
    keys = {k for r in records for k in r}
    output_keys = {k for r in records for o in r.get("outputs", []) for k in o}
    assert keys - set(ref.RECORD_KEYS) == set(), "record keys the docs do not describe"
    assert output_keys - set(ref.OUTPUT_KEYS) == set(), "output keys the docs do not describe"
    assert {"error_summary", "repro", "error_data", "kernel", "reused_from", "framework"} <= keys
    _page_uses("reference/results.md", "csv-columns")
    _page_uses("reference/results.md", "jsonl-keys")


def test_the_documented_record_keys_are_the_typed_record_s_fields() -> None:
    import dataclasses

    from pytest_msprobe.records import record

    fields = {f.name for f in dataclasses.fields(record.Record) if f.init}
    rows = {f.name for kind in (record.Row, record.DropoutRow, record.OverflowRow) for f in dataclasses.fields(kind)}
    assert set(ref.RECORD_KEYS) == fields
    assert set(ref.OUTPUT_KEYS) == rows


def test_api_specs_reference_lists_every_key_of_the_shipped_files() -> None:
    markdown = ref.api_specs_markdown()
    listed = set(re.findall(r"^\| `([\w.]+)`", markdown, re.M))
    for path in sorted((ROOT / "api_specs").glob("*.yaml")):
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        assert f"`api_specs/{path.name}`" in markdown
        for key, value in data.items():
            assert key in listed, f"{path.name}: {key}"
            if isinstance(value, dict) and key not in ref.API_KEYED:
                assert {f"{key}.{sub}" for sub in value} <= listed, f"{path.name}: {key}"
    assert "`precision.tf32` | CUDA runs fp32 convolutions in TF32" in markdown  # the file's comment came along
    _page_uses("reference/api-specs.md", "api-specs")


def test_the_site_builds_with_warnings_as_errors(tmp_path: Path) -> None:
    pytest.importorskip("sphinx", reason="the docs extra is not installed (pip install -e '.[docs]')")
    pytest.importorskip("myst_parser", reason="the docs extra is not installed (pip install -e '.[docs]')")
    out = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-q", "-b", "html",
                          str(DOCS), str(tmp_path / "html")], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    options = (tmp_path / "html" / "reference" / "options.html").read_text(encoding="utf-8")
    assert "--msprobe-resume" in options and "msprobe_min_work_per_worker" in options
    assert "--msprobe-allow-all-skipped" in options  # the former options' table


def test_readme_is_short_keeps_the_ci_commands_and_its_links_resolve() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    command1 = 'pip install "torch==2.13.0" -e . && pytest --msprobe-api-info examples/mlp_fp32_tensor/step0/rank0/dump.json'
    command2 = 'pip install "torch==2.13.0" -e ".[test]" && python -m pytest -n 2'
    first_block = readme.split("```bash", 1)[1].split("```", 1)[0]
    assert command1 in first_block and command2 in first_block  # at the top, as CI runs them
    assert command1 in ci and 'pip install "torch==2.13.0" -e ".[test]"' in ci and "python -m pytest -n 2" in ci
    assert "sphinx-build -W --keep-going -n docs" in ci and "sphinx-build -W --keep-going -n docs" in readme
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    assert len(links) > 20
    for link in links:
        assert (ROOT / link).exists(), link


def test_every_page_is_mapped_or_new_and_every_old_section_has_a_page() -> None:
    mapping = (DOCS / "README-MAPPING.md").read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([\w/.-]+\.md)\)", mapping):
        assert (DOCS / target).is_file(), target
    old_sections = ("Using it", "Options", "What an item is", "Inputs", "Execution", "Precision standards", "`strict`",
                    "Your own thresholds", "Coming from msprobe", "Results", "api_precision_compare on two CSVs",
                    "Bad input", "Fused NPU ops", "Your own kernels and devices", "MindSpore dumps and replay mode",
                    "Large runs", "Many devices", "Crashes and hung calls", "Resume", "Shards", "CI gate",
                    "Duplicate calls", "From a red item to a fix", "A script of any call", "Performance", "Layout")
    rows = [line for line in mapping.splitlines() if line.startswith("| ") and "](" in line]
    for section in old_sections:
        assert any(section in row.split("|")[1] for row in rows), section


# ---------------------------------------------------------------------------------- the project speaks of itself
# Docs, comments, benchmarks and tests describe the product as it is: no work sessions of its development
# ("the 11th session", "since the thirteenth session", "the session's base") and no tracker references
# ("issue 28, part C", "issue #12", "task 3", "#45"). "Session" as a product word stays: the online session,
# pytest's session, session-scoped fixtures, pytest_sessionstart.
_ORDINAL = (r"(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth"
            r"|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|\d+(?:st|nd|rd|th))")
HISTORY = re.compile("|".join((
    rf"\b{_ORDINAL}[- ](?:work )?sessions?\b",
    r"\bsessions? \d+\b",
    r"\b(?:last|previous|earlier|next) session\b",
    r"\b(?:this|that|last|previous) session's (?:base|remedy|changes?|figures?|tree|work|measurements?|merges?)\b",
    r"\bsession's base\b",
    r"\bissues? #?\d+",
    r"\bissue-\d+",
    r"\b(?:tasks?|tickets?|pr|pull request) #?\d+\b",
    r"(?:^|[\s(\[])#\d+\b",
    r"\bissue tracker\b",
    r"\bthe issue's\b",
)), re.IGNORECASE)
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".cfg", ".txt", ".ini", ".rst", ".json", ".sh", ".css", ".js",
                 ".html", ""}


def test_the_history_pattern_matches_development_history_and_spares_the_product() -> None:
    history = ["2026-11-25 (11th session), the random draw", "since the thirteenth session",
               "End of the tenth session (2026-11-25)", "issue 28, part C", "see issue #12", "task 3 of the plan",
               "the 12th session's figures", "the 2nd session", "in session 14", "the session's base (a85f9cc)",
               "without this session's remedy", "fixed in #45", "(vendor ticket 456)", "PR #7", "issue-7 tests",
               "the issue's own measurement", "left for the issue tracker", "Issue 26: replaying", "last session's"]
    product = ["the online session ends when every client stops", "a pytest session", "a session-scoped fixture",
               "pytest_sessionstart", "pytest_sessionfinish", "At the end of the session the controller writes",
               "checked in the session's own process", "this session's node id", "color:#222", "every 997th pattern",
               "a 4th cell", "rank 0, step 0", "the first item", "issue a warning", "a session fixture of the suite"]
    assert [text for text in history if not HISTORY.search(text)] == []
    assert [text for text in product if HISTORY.search(text)] == []


def _tracked_text_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"not a git checkout, or git is missing: {exc}")
    paths = [ROOT / name for name in out.split("\0") if name]
    return [path for path in paths if path.suffix in TEXT_SUFFIXES and path.is_file()
            and path != Path(__file__).resolve()]


def test_no_tracked_file_mentions_work_sessions_or_tracker_numbers() -> None:
    found = []
    for path in _tracked_text_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            match = HISTORY.search(line)
            if match:
                found.append(f"{path.relative_to(ROOT)}:{number}: {match.group(0)!r}")
    assert found == [], "development history in the tree (speak of the product):\n" + "\n".join(found)


_FENCE = re.compile(r"^(`{3,}|~{3,}).*?^\1[ \t]*$", re.S | re.M)
_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s")
LONGEST_PARAGRAPH = 1200  # characters of prose; code blocks, directives and tables excluded


def paragraphs(markdown: str) -> list[str]:
    """The prose paragraphs of a Markdown page: blocks between blank lines, each list item on its own."""
    prose: list[str] = []
    current: list[str] = []
    for line in _FENCE.sub("", markdown).splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith(("|", "#", ":", "<!--")):
            prose += [" ".join(current)] if current else []
            current = []
            continue
        if _ITEM.match(line) and current:
            prose.append(" ".join(current))
            current = []
        current.append(stripped)
    return prose + ([" ".join(current)] if current else [])


def test_paragraph_splitting_leaves_out_code_and_tables_and_splits_list_items() -> None:
    page = "# T\n\none\ntwo\n\n```bash\ncode\n```\n\n| a | b |\n|---|---|\n\n* x\n* y\n  z\n\n```{image} i.png\n```\n"
    assert paragraphs(page) == ["one two", "* x", "* y z"]


def test_pages_keep_paragraphs_short_and_the_benchmark_pages_within_their_length() -> None:
    pages = sorted(path for path in DOCS.rglob("*.md") if "_build" not in path.parts) + [ROOT / "README.md"]
    long = [f"{page.relative_to(ROOT)}: {len(text)} characters: {text[:70]}..."
            for page in pages for text in paragraphs(page.read_text(encoding="utf-8"))
            if len(text) > LONGEST_PARAGRAPH]
    assert long == [], f"paragraphs over {LONGEST_PARAGRAPH} characters (split them):\n" + "\n".join(long)
    assert len((ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8").splitlines()) <= 300
    assert len((DOCS / "explanation" / "performance.md").read_text(encoding="utf-8").splitlines()) <= 150


def test_every_included_section_marker_is_in_the_included_file() -> None:
    """An `{include}` with start-after/end-before keeps working only while both markers stay in the file."""
    for page in DOCS.rglob("*.md"):
        for target, options in re.findall(r"```\{include\} (\S+)\n((?::[\w-]+:.*\n)*)", page.read_text(encoding="utf-8")):
            included = (page.parent / target).resolve().read_text(encoding="utf-8")
            for marker in re.findall(r':(?:start-after|end-before): "(.*)"', options):
                assert included.count(marker) == 1, f"{page.name}: {marker!r} not once in {target}"
