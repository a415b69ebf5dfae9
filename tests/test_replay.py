"""Replay mode and MindSpore dumps without MindSpore: recorded outputs vs the CPU bench.

Runs in the main environment (no MindSpore). tests/test_mindspore.py runs MindSpore for real.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import pytest_msprobe.check.replay  # noqa: F401

# imported before any pytester run, so in-process runs keep them (see tests/conftest.py)
import pytest_msprobe.runs.mindspore as msmap
from pytest_msprobe.inputs.build import InputError, parse_dtype
from pytest_msprobe.runs.execution import NotCheckable
from pytest_msprobe.specs.loader import load_specs
from pytest_msprobe.verdict import judge, ms_results
from pytest_msprobe.verdict.standards import OutputComparison
from tests.helpers import EXAMPLES, api_records, copy_dump

MS_TENSOR = EXAMPLES / "mint_mlp_fp32_tensor" / "step0" / "rank0"
MS_STATISTICS = EXAMPLES / "mint_mlp_fp32_statistics" / "step0" / "rank0"
PT_TENSOR = EXAMPLES / "mlp_fp32_tensor" / "step0" / "rank0"
MS_DETAILS = ["API Name", "Bench Dtype", "Tested Dtype", "Shape", "Cosine", "MaxAbsErr", "MaxRelativeErr", "Status",
              "Message"]






def read_csv(path: Path) -> list[list[str]]:
    assert path.read_bytes().startswith(b"\xef\xbb\xbf")
    return list(csv.reader(path.open(encoding="utf-8-sig")))


def edit_dump(path: Path, fn: Any) -> None:
    doc = json.loads(path.read_text())
    fn(doc["data"])
    path.write_text(json.dumps(doc))


def mindspore_installed() -> bool:
    return msmap.import_error() is None


# --------------------------------------------------------------------------- MindSpore tensor dumps


def test_mindspore_tensor_dump_replays_without_mindspore(pytester: pytest.Pytester) -> None:
    """auto mode replays a MindSpore tensor dump: recorded outputs vs the raised-precision torch bench."""
    dump = copy_dump(pytester, MS_TENSOR, "ms")
    result = pytester.runpytest(str(dump), "-rs")
    # MindSpore's own fp32 silu (the recorded output) is 10-15 ULP off: the default standard flags it
    # as a fast approximation; msprobe's MindSpore rule (cosine, max abs error) passes it
    result.assert_outcomes(passed=18, failed=2)
    result.stdout.fnmatch_lines(["*MintFunctional.silu.0.forward: error*",
                                 "*output.0: gross error:*scale units*ULP, at flat index*"])
    recs = api_records(pytester)
    msrule = pytester.runpytest(str(dump), "--msprobe-standard", "mindspore", "--msprobe-out", "ms_rule")
    assert msrule.parseoutcomes()["passed"] == 20
    assert {r["mode"] for r in recs.values()} == {"replay"}
    assert {r["framework"] for r in recs.values()} == {"mindspore"}
    assert {r["device"] for r in recs.values()} == {"recorded"}
    assert all(r["data"] == "real" for r in recs.values())
    linear = recs["MintFunctional.linear.0.backward"]
    assert linear["impl"].endswith("(bench torch.nn.functional.linear)")
    # MindSpore records the gradients in argument order: input, weight, bias
    assert [(o["name"].rsplit(".", 1)[-1], o["shape"]) for o in linear["outputs"]] == [
        ("0", [4, 16]), ("1", [32, 16]), ("2", [32])]
    assert all(o["bench_dtype"] == "torch.float64" for r in recs.values() for o in r["outputs"])  # raised bench
    out = pytester.path / "msprobe_results"
    (details,) = out.glob("accuracy_checking_details_*.csv")
    (result_csv,) = out.glob("accuracy_checking_result_*.csv")
    rows = read_csv(details)
    assert rows[0] == MS_DETAILS
    row = next(r for r in rows if r[0] == "Mint.matmul.0.forward.output.0")
    assert row[1:4] == ["Float64", "Float32", "(4, 5)"] and float(row[4]) > 0.999999 and float(row[5]) < 1e-5
    assert row[7] == "pass"
    assert read_csv(result_csv)[0] == ["API Name", "Forward Test Success", "Backward Test Success", "Message"]
    assert ["Mint.mean.0", "pass", "pass"] in read_csv(result_csv)
    result.stdout.fnmatch_lines(["*mode auto*"])


def test_mindspore_standard_is_msprobes_rule(pytester: pytest.Pytester) -> None:
    dump = copy_dump(pytester, MS_TENSOR, "ms")
    # plant an error of 0.01 in one recorded output: above the rule's max abs error of 0.001
    target = dump.parent / "dump_tensor_data" / "Mint.add.0.forward.output.0.npy"
    values = np.load(target)
    values[0, 0] += 0.01
    np.save(target, values)
    result = pytester.runpytest(str(dump), "--msprobe-standard", "mindspore")
    result.assert_outcomes(passed=19, failed=1)
    result.stdout.fnmatch_lines(["*Mint.add.0.forward: error*", "*is not < 0.001 (msprobe's MindSpore rule)*"])
    recs = api_records(pytester)
    assert "cosine 1 > 0.99" in recs["Mint.mean.0.forward"]["outputs"][0]["verdict_message"]
    metrics = recs["Mint.add.0.forward"]["outputs"][0]["ms_metrics"]
    assert metrics["max_abs_err"] == pytest.approx(0.01, rel=1e-4)


def test_mindspore_statistics_dump_without_mindspore_skips_naming_it(pytester: pytest.Pytester) -> None:
    if mindspore_installed():
        pytest.skip("MindSpore is installed here: the statistics dump re-runs (tests/test_mindspore.py)")
    dump = copy_dump(pytester, MS_STATISTICS, "ms")
    result = pytester.runpytest(str(dump), "-rs")
    result.assert_outcomes(skipped=20)
    result.stdout.fnmatch_lines(["*MindSpore is not installed or cannot be imported*pip install mindspore*"])


def test_statistics_dump_cannot_be_replayed(pytester: pytest.Pytester) -> None:
    dump = copy_dump(pytester, MS_STATISTICS, "ms")
    result = pytester.runpytest(str(dump), "--msprobe-mode", "replay", "-rs")
    result.assert_outcomes(skipped=20)
    result.stdout.fnmatch_lines(["*--msprobe-mode replay compares the outputs a tensor dump saved*"])
    result = pytester.runpytest(str(dump), "--msprobe-mode", "replay", "-o", "msprobe_data_mode=random")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*cannot use msprobe_data_mode random*"])


def test_renamed_mint_api_replays_through_the_table(pytester: pytest.Pytester) -> None:
    """`dense` (an older mint name) has no torch twin of that name: api_specs/mindspore.yaml maps it."""
    dump = copy_dump(pytester, MS_TENSOR, "ms")

    def rename(data: dict[str, Any]) -> None:
        for direction in ("forward", "backward"):
            data[f"MintFunctional.dense.0.{direction}"] = data.pop(f"MintFunctional.linear.0.{direction}")
        data["MintFunctional.no_such_op.0.forward"] = data["MintFunctional.relu.0.forward"]

    edit_dump(dump, rename)
    result = pytester.runpytest(str(dump), "-rs", "-k", "dense or no_such_op")
    result.assert_outcomes(passed=2, skipped=1)
    result.stdout.fnmatch_lines([  # grouped in the summary with what to do; -rs names the item
        "  MindSpore API without a torch counterpart (1: MintFunctional.no_such_op): map it in *",
        "SKIPPED [[]1] ms/dump.json:1: MintFunctional.no_such_op.0.forward: no torch counterpart "
        "(torch.nn.functional.no_such_op*"])
    assert api_records(pytester)["MintFunctional.dense.0.forward"]["impl"].endswith("torch.nn.functional.linear)")


def test_unsaved_tensors_are_never_invented(pytester: pytest.Pytester) -> None:
    dump = copy_dump(pytester, MS_TENSOR, "ms")

    def drop(data: dict[str, Any]) -> None:
        del data["Mint.matmul.0.forward"]["input_args"][1]["data_name"]
        del data["Mint.add.0.forward"]["output"][0]["data_name"]

    edit_dump(dump, drop)
    result = pytester.runpytest(str(dump), "-rs", "-k", "matmul or add")
    result.assert_outcomes(passed=1, skipped=3)  # both matmul items need the missing input
    recs = api_records(pytester)
    assert "Mint.matmul.0 input_args.1: the dump saved no tensor for it" in recs["Mint.matmul.0.forward"]["message"]
    add = recs["Mint.add.0.forward"]
    assert add["status"] == "SKIP" and add["outputs"][0]["status"] == "SKIP"
    assert "output.0: not saved in dump_tensor_data/" in add["message"]


def test_mindspore_gradient_count_that_does_not_fit_is_skipped(pytester: pytest.Pytester) -> None:
    dump = copy_dump(pytester, MS_TENSOR, "ms")

    def damage(data: dict[str, Any]) -> None:
        data["MintFunctional.linear.0.backward"]["output"].pop()
        grads = data["Mint.mul.0.backward"]["output"]
        grads[0] = {**grads[0], "shape": [32, 4], "data_name": "Mint.matmul.0.backward.output.1.npy"}
        grads[0]["shape"] = [32, 5]

    edit_dump(dump, damage)
    result = pytester.runpytest(str(dump), "-rs", "-k", "backward and (linear or mul)")  # mul.0, mul.1, matmul
    result.assert_outcomes(passed=2, skipped=2)
    recs = api_records(pytester)
    assert recs["MintFunctional.linear.0.backward"]["message"] == (
        "MintFunctional.linear.0: the dump recorded 2 gradients for 3 tensor arguments (3 floating-point): "
        "which is which cannot be told")
    assert recs["Mint.mul.0.backward"]["message"].startswith(
        "Mint.mul.0: recorded backward.output.0 has shape [32, 5], tensor argument 0 has [4, 32]")


# --------------------------------------------------------------------------- PyTorch dumps in replay mode


def test_pytorch_tensor_dump_replays_by_autograd_node(pytester: pytest.Pytester) -> None:
    """msprobe records a PyTorch API's gradients in its autograd node's order: linear is AddmmBackward0
    (bias, input, weight.t()), cross_entropy is NllLossBackward0 (gradient w.r.t. the log-softmax)."""
    dump = copy_dump(pytester, PT_TENSOR, "pt")
    result = pytester.runpytest(str(dump), "--msprobe-mode", "replay", "-rs")
    result.assert_outcomes(passed=18)
    recs = api_records(pytester)
    assert {r["mode"] for r in recs.values()} == {"replay"}
    assert "framework" not in recs["Functional.linear.0.forward"]  # PyTorch CSV layout
    linear = recs["Functional.linear.0.backward"]
    assert [(o["name"], o["shape"]) for o in linear["outputs"]] == [
        ("Functional.linear.0.backward.output.0", [32]), ("Functional.linear.0.backward.output.2", [16, 32])]
    assert "backward.output.2: the gradient of tensor argument 1, transposed (input 2 of AddmmBackward0)" \
        in linear["notes"]
    notes = recs["Functional.cross_entropy.0.backward"]["notes"]
    assert any("intermediate result (LogSoftmaxBackward0)" in n for n in notes)
    (details,) = (pytester.path / "msprobe_results").glob("accuracy_checking_details_*.csv")
    assert len(read_csv(details)[0]) == 23


def test_pytorch_replay_finds_a_planted_gradient_error(pytester: pytest.Pytester) -> None:
    dump = copy_dump(pytester, PT_TENSOR, "pt")
    target = dump.parent / "dump_tensor_data" / "Functional.linear.0.backward.output.2.pt"
    grad = torch.load(target)
    grad[3, 7] += 1.0
    torch.save(grad, target)
    result = pytester.runpytest(str(dump), "--msprobe-mode", "replay", "-k", "linear")
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines(["*Functional.linear.0.backward: error*", "*output.2 *(16, 32)*error*"])


def test_replayed_forward_of_an_exact_op_is_judged_for_exactness(pytester: pytest.Pytester) -> None:
    """A replayed add_'s output is a forward output, not a gradient: 8 elements one ULP toward zero (each
    within any elementwise limit) fail strict's exactness check. (The recorded SGD update has alpha = -0.01, a
    multiply-add a kernel may fuse; the call is made a plain add, its output the exact sum.)"""
    dump = copy_dump(pytester, PT_TENSOR, "pt")
    edit_dump(dump, lambda data: data["Tensor.add_.0.forward"]["input_kwargs"].clear())
    saved = dump.parent / "dump_tensor_data"
    target = saved / "Tensor.add_.0.forward.output.0.pt"
    out = torch.load(saved / "Tensor.add_.0.forward.input.0.pt") + torch.load(saved / "Tensor.add_.0.forward.input.1.pt")
    flat = out.view(-1)
    for i in range(0, 512, 64):
        flat[i] = torch.nextafter(flat[i], torch.zeros(()))
    torch.save(out, target)
    result = pytester.runpytest(str(dump), "--msprobe-mode", "replay", "-k", "add_ and 0 and forward")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*not correctly rounded: 8 of 512 elements*"])


def test_a_replayed_multiply_add_is_judged_against_its_terms(pytester: pytest.Pytester) -> None:
    """add_ with alpha (an SGD update) may be one fused multiply-add: replay, as a re-run, runs it on |inputs| and
    judges it relative to those terms; an update rounded toward zero in 1 of 4 elements still fails."""
    dump = copy_dump(pytester, PT_TENSOR, "pt")
    result = pytester.runpytest(str(dump), "--msprobe-mode", "replay", "-k", "add_ and 0 and forward")
    result.assert_outcomes(passed=1)
    rec = api_records(pytester)["Tensor.add_.0.forward"]
    assert "magnitude_s" in rec["timings"]
    target = dump.parent / "dump_tensor_data" / "Tensor.add_.0.forward.output.0.pt"
    out = torch.load(target)
    flat = out.view(-1)
    flat[::4] = torch.nextafter(flat[::4], torch.zeros(()))
    torch.save(out, target)
    result = pytester.runpytest(str(dump), "--msprobe-mode", "replay", "-k", "add_ and 0 and forward")
    result.assert_outcomes(failed=1)


def test_pytorch_gradient_layout_mismatch_is_skipped_not_compared(pytester: pytest.Pytester) -> None:
    dump = copy_dump(pytester, PT_TENSOR, "pt")
    # argument order instead of the autograd node's order: every shape disagrees with AddmmBackward0's slots
    edit_dump(dump, lambda data: data["Functional.linear.1.backward"]["output"].reverse())
    edit_dump(dump, lambda data: data["Functional.gelu.0.backward"]["output"].append(
        data["Functional.gelu.0.backward"]["output"][0]))
    result = pytester.runpytest(str(dump), "--msprobe-mode", "replay", "-rs", "-k", "backward and (linear or gelu)")
    result.assert_outcomes(passed=1, skipped=2)
    recs = api_records(pytester)
    assert recs["Functional.linear.1.backward"]["message"].startswith(
        "Functional.linear.1: recorded backward.output.0 has shape [32, 5], input 0 of AddmmBackward0 has [5] here")
    assert recs["Functional.gelu.0.backward"]["message"].startswith(
        "Functional.gelu.0: the dump recorded 2 gradients, GeluBackward0 has 1 inputs here")
    assert all(r["outputs"] == [] for r in recs.values() if r["status"] == "SKIP")  # nothing compared


def test_replay_with_pytorch_and_mindspore_dumps_writes_both_layouts(pytester: pytest.Pytester) -> None:
    pt = copy_dump(pytester, PT_TENSOR, "pt")
    ms = copy_dump(pytester, MS_TENSOR, "ms")
    result = pytester.runpytest(str(pt), str(ms), "--msprobe-mode", "replay", "-k", "forward")
    result.assert_outcomes(passed=21, failed=1)  # MindSpore's fp32 silu, see above
    out = pytester.path / "msprobe_results"
    (pt_details,) = out.glob("accuracy_checking_details_*_pt.csv")  # one set per dump, each in its layout
    (ms_details,) = out.glob("accuracy_checking_details_*_ms.csv")
    (ms_result,) = out.glob("accuracy_checking_result_*_ms.csv")
    assert len(read_csv(pt_details)[0]) == 23 and read_csv(ms_details)[0] == MS_DETAILS
    assert {row[0].split(".")[0] for row in read_csv(pt_details)[1:]} == {"Functional", "Tensor"}
    assert [row[0] for row in read_csv(ms_result)[1:]][:2] == ["MintFunctional.linear.0", "MintFunctional.relu.0"]


def test_rerun_command_keeps_the_mode(pytester: pytest.Pytester) -> None:
    dump = copy_dump(pytester, PT_TENSOR, "pt")
    target = dump.parent / "dump_tensor_data" / "Functional.gelu.0.forward.output.0.pt"
    torch.save(torch.load(target) * 2, target)
    result = pytester.runpytest(str(dump), "--msprobe-mode", "replay", "-k", "gelu and forward")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*rerun: pytest *Functional.gelu.0.forward*--msprobe-mode replay*"])


# --------------------------------------------------------------------------- units


def test_mindspore_dtype_names_parse_everywhere() -> None:
    assert parse_dtype("Float32") is torch.float32
    assert parse_dtype("BFloat16") is torch.bfloat16
    assert parse_dtype("mindspore.float16") is torch.float16
    assert parse_dtype("Bool") is torch.bool and parse_dtype("mindspore.bool_") is torch.bool
    assert parse_dtype("torch.int64") is torch.int64
    with pytest.raises(InputError, match="MindSpore dtype 'Int4' has no torch equivalent"):
        parse_dtype("Int4")
    with pytest.raises(InputError, match="not a torch dtype string .nor a MindSpore one"):
        parse_dtype("Float99")
    with pytest.raises(InputError, match="not a torch dtype"):
        parse_dtype("float32")  # neither torch's nor MindSpore's spelling
    assert ms_results.ms_dtype("torch.bfloat16") == "BFloat16"


def test_mint_to_torch_table() -> None:
    specs = load_specs()
    dense = msmap.torch_twin("MintFunctional", "dense", specs)
    assert (dense.label, dense.api) == ("torch.nn.functional.linear", "linear")
    assert msmap.torch_twin("Mint", "add_ex", specs).label == "torch.add"
    assert msmap.torch_twin("Mint", "matmul", specs).label == "torch.matmul"  # name for name by default
    # MindSpore's third positional parameter of bce_with_logits is `reduction` (torch's is `size_average`)
    bce = msmap.torch_twin("MintFunctional", "bce_with_logits", specs)
    x, y = torch.tensor([0.5, -1.0], dtype=torch.float64), torch.tensor([1.0, 0.0], dtype=torch.float64)
    assert bce.fn(x, y, None, "sum") == torch.nn.functional.binary_cross_entropy_with_logits(x, y, reduction="sum")
    softmax = msmap.torch_twin("MintFunctional", "softmax", specs)  # third positional: dtype, not _stacklevel
    assert softmax.fn(x, 0, torch.float32).dtype == torch.float32
    assert msmap.torch_twin("Tensor", "all", specs).fn(torch.ones(2, 2), axis=1, keep_dims=True).shape == (2, 1)
    with pytest.raises(NotCheckable, match=r"Mint.frobnicate: no torch counterpart \(torch.frobnicate"):
        msmap.torch_twin("Mint", "frobnicate", specs)
    with pytest.raises(NotCheckable, match="Tensor.asnumpy: this MindSpore Tensor method is not in the"):
        msmap.torch_twin("Tensor", "asnumpy", specs)
    with pytest.raises(NotCheckable, match="Tensor.numpy: returns a host copy"):
        msmap.torch_twin("Tensor", "numpy", specs)
    with pytest.raises(NotCheckable, match="MindSpore API type 'Functional' has no torch bench"):
        msmap.torch_twin("Functional", "matmul", specs)


def test_mindspore_metrics_follow_msprobes_formulas() -> None:
    b = np.array([1.0, 2.0, 0.0, -4.0])
    d = np.array([1.0, 2.0005, 0.0, -4.0])
    m = ms_results.ms_metrics(b, d)
    assert m["cosine"] == pytest.approx((1e-8 + b @ d) / (1e-8 + np.linalg.norm(b) * np.linalg.norm(d)))
    assert m["max_abs_err"] == pytest.approx(5e-4) and m["max_rel_err"] == pytest.approx(2.5e-4)
    rule = load_specs()["thresholds"]["mindspore"]
    assert ms_results.ms_status(m, rule)[0] == "pass"
    assert ms_results.ms_status(ms_results.ms_metrics(b, b + 0.002), rule)[0] == "error"
    assert ms_results.ms_status(ms_results.ms_metrics(b, b * np.nan), rule)[0] == "error"


def test_mindspore_standard_compares_scalars_exactly() -> None:
    """msprobe's checker marks every scalar output `error`; here equal scalars pass."""
    specs = load_specs()
    row = OutputComparison("Mint.item.0.forward.output.0", "pass", "", "<class 'float'>", "<class 'float'>", None,
                           {})
    judge.decide(row, "mindspore", api_name="item", specs=specs, evidence=judge.Evidence())
    assert row.verdict == "pass" and row.verdict_message == "compared exactly"
    row = OutputComparison("x", "pass", "", "torch.float64", "torch.float32", [3], {})
    judge.decide(row, "mindspore", api_name="add", specs=specs,
                 evidence=judge.Evidence(arrays=judge.StrictArrays(np.ones(3), np.ones(3) + 0.01)))
    assert row.verdict == "error" and "max abs error 0.01 is not < 0.001" in row.verdict_message


def test_user_specs_extend_the_mindspore_table(tmp_path: Path) -> None:
    from pytest_msprobe.specs.loader import SpecError

    user = tmp_path / "specs.yaml"
    user.write_text("mindspore:\n  apis:\n    Mint.my_add: {torch: torch.add}\n    Mint.matmul: {skip: vendor bug 7}\n")
    specs = load_specs(user_file=str(user))
    assert msmap.torch_twin("Mint", "my_add", specs).label == "torch.add"
    assert msmap.torch_twin("MintFunctional", "dense", specs).label == "torch.nn.functional.linear"  # shipped kept
    with pytest.raises(NotCheckable, match="Mint.matmul: vendor bug 7"):
        msmap.torch_twin("Mint", "matmul", specs)
    bad = tmp_path / "bad.yaml"  # (load_specs caches per file)
    bad.write_text("mindspore:\n  apis:\n    Mint.my_add: {torch_name: torch.add}\n")
    with pytest.raises(SpecError, match=r"mindspore.apis.Mint.my_add: unknown key 'torch_name'"):
        load_specs(user_file=str(bad))
