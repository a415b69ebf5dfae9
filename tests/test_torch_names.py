"""msprobe records torch.linalg.<name> calls as Torch.<name>: resolved by what the recorded call fits.

tests/data/linalg_msprobe26/dump.json is recorded by msprobe 26.2's own dumper (record.py beside it).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from pytest_msprobe.dump.reader import iter_leaves
from pytest_msprobe.runs.torch_names import torch_function
from tests.helpers import ROOT, by_api, records

LINALG = ROOT / "tests" / "data" / "linalg_msprobe26"
ENTRIES = json.loads((LINALG / "dump.json").read_text())["data"]
EXPECTED = {  # the call record.py made, as the recorded arguments tell it
    "Torch.inv.0": "torch.linalg.inv", "Torch.vector_norm.0": "torch.linalg.vector_norm",
    "Torch.matrix_norm.0": "torch.linalg.matrix_norm", "Torch.pinv.0": "torch.linalg.pinv",
    "Torch.svdvals.0": "torch.linalg.svdvals", "Torch.multi_dot.0": "torch.linalg.multi_dot",
    "Torch.vecdot.0": "torch.linalg.vecdot", "Torch.lu_factor.0": "torch.linalg.lu_factor",
    "Torch.cholesky_ex.0": "torch.linalg.cholesky_ex", "Torch.inv.1": "torch.linalg.inv",
    "Torch.svd.0": "torch.linalg.svd",    # no kwargs: both fit; the recorded U is 6x6 (full_matrices)
    "Torch.svd.1": "torch.svd",           # some=True: only torch.svd has `some`
    "Torch.lstsq.0": "torch.linalg.lstsq",  # torch.lstsq is a removed stub that only raises
    "Torch.solve.0": "torch.linalg.solve", "Torch.matrix_rank.0": "torch.linalg.matrix_rank",
    "Torch.vander.1": "torch.vander",     # three positional arguments: only torch.vander(x, N, increasing)
    "Torch.cond.0": "torch.linalg.cond",  # torch.cond is control flow (pred, true_fn, false_fn)
    "Torch.norm.0": "torch.linalg.norm",  # ord=: torch.norm has p
}


def test_the_dump_was_recorded_by_msprobe_with_torch_names() -> None:
    assert not [name for name in ENTRIES if "linalg" in name]
    assert {name.rsplit(".", 1)[0] for name in ENTRIES if name.startswith("Torch.")} == set(EXPECTED) | {"Torch.vander.0"}
    for name in ("inv", "vector_norm", "pinv", "svdvals", "multi_dot", "vecdot", "lu_factor", "cholesky_ex"):
        assert not hasattr(torch, name)  # so torch.<name> alone cannot run them


@pytest.mark.parametrize("api", sorted(EXPECTED))
def test_each_call_resolves_to_the_function_that_was_called(api: str) -> None:
    fn, label = torch_function(api.split(".")[1], ENTRIES[f"{api}.forward"])
    assert label == EXPECTED[api] and fn is eval(EXPECTED[api], {"torch": torch})


def test_an_undecidable_call_keeps_torch_and_says_so() -> None:
    # torch.linalg.vander(x, N=3) and torch.vander(x, N=3) take the same arguments and give the same shapes
    fn, label = torch_function("vander", ENTRIES["Torch.vander.0.forward"])
    assert fn is torch.vander and label == "torch.vander (torch.linalg.vander accepts the recorded arguments too)"
    assert torch_function("relu")[1] == "torch.relu" and torch_function("linalg.inv")[1] == "torch.linalg.inv"
    with pytest.raises(AttributeError):
        torch_function("no_such_function")


@pytest.mark.parametrize("workers", [0, 2])
def test_the_recorded_linalg_dump_runs(pytester: pytest.Pytester, workers: int) -> None:
    dump = pytester.path / "linalg" / "dump.json"
    dump.parent.mkdir()
    dump.write_text((LINALG / "dump.json").read_text())
    xdist = ["-n", str(workers), "-p", "xdist"] if workers else []
    # msprobe's standard: this test is about names; CPU lstsq is not bit-reproducible from run to run (its
    # LAPACK path depends on the buffers), so strict's torch run of it is another sample than the device's
    result = (pytester.runpytest_subprocess if workers else pytester.runpytest)(
        str(dump), "-rs", *xdist, "--msprobe-standard", "msprobe", "-p", "no:cacheprovider")
    recs = by_api(records(pytester))
    for api, path in EXPECTED.items():
        assert recs[f"{api}.forward"]["impl"] == path
    assert recs["Torch.inv.1.backward"]["impl"] == "torch.linalg.inv"
    messages = " ".join(str(r["message"]) for r in recs.values())
    assert "no such API" not in messages and "TypeError" not in messages
    # the generated inputs are not positive-definite: a precondition of the API, not a kernel failure
    chol = recs["Torch.cholesky_ex.0.forward"]
    assert chol["status"] == "SKIP" and chol["message"].startswith(
        "the generated inputs break a precondition of the API (not a kernel failure): the device and the bench "
        "both raise _LinAlgError: linalg.cholesky_ex: The factorization could not be completed")
    for key, rec in recs.items():  # what ran gives the recorded output shapes
        if rec["outputs"] and key.endswith("forward"):
            recorded = [leaf["shape"] for leaf in iter_leaves(ENTRIES[key]["output"]) if isinstance(leaf, dict)]
            assert [o["shape"] for o in rec["outputs"]] == recorded, key
    # lstsq's residuals and singular values are empty with the CPU driver: msprobe 8.3.3 calls that an error
    lstsq = recs["Torch.lstsq.0.forward"]
    assert [o["status"] for o in lstsq["outputs"]] == ["pass", "error", "pass", "error"]
    assert {o["message"] for o in lstsq["outputs"] if o["status"] == "error"} == {"There is not bench calculation result."}
    others = {k: r["status"] for k, r in recs.items() if k not in ("Torch.cholesky_ex.0.forward", "Torch.lstsq.0.forward")}
    assert set(others.values()) == {"pass"}, others
    result.assert_outcomes(passed=20, failed=1, skipped=1)


INV_KERNEL = """
import torch


def inv(a, *args, **kwargs):  # an inverse 1% off
    return torch.linalg.inv(a, *args, **kwargs) * 1.01


KERNELS = {"Torch.inv": inv}
"""


def test_a_repro_script_runs_the_linalg_function(pytester: pytest.Pytester) -> None:
    from tests.triage_helpers import assert_same_numbers, run_script, site_dir

    pytester.makepyfile(kern=INV_KERNEL)
    dump = pytester.path / "linalg" / "dump.json"
    dump.parent.mkdir()
    dump.write_text(json.dumps({**json.loads((LINALG / "dump.json").read_text()),
                                "data": {"Torch.inv.0.forward": ENTRIES["Torch.inv.0.forward"]}}))
    pytester.runpytest(str(dump), "--msprobe-kernels", "kern.py:KERNELS", "--msprobe-repro", "rep",
                       "-p", "no:cacheprovider").assert_outcomes(failed=1)
    (record,) = records(pytester)
    script = Path(record["repro"])
    assert '"entry": "Torch.inv.0.forward"' in script.read_text()
    rc, out = run_script(script, site_dir(pytester.path, planted=False), "--json")
    # the script ran the item's check: the kernel on the device side, torch.linalg.inv on the bench side
    assert out["impl"] == record["impl"] == "kern:inv (substituted)"
    assert rc == 1 and assert_same_numbers(out, record) >= 3
