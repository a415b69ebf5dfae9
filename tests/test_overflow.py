"""Overflow triage of `overflow_check` dumps (REFERENCE §3.6): normal (the bench overflows too) or abnormal."""
from __future__ import annotations

import json
import math

import pytest

from tests.helpers import by_api, make_dump, records, tensor

LEAN = ("-p", "no:cacheprovider")

# A device exp that overflows early (inf above x = 10, where fp16's exp overflows only above ~11.09).
KERNEL = """
import torch


def exp(x, *args, **kwargs):
    y = torch.exp(x.float())
    return torch.where(x > 10, torch.full_like(y, float("inf")), y).to(x.dtype)


KERNELS = {"Torch.exp": exp}
"""


def _exp(mx: float, mn: float, out_max: float = math.inf) -> dict:
    return {"input_args": [tensor("torch.float16", [4, 4], mx, mn)], "input_kwargs": {},
            "output": [tensor("torch.float16", [4, 4], out_max, 1.0)]}


DATA = {"Torch.exp.0.forward": _exp(10.5, 0.0),      # device-only overflow: abnormal
        "Torch.exp.1.forward": _exp(12.0, 11.5),     # exp overflows fp16 everywhere: normal
        "Torch.exp.2.forward": _exp(5.0, 0.0, 150.0)}  # nothing overflows with these inputs: not reproduced


def test_overflow_items_tell_device_overflows_from_math_overflows(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(kern=KERNEL)
    dump = make_dump(pytester, DATA, task="overflow_check")
    result = pytester.runpytest(str(dump), "--msprobe-kernels", "kern.py:KERNELS", "--msprobe-save-error-data", "err",
                                *LEAN)
    result.assert_outcomes(failed=1, passed=2)
    result.stdout.fnmatch_lines(["*Torch.exp.0.forward: error*", "*abnormal overflow: only the device overflows*"])
    recs = by_api(records(pytester))
    assert [recs[f"Torch.exp.{i}.forward"]["overflow"] for i in range(3)] == ["abnormal", "normal", "not reproduced"]
    flags = recs["Torch.exp.1.forward"]["outputs"][0]["overflow"]
    assert flags["device"] and flags["bench"] and flags["bench_inf"] == 16
    assert all(r["mode"] == "overflow_check" for r in recs.values())
    assert recs["Torch.exp.0.forward"]["outputs"][0]["bench_dtype"] == "torch.float16"  # no precision raise
    saved = json.loads((pytester.path / "err" / "dump.json").read_text())
    assert saved["task"] == "overflow_check" and list(saved["data"]) == ["Torch.exp.0.forward"]
    again = pytester.runpytest(str(pytester.path / "err"), "--msprobe-kernels", "kern.py:KERNELS",
                               "--msprobe-out", "replay", *LEAN)
    again.assert_outcomes(failed=1)
    assert records(pytester, "replay")[0]["data"] == "real"


def test_on_a_cpu_without_a_substituted_kernel_every_overflow_is_normal(pytester: pytest.Pytester) -> None:
    grad = {"Torch.exp.4.forward": {"input_args": [tensor("torch.float16", [4, 4], 5.0, 0.0, requires_grad=True)],
                                    "input_kwargs": {}, "output": [tensor("torch.float16", [4, 4], 150.0, 1.0)]},
            "Torch.exp.4.backward": {"input": [tensor("torch.float16", [4, 4], 60000.0, 50000.0)]}}
    dump = make_dump(pytester, {**DATA, **grad, "Torch.exp.3.backward": {"input": [tensor("torch.float16", [4, 4])]}},
                     task="overflow_check")
    result = pytester.runpytest(str(dump), *LEAN, "-rs")
    result.assert_outcomes(passed=5, skipped=1)  # the backward without its forward entry is skipped, as always
    recs = by_api(records(pytester))
    assert {r["overflow"] for r in recs.values() if r["status"] == "pass"} == {"normal", "not reproduced"}
    backward = recs["Torch.exp.4.backward"]  # the gradient exp(x) * 5e4 overflows fp16 on both sides
    assert backward["overflow"] == "normal" and backward["outputs"][0]["name"] == "Torch.exp.4.backward.output.0"
