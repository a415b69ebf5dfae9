"""MindSpore re-run mode for real: the recorded mint call runs in MindSpore (on CPU here), the bench in torch.

Needs MindSpore (it wants numpy<2, so CI installs it in its own environment, .ci/venv-ms, and runs
`python -m pytest tests/test_mindspore.py -m mindspore` there). Without MindSpore every test here is
skipped with the import error as the reason.
"""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest
import torch

import pytest_msprobe.check.replay  # noqa: F401  (kept across pytester's in-process runs)
import pytest_msprobe.runs.mindspore as msmap
from pytest_msprobe.inputs.build import BuildContext, build
from pytest_msprobe.runs.execution import NotCheckable, tensors_of
from pytest_msprobe.specs.loader import load_specs
from tests import helpers
from tests.helpers import EXAMPLES, api_records, copy_dump

IMPORT_ERROR = msmap.import_error()  # imports MindSpore once, before any in-process pytester run
pytestmark = [pytest.mark.mindspore,
              pytest.mark.skipif(IMPORT_ERROR is not None,
                                 reason=f"MindSpore is not importable here ({IMPORT_ERROR}); CI runs these tests "
                                        "in .ci/venv-ms")]

MS_TENSOR = EXAMPLES / "mint_mlp_fp32_tensor" / "step0" / "rank0"
MS_STATISTICS = EXAMPLES / "mint_mlp_fp32_statistics" / "step0" / "rank0"


def ms_tensor(dtype: str = "Float32", shape: list[int] | None = None, mx: Any = 2.0, mn: Any = -1.0) -> dict:
    return {"type": "mindspore.Tensor", "dtype": dtype, "shape": [16, 32] if shape is None else shape,
            "Max": mx, "Min": mn, "Mean": 0.5, "Norm": 10.0}


def make_dump(pytester: pytest.Pytester, data: dict[str, Any], name: str = "ms") -> Path:
    return helpers.make_dump(pytester, data, name, framework="mindspore")






def test_statistics_dump_reruns_in_mindspore(pytester: pytest.Pytester) -> None:
    dump = copy_dump(pytester, MS_STATISTICS, "ms")
    # MindSpore's own fp32 softmax and silu CPU kernels lose several ULPs more than torch's: the default
    # standard flags them (forward and backward); msprobe's MindSpore rule passes every call. silu shows it
    # on every input drawn; softmax's 20 elements on about half of the seeds (one element 22-34 ULP off): seed
    # 11 draws inputs where both of its items show it.
    result = pytester.runpytest(str(dump), "-rs", "--msprobe-seed", "11")
    result.assert_outcomes(passed=16, failed=4)
    recs = api_records(pytester)
    assert {name for name, r in recs.items() if r["status"] == "error"} == {
        "MintFunctional.softmax.0.forward", "MintFunctional.softmax.0.backward", "MintFunctional.silu.0.forward",
        "MintFunctional.silu.0.backward"}
    msrule = pytester.runpytest(str(dump), "--msprobe-seed", "11", "--msprobe-standard", "mindspore", "--msprobe-out",
                                "ms_rule")
    msrule.assert_outcomes(passed=20)
    assert {(r["mode"], r["device"], r["data"]) for r in recs.values()} == {("rerun", "mindspore:CPU", "random")}
    assert recs["Mint.matmul.0.forward"]["impl"] == "mindspore.mint.matmul (bench torch.matmul)"
    linear = recs["MintFunctional.linear.0.backward"]["outputs"]
    assert [(o["name"].rsplit(".", 1)[-1], o["shape"]) for o in linear] == [("0", [4, 16]), ("1", [32, 16]),
                                                                          ("2", [32])]
    assert all(o["ms_metrics"]["max_abs_err"] < 1e-5 for r in recs.values() for o in r["outputs"])


def test_tensor_dump_reruns_from_the_saved_inputs(pytester: pytest.Pytester) -> None:
    dump = copy_dump(pytester, MS_TENSOR, "ms")
    result = pytester.runpytest(str(dump), "--msprobe-mode", "rerun", "--msprobe-standard", "mindspore")
    result.assert_outcomes(passed=20)
    recs = api_records(pytester)
    assert {(r["mode"], r["data"]) for r in recs.values()} == {("rerun", "real")}
    assert all("msprobe's MindSpore rule" in o["verdict_message"] for r in recs.values() for o in r["outputs"])


def test_items_are_reproducible_alone(pytester: pytest.Pytester) -> None:
    dump = copy_dump(pytester, MS_STATISTICS, "ms")
    pytester.runpytest(str(dump), "--msprobe-out", "full", "-k", "forward")
    full = api_records(pytester, "full")
    pytester.runpytest(str(dump), "--msprobe-out", "one", "-k", "softmax and forward")
    alone = api_records(pytester, "one")["MintFunctional.softmax.0.forward"]
    assert alone["outputs"] == full["MintFunctional.softmax.0.forward"]["outputs"]
    pytester.runpytest(str(dump), "--msprobe-out", "other", "-k", "softmax and forward", "--msprobe-seed", "5")
    other = api_records(pytester, "other")["MintFunctional.softmax.0.forward"]
    assert other["outputs"][0]["ms_metrics"] != alone["outputs"][0]["ms_metrics"]


def test_inputs_are_distinct_and_keep_the_recorded_range() -> None:
    """msprobe's MindSpore checker reseeds per tensor, so `sub(x, y)` with equal statistics sees x == y."""
    dump_like = type("D", (), {"tensor_dir": Path("/nonexistent")})()
    ctx = BuildContext(dump_like, torch.Generator().manual_seed(7), False, 1 << 30)  # type: ignore[arg-type]
    args = [build(ms_tensor(), ctx, f"input_args.{i}") for i in range(2)]
    x, y = args
    assert x.dtype == torch.float32 and not torch.equal(x, y)
    assert x.flatten()[0] == -1.0 and x.flatten()[-1] == 2.0 and x.min() == -1.0 and x.max() == 2.0
    call = msmap.ms_callable("Mint", "sub", load_specs(), "auto", None)
    (out,), _ = msmap.run(call, args, {}, seed=1, grad_positions=[], cotangents={})
    assert torch.equal(out, x - y) and out.abs().max() > 0


def test_bf16_runs_in_mindspore_and_benches_in_fp32(pytester: pytest.Pytester) -> None:
    bf16 = ms_tensor("BFloat16", [32, 64], mx=4.0, mn=-4.0)
    data = {"Mint.mul.0.forward": {"input_args": [bf16, bf16], "input_kwargs": {}, "output": [bf16]},
            "Mint.mul.0.backward": {"input": [ms_tensor("BFloat16", [32, 64], mx=0.01, mn=-0.01)],
                                    "output": [bf16, bf16]},
            "Mint.add.0.forward": {"input_args": [bf16, {"type": "float", "value": 0.5}], "input_kwargs": {},
                                   "output": [bf16]}}
    dump = make_dump(pytester, data)
    result = pytester.runpytest(str(dump), "--msprobe-standard", "strict", "-rs")
    result.assert_outcomes(passed=3)
    (details,) = (pytester.path / "msprobe_results").glob("accuracy_checking_details_*.csv")
    rows = list(csv.reader(details.open(encoding="utf-8-sig")))
    assert {tuple(r[1:3]) for r in rows[1:]} == {("Float32", "BFloat16")}
    assert [r[0] for r in rows[1:]] == ["Mint.mul.0.forward.output.0", "Mint.mul.0.backward.output.0",
                                        "Mint.mul.0.backward.output.1", "Mint.add.0.forward.output.0"]


def test_ops_without_a_cpu_kernel_skip_with_mindsporess_reason(pytester: pytest.Pytester) -> None:
    t = ms_tensor(shape=[8, 16])
    data = {"MintFunctional.gelu.0.forward": {"input_args": [t], "input_kwargs": {}, "output": [t]},
            "Mint.cumsum.0.forward": {"input_args": [t, {"type": "int", "value": 0}], "input_kwargs": {},
                                      "output": [t]},
            "Mint.add.0.forward": {"input_args": [t, t], "input_kwargs": {}, "output": [t]}}
    dump = make_dump(pytester, data)
    result = pytester.runpytest(str(dump), "-rs")
    result.assert_outcomes(passed=1, skipped=2)  # the op after an unsupported one is unaffected
    recs = api_records(pytester)
    # MindSpore's own words (2.10 has no CPU kernel for either; a later release may add one)
    assert "cannot run mindspore.mint.nn.functional.gelu on CPU: RuntimeError: The kernel GeluExt unregistered" \
        in recs["MintFunctional.gelu.0.forward"]["message"]
    assert "cannot run mindspore.mint.cumsum on CPU: RuntimeError: The kernel CumsumExt unregistered" \
        in recs["Mint.cumsum.0.forward"]["message"]


def test_other_mindspore_errors_are_failures_not_skips() -> None:
    call = msmap.ms_callable("Mint", "matmul", load_specs(), "auto", None)
    args = [torch.ones(4, 8), torch.ones(4, 8)]
    with pytest.raises(Exception) as info:
        msmap.run(call, args, {}, seed=1, grad_positions=[], cotangents={})
    assert not isinstance(info.value, NotCheckable)
    (out,), _ = msmap.run(call, [torch.ones(4, 8), torch.ones(8, 2)], {}, seed=1, grad_positions=[],
                          cotangents={})  # and MindSpore is usable again right after
    assert torch.equal(out, torch.full((4, 2), 8.0))


def test_gradients_of_every_float_argument() -> None:
    call = msmap.ms_callable("MintFunctional", "linear", load_specs(), "auto", None)
    x, w, b = torch.randn(4, 16), torch.randn(32, 16), torch.randn(32)
    cot = torch.randn(4, 32)
    (out,), grads = msmap.run(call, [x, w, b], {}, seed=1, grad_positions=[0, 1, 2], cotangents={0: cot})
    torch.testing.assert_close(out, torch.nn.functional.linear(x, w, b), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grads[0], cot @ w, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grads[1], cot.T @ x, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grads[2], cot.sum(0), rtol=1e-5, atol=1e-5)
    assert [t.shape for t in tensors_of([x, w, b])] == [g.shape for g in grads.values()]


PLANTED_MS = """
import mindspore

_matmul = mindspore.mint.matmul


def matmul(a, b, *args, **kwargs):  # a MindSpore kernel 1% off
    return _matmul(a, b, *args, **kwargs) * 1.01


mindspore.mint.matmul = matmul


def pytest_unconfigure():
    mindspore.mint.matmul = _matmul
"""


def test_rerun_items_get_error_data_scripts_and_plots(pytester: pytest.Pytester) -> None:
    import json
    import subprocess
    import sys

    pytester.makeconftest(PLANTED_MS)
    dump = copy_dump(pytester, MS_STATISTICS, "ms")
    result = pytester.runpytest(str(dump), "-k", "matmul and forward", "--msprobe-save-error-data", "err",
                                "--msprobe-repro", "rep", "--msprobe-html", "r.html", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1, deselected=19)
    (record,) = api_records(pytester).values()
    assert record["mode"] == "rerun" and record["status"] == "error"
    saved = json.loads((pytester.path / "err" / "dump.json").read_text())
    assert saved["framework"] == "mindspore" and list(saved["data"]) == ["Mint.matmul.0.forward"]
    # the saved MindSpore result replays against the bench and fails the same way, without the planted kernel
    (pytester.path / "conftest.py").unlink()
    again = pytester.runpytest(str(pytester.path / "err"), "--msprobe-out", "again", "-p", "no:cacheprovider")
    again.assert_outcomes(failed=1)
    (replayed,) = api_records(pytester, "again").values()
    assert replayed["mode"] == "replay" and replayed["outputs"][0]["metrics"] == record["outputs"][0]["metrics"]
    page = (pytester.path / "r.html").read_text(encoding="utf-8")
    assert page.count('<svg class="plot heatmap"') == 1
    # the call's script re-runs it in MindSpore, here without the bug: the fix is verified
    proc = subprocess.run([sys.executable, record["repro"], "--json"], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (rerun,) = json.loads(proc.stdout)["records"]
    assert rerun["mode"] == "rerun" and rerun["device"] == "mindspore:CPU" and rerun["status"] == "pass"
