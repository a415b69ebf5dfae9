"""Comparing one item's outputs: msprobe's metrics and the selected standard's verdict on each pair.

The bench, device and third-run outputs become numpy arrays once, without a copy where they are on the host
(a bf16 or fp16 one as its 16-bit storage, which the compiled passes widen in registers: metrics/storage.py). With a
spare core, a large output's msprobe metrics and strict checks run side by side in two threads (numpy frees
the GIL): the metrics start in the helper thread as soon as bench and device are done (`start_metrics`; while
the torch run still runs), the strict checks follow in the caller, which then takes grains of the metrics' pass
that the helper has not reached (helper.wait_helping).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from ..helper import helper, wait_helping
from ..metrics import storage
from ..records.record import Record, Row
from ..runs import capture
from ..settings import CheckOptions
from ..specs.loader import error_kind, in_list, load_specs, thresholds_for
from ..verdict import contracts, grid, judge, standards, strict

_LOW_PRECISION = (torch.bfloat16,) + tuple(
    getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz") if hasattr(torch, n)
)


def to_numpy(x: Any) -> tuple[str, Any, str | None]:
    if x is None:
        return ("none", None, None)
    if isinstance(x, torch.Tensor):
        t = x.detach().cpu().resolve_conj()
        dtype = str(t.dtype)
        if t.dtype in _LOW_PRECISION:
            t = t.float()
        return ("tensor", t.numpy(), dtype)
    return ("scalar", x, None)


def stored(x: Any) -> tuple[str, Any, str | None]:
    """`to_numpy`, but a bf16 tensor as its 16-bit storage (metrics/storage.py), not widened: the checks'
    converter, whose arrays only the checks read."""
    if isinstance(x, torch.Tensor) and x.dtype == torch.bfloat16:
        t = x.detach().cpu()
        return ("tensor", t.view(torch.int16).numpy().view(storage.BITS), str(t.dtype))
    return to_numpy(x)


def _memoised(convert: standards.Converter) -> standards.Converter:
    """`convert`, computed once per object (the caller keeps the objects alive)."""
    done: dict[int, tuple[str, Any, str | None]] = {}

    def once(x: Any) -> tuple[str, Any, str | None]:
        if id(x) not in done:
            done[id(x)] = convert(x)
        return done[id(x)]

    return once


OVERLAP_MIN_ELEMENTS = 1 << 16  # smaller outputs: a thread hand-off costs more than it saves


@dataclass(frozen=True)
class EarlyMetrics:
    """msprobe's rows of bench against device, computing in the helper thread."""
    rows: Future[list[standards.OutputComparison]]
    convert: standards.Converter  # the arrays they use, for the strict checks to reuse


def start_metrics(prefix: str, bench: list[Any] | Callable[[], list[Any]], device: list[Any], api: str,
                  specs: dict[str, Any], options: CheckOptions) -> EarlyMetrics | None:
    """Start msprobe's metrics of a large output in the helper thread, where a core is spare, so they run
    while the torch run does (they need only bench and device); None where they are computed later. `bench`: the
    bench's outputs, or a function that gives them in the helper thread (a bench still running there, ahead in
    its queue)."""
    large = sum(x.numel() for x in device if isinstance(x, torch.Tensor)) >= OVERLAP_MIN_ELEMENTS
    if options.work_threads < 2 or not large or api in specs.get("dropout_apis", []) or \
            checks_device(options, device, None) is not None:  # taken where the device output lives
        return None
    convert = _memoised(stored)

    def rows() -> list[standards.OutputComparison]:
        leaves = bench() if callable(bench) else bench
        for x in (*leaves, *device):  # converted once: the strict checks read the same arrays
            convert(x)
        return standards.compare_structure(prefix, leaves, device, judging=standards.Judging(
                                           api, specs, _metric_standard(options)), converter=convert)

    return EarlyMetrics(helper().submit(rows), convert)


def _metric_standard(options: CheckOptions) -> str:
    return "msprobe26" if options.standard == "msprobe26" else "msprobe"


@dataclass
class Comparison:
    """A flat declaration of what one comparison of an item's outputs reads (kinds.py): the record, the rows'
    prefix, the bench's, device's and third run's outputs and the third run's role, the API and settings.
    `positions` name the rows (the inputs gradients belong to); `product`: a magnitude run's product before the
    bias; `autocast`: the plan's autocast dtype; `scalar_operand`: the call had a Python number among its
    arguments; `gradients`: the pairs are a backward item's gradients; `estimated`: per pair, the elements of a
    sampled third run that were estimated; `early`: start_metrics of these bench and device outputs; `contract`: the
    device's accuracy contract (verdict/contracts.py); `summed`: per pair, the magnitude run's output where that
    pair is a sum (None elsewhere), and the thresholds' section that scales it (third_run.Summed); `ms_format`: a
    MindSpore dump (its checker's metrics on each row); `overflow`: an overflow_check dump (each output
    classified, no precision verdict); `validity`: a forward item's outputs may not be unique (the API as
    api_specs' not_unique lists name it, and the device side's args and kwargs)."""

    record: Record
    prefix: str
    bench: list[Any]
    device: list[Any]
    third: list[Any] | None
    role: str
    api: str
    specs: dict[str, Any]
    options: CheckOptions
    positions: list[int] | None = None
    product: Any = None
    autocast: torch.dtype | None = None
    scalar_operand: bool = False
    gradients: bool = False
    estimated: list[Any] | None = None
    early: EarlyMetrics | None = None
    contract: str = "torch"
    summed: tuple[list[Any], str] | None = None
    ms_format: bool = False
    overflow: bool = False
    validity: tuple[str, list[Any], dict[str, Any]] | None = None
    pieces: Any = None  # piece_check.Plan: the one float output is checked a block of rows at a time (kinds.InPieces)


def compare_floats(job: Comparison) -> None:
    """Compare each float output pair (kinds.FloatPairs), and judge it by the selected standard.

    Stages, each one call: the pairs' arrays for the strict checks (`strict_arrays`), msprobe's metrics and the
    strict checks side by side (`metrics_and_checks`), then each row's verdict (`decide_rows`)."""
    device, third, options = job.device, job.third, job.options
    capture.stash(compared_bench=job.bench, compared_device=device, positions=job.positions)
    # each tensor becomes one array, for msprobe's metrics and the strict checks
    convert = job.early.convert if job.early is not None else _memoised(stored)
    torch_run = [_round_like(r, d) for r, d in zip(third, device)] if third is not None and job.role == "torch" \
        else None
    magnitude = third if third is not None and job.role != "torch" else None
    on, metrics_on = checks_device(options, device, third), checks_device(options, device, None)
    if on is not None and on == metrics_on:  # the bench goes to the device once, for the strict and msprobe's passes
        job = dataclasses.replace(job, bench=[b.detach().to(on) if isinstance(b, torch.Tensor) else b
                                              for b in job.bench])
    pairs = strict_arrays(job, torch_run, magnitude, convert, on)
    rows, strict_results = metrics_and_checks(job, pairs, convert, metrics_on)
    ref_rows = None
    if torch_run is not None and options.standard in ("msprobe", "msprobe26"):
        ref_rows = standards.compare_structure(job.prefix, job.bench, torch_run, judging=standards.Judging(
                                               job.api, job.specs, _metric_standard(options)), converter=convert)
    decide_rows(job, rows, ref_rows, pairs, strict_results)


def strict_arrays(job: Comparison, torch_run: list[Any] | None, magnitude: list[Any] | None,
                  convert: standards.Converter, on: torch.device | None) -> list[judge.StrictArrays | None]:
    """Per pair, the arrays the strict checks read, with the error model's rules and the contract's allowance
    (None: not a float pair of one shape)."""
    api, specs, autocast = job.api, job.specs, job.autocast
    kind = error_kind(api, specs)
    if kind == "exact" and job.gradients:
        kind = "elementwise"  # IEEE exactness is the forward operation's; its gradients are other operations
    # an autocast kernel computes in the autocast dtype whatever dtype its results are stored in
    narrow = autocast if autocast is not None and in_list(specs, api, "error_model", "autocast_lower_precision") \
        else None
    pairs: list[judge.StrictArrays | None] = []
    sums, sums_rules = job.summed if job.summed is not None else (None, None)
    for i, (b, d) in enumerate(zip(job.bench, job.device)):
        runs = PairRuns(b, d, _nth(torch_run, i), _nth(magnitude, i) if sums is None or _nth(sums, i) is None
                        else _nth(sums, i), job.product if i == 0 else None, _nth(job.estimated, i))
        arrays = _float_arrays(runs, kind, narrow, convert, on)
        if arrays is not None:
            dress(arrays, job, sums_rules if _nth(sums, i) is not None else None, str(d.dtype))
        pairs.append(arrays)
    return pairs


def metrics_and_checks(job: Comparison, pairs: list[judge.StrictArrays | None], convert: standards.Converter,
                       metrics_on: torch.device | None,
                       ) -> tuple[list[standards.OutputComparison], dict[int, strict.StrictResult]]:
    """msprobe's rows and the strict checks' results. With a spare core, msprobe's metrics of a large output and
    its strict checks run side by side: the metrics in the helper thread when they started early, else the
    strict checks there."""
    device, api, specs, options, early = job.device, job.api, job.specs, job.options, job.early
    strict_results: dict[int, strict.StrictResult]
    strict_pairs = [(i, a) for i, a in enumerate(pairs) if a is not None and options.standard == "strict"
                    and grid.supported(str(device[i].dtype))]
    if early is not None:
        strict_results = {i: judge.strict_verdict(a, str(device[i].dtype), thresholds_for(specs, api))
                          for i, a in strict_pairs}
        rows = wait_helping(early.rows)  # this thread takes chunks of their pass once its own checks are done
    else:
        pending = {i: helper().submit(judge.strict_verdict, a, str(device[i].dtype), thresholds_for(specs, api))
                   for i, a in strict_pairs if options.work_threads > 1 and strict.size_of(a.device) >= OVERLAP_MIN_ELEMENTS}
        # msprobe's statistics where the device output lives (on an accelerator: only they come back), else here
        rows = standards.compare_structure(job.prefix, job.bench, device, judging=standards.Judging(
                                           api, specs, _metric_standard(options)), converter=convert, on=metrics_on)
        strict_results = {i: wait_helping(future) for i, future in pending.items()}  # with blocks of their pass
    return rows, strict_results


def decide_rows(job: Comparison, rows: list[standards.OutputComparison],
                ref_rows: list[standards.OutputComparison] | None, pairs: list[judge.StrictArrays | None],
                strict_results: dict[int, strict.StrictResult]) -> None:
    """Each row named and judged by the standard (judge.decide); the record gets it."""
    bench, device, positions, options = job.bench, job.device, job.positions, job.options
    for i, row in enumerate(rows):
        if positions is not None and i < len(positions):
            row.name = f"{job.prefix}.{positions[i]}"
        paired = i < len(bench) and len(rows) == len(bench)
        arrays = pairs[i] if paired and i < len(pairs) else None
        judge.decide(row, options.standard, api_name=job.api, specs=job.specs,
                     evidence=judge.Evidence(
                         ref_rows[i] if ref_rows is not None and paired and i < len(ref_rows) else None, arrays,
                         options.reference_results, strict_results.get(i) if arrays is not None else None))
        if options.standard == "strict" and paired and row.verdict == "error" and arrays is None:
            row.verdict, row.verdict_message = _exactly(bench[i], device[i]) or (row.verdict, row.verdict_message)
        job.record.outputs.append(Row(**row.to_dict()))


def dress(arrays: judge.StrictArrays, job: Comparison, sums_rules: str | None, device_dtype: str) -> None:
    """The strict thresholds' further section and the contract's allowance of one output's arrays; `sums_rules`:
    the section of a magnitude run that bounds this output as a sum (None where there is none)."""
    api, specs, gradients, scalar_operand, contract = job.api, job.specs, job.gradients, job.scalar_operand, \
        job.contract
    if gradients and in_list(specs, api, "error_model", "gradient_rounding"):
        arrays.rules = "gradient_rounding"
    elif arrays.kind == "exact" and scalar_operand:
        arrays.rules = "exact_scalar"  # a sound kernel may round a Python scalar otherwise than torch
    elif in_list(specs, api, "error_model", "row_statistic"):
        arrays.rules = "row_statistic"  # a row's statistic (rstd) in low precision shifts the whole row
    if sums_rules is not None and arrays.magnitude is not None:
        arrays.rules = sums_rules  # a sum in any order, or a fused multiply-add: relative to its terms
        if arrays.kind == "exact":
            arrays.kind = "elementwise"  # x + alpha * y is two IEEE operations, which an FMA rounds once
    arrays.allowance = contracts.bound(specs, contract, api, arrays.dtype or device_dtype, gradients)


ACCELERATORS = ("cuda", "npu")


def checks_device(options: CheckOptions, device: list[Any], third: list[Any] | None) -> torch.device | None:
    """Where the strict checks of these outputs run in torch ops (strict.torch_pass), or None for the host's
    compiled pass: with msprobe_checks_on auto, the accelerator that holds the device output (or else the
    reference run); with `device`, that one or wherever the device output lives, the CPU included."""
    if options.checks_on == "host" or options.standard != "strict":
        return None
    held = [x.device for x in (*device, *(third or ())) if isinstance(x, torch.Tensor)]
    on = next((where for where in held if where.type in ACCELERATORS), None)
    if on is None and options.checks_on == "device" and held:
        on = held[0]
    if on is not None and on.type != "cpu":
        from ..verdict.strict.torch_pass import UNSUPPORTED

        return None if on.type in UNSUPPORTED else on  # the pass failed there once: the host's
    return on


_WARMED: set[str] = set()  # what this process has loaded: "draw and metrics", and "strict" once asked for


def warm_up(standard: str) -> None:
    """Load the compiled passes (numba's on-disk cache; on a cold one, compile them) once per process,
    before its first item, so that no item's msprobe_timeout pays for it: the random draw of inputs,
    msprobe's metric pass and, under `strict`, the strict pass, in the signatures of 16-bit outputs (as their
    storage, metrics/storage.py; beside a float64 bench too). A
    process whose first items were judged by another standard loads the strict pass when first asked for it."""
    import numpy as np

    values = np.linspace(-1.0, 1.0, 16, dtype=np.float32)
    bits = stored(torch.from_numpy(values).bfloat16())[1]  # how bf16 outputs reach the passes
    sides = {"torch.bfloat16": bits, "torch.float16": stored(torch.from_numpy(values).half())[1]}
    if "draw and metrics" not in _WARMED:
        from ..inputs.draw import warm_up as warm_draw

        warm_draw()
        pairs: list[tuple[str, Any, Any]] = [(dtype, device, values) for dtype, device in sides.items()]
        pairs += [(dtype, device, values.astype(np.float64)) for dtype, device in sides.items()]  # read in place too
        for dtype, device, bench in pairs:
            standards.compare_tensor("warm-up", bench, device, bench_dtype=str(bench.dtype), device_dtype=dtype,
                                     judging=standards.Judging("add", load_specs()))
        _WARMED.add("draw and metrics")
    if standard == "strict" and "strict" not in _WARMED:  # a float32 bench and a float64 one (read as they are)
        benches: tuple[Any, ...] = (values, values.astype(np.float64))
        for dtype, device in sides.items():
            for bench in benches:
                judge.strict_verdict(judge.StrictArrays(bench, device), dtype, thresholds_for(load_specs(), "add"))
        _WARMED.add("strict")


def _exactly(bench: Any, device: Any) -> tuple[str, str] | None:
    """strict's verdict on tensors msprobe's Layer 1 cannot compare (empty, int16, int8, complex), or None."""
    if not (isinstance(bench, torch.Tensor) and isinstance(device, torch.Tensor)) or bench.shape != device.shape:
        return None
    if device.numel() == 0:
        return "pass", "empty output of the recorded shape"
    if device.is_complex() and bench.is_complex():
        return "SKIP", "complex output: not judged by strict (msprobe's standards compare it)"
    if device.is_complex() or bench.dtype != device.dtype or device.is_floating_point():
        return None
    wrong = int((bench.cpu() != device.cpu()).sum())
    return ("pass", "compared exactly") if not wrong else ("error", f"{wrong} of {device.numel()} elements differ")


def _nth(values: list[Any] | None, i: int) -> Any:
    return values[i] if values is not None and i < len(values) else None


def _round_like(ref: Any, device: Any) -> Any:
    """A reference computed in a wider dtype is rounded to the device output's dtype."""
    if isinstance(ref, torch.Tensor) and isinstance(device, torch.Tensor) and ref.dtype != device.dtype \
            and ref.is_floating_point() and device.is_floating_point():
        return ref.detach().to(device.dtype)
    return ref


class PairRuns(NamedTuple):
    """One output pair and what the runs beside it gave for it: the third run's output, the magnitude run's, a
    contraction's product before its bias, and the elements of a sampled third run that were estimated."""

    bench: Any
    device: Any
    torch_run: Any = None
    magnitude: Any = None
    product: Any = None
    estimated: Any = None


def _float_arrays(runs: PairRuns, kind: str, narrow: torch.dtype | None, convert: standards.Converter,
                  on: torch.device | None) -> judge.StrictArrays | None:
    """numpy arrays of a float output for the strict standard, or None; with `on` (checks_device), tensors on
    that device instead: the device output and a reference run already there stay, the bench and the other
    arrays are copied there once.

    Kept in their own dtypes (bf16 as its storage, metrics/storage.py); a third run of another shape is left out.
    """
    bench, device, torch_run, magnitude, product, estimated = runs
    if not all(isinstance(x, torch.Tensor) for x in (bench, device)) or not device.is_floating_point():
        return None
    if bench.shape != device.shape:
        return None

    if on is not None:
        convert = _on_device(on)

    def same(x: Any) -> Any:
        ok = isinstance(x, torch.Tensor) and x.shape == device.shape and x.is_floating_point()
        return convert(x)[1] if ok else None

    run = same(torch_run)
    return judge.StrictArrays(convert(bench)[1], convert(device)[1], run, same(magnitude), kind,
                              int(device.shape[-1]) if device.dim() else 1, same(product),
                              str(narrow) if narrow is not None and narrow.itemsize < device.dtype.itemsize else None,
                              estimated=None if estimated is None or run is None else
                              estimated.to(on) if on is not None else estimated.numpy())


def _on_device(on: torch.device) -> standards.Converter:
    """A converter that leaves tensors as tensors, on `on` (no copy of one already there)."""
    def convert(x: Any) -> tuple[str, Any, str | None]:
        t = x.detach().to(on)
        return ("tensor", t, str(t.dtype))

    return convert
