"""The settings that are ini keys only: set in pytest.ini / pyproject.toml, or for one run with pytest's own
`-o msprobe_key=value`. Each of them was a `--msprobe-*` option, spelled as its key with dashes; that spelling
still parses for one release (hidden from --help), wins over the ini key as before, and prints one line that
names its replacement. KEYS is the one table of them: the ini keys, their former options and the value()
that every reader asks."""
from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import pytest

from ..reports.result_sets import DEFAULT_KEEP
from ..settings import BENCH_PRECISIONS, CHECKS_ON, DATA_MODES, HELPER_THREAD, RECORDED_ON, SCHEDULES

DEFAULT_MIN_WORK_S = 3.0  # msprobe_min_work_per_worker
DEFAULT_ONLINE_QUEUE = 50  # msprobe_online_queue: msprobe's queue of received calls
ON_OFF = ("on", "off")


@dataclass(frozen=True)
class Key:
    """One ini key; its former command-line option is `flag`, which parses as it did (choices, type)."""

    name: str
    help: str
    default: str | bool = ""  # a bool: an ini key of type bool, the former option a switch
    choices: tuple[str, ...] = ()
    metavar: str | None = None
    convert: Callable[[str], Any] = str  # the former option's type, applied to the ini value too

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def switch(self) -> bool:
        return isinstance(self.default, bool)


KEYS: tuple[Key, ...] = (
    Key("msprobe_kernels_run_all", "with --msprobe-kernels: run the APIs without a kernel too, with the usual APIs",
        False),
    Key("msprobe_data_mode", "auto (default): saved tensors when the dump has them, else random from statistics; "
        "random; real", "auto", DATA_MODES),
    Key("msprobe_recorded_on", "replay: the device that recorded the dump's outputs (npu: fp32 conv1d/conv2d "
        "inputs are read as HF32, as msprobe assumes; cuda: as TF32 where torch's settings say its kernels read "
        "TF32, cuDNN's convolutions by default; cpu: in full fp32); auto (default): the device the saved tensors "
        "were on, else npu", RECORDED_ON[0], RECORDED_ON),
    Key("msprobe_bench_precision", "auto (default): the bench raises fp16/bf16 to fp32 and fp32 to fp64 "
        "(msprobe's rule), with per-API choices from api_specs (precision.raise_map_by_api); fp64: every float "
        "input of the bench in fp64", "auto", BENCH_PRECISIONS),
    Key("msprobe_checks_on", "strict checks (and msprobe's metric columns) in torch ops where the outputs live "
        "(device, even cpu), or on the host; auto (default): device on cuda/npu outputs (or reference run), else "
        "host. Same verdicts", CHECKS_ON[0], CHECKS_ON),
    Key("msprobe_bench_device", "where the bench, the third run and the magnitude run compute: cpu (default), "
        "cuda, npu. 16-bit outputs: fp32 there with TF32/HF32 off; fp32 outputs: fp64 there where the device has it "
        "(cuda), else fp64 on the cpu (npu). See docs/explanation/execution.md", "cpu", metavar="DEVICE"),
    Key("msprobe_reference_results", "reference metrics of an earlier run: msprobe_records_*.jsonl or an msprobe "
        "accuracy_checking_details_*.csv (e.g. from a GPU host); relative to the current directory",
        metavar="PATH"),
    Key("msprobe_specs", "YAML file overriding or extending api_specs/ (thresholds, categories, per-API "
        "settings); relative to the current directory", metavar="FILE"),
    Key("msprobe_warning_as_error", "fail items whose verdict is msprobe's 'Warning'", False),
    Key("msprobe_workers_per_device", "at most N xdist workers per device of --msprobe-devices (default 8, as "
        "msprobe); extra workers are not started", "8", metavar="N"),
    Key("msprobe_threads", "torch intra-op threads per process running items (default: OMP_NUM_THREADS, else 1); "
        "fixed so results do not depend on -n", metavar="N"),
    Key("msprobe_helper_thread", "auto (default): where a core is spare, one more thread per process runs the bench "
        "beside the device, builds the next item's inputs and computes msprobe's metrics (the same records); off: "
        "each item's work in one thread (for device plugins that change torch for every thread inside the device "
        "call)", HELPER_THREAD[0], HELPER_THREAD),
    Key("msprobe_timeout", "fail an item running longer than this many seconds; a call stuck in native code ends "
        "its xdist worker (counted as a crash) or, without xdist, the run", metavar="SECONDS"),
    Key("msprobe_filter_api", "check one of each group of identical calls (same API, arguments equal but for "
        "Max/Min, as msprobe's -f/--filter_api) and report the others with its result, marked as reused", False),
    Key("msprobe_schedule", "with xdist's default --dist load: cost (default) deals the most expensive items first "
        "to whichever worker is free (estimated from the dump's shapes) and keeps each msprobe_filter_api group on "
        "one worker; xdist keeps xdist's own load scheduler", SCHEDULES[0], SCHEDULES),
    Key("msprobe_min_work_per_worker", f"under -n: start at most one xdist worker per this many seconds of work "
        f"estimated from the dumps, none when that is fewer than two (default {DEFAULT_MIN_WORK_S:g}; 0: every "
        f"worker asked for)", metavar="SECONDS"),
    Key("msprobe_allow_all_skipped", "exit 0 when every API item was skipped (by default such a run checked "
        "nothing and fails)", False),
    Key("msprobe_jit_compile", "NPU: on|off, torch_npu.npu.set_compile_mode(jit_compile=...) before items run "
        "(msprobe run_ut -j); also sets msprobe_allow_internal_format to the same value unless that is given "
        "(default: torch_npu's)", "", ON_OFF),
    Key("msprobe_allow_internal_format", "NPU: on|off, torch.npu.config.allow_internal_format before items run "
        "(default: torch_npu's)", "", ON_OFF),
    Key("msprobe_keep_runs", f"keep the newest N sets of result files in --msprobe-out, remove older ones (default "
        f"{DEFAULT_KEEP}; 0: keep every set)", str(DEFAULT_KEEP), metavar="N"),
    Key("msprobe_online_tls", "--msprobe-online tls://: msprobe's tls_path, the folder of server.key, server.crt, "
        "ca.crt, optional crl.pem; the key's passphrase from $MSPROBE_TLS_PASSPHRASE or the terminal",
        metavar="DIR"),
    Key("msprobe_online_queue", f"--msprobe-online: calls held between receiving and checking (default "
        f"{DEFAULT_ONLINE_QUEUE}); clients get BUSY_ when it is full", metavar="N", convert=int),
    Key("msprobe_online_max_frame", "--msprobe-online: refuse a call larger than this many bytes before reading it "
        "(default 4 GiB)", metavar="BYTES", convert=int),
    Key("msprobe_online_clients", "--msprobe-online: end the session only after N clients (ranks) have ended, and "
        "every client that connected (default: one per rank of --msprobe-config's rank_list, else 1)",
        metavar="N", convert=int),
    Key("msprobe_online_listen_any", "--msprobe-online: allow a plain-TCP address other than loopback (calls then "
        "cross the network unencrypted)", False),
    Key("msprobe_online_idle", "--msprobe-online: end the session when no call has arrived for this many seconds "
        "before every client stopped (a client that died); such a session fails", metavar="SECONDS",
        convert=float),
    Key("msprobe_online_workers", "--msprobe-online: check the calls in N worker processes (each imports torch "
        "once; auto: one per core) while the main process reports them in arrival order; default 1: in the main "
        "process", metavar="N"),
    Key("msprobe_online_keep", "--msprobe-online: keep every received call as a one-call tensor dump (by default "
        "only failing ones)", False),
)
BY_NAME = {key.name: key for key in KEYS}


def addoption(group: Any, parser: pytest.Parser) -> None:
    """Every key of the table, and its former option, hidden from --help."""
    for key in KEYS:
        if key.switch:
            parser.addini(key.name, key.help, type="bool", default=key.default)
        else:
            parser.addini(key.name, key.help, default=key.default)
        kwargs: dict[str, Any] = {"dest": key.name, "default": None, "help": argparse.SUPPRESS}
        if key.switch:
            kwargs["action"] = "store_true"
        elif key.choices:
            kwargs["choices"] = key.choices
        else:
            kwargs.update(metavar=key.metavar, type=key.convert)
        group.addoption(key.flag, **kwargs)


def value(config: pytest.Config, name: str) -> Any:
    """The setting `name`: its former option when given, else the ini key (or -o); None for an empty key. An ini
    value outside the key's choices, or not of its type, is one usage error line."""
    key = BY_NAME[name]
    given = config.getoption(name, None)
    if given is not None:
        return given
    raw = config.getini(name)
    if key.switch:
        return bool(raw)
    if raw == "":
        return None
    if key.choices and raw not in key.choices:
        raise pytest.UsageError(f"ini {name}: {raw!r} is not one of {', '.join(key.choices)}")
    try:
        return key.convert(raw)
    except ValueError:
        raise pytest.UsageError(f"ini {name}: {raw!r} is not a number") from None


def where(config: pytest.Config, name: str) -> str:
    """How a message names the setting: the former option when that gave it, else the ini key."""
    return BY_NAME[name].flag if config.getoption(name, None) is not None else f"ini {name}"


def spelled(value: Any) -> str:
    return "true" if value is True else str(value)


def override(name: str, value: Any) -> list[str]:
    """The command-line arguments that set ini key `name` for one run (what a printed command says)."""
    return ["-o", f"{name}={spelled(value)}"]


def respell(args: Iterable[str]) -> list[str]:
    """A command line with every former option in its new spelling (`-o key=value`), for a command that is
    printed for the user to run again."""
    by_flag = {key.flag: key for key in KEYS}
    out: list[str] = []
    pending: Key | None = None  # a former option whose value is the next argument
    for arg in args:
        flag, eq, value = arg.partition("=")
        if pending is not None:
            out += override(pending.name, arg)
            pending = None
        elif flag in by_flag and eq and not by_flag[flag].switch:
            out += override(by_flag[flag].name, value)
        elif arg in by_flag:
            key = by_flag[arg]
            if key.switch:
                out += override(key.name, True)
            else:
                pending = key
        else:
            out.append(arg)
    return out


def deprecations(config: pytest.Config) -> list[str]:
    """One line per former option the command line used, naming its replacement."""
    return [f"msprobe: {key.flag} is deprecated; use {shlex.join(override(key.name, given))} (ini key {key.name})"
            for key in KEYS if (given := config.getoption(key.name, None)) is not None]
