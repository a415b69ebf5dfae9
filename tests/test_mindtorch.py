"""mindtorch (MSAdapter) dumps: torch-style entries recorded from MindSpore. A tensor dump is replayed without
MindSpore; a statistics dump re-runs each call as the MindSpore API mindtorch maps it to, when MindSpore is
installed (CI: .ci/venv-ms), against the torch bench of the entry's name."""
from __future__ import annotations

from typing import Any

import pytest

import pytest_msprobe.check.replay  # noqa: F401  (kept across pytester's in-process runs)
import pytest_msprobe.runs.mindspore as msmap
from tests.helpers import api_records, make_dump

MS_IMPORT_ERROR = msmap.import_error()  # MindSpore imported once, before any in-process pytester run


def ms_tensor(shape: list[int], mx: float = 2.0, mn: float = -1.0) -> dict[str, Any]:
    # msprobe's MindSpore dumper writes mindtorch tensors as mindspore.Tensor with MindSpore dtype names
    return {"type": "mindspore.Tensor", "dtype": "Float32", "shape": shape, "Max": mx, "Min": mn, "Mean": 0.5,
            "Norm": 10.0}


DATA = {
    "Torch.matmul.0.forward": {"input_args": [ms_tensor([8, 16]), ms_tensor([16, 4])], "input_kwargs": {},
                               "output": [ms_tensor([8, 4])]},
    "Torch.matmul.0.backward": {"input": [ms_tensor([8, 4], 0.1, -0.1)],
                                "output": [ms_tensor([8, 16]), ms_tensor([16, 4])]},
    "Functional.relu.0.forward": {"input_args": [ms_tensor([8, 16])], "input_kwargs": {},
                                  "output": [ms_tensor([8, 16])]},
    "Tensor.sum.0.forward": {"input_args": [ms_tensor([8, 16])], "input_kwargs": {"dim": {"type": "int", "value": 1}},
                             "output": [ms_tensor([8])]},
}


def test_statistics_dump_reruns_in_mindspore(pytester: pytest.Pytester) -> None:
    dump = make_dump(pytester, DATA, name="mt", framework="mindtorch")
    result = pytester.runpytest(str(dump), "-rs", "-p", "no:cacheprovider")
    recs = api_records(pytester)
    if MS_IMPORT_ERROR is not None:
        result.assert_outcomes(skipped=4)
        assert all("MindSpore is not installed or cannot be imported" in r["message"] for r in recs.values())
        return
    result.assert_outcomes(passed=4)
    assert {(r["mode"], r["device"], r["framework"]) for r in recs.values()} == {
        ("rerun", "mindspore:CPU", "mindtorch")}
    assert recs["Torch.matmul.0.forward"]["impl"] == "mindspore.mint.matmul (bench torch.matmul)"
    assert recs["Functional.relu.0.forward"]["impl"] == "mindspore.mint.nn.functional.relu (bench " \
                                                         "torch.nn.functional.relu)"
    grads = recs["Torch.matmul.0.backward"]["outputs"]  # MindSpore's gradients, by tensor argument
    assert [(o["name"].rsplit(".", 1)[-1], o["shape"]) for o in grads] == [("0", [8, 16]), ("1", [16, 4])]
    assert all(o["ms_metrics"]["max_abs_err"] < 1e-4 for r in recs.values() for o in r["outputs"])
