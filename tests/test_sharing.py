"""Inputs the sides take without a copy (runs/execution.Shared, make_side) and which inputs a call may write
(runs/sharing.written_inputs); the safety net (torch's version counters) and, end to end, in-place calls judged
on the inputs as they were drawn on every side."""
from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from pytest_msprobe.check import check_entry
from pytest_msprobe.dump.reader import load_dump
from pytest_msprobe.records.record import Record
from pytest_msprobe.runs.execution import Shared, Target, make_side
from pytest_msprobe.runs.sharing import written_inputs
from pytest_msprobe.settings import CheckOptions
from pytest_msprobe.specs.loader import load_specs
from tests.helpers import make_dump, records, tensor

SPECS = load_specs()
bf16 = torch.bfloat16


def _ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _side(args: list[Any], shared: Shared | None, dtype: torch.dtype | None = None, *, grad: set[int] | None = None,
          kwargs: dict[str, Any] | None = None) -> Any:
    return make_side(args, kwargs or {}, target=Target("cpu", lambda t: dtype or t.dtype, dtype is not None,
                                                       shared=shared),
                     requires_grad=grad or set(), want_grad=grad is not None)


def test_sides_share_an_input_the_call_cannot_write_and_a_write_moves_its_version() -> None:
    x, w = torch.rand(8, 4, dtype=bf16), torch.rand(4, 4, dtype=bf16)
    shared = Shared(set())
    device, bench, torch_run = _side([x, w], shared), _side([x, w], shared, torch.float32), _side([x, w], shared)
    assert _ptr(device.args[0]) == _ptr(x) == _ptr(torch_run.args[0]) and _ptr(device.args[1]) == _ptr(w)
    assert bench.args[0].dtype == torch.float32 and torch.equal(bench.args[0], x.float())  # a cast is a copy
    assert shared.changed() == []
    torch_run.args[1].mul_(2)  # a write through a side's alias: the counter is shared with the drawn tensor
    assert [id(t) for t in shared.changed()] == [id(w)]


def test_a_written_input_goes_to_one_side_alone_and_unknown_writes_copy_everything() -> None:
    x, y = torch.rand(16, dtype=bf16), torch.rand(16, dtype=bf16)
    drawn = x.clone()
    shared = Shared({id(x)})
    device, torch_run = _side([x, y], shared), _side([x, y], shared)
    assert _ptr(device.args[0]) == _ptr(x) and _ptr(torch_run.args[0]) != _ptr(x)
    assert _ptr(device.args[1]) == _ptr(y) == _ptr(torch_run.args[1])
    device.args[0].add_(y)  # the API writes the input it was given
    assert torch.equal(torch_run.args[0], drawn) and shared.changed() == []  # a given input is not watched
    for kept in (Shared({id(x)}, give=False), Shared(None)):  # inputs read after the runs; or writes unknown
        sides = [_side([x, y], kept), _side([x, y], kept)]
        assert all(_ptr(s.args[0]) != _ptr(x) for s in sides)
        assert all(_ptr(s.args[1]) != _ptr(y) for s in sides) == (kept.written is None)


def test_gradient_leaves_share_the_drawn_storage_but_not_autograd() -> None:
    x = torch.rand(4, 4, dtype=bf16)
    drawn = x.clone()
    shared = Shared({id(x)})  # written: the API gets a clone either way
    device, torch_run = _side([x], shared, grad={id(x)}), _side([x], shared, grad={id(x)})
    (_, leaf_d), (_, leaf_r) = device.grad_leaves[0], torch_run.grad_leaves[0]
    assert _ptr(leaf_d) == _ptr(leaf_r) == _ptr(x) and leaf_d is not leaf_r
    assert _ptr(device.args[0]) != _ptr(x) and device.args[0].grad_fn is not None
    device.args[0].mul_(3).sum().backward()  # in place on the clone, under autograd
    (torch_run.args[0] * 2).sum().backward()
    assert torch.equal(leaf_d.grad, torch.full_like(x, 3)) and torch.equal(leaf_r.grad, torch.full_like(x, 2))
    assert torch.equal(x, drawn) and x.grad is None and shared.changed() == []


def _ids(written: set[int] | None, tensors: list[torch.Tensor]) -> list[int] | None:
    return None if written is None else [i for i, t in enumerate(tensors) if id(t) in written]


@pytest.mark.parametrize("api_type, api, args, kwargs, expected", [
    ("Tensor", "add", "ab", {}, []),
    ("Tensor", "add_", "ab", {}, [0]),  # aten's add_: Tensor(a!) self
    ("Tensor", "addcdiv_", "abc", {"value": 0.5}, [0]),
    ("Tensor", "__iadd__", "ab", {}, [0]),
    ("Tensor", "__setitem__", "a", {}, [0]),
    ("Torch", "add", "ab", {"out": "c"}, [2]),
    ("Torch", "_foreach_add_", ["ab", "c"], {}, [0, 1]),  # the first list, whole
    ("Torch", "_fused_adam_", ["a", "b", "c"], {}, [0, 1, 2]),  # params, grads and moments
    ("Functional", "relu", "a", {}, []),
    ("Functional", "relu", "a", {"inplace": True}, [0]),
    ("Functional", "relu", ["a", True], {}, [0]),  # inplace given by position
    ("Functional", "dropout", ["a", 0.1, True, True], {}, [0]),
    ("Functional", "batch_norm", "abc", {"training": True}, None),  # api_specs changes_inputs: always
    ("Functional", "embedding", "ab", {}, []),
    ("Functional", "embedding", "ab", {"max_norm": 1.0}, None),  # renormalises its weight in place
    ("Tensor", "not_an_aten_op_", "a", {}, None),  # in place, but where cannot be told
    ("NPU", "npu_rms_norm", "ab", {}, None),
])
def test_written_inputs_from_the_call(api_type: str, api: str, args: Any, kwargs: dict[str, Any],
                                      expected: list[int] | None) -> None:
    pool = {k: torch.rand(4) for k in "abc"}

    def make(v: Any) -> Any:
        if isinstance(v, str):
            return pool[v] if len(v) == 1 else [pool[c] for c in v]
        return v

    real_args = [make(a) for a in args] if isinstance(args, list) else [pool[c] for c in args]
    real_kwargs = {k: make(v) for k, v in kwargs.items()}
    fn = getattr(torch.nn.functional, api, None) if api_type == "Functional" else None
    found = written_inputs(api_type, api, fn, real_args, real_kwargs, SPECS)
    assert _ids(found, [pool[k] for k in "abc"]) == expected


def _judged(record: Record) -> Any:
    return record.status, [o.to_dict() for o in record.outputs]


def test_an_unforeseen_write_is_caught_and_the_item_checked_again(write_dump, monkeypatch) -> None:
    """The rules say Tensor.add_ writes nothing: the device writes `self`, which the torch run shares; the version
    counter moves, and the item is judged again with copies, as if the rules had known."""
    data = {"Tensor.add_.0.forward": {"input_args": [tensor("torch.bfloat16", [64, 64]),
                                                     tensor("torch.bfloat16", [64, 64])],
                                      "input_kwargs": {}, "output": [tensor("torch.bfloat16", [64, 64])]}}
    dump, options = load_dump(write_dump(data)), CheckOptions(device="cpu")
    truth = check_entry(dump, "Tensor.add_.0.forward", options, SPECS)
    monkeypatch.setattr("pytest_msprobe.check.placement.written_inputs", lambda *a: set())
    again = check_entry(dump, "Tensor.add_.0.forward", options, SPECS)
    assert truth.status == "pass" and not truth.notes
    assert any("checked again with a copy of every input" in n for n in again.notes)
    assert _judged(again) == _judged(truth)


# In-place calls: a device side whose kernels are torch's own, so a record equal to the record of a run that
# copies every input for every side (the conftest below) was judged on the drawn inputs on every side.
COPY_EVERYTHING = """
import pytest_msprobe.check.placement as placement
placement.written_inputs = lambda *args: None
"""


def _inplace_dump() -> dict[str, Any]:
    b16 = {"dtype": "torch.bfloat16", "shape": [32, 32]}
    flag = {"type": "bool", "value": True}
    return {
        "Tensor.add_.0.forward": {"input_args": [tensor(**b16), tensor(**b16)], "input_kwargs": {},
                                  "output": [tensor(**b16)]},
        "Tensor.addcdiv_.0.forward": {"input_args": [tensor(**b16), tensor(**b16), tensor(mx=2.0, mn=0.5, **b16)],
                                      "input_kwargs": {"value": {"type": "float", "value": -0.5}},
                                      "output": [tensor(**b16)]},
        "Functional.relu.0.forward": {"input_args": [tensor(**b16)], "input_kwargs": {"inplace": flag},
                                      "output": [tensor(**b16)]},
        "Functional.relu.1.forward": {"input_args": [tensor(**b16), flag], "input_kwargs": {},
                                      "output": [tensor(**b16)]},
        "Torch.mul.0.forward": {"input_args": [tensor(**b16), tensor(**b16)], "input_kwargs": {"out": tensor(**b16)},
                                "output": [tensor(**b16)]},
        "Functional.batch_norm.0.forward": {
            "input_args": [tensor(shape=[16, 8]), tensor(shape=[8]), tensor(shape=[8], mx=2.0, mn=0.5)],
            "input_kwargs": {"weight": tensor(shape=[8]), "bias": tensor(shape=[8]), "training": flag,
                             "momentum": {"type": "float", "value": 0.1}},
            "output": [tensor(shape=[16, 8])]},
    }


def _comparable(recs: list[dict[str, Any]]) -> dict[str, Any]:
    drop = ("timings", "worker", "item_id", "rerun", "nodeid")
    return {f"{r['api']}.{r['direction']}": {k: v for k, v in r.items() if k not in drop} for r in recs}


@pytest.mark.parametrize("workers", [[], ["-n", "2"]])
def test_inplace_calls_are_judged_on_the_drawn_inputs_on_every_side(pytester: pytest.Pytester,
                                                                     workers: list[str]) -> None:
    dump = make_dump(pytester, _inplace_dump())
    shared = pytester.runpytest_subprocess(str(dump), "-p", "no:cacheprovider", "--msprobe-out", "shared", *workers)
    shared.assert_outcomes(passed=6)
    pytester.makeconftest(COPY_EVERYTHING)
    copies = pytester.runpytest_subprocess(str(dump), "-p", "no:cacheprovider", "--msprobe-out", "copies", *workers)
    copies.assert_outcomes(passed=6)
    got, want = _comparable(records(pytester, "shared")), _comparable(records(pytester, "copies"))
    assert got == want and len(got) == 6
    assert not any("checked again" in note for r in got.values() for note in r["notes"])  # every write foreseen
    assert json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True)


@pytest.mark.filterwarnings("ignore:An output with one or more elements was resized")
@pytest.mark.parametrize("api, args, kwargs, shape", [
    ("Tensor.resize_", [tensor(shape=[4, 4]), {"type": "int", "value": 64}], {}, [64]),  # grows its storage
    ("Torch.add", [tensor(shape=[64]), tensor(shape=[64])], {"out": tensor(shape=[2, 2])}, [64]),  # grows out
    ("Tensor.addbmm_", [tensor(shape=[1]), tensor(shape=[2, 8, 4]), tensor(shape=[2, 4, 8])], {}, [8, 8]),  # self
])
def test_a_call_that_grows_a_written_input_gets_storage_it_can_grow(write_dump, api: str, args: list[Any],
                                                                     kwargs: dict[str, Any], shape: list[int]) -> None:
    """A drawn tensor lives in numpy's memory, which torch cannot resize: a call that may grow an input it writes
    (resize_, resize_as_, out=, an in-place call whose recorded output is larger than its self) gets a copy in
    torch's memory, as before inputs were shared."""
    data = {f"{api}.0.forward": {"input_args": args, "input_kwargs": kwargs, "output": [tensor(shape=[64])]}}
    record = check_entry(load_dump(write_dump(data)), f"{api}.0.forward", CheckOptions(device="cpu"), SPECS)
    assert "raised" not in record.message and record.outputs[0].shape == shape, record.message


def test_inputs_kept_for_the_failure_tools_are_never_given_away(write_dump) -> None:
    """--msprobe-save-error-data/-repro/-html save the inputs after the runs (runs/capture.py): an input the call
    writes is then copied for every side, so what they save is the input as it was built."""
    from pytest_msprobe.runs import capture

    data = {"Tensor.add_.0.forward": {"input_args": [tensor("torch.bfloat16", [16, 16]),
                                                     tensor("torch.bfloat16", [16, 16])],
                                      "input_kwargs": {}, "output": [tensor("torch.bfloat16", [16, 16])]}}
    with capture.capturing() as captured:
        record = check_entry(load_dump(write_dump(data)), "Tensor.add_.0.forward", CheckOptions(device="cpu"), SPECS)
    x, y = captured["args"]
    assert record.status == "pass" and _ptr(captured["out_d"]) != _ptr(x)
    assert torch.equal(captured["out_d"], x + y)  # x is still the built input the device added y to
