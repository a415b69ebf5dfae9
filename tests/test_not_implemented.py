"""A call the device has no kernel for is a skip with its reason, counted in the summary, never a failure.

The device raises as torch's dispatcher does where a backend lacks a kernel for a dtype or an operator; a kernel
that runs and raises anything else is still a failure.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from pytest_msprobe.runs.backends import not_implemented
from tests.helpers import api_records, make_dump, tensor

KERNELS = '''
def no_bf16(input, dim=None, _stacklevel=3, dtype=None):
    raise RuntimeError("\\"softmax_lastdim_kernel_impl\\" not implemented for 'BFloat16'")

def no_operator(self, other, *, alpha=1):
    raise NotImplementedError("Could not run 'aten::add.Tensor' with arguments from the 'PrivateUse1' backend.")

def broken(input, weight, bias=None):
    raise RuntimeError("illegal memory access")

KERNELS = {"Functional.softmax": no_bf16, "Tensor.add": no_operator, "Functional.linear": broken}
'''


def _dump(pytester: pytest.Pytester) -> Path:
    return make_dump(pytester, {
        "Functional.softmax.0.forward": {"input_args": [tensor(shape=[4, 16])],
                                         "input_kwargs": {"dim": {"type": "int", "value": -1}},
                                         "output": [tensor(shape=[4, 16])]},
        "Tensor.add.0.forward": {"input_args": [tensor(), tensor()], "input_kwargs": {}, "output": [tensor()]},
        "Functional.linear.0.forward": {"input_args": [tensor(shape=[4, 8]), tensor(shape=[3, 8])],
                                        "input_kwargs": {}, "output": [tensor(shape=[4, 3])]},
    })


def test_missing_kernels_are_skipped_and_counted_while_a_failing_kernel_fails(pytester: pytest.Pytester) -> None:
    dump = _dump(pytester)
    pytester.makepyfile(missing_kernels=KERNELS)
    result = pytester.runpytest(str(dump), "--msprobe-device", "cpu", "--msprobe-kernels",
                                "missing_kernels.py:KERNELS", "-rs")
    result.assert_outcomes(failed=1, skipped=2)
    result.stdout.fnmatch_lines(["skipped 2 item(s), by reason (pytest -rs names each item):",
                                 "  not implemented on the device (2: Functional.softmax, Tensor.add): no kernel for "
                                 "the call or its dtype*"])
    recs = api_records(pytester)
    for name in ("Functional.softmax.0.forward", "Tensor.add.0.forward"):
        assert recs[name]["status"] == "SKIP" and recs[name]["not_implemented"] is True
        assert recs[name]["message"].startswith("not implemented on the device: device run raised")
    assert "BFloat16" in recs["Functional.softmax.0.forward"]["message"]
    assert recs["Functional.linear.0.forward"]["status"] == "error"
    assert "not_implemented" not in recs["Functional.linear.0.forward"]


@pytest.mark.parametrize(("exc", "expected"), [
    (NotImplementedError("no kernel"), True),
    (RuntimeError("\"erfinv_cuda\" not implemented for 'BFloat16'"), True),
    (RuntimeError("Could not run 'aten::_foo' with arguments from the 'CUDA' backend."), True),
    (RuntimeError("The operator 'aten::x' is not currently implemented for the MPS device."), True),
    (RuntimeError("CUDA error: an illegal memory access was encountered"), False),
    (ValueError("not implemented for 'BFloat16'"), False),
    (None, False),
])
def test_only_a_missing_kernel_counts_as_not_implemented(exc: BaseException | None, expected: bool) -> None:
    assert not_implemented(exc) is expected
