"""Resolved command-line/ini settings, shared by the hooks, the items and every stage (torch- and pytest-free;
the key that keeps them on config.stash is session/stash.py's SETTINGS_KEY)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_SEED = 1234
DEVICES = ("auto", "npu", "cuda", "cpu")  # the built-in ones; backends.py adds registered devices
DATA_MODES = ("auto", "random", "real")
STANDARDS = ("strict", "msprobe", "original", "msprobe26", "mindspore")  # first is the default
# auto: replay MindSpore tensor dumps, re-run everything else; replay: the device result is the output
# recorded in the dump; rerun: the API runs again on the device under test (docs/how-to/mindspore-and-replay.md)
MODES = ("auto", "rerun", "replay")
# auto: msprobe's raise rule (fp16/bf16 -> fp32, fp32 -> fp64) with api_specs' per-API tables; fp64: all fp64
BENCH_PRECISIONS = ("auto", "fp64")
# what computed a tensor dump's recorded outputs (replay): auto reads the saved tensors' device, else npu
RECORDED_ON = ("auto", "npu", "cuda", "cpu")
# where the strict checks run: auto: on the accelerator that holds the device output (or the reference run's),
# else on the host (the compiled pass); device: in torch ops where those outputs live, the CPU included; host:
# the compiled pass on the host
CHECKS_ON = ("auto", "device", "host")
# whose accuracy contract a correct kernel keeps (api_specs/contracts.yaml); auto: the device's vendor
CONTRACTS = ("auto", "torch", "cuda", "npu")
HELPER_THREAD = ("auto", "off")  # msprobe_helper_thread: off keeps each item's work in one thread
# under -n: cost deals the most expensive items first (session/schedule.py); xdist: xdist's own load scheduler
SCHEDULES = ("cost", "xdist")
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 10**3, "kib": 1 << 10, "m": 1 << 20, "mb": 10**6, "mib": 1 << 20,
          "g": 1 << 30, "gb": 10**9, "gib": 1 << 30, "t": 1 << 40, "tb": 10**12, "tib": 1 << 40}


def parse_bytes(text: str) -> int:
    """A size such as "8GiB", "512 MiB", "2g" or "1000000" (bytes) as bytes; ValueError with the reason."""
    number = text.strip()
    digits = len(number) - len(number.lstrip("0123456789.")) if number else 0
    value, unit = number[:digits], number[digits:].strip().lower()
    if not value or unit not in _UNITS:
        raise ValueError(f"{text!r} is not a size (e.g. 8GiB, 512MiB, 2000000000)")
    size = int(float(value) * _UNITS[unit])
    if size <= 0:
        raise ValueError(f"{text!r}: a size above zero is needed")
    return size


@dataclass(frozen=True)
class CheckOptions:
    """What a single check needs to know; identical in every worker."""

    device: str = "auto"
    device_index: int | None = None
    run_seed: int = DEFAULT_SEED
    data_mode: str = "auto"  # auto: real tensors when the dump has them, else random from statistics
    max_tensor_bytes: int | None = None
    standard: str = "strict"
    reference_device: str | None = None  # third device for the benchmark/ULP/strict comparisons
    reference_results: str | None = None  # an earlier run's details (JSON lines or msprobe CSV)
    specs_file: str | None = None  # the user's api_specs overrides
    mode: str = "auto"  # MODES: where the device result comes from
    kernels: str | None = None  # --msprobe-kernels module:attr (a file path made absolute)
    threads: int = 1  # torch intra-op threads; CPU reductions depend on it, so it is fixed, not per -n
    work_threads: int = 1  # 2 with a spare core: a helper thread runs the bench beside the device and the
    # third run, builds the next item's inputs, draws large random tensors and runs a large output's msprobe
    # metrics beside the strict checks (helper.py; the same values and verdicts as with 1)
    bench_precision: str = "auto"  # BENCH_PRECISIONS
    recorded_on: str = "auto"  # RECORDED_ON: the device that recorded a replayed dump's outputs
    checks_on: str = "auto"  # CHECKS_ON: where the strict checks run (the same verdicts either way)
    contract: str = "auto"  # CONTRACTS: what the device's vendor says a correct kernel may lose
    bench_device: str = "cpu"  # where the bench, the third run and the magnitude run compute (raised precision)
    max_memory: int | None = None  # bytes an item's runs beside the device output may hold; None: what is free


@dataclass
class Settings:
    check_options: CheckOptions
    standard: str = "strict"
    warning_as_error: bool = False
    out_dir: Path = Path("msprobe_results")
    api_info: list[Path] = field(default_factory=list)
    filter_api: bool = False  # msprobe_filter_api: one check per group of identical calls (dedup.py)

