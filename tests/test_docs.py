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
    assert len(in_help) > 20 and len(ini_in_help) > 10  # the parse found the plugin's sections
    documented = ref.listed_options(ref.options_markdown())
    assert documented - in_help == set(), "documented options that pytest does not know"
    assert in_help - documented == set(), "options pytest knows that the docs do not list"
    ini_documented = set(ref.listed_first_column(ref.ini_markdown()))
    assert ini_documented == ini_in_help
    _page_uses("reference/options.md", "options")
    _page_uses("reference/options.md", "ini")


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
         "--msprobe-standard", "msprobe", "--msprobe-filter-api")
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


def test_every_documented_record_key_is_written_by_the_package() -> None:
    source = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "pytest_msprobe").rglob("*.py"))
    literals = set(re.findall(r"""["']([a-z_0-9]+)["']""", source))
    assert set(ref.RECORD_KEYS) - literals == set()
    assert set(ref.OUTPUT_KEYS) - literals == set()


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
    assert "--msprobe-allow-all-skipped" in options and "msprobe_min_work_per_worker" in options


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
