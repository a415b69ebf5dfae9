"""Execution rules: bench upcast, autocast hint, HF32, indexing special cases, out=/in-place, devices."""
from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
import torch

from pytest_msprobe.check import check_entry
from pytest_msprobe.dump.reader import load_dump
from pytest_msprobe.runs.backends import select as select_device
from pytest_msprobe.runs.execution import NotCheckable, Target, _getitem, make_side, pair_cotangents
from pytest_msprobe.runs.precision import HF32_BITS, PrecisionPolicy, plan_precision, round_mantissa
from pytest_msprobe.settings import CheckOptions
from pytest_msprobe.specs.loader import load_specs
from tests.helpers import tensor

SPECS = load_specs()
f16, bf16, f32, f64 = torch.float16, torch.bfloat16, torch.float32, torch.float64


@pytest.mark.parametrize(
    "dtypes, output, expected_raise, expected_autocast",
    [
        ([f16, f16], f16, f32, None),
        ([bf16], bf16, f32, None),
        ([f32, f32], f32, f64, None),
        ([f64], f64, None, None),   # nothing raisable: fp64 stays fp64
        ([f16, f32], f16, f32, f16),  # mixed -> everything fp32, device under autocast(fp16)
        ([f32], bf16, f64, bf16),     # AMP region: fp32 inputs, bf16 output recorded
        ([], f32, None, None),        # msprobe's fp32 autocast for int-only inputs is a no-op: dropped
    ],
)
def test_precision_plan(dtypes, output, expected_raise, expected_autocast) -> None:
    args = [torch.zeros(2, dtype=d) for d in dtypes] + [torch.zeros(2, dtype=torch.int64)]
    plan = plan_precision("add", args, {}, output, SPECS)
    assert plan.raise_to == expected_raise and plan.autocast == expected_autocast


def test_type_conversion_apis_are_not_raised_and_convs_use_hf32() -> None:
    assert plan_precision("type_as", [torch.zeros(1, dtype=f16)], {}, f16, SPECS).raise_to is None
    assert plan_precision("conv2d", [torch.zeros(1)], {}, f32, SPECS).hf32


def test_bench_precision_per_api_and_the_fp64_policy() -> None:
    attention = [torch.zeros(2, dtype=bf16)] * 3
    FP64, STRICT = PrecisionPolicy("fp64"), PrecisionPolicy("auto", "strict")
    assert plan_precision("npu_fusion_attention", attention, {}, bf16, SPECS).raise_to == f32
    assert plan_precision("npu_fusion_attention", [torch.zeros(2, dtype=f16)], {}, f16, SPECS).raise_to == f64
    assert plan_precision("npu_fusion_attention", attention, {}, bf16, SPECS, FP64).raise_to == f64
    assert plan_precision("npu_fusion_attention", attention, {}, bf16, SPECS, STRICT).raise_to == f32
    assert plan_precision("add", [torch.zeros(2, dtype=bf16)], {}, bf16, SPECS, STRICT).raise_to == f32
    assert plan_precision("add", [torch.zeros(2, dtype=bf16)], {}, bf16, SPECS, FP64).raise_to == f64
    assert plan_precision("add", [torch.zeros(2, dtype=bf16), torch.zeros(2)], {}, bf16, SPECS, FP64).raise_to == f64
    assert plan_precision("add", [torch.zeros(2, dtype=bf16)], {}, bf16, SPECS).raise_to == f32


def test_hf32_rounds_half_up_at_mantissa_bit_11() -> None:
    x = torch.tensor([1 + 2**-12, 1 + 2**-13, 1.0, -(1 + 2**-12)], dtype=f32)
    assert round_mantissa(x, HF32_BITS).tolist() == [1 + 2**-11, 1.0, 1.0, -(1 + 2**-11)]


def test_getitem_special_cases_match_plain_indexing() -> None:
    x = torch.arange(24.0).reshape(4, 6)
    mask = x > 10
    assert torch.equal(_getitem(x, mask), x[mask])
    assert torch.equal(_getitem(x, mask.to(torch.uint8)), x[mask])
    rows = torch.tensor([True, False, True, False])
    assert torch.equal(_getitem(x, rows), x[rows])
    idx = torch.tensor([[0, 2], [3, 1]])
    assert torch.equal(_getitem(x, idx), x[idx])
    assert torch.equal(_getitem(x, torch.tensor(2)), x[2])
    assert torch.equal(_getitem(x, (slice(0, 2), Ellipsis)), x[0:2, ...])


def test_cotangent_pairing() -> None:
    a = torch.zeros(2, requires_grad=True) * 1
    idx = torch.zeros(2, dtype=torch.int64)
    g = torch.ones(2)
    assert pair_cotangents([a], [g], None) == [(0, g)]
    assert pair_cotangents([a, idx], [g, None], 0) == [(0, g)]
    assert pair_cotangents([a, idx], [g], 0) == [(0, g)]
    with pytest.raises(NotCheckable, match="grad_index"):
        pair_cotangents([a, a], [g], None)


def test_device_selection_is_clear() -> None:
    assert select_device("cpu").name == "cpu"
    assert select_device("auto").kind in ("npu", "cuda", "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(NotCheckable, match="cuda"):
            select_device("cuda")


def test_plugin_import_and_collection_do_not_import_torch_or_yaml(tmp_path) -> None:
    """The plugin loads in every pytest run of the environment: torch comes with the first item, yaml with the
    first item's api_specs or with --msprobe-baseline (15-20 ms per process otherwise)."""
    dump = tmp_path / "dump.json"
    dump.write_text(json.dumps({"data": {"Functional.relu.0.forward": {"input_args": [tensor()]}}}))
    code = ("import sys, pytest; import pytest_msprobe.plugin; assert 'torch' not in sys.modules; "
            "assert 'yaml' not in sys.modules, 'the plugin imported yaml'; "
            f"pytest.main(['--collect-only', '-q', '-p', 'no:cacheprovider', {str(dump)!r}]); "
            "assert 'torch' not in sys.modules, 'collection imported torch'; "
            "assert 'yaml' not in sys.modules, 'collection imported yaml'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path, capture_output=True)


def run(write_dump, data: dict[str, Any], name: str, **options: Any) -> dict[str, Any]:
    dump = load_dump(write_dump(data))
    return check_entry(dump, name, CheckOptions(device="cpu", **options), SPECS).to_dict()


def test_out_kwarg_and_inplace_run_on_clones(write_dump) -> None:
    data = {
        "Torch.add.0.forward": {"input_args": [tensor(), tensor()],
                                "input_kwargs": {"out": tensor()}, "output": [tensor()]},
        "Torch.add.0.backward": {"input": [tensor()], "output": [tensor()]},
        "Tensor.mul_.0.forward": {"input_args": [tensor(requires_grad=True), tensor()], "input_kwargs": {},
                                  "output": [tensor()]},
        "Tensor.mul_.0.backward": {"input": [tensor()], "output": [tensor()]},
    }
    assert run(write_dump, data, "Torch.add.0.forward")["status"] == "pass"
    bwd = run(write_dump, data, "Torch.add.0.backward")
    assert bwd["status"] == "SKIP" and "out=" in bwd["message"]
    rec = run(write_dump, data, "Tensor.mul_.0.backward")
    assert rec["status"] == "pass" and [o["name"] for o in rec["outputs"]] == ["Tensor.mul_.0.backward.output.0"]


def test_device_and_dtype_kwargs(write_dump) -> None:
    data = {"Torch.ones.0.forward": {
        "input_args": [{"type": "int", "value": 4}, {"type": "int", "value": 16}],
        "input_kwargs": {"dtype": {"type": "torch.dtype", "value": "torch.float16"},
                         "device": {"type": "torch.device", "value": "npu:0"}},
        "output": [tensor("torch.float16", [4, 16])]}}
    rec = run(write_dump, data, "Torch.ones.0.forward")
    assert rec["status"] == "pass" and rec["outputs"][0]["device_dtype"] == "torch.float16"


def test_amp_region_runs_device_under_autocast(write_dump) -> None:
    data = {"Functional.linear.0.forward": {
        "input_args": [tensor(shape=[8, 16]), tensor(shape=[4, 16])], "input_kwargs": {},
        "output": [tensor("torch.bfloat16", [8, 4])]}}
    rec = run(write_dump, data, "Functional.linear.0.forward")
    out = rec["outputs"][0]
    assert out["device_dtype"] == "torch.bfloat16" and out["bench_dtype"] == "torch.float64"


def test_multi_output_backward_uses_grad_index(write_dump) -> None:
    data = {"Torch.topk.0.forward": {"input_args": [tensor(shape=[4, 32], requires_grad=True),
                                                    {"type": "int", "value": 3}], "input_kwargs": {},
                                     "output": {"values": tensor(shape=[4, 3]),
                                                "indices": tensor("torch.int64", [4, 3], mx=31, mn=0)}},
            "Torch.topk.0.backward": {"input": [tensor(shape=[4, 3]), None], "output": [tensor(shape=[4, 32])]}}
    fwd = run(write_dump, data, "Torch.topk.0.forward")
    assert [o["status"] for o in fwd["outputs"]] == ["pass", "pass"]
    bwd = run(write_dump, data, "Torch.topk.0.backward")
    assert bwd["status"] == "pass" and bwd["outputs"][0]["shape"] == [4, 32]


def test_cross_entropy_targets_are_valid_classes(write_dump) -> None:
    data = {"Functional.cross_entropy.0.forward": {
        "input_args": [tensor(shape=[16, 5]), tensor("torch.int32", [16], mx=4, mn=-100)],
        "input_kwargs": {}, "output": [tensor(shape=[])]}}
    assert run(write_dump, data, "Functional.cross_entropy.0.forward")["status"] == "pass"


def test_seeded_random_api_inside_call_is_reproducible(write_dump) -> None:
    data = {"Functional.dropout.0.forward": {"input_args": [tensor(shape=[64, 64], mx=2.0, mn=1.0),
                                                            {"type": "float", "value": 0.5}], "input_kwargs": {},
                                             "output": [tensor(shape=[64, 64])]}}
    first = run(write_dump, data, "Functional.dropout.0.forward")
    assert first == run(write_dump, data, "Functional.dropout.0.forward") | {"timings": first["timings"]}
    assert first["status"] == "pass" and "fraction of zeros" in first["notes"][-1]


LOW_ACCUMULATION = """
import torch
def linear(x, w, b=None):  # accumulates in the output dtype, 16 products at a time
    total = None
    for i in range(0, x.shape[-1], 16):
        part = (x[..., i:i + 16].float() @ w[:, i:i + 16].float().T).to(x.dtype)
        total = part if total is None else (total.float() + part.float()).to(x.dtype)
    return total if b is None else (total.float() + b.float()).to(x.dtype)
KERNELS = {"Functional.linear": linear}
"""


@pytest.mark.parametrize("dtype", ["torch.bfloat16", "torch.float16"])
def test_strict_third_runs_by_kind_of_op(write_dump, tmp_path, dtype) -> None:
    """A contraction learns from its magnitude run (the API on |inputs|), an elementwise API from torch's
    own kernel in the device dtype; a linear accumulating in 16 bits fails, torch's own passes."""
    data = {"Functional.linear.0.forward": {
        "input_args": [tensor(dtype, [16, 2048], requires_grad=True), tensor(dtype, [32, 2048], requires_grad=True)],
        "input_kwargs": {}, "output": [tensor(dtype, [16, 32])]},
        "Functional.linear.0.backward": {"input": [tensor(dtype, [16, 32])], "output": []},
        "Functional.gelu.0.forward": {"input_args": [tensor(dtype, [64, 64])], "input_kwargs": {},
                                      "output": [tensor(dtype, [64, 64])]}}
    (tmp_path / "low.py").write_text(LOW_ACCUMULATION)
    for direction in ("forward", "backward"):
        plain = run(write_dump, data, f"Functional.linear.0.{direction}", standard="strict")
        assert plain["status"] == "pass" and plain["reference"].startswith("magnitude")
        assert "reference_s" in plain["timings"]
    low = run(write_dump, data, "Functional.linear.0.forward", standard="strict",
              kernels=f"{tmp_path / 'low.py'}:KERNELS")
    assert low["status"] == "error" and "gross error" in low["outputs"][0]["verdict_message"]
    gelu = run(write_dump, data, "Functional.gelu.0.forward", standard="strict")
    assert gelu["status"] == "pass" and gelu["reference"].startswith("torch's kernel")
    assert gelu["outputs"][0]["reference"]["ref_max_err"] == gelu["outputs"][0]["reference"]["max_err"]


def test_magnitude_run_is_the_api_on_absolute_values() -> None:
    from types import SimpleNamespace

    from pytest_msprobe.runs.execution import run_side
    from pytest_msprobe.runs.third_run import RunInputs, third_run

    x, w, b = torch.randn(4, 8), torch.randn(3, 8), torch.randn(3)
    name = SimpleNamespace(api_type="Torch", api_name="addmm")
    args, kwargs = [b, x, w.T], {"beta": -0.5, "alpha": -2.0}
    plan = plan_precision("addmm", args, kwargs, f32, SPECS)
    run3 = third_run(CheckOptions(standard="strict"), SimpleNamespace(bench_fn=torch.addmm), name, SPECS, plan,
                     RunInputs(args, kwargs, set(), False))
    assert run3 is not None and run3.role == "magnitude" and run3.side is not None
    out = run_side(run3.fn, run3.side, autocast=None, device_type="cpu", grad=False)
    assert torch.allclose(out, 0.5 * b.abs() + 2.0 * x.abs() @ w.T.abs())


def test_hf32_rounded_conv_inputs_keep_their_gradients(write_dump) -> None:
    """fp32 conv2d inputs are rounded to HF32 (Ascend's cube precision); their gradients are still checked."""
    data = {"Functional.conv2d.0.forward": {
        "input_args": [tensor("torch.float32", [2, 3, 8, 8], requires_grad=True),
                       tensor("torch.float32", [4, 3, 3, 3], requires_grad=True)],
        "input_kwargs": {}, "output": [tensor("torch.float32", [2, 4, 6, 6])]},
        "Functional.conv2d.0.backward": {"input": [tensor("torch.float32", [2, 4, 6, 6])], "output": []}}
    record = run(write_dump, data, "Functional.conv2d.0.backward")
    assert record["status"] == "pass", record["message"]
    assert [o["name"].rsplit(".", 1)[-1] for o in record["outputs"]] == ["0", "1"]


def test_strict_judges_what_layer1_cannot_compare(write_dump) -> None:
    """int16 outputs are compared exactly, empty outputs of the recorded shape pass, complex ones skip."""
    data = {"Tensor.short.0.forward": {"input_args": [tensor("torch.float32", [4, 8], mx=100.0, mn=-100.0)],
                                       "input_kwargs": {}, "output": [tensor("torch.int16", [4, 8])]},
            "Torch.polar.0.forward": {"input_args": [tensor("torch.float32", [4], mx=2.0, mn=0.5), tensor()],
                                      "input_kwargs": {}, "output": [tensor("torch.complex64", [4])]}}
    data["Torch.polar.0.forward"]["input_args"][1]["shape"] = [4]
    short = run(write_dump, data, "Tensor.short.0.forward", standard="strict")
    assert short["status"] == "pass" and short["outputs"][0]["verdict_message"] == "compared exactly"
    assert short["outputs"][0]["status"] == "error"  # msprobe's Layer 1: int16 "cannot compare"
    polar = run(write_dump, data, "Torch.polar.0.forward", standard="strict")
    assert polar["status"] == "SKIP" and "complex output" in polar["message"]


@pytest.mark.parametrize("dtype", ["torch.int32", "torch.int64", "torch.int8", "torch.uint8"])
def test_integer_histc_input_becomes_float(write_dump, dtype: str) -> None:
    """api_specs preprocess.int_input_to_float: CPU histc has no integer kernel (int32 and int64 alike)."""
    data = {"Torch.histc.0.forward": {
        "input_args": [tensor(dtype, [64], mx=9, mn=0)],
        "input_kwargs": {"bins": {"type": "int", "value": 10}, "min": {"type": "int", "value": 0},
                         "max": {"type": "int", "value": 9}},
        "output": [tensor("torch.float32", [10])]}}
    record = run(write_dump, data, "Torch.histc.0.forward")
    assert record["status"] == "pass", record["message"]
    (out,) = record["outputs"]
    assert out["device_dtype"] == "torch.float32" and out["shape"] == [10]
    assert out["metrics"]["max_abs_err"] == 0.0
    with pytest.raises((NotImplementedError, RuntimeError)):  # what CPU histc does without the conversion
        torch.histc(torch.zeros(4, dtype=getattr(torch, dtype.split(".")[1])), bins=4)


def test_a_side_takes_its_own_temporaries_without_a_copy_and_copies_everything_else() -> None:
    """make_side's `owned`: a temporary made for the side alone (the magnitude run's |inputs|) is taken as
    it is when no cast is needed; a recorded input is always copied, so an in-place API cannot reach it."""
    temp, recorded, narrow = torch.rand(64), torch.rand(64), torch.rand(64, dtype=torch.bfloat16)
    side = make_side([temp, recorded, narrow], {},
                     target=Target("cpu", lambda t: torch.float32, True, owned={id(temp), id(narrow)}),
                     requires_grad=set(), want_grad=False)
    taken, copied, cast = side.args
    assert taken.untyped_storage().data_ptr() == temp.untyped_storage().data_ptr()
    assert copied.untyped_storage().data_ptr() != recorded.untyped_storage().data_ptr()
    assert torch.equal(copied, recorded) and cast.dtype == torch.float32 and torch.equal(cast, narrow.float())


def test_a_view_that_reinterprets_bits_keeps_the_device_dtype_on_the_bench() -> None:
    bf16 = torch.bfloat16
    x = torch.zeros(4, 8, dtype=bf16)
    assert plan_precision("view", [x, torch.float32], {}, torch.float32, SPECS).raise_to is None
    assert plan_precision("view", [x], {"dtype": torch.int16}, torch.int16, SPECS).raise_to is None
    assert plan_precision("view", [x, [8, 4]], {}, bf16, SPECS).raise_to == torch.float32  # a reshape is raised


def test_a_list_index_holding_slices_or_tensors_reads_as_the_tuple_it_was() -> None:
    import warnings

    x = torch.arange(24.0).view(4, 6)
    rows = torch.tensor([0, 2])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's deprecation warning for a list read as a tuple
        assert torch.equal(_getitem(x, [slice(None), rows]), x[:, rows])
        assert torch.equal(_getitem(x, [rows, rows]), x[rows, rows])
    assert torch.equal(_getitem(x, [0, 2]), x[[0, 2]])  # a list of ints stays an index list
