"""msprobe's per-output verdict (the Layer-1 "original standard") and its rules for an API's outputs as a whole:
their structure, scalars, dropout, the item's status. Each float output's row also carries the columns of its
Layer-2 algorithm, which verdict/layer2.py chooses and computes.

REFERENCE-msprobe.md §4.1 (verdict, structure rules), §4.2 (metrics). Torch-free: tensors arrive as numpy arrays
with their torch dtype string (bf16 as float32, or as its 16-bit storage: metrics/storage.py), so the comparison
runs anywhere. All numbers come from api_specs/thresholds.yaml and categories.yaml.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Callable, NamedTuple, Optional, cast

import numpy as np

from ..metrics import fused, storage
from ..metrics import vectorised as M
from ..specs.loader import load_specs, thresholds_for
from . import layer2
from .layer2 import Plan as Plan  # from_stats' argument; check/chunked.py makes one

PASS, WARNING, ERROR, SKIP = "pass", "Warning", "error", "SKIP"
BLANK = " "
BF16 = "torch.bfloat16"
ALGORITHMS = ("absolute_threshold", "binary_consistency", "ulp_compare", "thousandth_threshold",
              "accumulative_error_compare", "benchmark")

MSG_TYPE = "bench and npu output type is different."
MSG_STRUCTURE = "bench and npu output structure is different."
MSG_BENCH_NONE = "Bench output is None, skip this test."
MSG_EMPTY = "There is not bench calculation result."
MSG_COS_FAIL = "Cosine similarity is less than 0.99, consider as error, skip other check and set to SPACE."
MSG_MAX_ABS_PASS = "Max abs error is less than 0.001, consider as pass, skip other check and set to SPACE."
MSG_R100_ERROR = "Relative error is greater than 0.01, consider as error, skip other check and set to SPACE."
MSG_R1000_PASS = "Relative error is less than 0.001, consider as pass, skip other check and set to SPACE."
MSG_R1000_WARNING = "Relative error is greater than 0.001, consider as warning, skip other check and set to SPACE."
MSG_R1000_ERROR = "Relative error is greater than 0.001, consider as error, skip other check and set to SPACE."
MSG_R10000_WARNING = "Relative error is greater than 0.0001, consider as warning, skip other check and set to SPACE."
MSG_R10000_PASS = "Relative error is less than 0.0001, consider as pass."

# numpy dtype each torch float dtype arrives in (bf16 has no numpy dtype: float32 holds its values).
_FLOAT_NUMPY = {"torch.float16": np.float16, "torch.bfloat16": np.float32, "torch.float32": np.float32,
                "torch.float64": np.float64}
# msprobe's "comparable" groups of numpy dtypes; a pair must fall in the same group.
_COMPARABLE = ({np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.longdouble)},
               {np.dtype(np.bool_), np.dtype(np.uint8)}, {np.dtype(np.int32), np.dtype(np.int64)})
# What a converter makes of one output: (kind: "tensor" | "scalar" | "none" | other, value, torch dtype
# string of a tensor, else None).
Converter = Callable[[Any], tuple[str, Any, Optional[str]]]  # Optional: a run-time alias, and Python 3.9's


class Judging(NamedTuple):
    """What an output is judged by: its API's name (its thresholds and category), the specs (None: the shipped
    api_specs/) and the metric standard."""
    api_name: str
    specs: Mapping[str, Any] | None = None
    standard: str = "msprobe"


class Layer1Measures(NamedTuple):
    """What the Layer-1 verdict reads of one output: its cosine (value, whether it passes, a message), its
    largest abs error, and `dual(t)`: the fraction of relative errors below t and whether it passes."""
    cosine: tuple[float | None, bool, str]
    max_abs: np.floating
    dual: Callable[[float], tuple[float, bool]]


@dataclass
class OutputComparison:
    """One details-CSV row: the verdict and metrics of one output (or gradient) pair."""
    name: str
    status: str                              # "pass" | "Warning" | "error" | "SKIP"
    message: str
    bench_dtype: str
    device_dtype: str
    shape: list[int] | None
    metrics: dict[str, float | None]         # every METRIC_KEYS key; None is a blank cell
    worst: dict[str, Any] | None = None      # element with the largest abs error (float outputs)
    algorithm: str | None = None             # Layer-2 algorithm whose columns are filled
    verdict: str | None = None               # status under the selected standard (None: same as status)
    verdict_message: str = ""
    compare: dict[str, Any] | None = None    # api_precision_compare cells (ratios and sub-statuses)
    reference: dict[str, Any] | None = None  # the reference side's metrics / statistics, when there is one

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (nan/inf stay floats); one level of copying (asdict's deep copy costs
        more than the metrics of a small output)."""
        data = {f.name: _copied(getattr(self, f.name)) for f in _FIELDS}
        data["metrics"] = {k: None if v is None else float(v) for k, v in self.metrics.items()}
        return data


def _copied(value: Any) -> Any:
    return dict(value) if isinstance(value, dict) else list(value) if isinstance(value, list) else value


_FIELDS = fields(OutputComparison)


# --------------------------------------------------------------------------------------- specs
def threshold_sections(specs: Mapping[str, Any] | None) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """(thresholds, categories) of a specs mapping; None means the shipped api_specs/."""
    if specs is None or "thresholds" not in specs or "categories" not in specs:
        default = load_specs()
        specs = default if specs is None else {**default, **specs}
    return specs["thresholds"], specs["categories"]


# --------------------------------------------------------------------------------------- verdicts
def blank_row(name: str, status: str, message: str, bench_dtype: str = BLANK, device_dtype: str = BLANK,
         shape: list[int] | None = None) -> OutputComparison:
    return OutputComparison(name, status, message, bench_dtype, device_dtype, shape, M.blank_metrics())


def _torch_size(shape: tuple[int, ...]) -> str:
    return f"torch.Size({list(shape)})"


def compare_tensor(name: str, bench: np.ndarray, device: np.ndarray, *, bench_dtype: str, device_dtype: str,
                   judging: Judging) -> OutputComparison:
    """Layer-1 verdict of one tensor pair plus the Layer-2 columns of its algorithm (§4.1, §4.2)."""
    api_name, specs = judging.api_name, judging.specs
    b, d = np.asarray(bench), np.asarray(device)
    if bench_dtype == BF16:  # a bf16 bench (rare) as its values; a bf16 device output's storage is read as it is
        b = storage.widen(b)
    row = blank_row(name, ERROR, "", bench_dtype, device_dtype, [int(s) for s in d.shape])
    if device_dtype == BF16 and b.dtype != np.float64:  # msprobe compares bf16 outputs in float32 (a float64
        b = b.astype(np.float32, copy=False)           # bench: in _compare_float, read in place where it can be)
    if device_dtype in _FLOAT_NUMPY and d.dtype.kind == "f":
        d = d.astype(_FLOAT_NUMPY[device_dtype], copy=False)
    # the numpy dtype of d's values: float32 for a bf16 output's storage (a torch.uint16 output stays integers)
    held = np.dtype(np.float32) if device_dtype == BF16 and storage.is_bits(d) else d.dtype
    if b.shape != d.shape:
        row.message = f"The shape of bench{_torch_size(b.shape)} and npu{_torch_size(d.shape)} not equal."
        return row
    if b.dtype.kind in "iu" and held.kind in "iu" and b.size:
        rule = _quantization(api_name, specs)
        if rule is not None:  # 26.x: integer outputs of quantisation APIs may differ by one step of rounding
            max_abs = int(np.max(np.abs(b.astype(np.int64) - d.astype(np.int64))))
            row.metrics["max_abs_err"] = float(max_abs)
            row.status = PASS if max_abs <= rule else ERROR
            row.message = (f"Quantization API: max abs error {max_abs} {'<=' if max_abs <= rule else '>'} {rule} "
                           f"(msprobe 26.x's rule for integer outputs of quantization APIs).")
            return row
    if not any(b.dtype in group and held in group for group in _COMPARABLE):
        row.message = f"Bench out dtype is {b.dtype} but npu output dtype is {held}, cannot compare."
        return row
    if b.size == 0:
        row.message = MSG_EMPTY
        return row
    if b.dtype.kind in "biu":
        rate = M.binary_error_rate(b, d)
        row.metrics["binary_error_rate"] = rate
        row.status = PASS if rate == 0 else ERROR
        row.message = f"Compare algorithm is not supported for {b.dtype} data. Only judged by Error Rate."
        return row
    with np.errstate(all="ignore"):
        _compare_float(row, b.reshape(-1), d.reshape(-1), device_dtype, judging)
    return row


def _quantization(api_name: str, specs: Mapping[str, Any] | None) -> float | None:
    """The max-abs-error limit of a quantisation API's integer outputs (thresholds.quantization), or None."""
    th = threshold_sections(specs)[0]
    if specs is not None and "apis" in specs:
        th = thresholds_for(specs, api_name)
    rule = th["quantization"]
    return rule["max_abs_err_le"] if api_name in rule["apis"] else None


def metric_plan(row: OutputComparison, device_dtype: str, work: np.dtype[Any], api_name: str,
          specs: Mapping[str, Any] | None, standard: str) -> tuple[Mapping[str, Any], str | None, fused.Limits]:
    """The thresholds, the Layer-2 algorithm (None outside layer2_dtypes; set on the row) and the limits of one
    float output whose error dtype is `work`."""
    th, cats = threshold_sections(specs)
    if specs is not None and "apis" in specs:
        th = thresholds_for(specs, api_name)
    eps = th["rel_err_eps"].get(device_dtype)
    eps = np.finfo(work).eps if eps is None else eps
    algo = None
    if device_dtype in cats["layer2_dtypes"]:
        override = (specs or {}).get("apis", {}).get(api_name, {}).get("algorithm")
        algo = row.algorithm = layer2.algorithm_for(api_name, device_dtype, cats, standard, override)
    return th, algo, layer2.limits(algo, device_dtype, float(eps), th)


def _compare_float(row: OutputComparison, b: np.ndarray, d: np.ndarray, device_dtype: str,
                   judging: Judging) -> None:
    shape, dev_dtype = tuple(row.shape or ()), np.dtype(np.float32) if storage.is_bits(d) else d.dtype
    work = np.dtype(np.float32) if device_dtype == BF16 else b.dtype  # the error dtype B
    standard = judging.standard
    th, algo, limits = metric_plan(row, device_dtype, work, judging.api_name, judging.specs, standard)
    if fused.supported(b, d, dev_dtype, th["ulp"][device_dtype]["compute_dtype"] if limits.ulp else None, work):
        _compare_fused(row, b, d, Plan(device_dtype, dev_dtype, work, th, algo, limits, standard))
        return
    b, d = worst_values(b, d, work)  # the numpy path
    err = M.error_arrays(b, d, limits.eps)
    worst = int(np.argmax(err.abs_err))
    if not err.abs_err[worst] < th["layer1"]["max_abs_err_pass_lt"]:
        _ = err.rel_err  # Layer 1's ratios will read every relative error: made now, Layer 2 takes its own from them
    messages: list[str] = []
    if algo is not None:
        row.metrics.update(layer2.columns(Plan(device_dtype, dev_dtype, work, th, algo, limits, standard), b, d, err))
    else:
        messages += _other_columns(row, b, d, device_dtype, th, standard)
    row.worst = {"index": [int(i) for i in np.unravel_index(worst, shape)], "device": float(d[worst]),
                 "bench": float(b[worst]), "abs_err": float(err.abs_err[worst]),
                 "rel_err": float(err.rel_err_at(slice(worst, worst + 1), 1)[0])}
    l1 = th["layer1"]
    cos = M.cosine(b, d, zero_eps=l1["cosine"]["zero_eps"], pass_gt=l1["cosine"]["pass_gt"],
                   bench_absmax=np.max(err.abs_bench))
    row.status = _layer1(row.metrics, messages, Layer1Measures(cos, err.abs_err[worst],
                         lambda t: M.dual_ratio(err.rel_err, t)), device_dtype, l1)
    row.message = "\n".join(messages)


def worst_values(b: np.ndarray, d: np.ndarray, work: np.dtype[Any]) -> tuple[np.ndarray, np.ndarray]:
    """The numpy paths' arrays: the bench in the error dtype `work`, and the device output's values (bf16
    storage widened, metrics/storage.py; fp16 in float32 beside a wider bench: numpy's fp16 math is slow and
    float32 holds the values exactly)."""
    d = storage.widen(d)
    return b.astype(work, copy=False), d.astype(np.float32) if d.dtype == np.float16 and b.dtype != np.float16 else d


def _other_columns(row: OutputComparison, b: np.ndarray, d: np.ndarray, device_dtype: str, th: Mapping[str, Any],
                   standard: str) -> list[str]:
    """layer2.other_columns into the row; its messages."""
    row.algorithm, found, messages = layer2.other_columns(b, d, device_dtype, th, standard)
    row.metrics.update(found)
    return messages


def _compare_fused(row: OutputComparison, b: np.ndarray, d: np.ndarray, plan: Plan) -> None:
    """_compare_float from the statistics of one compiled pass (metrics/fused.py): the same columns. `b` may be
    wider than the error dtype `plan.work` (a bf16 output's float64 bench, read in place)."""
    work = plan.work
    stats = fused.compute(b, d, plan.dev_dtype, plan.limits, work)
    if stats.n_nonfinite:  # rare: the numpy path below reads the values
        b, d = worst_values(b, d, work)
    from_stats(row, stats, b, d, worst_values(b[stats.worst:stats.worst + 1], d[stats.worst:stats.worst + 1], work),
               plan)


def from_stats(row: OutputComparison, stats: fused.MetricStats, b: np.ndarray, d: np.ndarray,
               worst: tuple[np.ndarray, np.ndarray], plan: Plan) -> None:
    """The row's columns and Layer-1 status from the statistics and the worst element's values (`worst`: bench
    and device, as worst_values gives them); `b` and `d` are read only for an output holding non-finite elements,
    for one outside layer2_dtypes, and for the cosine of values beyond vectorised._SAFE_SCALE. The row's shape
    is the output's."""
    dev_dtype, device_dtype, algo, limits, th, work = (plan.dev_dtype, plan.dtype, plan.algo, plan.limits, plan.th,
                                                       plan.work)
    shape = tuple(row.shape or ())
    messages: list[str] = []
    if algo == "thousandth_threshold":
        row.metrics["dual_thousandth"] = fused.dual(stats, limits.dual[1])[0]
    elif algo is not None:
        inf_nan = 0.0
        if stats.n_nonfinite and algo in ("absolute_threshold", "accumulative_error_compare"):
            err = M.error_arrays(b, d, limits.eps)  # only outputs with inf/NaN: their non-finite elements
            both_finite, bench_dev = M.finite_mask(b, d, dev_dtype)
            clip = th["inf_nan_clip_range"].get(device_dtype) or (np.finfo(dev_dtype).min, np.finfo(dev_dtype).max)
            inf_nan = M.inf_nan_error_ratio(err, M.Sides(d, bench_dev, both_finite, dev_dtype), limits.rtol,
                                            tuple(clip))
        fudge = th["rmse_fudge"]
        row.metrics.update(fused.layer2(stats, algo, work, rmse_fudge=(fudge["denominator_eps"], fudge["additive"]),
                                        inf_nan=inf_nan))
    else:
        messages += _other_columns(row, b, d, device_dtype, th, plan.standard)
    w, (bw, dw) = stats.worst, worst
    one = M.error_arrays(bw, dw, limits.eps)
    row.worst = {"index": [int(i) for i in np.unravel_index(w, shape)], "device": float(dw[0]), "bench": float(bw[0]),
                 "abs_err": float(one.abs_err[0]), "rel_err": float(one.rel_err[0])}
    l1 = th["layer1"]
    cos = fused.cosine(stats, d, b, zero_eps=l1["cosine"]["zero_eps"], pass_gt=l1["cosine"]["pass_gt"], work=work)
    row.status = _layer1(row.metrics, messages, Layer1Measures(cos, one.abs_err[0], lambda t: fused.dual(stats, t)),
                         device_dtype, l1)
    row.message = "\n".join(messages)


def _layer1(m: dict[str, float | None], messages: list[str], measures: Layer1Measures, device_dtype: str,
            l1: Mapping[str, Any]) -> str:
    """cosine -> max-abs short-circuit -> 双百/双千/双万 (fp16/bf16 vs fp32/fp64 branches)."""
    (cos, cos_ok, msg), max_abs, dual = measures
    m["cosine"] = cos
    if msg:
        messages.append(msg)
    if not cos_ok:
        messages.append(MSG_COS_FAIL)
        return ERROR
    m["max_abs_err"] = float(max_abs)
    if max_abs < l1["max_abs_err_pass_lt"]:       # compared in the error dtype, like msprobe
        messages.append(MSG_MAX_ABS_PASS)
        return PASS
    t = l1["dual_ratio"]
    if device_dtype in l1["half_dtypes"]:
        m["dual_hundredth"], ok100 = dual(t["hundredth"])
        if not ok100:
            messages.append(MSG_R100_ERROR)
            return ERROR
        m["dual_thousandth"], ok1000 = dual(t["thousandth"])
        messages.append(MSG_R1000_PASS if ok1000 else MSG_R1000_WARNING)
        return PASS if ok1000 else WARNING
    m["dual_thousandth"], ok1000 = dual(t["thousandth"])
    m["dual_ten_thousandth"], ok10000 = dual(t["ten_thousandth"])
    if device_dtype in l1["full_dtypes"]:
        if not ok1000:
            messages.append(MSG_R1000_ERROR)
            return ERROR
        if not ok10000:
            messages.append(MSG_R10000_WARNING)
            return WARNING
        messages.append(MSG_R10000_PASS)
    return PASS


def compare_scalar(name: str, bench: Any, device: Any) -> OutputComparison:
    """Python bool/int/float/str outputs: equal -> pass (error rate 0), else error."""
    if not isinstance(bench, type(device)):
        return blank_row(name, ERROR, MSG_TYPE)
    if not isinstance(bench, (bool, int, float, str)):
        return blank_row(name, ERROR, f"Unexpected output type in compare_core: {type(bench)}")
    row = blank_row(name, PASS, "", str(type(bench)), str(type(device)))
    if bench != device:
        row.status = ERROR
    else:
        row.metrics["binary_error_rate"] = 0.0
    return row


def _on_device(name: str, bench: Any, device: Any, on: Any, judging: Judging) -> OutputComparison | None:
    """The row of a float output of layer2_dtypes from statistics taken where the device output lives (`on`, a
    torch.device; metrics/on_device.py): the bench goes there once, and only the statistics and the worst element
    come back. None where the host must take it (then the converter copies both as usual)."""
    import torch

    from ..metrics import on_device

    api_name, specs, standard = judging

    tensors = isinstance(bench, torch.Tensor) and isinstance(device, torch.Tensor)
    if not tensors or bench.dtype not in (torch.float32, torch.float64) or bench.shape != device.shape or \
            str(device.dtype) not in threshold_sections(specs)[1]["layer2_dtypes"]:
        return None
    device_dtype, shape = str(device.dtype), [int(x) for x in device.shape]
    work = np.dtype(np.float32 if device_dtype == BF16 else str(bench.dtype).split(".")[1])
    held = {BF16: storage.BITS, "torch.float16": np.dtype(np.float16)}.get(device_dtype, np.dtype(np.float32))
    # stand-ins of the host's arrays, for the dtype and size checks (zero strides: no memory)
    b, d = (np.broadcast_to(np.zeros((), dtype), shape).reshape(-1)
            for dtype in (np.float32 if bench.dtype == torch.float32 else np.float64, held))
    dev_dtype = np.dtype(np.float32) if device_dtype == BF16 else held
    row = blank_row(name, ERROR, "", str(bench.dtype), device_dtype, shape)
    th, algo, limits = metric_plan(row, device_dtype, work, api_name, specs, standard)
    ulp_dtype = th["ulp"][device_dtype]["compute_dtype"] if limits.ulp else None
    if not fused.supported(b, d, dev_dtype, ulp_dtype, work):
        return None
    try:
        stats = on_device.compute(bench.detach().to(on), device.detach().to(on), dev_dtype, limits, work)
    except RuntimeError as exc:  # an accelerator without an op the pass needs (re-raised on the CPU)
        from .strict.torch_pass import unsupported

        unsupported(torch.device(on), exc)
        return None
    if stats is None or not M.dots_unscaled(max(stats.device_max, -stats.device_min), stats.bench_absmax):
        return None  # non-finite elements, or a cosine whose dot products the host scales
    w = slice(stats.worst, stats.worst + 1)  # its values, bf16 widened (exact): what worst_values makes of storage
    bw, dw = (x.detach().reshape(-1)[w].cpu() for x in (bench, device))
    worst = worst_values(bw.numpy(), (dw.float() if dw.dtype == torch.bfloat16 else dw).numpy(), work)
    from_stats(row, stats, b, d, worst, Plan(device_dtype, dev_dtype, work, th, algo, limits, standard))
    return row


def _compare_one(name: str, bench: Any, device: Any, judging: Judging, converter: Converter,
                 on: Any = None) -> OutputComparison:
    if on is not None:  # the checks run where the device output lives
        row = _on_device(name, bench, device, on, judging)
        if row is not None:
            return row
    bkind, bval, bdtype = converter(bench)
    dkind, dval, ddtype = converter(device)
    # msprobe checks isinstance(bench, type(device)) first: a None bench only skips if the device is None too.
    if bkind != dkind or (bkind == "scalar" and not isinstance(bval, type(dval))):
        return blank_row(name, ERROR, MSG_TYPE)
    if bkind == "none":
        return blank_row(name, SKIP, MSG_BENCH_NONE)
    if bkind == "tensor":
        return compare_tensor(name, bval, dval, bench_dtype=cast(str, bdtype), device_dtype=cast(str, ddtype),
                              judging=judging)
    if bkind == "scalar":
        return compare_scalar(name, bval, dval)
    return blank_row(name, ERROR, f"Unexpected output type in compare_core: {type(bench)}")


def compare_structure(name_prefix: str, bench: Any, device: Any, *, judging: Judging, converter: Converter,
                      on: Any = None) -> list[OutputComparison]:
    """msprobe's list rules: more bench than device outputs -> one error row; else the device list is
    truncated and each pair gives a row `{name_prefix}.{i}`. A non-list bench is one pair. `on`: the
    torch.device where the float outputs' statistics are taken (_on_device), else the host."""
    if not isinstance(bench, (list, tuple)):
        return [_compare_one(f"{name_prefix}.0", bench, device, judging, converter, on)]
    if not isinstance(device, (list, tuple)):
        device = [device]
    if len(bench) > len(device):
        return [blank_row(f"{name_prefix}.0", ERROR, MSG_STRUCTURE)]
    return [_compare_one(f"{name_prefix}.{i}", b, d, judging, converter, on)
            for i, (b, d) in enumerate(zip(bench, device))]


def dropout_verdict(bench: np.ndarray, device: np.ndarray, specs: Mapping[str, Any] | None = None) -> tuple[str, str]:
    """Dropout outputs are random: judged only by how many zeros each side has (msprobe's rule)."""
    rule = threshold_sections(specs)[0]["dropout"]
    b, d = np.asarray(bench), np.asarray(device)
    if b.size < rule["min_numel"]:
        return PASS, f"Dropout output has {b.size} < {rule['min_numel']} elements: not judged (pass)."
    diff = M.zero_fraction_diff(b, d)
    ok = diff < rule["zero_fraction_diff_lt"]
    return (PASS if ok else ERROR), (f"Dropout zero-fraction difference {diff:.6g} "
                                     f"{'<' if ok else '>='} {rule['zero_fraction_diff_lt']}.")


def aggregate(statuses: Iterable[str]) -> str:
    """Item status: error > Warning > pass; SKIP only when nothing was compared (never pass without a
    compared output, unlike msprobe §8.1 item 6)."""
    seen = set(statuses)
    for status in (ERROR, WARNING, PASS):
        if status in seen:
            return status
    return SKIP
