"""Applying the selected standard (`--msprobe-standard`) to one compared output.

`status` of a row always stays msprobe's Layer-1 verdict (it is the details CSV's Status column);
`verdict` is what the item's outcome follows under the selected standard.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..metrics.storage import widen
from ..specs.loader import thresholds_for
from . import contracts, grid, ms_results, strict, verdicts
from .standards import OutputComparison

FLOAT_DTYPES = ("torch.float16", "torch.bfloat16", "torch.float32", "torch.float64")


@dataclass
class StrictArrays:
    """One float output's arrays for the strict standard: bench, device and the third run (torch's
    kernel in the device dtype, or the magnitude run of a contraction), with the op's kind and the
    length of the last dimension."""

    bench: Any
    device: Any
    torch_run: Any = None
    magnitude: Any = None
    kind: str = "elementwise"
    row: int = 1
    product: Any = None
    dtype: str | None = None  # the dtype the kernel computed in, when narrower than the output's (autocast)
    rules: str | None = None  # a further section of the strict thresholds (gradient_rounding)
    estimated: Any = None  # elements whose torch-run value a sampled run estimated (bool array)
    allowance: tuple[float, float] | None = None  # the device's contract for this output: (ULP bound, bias)


@dataclass(frozen=True)
class Evidence:
    """What a row's verdict may read beside its own metrics: the reference run's row, the strict standard's
    arrays and their strict_verdict when computed already, and a reference-results file
    (msprobe_reference_results)."""

    ref_row: OutputComparison | None = None
    arrays: StrictArrays | None = None
    reference_results: str | None = None
    strict_result: strict.StrictResult | None = None


def decide(row: OutputComparison, standard: str, *, api_name: str, specs: Mapping[str, Any],
           evidence: Evidence) -> None:
    """The row's verdict by `standard`."""
    ref_row, arrays, reference_results, strict_result = (evidence.ref_row, evidence.arrays,
                                                         evidence.reference_results, evidence.strict_result)
    if standard == "original" or row.status == "SKIP":
        row.verdict = row.status
        return
    th = thresholds_for(specs, api_name)
    if standard == "strict":
        _strict(row, arrays, th, strict_result)
        return
    if standard == "mindspore":
        _mindspore(row, arrays, th["mindspore"])
        return
    algorithm = row.algorithm
    if algorithm is None and row.metrics.get("binary_error_rate") is not None:
        algorithm = row.algorithm = "binary_consistency"  # int/bool outputs
    if algorithm is None:  # fp64/complex, scalars, structural errors: the new standard does not cover them
        row.verdict = row.status
        if row.device_dtype not in ("torch.float16", "torch.bfloat16", "torch.float32") and row.shape is not None:
            row.verdict_message = f"the new standard does not cover {row.device_dtype}: original standard applied"
        return
    if not verdicts.needs_reference(algorithm, row.device_dtype, th):
        status, message, cells = verdicts.single_run(algorithm, row.metrics, row.device_dtype, th)
    else:
        ref_metrics = _reference_metrics(row, algorithm, ref_row, reference_results)
        if ref_metrics is None:
            row.verdict = row.status
            row.verdict_message = (f"{algorithm} needs a reference (--msprobe-reference DEVICE or "
                                   "-o msprobe_reference_results=PATH): original standard applied")
            return
        status, message, cells = verdicts.with_reference(algorithm, row.metrics, ref_metrics, row.device_dtype,
                                                         verdicts.ApiRules(api_name, standard, th))
        row.reference = dict(ref_metrics)
    cells["algorithm_name"] = specs["categories"]["algorithm_names"].get(algorithm, algorithm)
    row.verdict, row.verdict_message, row.compare = status, message, cells


def _reference_metrics(row: OutputComparison, algorithm: str, ref_row: OutputComparison | None,
                       reference_results: str | None) -> Mapping[str, Any] | None:
    if ref_row is not None and ref_row.algorithm == algorithm:
        return ref_row.metrics
    if reference_results:
        from .reference import lookup

        return lookup(reference_results, row.name, row.device_dtype)
    return None


def strict_verdict(arrays: StrictArrays, device_dtype: str, th: Mapping[str, Any]) -> strict.StrictResult:
    """strict.strict_compare of one float output, by the API's thresholds `th` (pure numpy: another
    thread may run it)."""
    dtype, rules = strict_rules(arrays, device_dtype, th)
    return strict.strict_compare(arrays.bench, arrays.device, dtype, rules,
                                 strict.Runs(kind=arrays.kind, torch_run=arrays.torch_run, magnitude=arrays.magnitude,
                                             product=arrays.product, row=arrays.row, estimated=arrays.estimated))


def strict_rules(arrays: StrictArrays, device_dtype: str, th: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]]:
    """The dtype an output is judged in and its strict rules (the kind's, the further section's, the dtype's, the
    contract's allowance)."""
    dtype = arrays.dtype or device_dtype
    return dtype, contracts.raised(element_rules(th["strict"], dtype, arrays.kind, arrays.rules), arrays.allowance)


def _strict(row: OutputComparison, arrays: StrictArrays | None, th: Mapping[str, Any],
            result: strict.StrictResult | None) -> None:
    """Float tensors: strict.strict_compare; everything else keeps its exact Layer-1 comparison."""
    if arrays is None or not grid.supported(row.device_dtype) or row.shape is None:
        row.verdict = row.status
        if row.status != "error" and row.device_dtype not in FLOAT_DTYPES:
            row.verdict_message = "compared exactly"
        return
    result = result or strict_verdict(arrays, row.device_dtype, th)
    row.verdict, row.verdict_message, row.reference = result.status, result.message, result.stats


def _mindspore(row: OutputComparison, arrays: StrictArrays | None, rule: Mapping[str, Any]) -> None:
    """msprobe's MindSpore rule on float tensors; scalars and int/bool tensors keep their exact comparison
    (msprobe's checker marks every scalar output `error`)."""
    if arrays is None or row.shape is None:
        row.verdict = row.status
        if row.status != "error" and row.device_dtype not in FLOAT_DTYPES:
            row.verdict_message = "compared exactly"
        return
    row.verdict, row.verdict_message = ms_results.ms_status(
        ms_results.ms_metrics(widen(arrays.bench), widen(arrays.device), rule["epsilon"]), rule)  # bf16: values


def element_rules(rules: Mapping[str, Any], dtype: str, kind: str = "elementwise",
                  extra: str | None = None) -> Mapping[str, Any]:
    """strict rules with the op kind's, a further section's and then the device dtype's sub-mappings
    applied; a kind's or section's own per-dtype mapping right after it."""
    flat = {k: v for k, v in rules.items() if not isinstance(v, Mapping)}
    for key in (kind, extra, dtype):
        specific = rules.get(key) if key else None
        if isinstance(specific, Mapping):
            flat.update({k: v for k, v in specific.items() if not isinstance(v, Mapping)})
            nested = specific.get(dtype) if key != dtype else None
            if isinstance(nested, Mapping):
                flat.update(nested)
    return flat
