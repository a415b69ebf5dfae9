"""`--msprobe-config config.json`: the settings of msprobe's own run_ut/acc_check, for users migrating.

Read from the `acc_check` section (msprobe 26.x, `"task": "acc_check"`) or the `run_ut` section (8.x):

* `white_list` / `black_list`: bare API names (`matmul`, `gelu`). Items of APIs in the black list, or not in a
  non-empty white list, are deselected (black wins over white, as in msprobe). Names no dump can record are
  rejected before anything runs, as msprobe rejects them (api_names.py).
* `error_data_path`: where `--msprobe-save-error-data` given without a folder writes, into
  `<error_data_path>/ut_error_data` (msprobe adds a timestamp; one fixed name lets every xdist worker agree).
  msprobe requires the folder to exist; so does this.

Other keys of the section (the online mode's host, port, nfs_path, ...) have no meaning here and are listed
in the report header as ignored. The hooks are thin; reading and checking is plain Python.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

SECTIONS = ("acc_check", "run_ut")  # 26.x, 8.x
CONFIG_KEY = pytest.StashKey["RunUtConfig"]()
ERROR_DATA_FOLDER = "ut_error_data"


class ConfigError(Exception):
    """A config.json that cannot be used; the message names the file, key and problem."""


@dataclass(frozen=True)
class RunUtConfig:
    path: Path
    section: str
    white_list: tuple[str, ...] = ()
    black_list: tuple[str, ...] = ()
    error_data_path: Path | None = None
    ignored: tuple[str, ...] = ()

    def excluded(self, api_name: str) -> bool:
        """msprobe's filter: black list first, then a non-empty white list."""
        return api_name in self.black_list or bool(self.white_list) and api_name not in self.white_list


def read(path: Path, here: Path, specs: Any) -> RunUtConfig:
    """The run_ut/acc_check section of a config.json; ConfigError for anything msprobe would refuse."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: top level must be an object")
    present = [s for s in SECTIONS if s in doc]
    task = doc.get("task")
    section = task if task in present else (present[0] if present else None)
    if section is None:
        raise ConfigError(f"{path}: no {' or '.join(SECTIONS)} section (task {task!r}); this is not a config.json "
                          "of msprobe's accuracy pre-check")
    body = doc[section]
    if not isinstance(body, dict):
        raise ConfigError(f"{path}: {section} must be an object")
    lists = {}
    for key in ("white_list", "black_list"):
        value = body.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{path}: {section}.{key} must be a list of API names, got {value!r}")
        if value:
            from ..specs.api_names import WHERE, unknown

            bad = unknown(value, specs)
            if bad:
                raise ConfigError(f"{path}: {section}.{key}: unknown API name(s) {', '.join(bad)}: not in {WHERE}")
        lists[key] = tuple(value)
    error_data = body.get("error_data_path")
    error_path = None
    if error_data is not None:
        if not isinstance(error_data, str):
            raise ConfigError(f"{path}: {section}.error_data_path must be a string, got {error_data!r}")
        error_path = (here / error_data).resolve()
        if not error_path.is_dir():
            raise ConfigError(f"{path}: {section}.error_data_path: {error_path} is not an existing folder")
    used: tuple[str, ...] = ("white_list", "black_list", "error_data_path")
    if body.get("is_online") is True:  # msprobe 8.1's online keys: session/online_setup.py reads them
        used += ("is_online", "host", "port", "nfs_path", "tls_path", "rank_list")
    ignored = tuple(k for k in body if k not in used)
    return RunUtConfig(path, section, lists["white_list"], lists["black_list"], error_path, ignored)


class ConfigFilter:
    """Deselects the items the config's lists exclude and says so."""

    def __init__(self, cfg: RunUtConfig) -> None:
        self.cfg = cfg
        self.deselected = 0

    def pytest_report_header(self, config: pytest.Config) -> str:
        c = self.cfg
        parts = [f"white_list {len(c.white_list)}", f"black_list {len(c.black_list)}"]
        if c.error_data_path is not None:
            parts.append(f"error_data_path {c.error_data_path}")
        if c.ignored:
            parts.append(f"ignored: {', '.join(c.ignored)}")
        return f"msprobe: --msprobe-config {c.path} ({c.section}): " + "; ".join(parts)

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        from ..dump.reader import parse_entry_name
        from .items import FUZZ_SUFFIX, ApiItem

        keep: list[pytest.Item] = []
        drop: list[pytest.Item] = []
        dropped: set[str] = set()
        for item in items:
            try:
                excluded = isinstance(item, ApiItem) and self.cfg.excluded(parse_entry_name(item.name).api_name)
            except ValueError:
                excluded = False
            if excluded:
                dropped.add(item.nodeid)
            elif item.nodeid.endswith(FUZZ_SUFFIX) and item.nodeid[:-len(FUZZ_SUFFIX)] in dropped:
                excluded = True  # the API's <entry>[fuzz] item (--msprobe-fuzz), which follows it
            (drop if excluded else keep).append(item)
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep
        self.deselected = len(drop)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.deselected:
            terminalreporter.write_line(f"msprobe: {self.deselected} item(s) deselected by the white_list/black_list "
                                        f"of {self.cfg.path}")


def configure(config: pytest.Config) -> None:
    """Read --msprobe-config (a usage error if msprobe would refuse it) and register the filter."""
    option = config.getoption("msprobe_config", None)
    if not option:
        return
    from ..specs.loader import SpecError, load_specs
    from .stash import SETTINGS_KEY

    here = config.invocation_params.dir
    try:
        specs = load_specs(user_file=config.stash[SETTINGS_KEY].check_options.specs_file)
        cfg = read(here / option, here, specs)
    except (ConfigError, SpecError) as exc:
        raise pytest.UsageError(f"--msprobe-config: {exc}") from None
    config.stash[CONFIG_KEY] = cfg
    config.pluginmanager.register(ConfigFilter(cfg), "msprobe-config")


def error_data_dir(config: pytest.Config) -> Path:
    """Where `--msprobe-save-error-data` without a folder writes: <error_data_path or .>/ut_error_data."""
    cfg = config.stash.get(CONFIG_KEY, None)
    base = cfg.error_data_path if cfg is not None and cfg.error_data_path is not None else config.invocation_params.dir
    return Path(base) / ERROR_DATA_FOLDER


__all__ = ["ConfigError", "RunUtConfig", "configure", "error_data_dir", "read"]
