"""The plugin's command-line options and ini keys, registered in one place (pytest_addoption calls
addoption), so plugin.py stays the hooks only. The command line keeps what a run is about (the dumps, the device,
the judgement, the outputs, the triage); every other setting is an ini key of ini_keys.KEYS (settable for one run
with `-o msprobe_key=value`), whose former options still parse, hidden, for one release."""
from __future__ import annotations

import argparse

import pytest

from ..settings import (
    CONTRACTS,
    DEFAULT_SEED,
    MODES,
    STANDARDS,
)
from . import ini_keys, online_setup
from . import triage_hooks as triage
from .shard import parse_shard


def parse_seed(value: str) -> int | str:
    """--msprobe-seed and ini msprobe_seed: an integer in [0, 2**32) or `random`."""
    if value == "random":
        return value
    try:
        seed = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--msprobe-seed wants an integer or 'random', got {value!r}") from None
    if not 0 <= seed < 2**32:
        raise argparse.ArgumentTypeError(f"--msprobe-seed must be in [0, 2**32), got {seed}")
    return seed


def addoption(parser: pytest.Parser) -> None:
    """A flat declaration of every option, one call each, in the order --help shows them."""
    group = parser.getgroup("msprobe", "msprobe API precision checks (pytest-msprobe; the other settings are ini keys "
                             "msprobe_*, for one run -o msprobe_KEY=VALUE)")
    group.addoption("--msprobe-api-info", nargs="+", action="extend", default=[], metavar="DUMP_JSON",
                    help="msprobe dump.json file(s) to check; a dump.json given as a plain path works too")
    group.addoption("--msprobe-device", default=None, metavar="NAME",
                    help="device under test: auto (npu if torch_npu imports, else cuda, else cpu), npu, cuda, cpu, "
                         "or a device a plugin registers (hook pytest_msprobe_device, entry points "
                         "pytest_msprobe.devices)")
    group.addoption("--msprobe-devices", nargs="+", action="extend", default=[], metavar="ID",
                    help="device ids for xdist workers (e.g. -n 32 --msprobe-devices 0 1 2 3): each worker is "
                         "pinned to one; without xdist the first is used")
    group.addoption("--msprobe-kernels", default=None, metavar="MODULE:ATTR",
                    help="a mapping {API name: kernel} (module name or path/to/file.py); the device side of "
                         "those APIs runs your kernel, the other APIs are deselected")
    group.addoption("--msprobe-mode", choices=MODES, default="auto",
                    help="replay: the device result is the output saved in a tensor dump, only the bench runs "
                         "(no device, no MindSpore needed); rerun: run the API on the device; auto (default): "
                         "replay MindSpore tensor dumps, re-run everything else")
    group.addoption("--msprobe-standard", choices=STANDARDS, default=None,
                    help="judgement: strict (default: what a correct kernel in the device dtype may lose, per kind "
                         "of op; see docs/explanation/error-model.md), msprobe (msprobe 8.x's new standard), "
                         "original (msprobe's Layer 1 only), msprobe26 (benchmark for every float output), mindspore")
    group.addoption("--msprobe-contract", choices=CONTRACTS, default=None,
                    help="strict: whose accuracy contract a correct kernel keeps (api_specs/contracts.yaml): cuda "
                         "(the CUDA Math API's ULP bounds), npu, torch (torch's own CPU kernels); auto (default): "
                         "the device's vendor, in replay the recording device's (ini msprobe_recorded_on)")
    group.addoption("--msprobe-seed", type=parse_seed, default=None, metavar="N|random",
                    help=f"run seed for random inputs (default {DEFAULT_SEED}; 'random' picks one and prints it)")
    group.addoption("--msprobe-reference", default=None, metavar="DEVICE",
                    help="run each API on this second device too (cuda, cpu, npu) as the reference of the "
                         "benchmark/ULP/strict comparisons: the three-way check in one run")
    group.addoption("--msprobe-max-memory", default=None, metavar="SIZE",
                    help="memory an item's bench, third and magnitude runs and their checks may hold beside the "
                         "device output, e.g. 8GiB: a larger call whose rows are independent is checked a block of "
                         "rows at a time (the same statistics and verdict), another one is skipped with the "
                         "reason; default: about 1.4x the dump's largest call (at least 1 GiB), within what the "
                         "host has free, less a margin, shared by the workers (there an uncut item runs whole)")
    group.addoption("--msprobe-config", default=None, metavar="CONFIG_JSON",
                    help="msprobe's config.json: the white_list, black_list and error_data_path of its acc_check "
                         "(run_ut) section")
    group.addoption("--msprobe-out", default=None, metavar="DIR",
                    help="folder for the msprobe-compatible CSVs and the JSON lines records (default msprobe_results)")
    group.addoption("--msprobe-baseline", default=None, metavar="FILE",
                    help="reviewed known failures (YAML/JSON list of {api, reason}) run as strict xfails")
    group.addoption("--msprobe-resume", action="store_true", default=False,
                    help="run only items without a finished result in the journal (--msprobe-out); the "
                         "journaled results go into the final files")
    group.addoption("--msprobe-shard", type=parse_shard, default=None, metavar="K/N",
                    help="run part K of N of every dump (balanced by input size); merge with "
                         "python -m pytest_msprobe merge")
    triage.addoption(group)  # --msprobe-save-error-data, --msprobe-repro, --msprobe-fuzz, --msprobe-html
    online_setup.addoption(group, parser)  # --msprobe-online
    parser.addini("msprobe_devices", "default for --msprobe-devices", type="args", default=[])
    parser.addini("msprobe_baseline", "default for --msprobe-baseline", default="")
    parser.addini("msprobe_early_selection_entries", "dumps of at least this many entries apply -k/-m while they "
                  "are collected (the dropped items are then not counted as deselected)", default="10000")
    parser.addini("msprobe_device", "default for --msprobe-device", default="auto")
    parser.addini("msprobe_kernels", "default for --msprobe-kernels (a path is relative to the ini file)", default="")
    parser.addini("msprobe_seed", "default for --msprobe-seed", default=str(DEFAULT_SEED))
    parser.addini("msprobe_out", "default for --msprobe-out", default="msprobe_results")
    parser.addini("msprobe_standard", "default for --msprobe-standard", default=STANDARDS[0])
    parser.addini("msprobe_contract", "default for --msprobe-contract", default=CONTRACTS[0])
    parser.addini("msprobe_max_memory", "default for --msprobe-max-memory (empty: the default budget)",
                  default="")
    parser.addini("msprobe_dtype_markers", "auto (when -m/-k is given), always or never: dtype markers on items",
                  default="auto")
    parser.addini("msprobe_continue_on_collection_errors", type="bool", default=True,
                  help="a broken dump.json is reported as a collection error while the other dumps still run")
    ini_keys.addoption(group, parser)  # the settings that are ini keys only, and their former options
