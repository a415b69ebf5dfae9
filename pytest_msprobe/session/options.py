"""The plugin's command-line options and ini keys, registered in one place (pytest_addoption calls
addoption), so plugin.py stays the hooks only. Sub-features register their own in their modules."""
from __future__ import annotations

import argparse

import pytest

from ..settings import (
    BENCH_PRECISIONS,
    CHECKS_ON,
    CONTRACTS,
    DATA_MODES,
    DEFAULT_SEED,
    HELPER_THREAD,
    MODES,
    RECORDED_ON,
    STANDARDS,
)
from . import npu_options, online_setup, result_files, workers
from . import triage_hooks as triage
from .shard import parse_shard

SCHEDULES = ("cost", "xdist")


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
    group = parser.getgroup("msprobe", "msprobe API precision checks (pytest-msprobe)")
    group.addoption("--msprobe-api-info", nargs="+", action="extend", default=[], metavar="DUMP_JSON",
                    help="msprobe dump.json file(s) to check; a dump.json given as a plain path works too")
    group.addoption("--msprobe-device", default=None, metavar="NAME",
                    help="device under test: auto (npu if torch_npu imports, else cuda, else cpu), npu, cuda, cpu, "
                         "or a device a plugin registers (hook pytest_msprobe_device, entry points "
                         "pytest_msprobe.devices)")
    group.addoption("--msprobe-kernels", default=None, metavar="MODULE:ATTR",
                    help="a mapping {API name: kernel} (module name or path/to/file.py); the device side of "
                         "those APIs runs your kernel, the other APIs are deselected")
    group.addoption("--msprobe-kernels-run-all", action="store_true", default=False,
                    help="with --msprobe-kernels: run the APIs without a kernel too, with the usual APIs")
    group.addoption("--msprobe-seed", type=parse_seed, default=None, metavar="N|random",
                    help=f"run seed for random inputs (default {DEFAULT_SEED}; 'random' picks one and prints it)")
    group.addoption("--msprobe-data-mode", choices=DATA_MODES, default="auto",
                    help="auto: saved tensors when the dump has them, else random from statistics")
    group.addoption("--msprobe-mode", choices=MODES, default="auto",
                    help="replay: the device result is the output saved in a tensor dump, only the bench runs "
                         "(no device, no MindSpore needed); rerun: run the API on the device; auto (default): "
                         "replay MindSpore tensor dumps, re-run everything else")
    group.addoption("--msprobe-recorded-on", choices=RECORDED_ON, default=None,
                    help="replay: the device that recorded the dump's outputs (npu: fp32 conv1d/conv2d inputs are "
                         "read as HF32, as msprobe assumes; cuda, cpu: in full fp32); auto (default): the device "
                         "the saved tensors were on, else npu")
    group.addoption("--msprobe-standard", choices=STANDARDS, default=None,
                    help="judgement: strict (default: what a correct kernel in the device dtype may lose, per kind "
                         "of op; see docs/explanation/error-model.md), msprobe (msprobe 8.x's new standard), "
                         "original (msprobe's Layer 1 only), msprobe26 (benchmark for every float output), mindspore")
    group.addoption("--msprobe-bench-precision", choices=BENCH_PRECISIONS, default="auto",
                    help="auto (default): the bench raises fp16/bf16 to fp32 and fp32 to fp64 (msprobe's rule), "
                         "with per-API choices from api_specs (precision.raise_map_by_api); fp64: every float "
                         "input of the bench in fp64")
    group.addoption("--msprobe-checks-on", choices=CHECKS_ON, default=None,
                    help="strict checks (and msprobe's metric columns) in torch ops where the outputs live (device, "
                         "even cpu), or on the host; auto (default): device on cuda/npu outputs (or reference run), "
                         "else host. Same verdicts")
    group.addoption("--msprobe-bench-device", default=None, metavar="DEVICE",
                    help="where the bench, the third run and the magnitude run compute: cpu (default), cuda, npu. "
                         "16-bit outputs: fp32 there with TF32/HF32 off; fp32 outputs: fp64 there where the device "
                         "has it (cuda), else fp64 on the cpu (npu). See docs/explanation/execution.md")
    group.addoption("--msprobe-max-memory", default=None, metavar="SIZE",
                    help="memory an item's bench, third and magnitude runs and their checks may hold beside the "
                         "device output, e.g. 8GiB: a larger call whose rows are independent is checked a block of "
                         "rows at a time (the same statistics and verdict), another one is skipped with the "
                         "reason; default: what the host has free, less a margin, shared by the workers")
    group.addoption("--msprobe-contract", choices=CONTRACTS, default=None,
                    help="strict: whose accuracy contract a correct kernel keeps (api_specs/contracts.yaml): cuda "
                         "(the CUDA Math API's ULP bounds), npu, torch (torch's own CPU kernels); auto (default): "
                         "the device's vendor, in replay the recording device's (--msprobe-recorded-on)")
    group.addoption("--msprobe-reference", default=None, metavar="DEVICE",
                    help="run each API on this second device too (cuda, cpu, npu) as the reference of the "
                         "benchmark/ULP/strict comparisons: the three-way check in one run")
    group.addoption("--msprobe-reference-results", default=None, metavar="PATH",
                    help="reference metrics of an earlier run: msprobe_records_*.jsonl or an msprobe "
                         "accuracy_checking_details_*.csv (e.g. from a GPU host)")
    group.addoption("--msprobe-specs", default=None, metavar="FILE",
                    help="YAML file overriding or extending api_specs/ (thresholds, categories, per-API settings)")
    group.addoption("--msprobe-warning-as-error", action="store_true", default=False,
                    help="fail items whose verdict is msprobe's 'Warning'")
    group.addoption("--msprobe-out", default=None, metavar="DIR",
                    help="folder for the msprobe-compatible CSVs and the JSON lines records (default msprobe_results)")
    group.addoption("--msprobe-devices", nargs="+", action="extend", default=[], metavar="ID",
                    help="device ids for xdist workers (e.g. -n 32 --msprobe-devices 0 1 2 3): each worker is "
                         "pinned to one; without xdist the first is used")
    group.addoption("--msprobe-workers-per-device", default=None, metavar="N",
                    help="at most N xdist workers per device (default 8, as msprobe); extra workers are not started")
    group.addoption("--msprobe-threads", default=None, metavar="N",
                    help="torch intra-op threads per process running items (default: OMP_NUM_THREADS, else 1); "
                         "fixed so results do not depend on -n")
    group.addoption("--msprobe-helper-thread", choices=HELPER_THREAD, default=None,
                    help="auto: where a core is spare, one more thread per process runs the bench beside the "
                         "device, builds the next item's inputs and computes msprobe's metrics (the same "
                         "records); off: each item's work in one thread (for device plugins that change torch "
                         "for every thread inside the device call)")
    group.addoption("--msprobe-timeout", default=None, metavar="SECONDS",
                    help="fail an item running longer; a call stuck in native code ends its xdist worker "
                         "(counted as a crash) or, without xdist, the run")
    group.addoption("--msprobe-resume", action="store_true", default=False,
                    help="run only items without a finished result in the journal (--msprobe-out); the "
                         "journaled results go into the final files")
    group.addoption("--msprobe-shard", type=parse_shard, default=None, metavar="K/N",
                    help="run part K of N of every dump (balanced by input size); merge with "
                         "python -m pytest_msprobe merge")
    group.addoption("--msprobe-filter-api", action="store_true", default=None,
                    help="check one of each group of identical calls (same API, arguments equal but for "
                         "Max/Min, as msprobe's -f/--filter_api) and report the others with its result, "
                         "marked as reused")
    group.addoption("--msprobe-schedule", choices=SCHEDULES, default=None,
                    help="with xdist's default --dist load: cost (default) deals the most expensive items first "
                         "to whichever worker is free (estimated from the dump's shapes) and keeps each "
                         "--msprobe-filter-api group on one worker; xdist keeps xdist's own load scheduler")
    group.addoption("--msprobe-min-work-per-worker", default=None, metavar="SECONDS",
                    help=f"under -n: start at most one xdist worker per SECONDS of work estimated from the dumps, "
                         f"none when that is fewer than two (default {workers.DEFAULT_MIN_WORK_S:g}; 0: every worker asked for)")
    group.addoption("--msprobe-baseline", default=None, metavar="FILE",
                    help="reviewed known failures (YAML/JSON list of {api, reason}) run as strict xfails")
    group.addoption("--msprobe-allow-all-skipped", action="store_true", default=None,
                    help="exit 0 when every API item was skipped (by default such a run checked nothing and fails)")
    group.addoption("--msprobe-config", default=None, metavar="CONFIG_JSON",
                    help="msprobe's config.json: the white_list, black_list and error_data_path of its acc_check "
                         "(run_ut) section")
    npu_options.addoption(group)  # --msprobe-jit-compile, --msprobe-allow-internal-format
    triage.addoption(group)  # --msprobe-save-error-data, --msprobe-repro, --msprobe-fuzz, --msprobe-html
    result_files.addoption(group, parser)  # --msprobe-keep-runs
    online_setup.addoption(group, parser)  # --msprobe-online and its settings
    parser.addini("msprobe_devices", "default for --msprobe-devices", type="args", default=[])
    parser.addini("msprobe_workers_per_device", "default for --msprobe-workers-per-device", default="8")
    parser.addini("msprobe_threads", "default for --msprobe-threads", default="")
    parser.addini("msprobe_timeout", "default for --msprobe-timeout (seconds)", default="")
    parser.addini("msprobe_helper_thread", "default for --msprobe-helper-thread", default=HELPER_THREAD[0])
    parser.addini("msprobe_baseline", "default for --msprobe-baseline", default="")
    parser.addini("msprobe_allow_all_skipped", "default for --msprobe-allow-all-skipped", type="bool", default=False)
    parser.addini("msprobe_filter_api", "default for --msprobe-filter-api", type="bool", default=False)
    parser.addini("msprobe_early_selection_entries", "dumps of at least this many entries apply -k/-m while they "
                  "are collected (the dropped items are then not counted as deselected)", default="10000")
    parser.addini("msprobe_schedule", "default for --msprobe-schedule", default=SCHEDULES[0])
    parser.addini("msprobe_min_work_per_worker", "default for --msprobe-min-work-per-worker (seconds)", default="")
    parser.addini("msprobe_device", "default for --msprobe-device", default="auto")
    parser.addini("msprobe_kernels", "default for --msprobe-kernels (a path is relative to the ini file)", default="")
    parser.addini("msprobe_seed", "default for --msprobe-seed", default=str(DEFAULT_SEED))
    parser.addini("msprobe_out", "default for --msprobe-out", default="msprobe_results")
    parser.addini("msprobe_standard", "default for --msprobe-standard", default=STANDARDS[0])
    parser.addini("msprobe_recorded_on", "default for --msprobe-recorded-on", default=RECORDED_ON[0])
    parser.addini("msprobe_checks_on", "default for --msprobe-checks-on", default=CHECKS_ON[0])
    parser.addini("msprobe_contract", "default for --msprobe-contract", default=CONTRACTS[0])
    parser.addini("msprobe_bench_device", "default for --msprobe-bench-device", default="cpu")
    parser.addini("msprobe_max_memory", "default for --msprobe-max-memory (empty: what the host has free)",
                  default="")
    parser.addini("msprobe_dtype_markers", "auto (when -m/-k is given), always or never: dtype markers on items",
                  default="auto")
    parser.addini("msprobe_specs", "default for --msprobe-specs", default="")
    parser.addini("msprobe_continue_on_collection_errors", type="bool", default=True,
                  help="a broken dump.json is reported as a collection error while the other dumps still run")
