"""Outputs that are not unique (api_specs/error_model.yaml `not_unique`, pytest_msprobe/check/unique.py): indices of
tied values and elements written through repeated indices are judged by validity where they differ from the bench."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from pytest_msprobe.check.unique import DECOMPOSITION, TIES, WRITERS, judge_by_validity
from pytest_msprobe.records.record import Record, Row
from pytest_msprobe.specs.loader import load_specs
from tests.helpers import api_records, make_dump, tensor

SPECS = load_specs()
LEAN = ("-p", "no:cacheprovider")


def _int(value: int) -> dict[str, Any]:
    return {"type": "int", "value": value}


def _dump(pytester: pytest.Pytester) -> Any:
    """Calls whose inputs tie (integers 0..3, bf16 values) or whose indices repeat (0..3 along a dimension of 8)."""
    ints = tensor("torch.int64", [4, 16], mx=3, mn=0)
    index = tensor("torch.int64", [4, 8], mx=3, mn=0)
    return make_dump(pytester, {
        "Torch.sort.0.forward": {"input_args": [ints], "input_kwargs": {},
                                 "output": [ints, tensor("torch.int64", [4, 16], mx=15, mn=0)]},
        "Tensor.topk.0.forward": {"input_args": [ints, _int(5)], "input_kwargs": {"dim": _int(1)},
                                  "output": [tensor("torch.int64", [4, 5], mx=3, mn=0),
                                             tensor("torch.int64", [4, 5], mx=15, mn=0)]},
        "Torch.argsort.0.forward": {"input_args": [tensor("torch.bfloat16", [4, 256])], "input_kwargs": {},
                                    "output": [tensor("torch.int64", [4, 256], mx=255, mn=0)]},
        "Torch.scatter.0.forward": {"input_args": [tensor(shape=[4, 8]), _int(1), index, tensor(shape=[4, 8])],
                                    "input_kwargs": {}, "output": [tensor(shape=[4, 8])]},
    })


KERNELS = '''
import torch


def _reversed_ties(input, dim):
    """A stable sort of the flipped input: tied values in descending index order."""
    values, indices = torch.sort(input.flip(dim), dim=dim, stable=True)
    return values, input.size(dim) - 1 - indices


def sort(input, dim=-1, descending=False, stable=False):
    return _reversed_ties(input, dim)


def topk(self, k, dim=-1, largest=True, sorted=True):
    values, indices = _reversed_ties(-self, dim)
    return -values.narrow(dim, 0, k), indices.narrow(dim, 0, k)


def argsort(input, dim=-1, descending=False, stable=False):
    return _reversed_ties(input, dim)[1]


def scatter(input, dim, index, src):
    """Of the values written to one element, the first along `dim` (torch's CPU kernel keeps the last)."""
    src = src[tuple(slice(0, k) for k in index.shape)]
    return torch.scatter(input, dim, index.flip(dim), src.flip(dim))


def wrong_sort(input, dim=-1, descending=False, stable=False):
    values, indices = torch.sort(input, dim=dim)
    return values, indices.roll(1, dim)  # a permutation, but pointing at other values


def wrong_topk(self, k, dim=-1, largest=True, sorted=True):
    values, indices = torch.topk(self, k, dim)
    return values, (indices + 1) % self.size(dim)


def wrong_argsort(input, dim=-1, descending=False, stable=False):
    indices = torch.argsort(input, dim=dim)
    return torch.cat([indices.narrow(dim, 0, 1), indices.narrow(dim, 0, indices.size(dim) - 1)], dim)


def wrong_scatter(input, dim, index, src):
    out = scatter(input, dim, index, src)
    out[0, index[0, 0]] += 0.5  # a value none of the element's writers has
    return out


VALID = {"Torch.sort": sort, "Tensor.topk": topk, "Torch.argsort": argsort, "Torch.scatter": scatter}
WRONG = {"Torch.sort": wrong_sort, "Tensor.topk": wrong_topk, "Torch.argsort": wrong_argsort,
         "Torch.scatter": wrong_scatter}
'''

CALLS = ("Torch.sort.0.forward", "Tensor.topk.0.forward", "Torch.argsort.0.forward", "Torch.scatter.0.forward")
JUDGED = {"Torch.sort.0.forward": 1, "Tensor.topk.0.forward": 1, "Torch.argsort.0.forward": 0,
          "Torch.scatter.0.forward": 0}


def test_kernels_that_break_ties_or_keep_writers_another_valid_way_pass(pytester: pytest.Pytester) -> None:
    dump = _dump(pytester)
    pytester.makepyfile(kern=KERNELS)
    pytester.runpytest(str(dump), "--msprobe-kernels", "kern.py:VALID", "--msprobe-out", "valid",
                       *LEAN).assert_outcomes(passed=4)
    judged_valid(api_records(pytester, "valid"))


def judged_valid(recs: dict[str, Any]) -> None:
    for call in CALLS:
        row = recs[call]["outputs"][JUDGED[call]]
        # each differs from the bench (msprobe's Layer 1 fails it), and is valid
        assert row["status"] == "error" and row["verdict"] == "pass", (call, row)
        assert row["check"] == ("duplicate_writers" if "scatter" in call else "ties")
        assert row["verdict_message"] == (WRITERS if "scatter" in call else TIES)
        assert recs[call]["status"] == "pass" and recs[call]["layer1_status"] == "error"
    assert "check" not in recs["Torch.sort.0.forward"]["outputs"][0]  # the values: compared as usual


def judged_wrong(recs: dict[str, Any]) -> None:
    for call in CALLS:
        row = recs[call]["outputs"][JUDGED[call]]
        assert row["verdict"] == "error" and row["check"] in ("ties", "duplicate_writers"), (call, row)
    for call in CALLS[:3]:
        assert "point at other values" in recs[call]["outputs"][JUDGED[call]]["verdict_message"]
    assert "1 of " in recs["Torch.scatter.0.forward"]["outputs"][0]["verdict_message"]


def test_kernels_whose_indices_or_written_values_are_wrong_fail(pytester: pytest.Pytester) -> None:
    dump = _dump(pytester)
    pytester.makepyfile(kern=KERNELS)
    pytester.runpytest(str(dump), "--msprobe-kernels", "kern.py:WRONG", "--msprobe-out", "wrong",
                       *LEAN).assert_outcomes(failed=4)
    judged_wrong(api_records(pytester, "wrong"))


def test_a_device_that_agrees_with_the_bench_keeps_its_record(pytester: pytest.Pytester) -> None:
    pytester.runpytest(str(_dump(pytester)), "--msprobe-out", "same", *LEAN).assert_outcomes(passed=4)
    for rec in api_records(pytester, "same").values():
        assert all("check" not in row and "validity" not in row["verdict_message"] for row in rec["outputs"])


# ------------------------------------------------------------------------------------------ judge_by_validity
def _rows(bench: list[Any], device: list[Any]) -> Record:
    """A record whose rows fail exactly where device and bench differ (as the integer rows of strict do)."""
    same = [bool(torch.equal(b, d)) for b, d in zip(bench, device)]
    record = Record("x", "forward", 0)
    record.outputs = [Row(f"x.{i}", "pass" if s else "error", "", " ", " ", None, {}, verdict="pass" if s else "error")
                      for i, s in enumerate(same)]
    return record


def _judge(api: str, bench: list[Any], device: list[Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
    record = _rows(bench, device)
    judge_by_validity(record, (api, list(args), kwargs), SPECS, "strict", bench, device)
    return record.to_dict()


def test_ties_without_keepdim_nan_and_indices_out_of_range() -> None:
    x = torch.tensor([[1.0, 2.0, 1.0, 2.0], [0.0, 0.0, 5.0, float("nan")]])
    values, indices = torch.kthvalue(x, 2, dim=1)
    other = indices.clone()
    other[0] = 0 if int(indices[0]) == 2 else 2  # the other 1.0 of row 0
    row = _judge("kthvalue", [values, indices], [values, other], x, 2, 1)["outputs"][1]
    assert (row["verdict"], row["check"], row["verdict_message"]) == ("pass", "ties", TIES)
    far = indices.clone()
    far[1] = 4
    row = _judge("kthvalue", [values, indices], [values, far], x, 2, 1)["outputs"][1]
    assert row["verdict"] == "error" and "outside [0, 4)" in row["verdict_message"]
    y = torch.tensor([[float("nan"), 1.0, float("nan")]])
    m_values, m_indices = torch.max(y, dim=1, keepdim=True)  # NaN, as median's of a row of NaNs would be
    row = _judge("median", [m_values, m_indices], [m_values, 2 - m_indices], y, 1, True)["outputs"][1]
    assert row["verdict"] == "pass"  # one NaN is as good as the other
    row = _judge("median", [m_values, m_indices], [m_values, torch.tensor([[1]])], y, dim=1, keepdim=True)["outputs"][1]
    assert row["verdict"] == "error" and row["check"] == "ties"


def test_a_stable_sort_and_other_standards_keep_the_usual_verdict() -> None:
    x = torch.tensor([[3, 1, 3, 1]])
    bench = list(torch.sort(x, stable=True))
    device = [bench[0], torch.tensor([[3, 1, 2, 0]])]
    assert "check" not in _judge("sort", bench, device, x, stable=True)["outputs"][1]
    assert "check" not in _judge("argsort", bench[1:], device[1:], x, -1, False, True)["outputs"][0]  # positional
    assert _judge("argsort", bench[1:], device[1:], x, -1, False)["outputs"][0]["verdict"] == "pass"
    assert _judge("sort", bench, device, x)["outputs"][1]["verdict"] == "pass"
    record = _rows(bench, device)
    judge_by_validity(record, ("sort", [x], {}), SPECS, "msprobe", bench, device)
    assert record == _rows(bench, device)
    repeated = [bench[0], torch.tensor([[1, 1, 2, 2]])]  # points at equal values, but no permutation
    assert "permutation" in _judge("sort", bench, repeated, x)["outputs"][1]["verdict_message"]
    top_b = list(torch.topk(x, 2))
    assert "repeats" in _judge("topk", top_b, [top_b[0], torch.tensor([[2, 2]])], x, 2)["outputs"][1][
        "verdict_message"]


def test_index_put_and_index_copy_keep_one_of_their_writers() -> None:
    x = torch.zeros(5)
    where = torch.tensor([1, 3, 1, 1])
    values = torch.tensor([10.0, 20.0, 30.0, 40.0])
    bench = [x.index_put((where,), values)]
    for first in (10.0, 30.0):  # any writer of element 1 is valid
        device = bench[0].clone()
        device[1] = first
        row = _judge("index_put_", bench, [device], x, (where,), values)["outputs"][0]
        assert (row["verdict"], row["check"], row["verdict_message"]) == ("pass", "duplicate_writers", WRITERS)
    device = bench[0].clone()
    device[1], device[0] = 20.0, 7.0  # element 3's value, and an element no index writes
    row = _judge("index_put", bench, [device], x, (where,), values)["outputs"][0]
    assert row["verdict"] == "error" and "1 of 2 written" in row["verdict_message"] and \
        "1 elements no index" in row["verdict_message"]
    # accumulate=True sums every writer: the usual checks judge it
    assert "check" not in _judge("index_put", bench, [device], x, (where,), values, True)["outputs"][0]
    y = torch.zeros(4, 3)
    source = torch.arange(9.0).reshape(3, 3)
    index = torch.tensor([2, 0, 2])
    copied = y.index_copy(0, index, source)
    device = copied.clone()
    device[2] = source[0]
    assert _judge("index_copy", [copied], [device], y, 0, index, source)["outputs"][0]["verdict"] == "pass"
    device[2, 1] = 100.0
    assert _judge("index_copy", [copied], [device], y, 0, index, source)["outputs"][0]["verdict"] == "error"
    # scatter of a scalar: every writer has the same value; a reduction is left alone
    s_index = torch.tensor([[0, 0], [1, 1]])
    scattered = torch.zeros(2, 2).scatter(1, s_index, 2.5)
    assert "check" not in _judge("scatter", [scattered], [scattered], torch.zeros(2, 2), 1, s_index, 2.5)["outputs"][0]
    assert "check" not in _judge("scatter", [scattered], [scattered + 1], torch.zeros(2, 2), 1, s_index,
                                 torch.ones(2, 2), reduce="add")["outputs"][0]



def test_max_unpool_with_a_repeated_index_keeps_one_of_its_writers() -> None:
    """Two pooled values unpooled to the same place (the H200 kept the other one): either is valid, zeros stay zeros."""
    x = torch.tensor([[[[8.625, -1.0], [3.25, 2.0]]]])
    indices = torch.tensor([[[[15, 15], [4, 0]]]])  # the first two go to the same element of the 4x4 plane
    bench = [torch.nn.functional.max_unpool2d(x, indices, 2, output_size=(4, 4))]
    other = 8.625 if float(bench[0][0, 0, 3, 3]) == -1.0 else -1.0  # the writer the bench did not keep
    device = bench[0].clone()
    device[0, 0, 3, 3] = other
    row = _judge("max_unpool2d", bench, [device], x, indices)["outputs"][0]
    assert (row["verdict"], row["check"]) == ("pass", "duplicate_writers")
    device = bench[0].clone()
    device[0, 0, 3, 3], device[0, 0, 2, 2] = 3.25, 1.0  # another element's writer, and a zero written over
    row = _judge("max_unpool2d", bench, [device], x, indices)["outputs"][0]
    assert row["verdict"] == "error" and "1 of 3 written" in row["verdict_message"] and \
        "1 elements no index" in row["verdict_message"]


DECOMPOSITIONS = """
import torch


def _signs(n):
    return torch.tensor([(-1.0) ** j for j in range(n)])


def qr(A, mode="reduced"):
    Q, R = torch.linalg.qr(A, mode)
    d = _signs(Q.shape[-1])
    return Q * d, R * d[:, None]


def svd(A, full_matrices=True, driver=None):
    U, S, Vh = torch.linalg.svd(A, full_matrices=full_matrices)
    d = _signs(S.shape[-1])
    return U * d, S, Vh * d[:, None]


def eigh(A, UPLO="L"):
    L, Q = torch.linalg.eigh(A, UPLO)
    return L, Q * _signs(Q.shape[-1])


def wrong_qr(A, mode="reduced"):
    Q, R = qr(A, mode)
    return Q, R.abs()  # R's signs no longer Q's


def wrong_svd(A, full_matrices=True, driver=None):
    U, S, Vh = svd(A, full_matrices)
    return U, S, Vh.flip(-2)  # right singular vectors paired with other singular values


def wrong_eigh(A, UPLO="L"):
    L, Q = eigh(A, UPLO)
    return L, Q + 1e-3


VALID = {"Torch.qr": qr, "Torch.svd": svd, "Torch.eigh": eigh}
WRONG = {"Torch.qr": wrong_qr, "Torch.svd": wrong_svd, "Torch.eigh": wrong_eigh}
"""
FACTORS = {"Torch.qr.0.forward": (0, 1), "Torch.svd.0.forward": (0, 2), "Torch.eigh.0.forward": (1,)}


def test_decompositions_with_other_signs_pass_and_wrong_factors_fail(pytester: pytest.Pytester) -> None:
    f32 = "torch.float32"
    dump = make_dump(pytester, {
        "Torch.qr.0.forward": {"input_args": [tensor(f32, [6, 4])], "input_kwargs": {},
                               "output": [tensor(f32, [6, 4]), tensor(f32, [4, 4])]},
        "Torch.svd.0.forward": {"input_args": [tensor(f32, [2, 6, 4])],
                                "input_kwargs": {"full_matrices": {"type": "bool", "value": False}},
                                "output": [tensor(f32, [2, 6, 4]), tensor(f32, [2, 4], mx=3.0, mn=0.1),
                                           tensor(f32, [2, 4, 4])]},
        "Torch.eigh.0.forward": {"input_args": [tensor(f32, [5, 5])], "input_kwargs": {},
                                 "output": [tensor(f32, [5]), tensor(f32, [5, 5])]},
    })
    pytester.makepyfile(decompositions=DECOMPOSITIONS)
    pytester.runpytest(str(dump), "--msprobe-kernels", "decompositions.py:VALID", "--msprobe-out", "valid",
                       *LEAN).assert_outcomes(passed=3)
    pytester.runpytest(str(dump), "--msprobe-kernels", "decompositions.py:WRONG", "--msprobe-out", "wrong",
                       *LEAN).assert_outcomes(failed=3)
    for out, verdict in (("valid", "pass"), ("wrong", "error")):
        recs = api_records(pytester, out)
        for call, factors in FACTORS.items():
            rows = recs[call]["outputs"]
            for i, row in enumerate(rows):
                if i in factors:  # signs differ from the bench's: msprobe's Layer 1 fails them
                    assert row["status"] == "error" and row["check"] == "decomposition", (out, call, row)
                    assert row["verdict"] == verdict and (row["verdict_message"] == DECOMPOSITION) == (out == "valid")
                else:  # the singular values and eigenvalues: compared as usual
                    assert "check" not in row and row["verdict"] == "pass", (out, call, row)


def test_the_factors_of_torch_svd_geqrf_and_an_upper_eigh() -> None:
    A = torch.randn(5, 3, generator=torch.Generator().manual_seed(0))
    d = torch.tensor([1.0, -1.0, -1.0])
    U, S, V = torch.svd(A.double())  # V, not Vh: the bench's outputs tell which
    bench = [U, S, V]
    row = _judge("svd", bench, [(U * d).float(), S.float(), (V * d).float()], A)["outputs"][0]
    assert (row["verdict"], row["check"]) == ("pass", "decomposition")
    assert _judge("svd", bench, [(U * d).float(), S.float(), V.float()], A)["outputs"][0]["verdict"] == "error"
    a, tau = torch.geqrf(A.double())
    assert _judge("geqrf", [a, tau], [a.float(), tau.float()], A)["outputs"][1]["verdict"] == "pass"
    assert _judge("geqrf", [a, tau], [a.float(), tau.float() * 0.5], A)["outputs"][1]["verdict"] == "error"
    H = torch.randn(4, 4, generator=torch.Generator().manual_seed(1))
    L, Q = torch.linalg.eigh(H.double(), UPLO="U")
    flipped = (Q * torch.tensor([1.0, -1.0, 1.0, -1.0])).float()
    assert _judge("eigh", [L, Q], [L.float(), flipped], H, UPLO="U")["outputs"][1]["verdict"] == "pass"
    assert _judge("eigh", [L, Q], [L.float(), flipped], H)["outputs"][1]["verdict"] == "error"  # the lower one


def _recorded(pytester: pytest.Pytester, kernels: dict[str, Any], name: str) -> Any:
    """A tensor dump of the four calls as a device running `kernels` recorded them: their real inputs (ties and
    repeated indices) and the kernels' outputs, saved as msprobe's dumper saves them."""
    gen = torch.Generator().manual_seed(7)
    ints = torch.randint(0, 4, (4, 16), generator=gen)
    scores = torch.randint(-2, 3, (4, 256), generator=gen).to(torch.bfloat16)
    index = torch.randint(0, 4, (4, 8), generator=gen)
    base, src = torch.randn(4, 8, generator=gen), torch.randn(4, 8, generator=gen)
    calls = {"Torch.sort.0.forward": ([ints], {}), "Tensor.topk.0.forward": ([ints, 5], {"dim": 1}),
             "Torch.argsort.0.forward": ([scores], {}), "Torch.scatter.0.forward": ([base, 1, index, src], {})}
    folder = pytester.path / name
    (folder / "dump_tensor_data").mkdir(parents=True)

    def saved(value: Any, stem: str) -> dict[str, Any]:
        if not isinstance(value, torch.Tensor):
            return _int(value)
        torch.save(value.clone(), folder / "dump_tensor_data" / f"{stem}.pt")
        return {**tensor(str(value.dtype), list(value.shape), mx=value.max().item(), mn=value.min().item()),
                "data_name": f"{stem}.pt"}

    data = {}
    for call, (args, kwargs) in calls.items():
        out = kernels[call.rsplit(".", 2)[0]](*args, **kwargs)
        outs = list(out) if isinstance(out, tuple) else [out]
        data[call] = {"input_args": [saved(a, f"{call}.input.{i}") for i, a in enumerate(args)],
                      "input_kwargs": {k: saved(v, f"{call}.input.{k}") for k, v in kwargs.items()},
                      "output": [saved(o, f"{call}.output.{i}") for i, o in enumerate(outs)]}
    (folder / "dump.json").write_text(json.dumps({"task": "tensor", "level": "L1", "framework": "pytorch",
                                                  "dump_data_dir": None, "data": data}))
    return folder / "dump.json"


def test_replayed_outputs_that_break_ties_another_valid_way_pass_and_wrong_ones_fail(pytester: pytest.Pytester) -> \
        None:
    """Recorded on a device whose kernels break ties and keep writers another valid way, then replayed: judged by
    validity as a re-run judges them. Wrong indices and written values recorded the same way still fail."""
    namespace: dict[str, Any] = {}
    exec(KERNELS, namespace)  # noqa: S102  # the test's own kernels, above
    valid = _recorded(pytester, namespace["VALID"], "valid")
    pytester.runpytest(str(valid), "--msprobe-mode", "replay", "--msprobe-out", "valid",
                       *LEAN).assert_outcomes(passed=4)
    judged_valid(api_records(pytester, "valid"))
    wrong = _recorded(pytester, namespace["WRONG"], "wrong")
    pytester.runpytest(str(wrong), "--msprobe-mode", "replay", "--msprobe-out", "wrong",
                       *LEAN).assert_outcomes(failed=4)
    judged_wrong(api_records(pytester, "wrong"))


def _tied_topk_dump(root: Path, planted: str = "") -> Path:
    """A replayed topk of a ReLU router's scores (bf16, zeros tied at the top-2 boundary in every row), recorded by
    a kernel that breaks ties from the end: its forward and its backward, whose gradient goes where its indices
    point. `planted`: `scaled` multiplies that gradient by 1.5; `misrouted` sends it to the bench's own indices."""
    gen = torch.Generator().manual_seed(5)
    scores = torch.relu(torch.randn(32, 8, generator=gen)).bfloat16()
    scores[:, :7] = torch.where(torch.arange(32)[:, None] % 2 == 0, 0.0, scores[:, :7]).bfloat16()
    scores[::2, 7] = 1.0  # even rows: one positive score, then seven tied zeros for the second place
    flipped = torch.topk(scores.flip(-1), 2, -1)
    values, indices = flipped.values, 7 - flipped.indices
    grad = torch.randn(32, 2, generator=gen).bfloat16()
    routed = torch.topk(scores, 2, -1).indices if planted == "misrouted" else indices
    grad_in = torch.zeros_like(scores).scatter(-1, routed, grad * (1.5 if planted == "scaled" else 1.0))
    folder = root / "dump_tensor_data"
    folder.mkdir(parents=True)

    def leaves(where: str, tensors: list[torch.Tensor], requires_grad: bool = False) -> list[dict[str, Any]]:
        found = []
        for i, t in enumerate(tensors):
            name = f"Torch.topk.0.{where}.{i}.pt"
            torch.save(t.clone(), folder / name)
            found.append(tensor(str(t.dtype), list(t.shape), float(t.max()), float(t.min()), data_name=name,
                                requires_grad=requires_grad))
        return found

    data = {"Torch.topk.0.forward": {"input_args": [*leaves("forward.input", [scores], True), _int(2)],
                                     "input_kwargs": {"dim": _int(-1)},
                                     "output": leaves("forward.output", [values, indices])},
            "Torch.topk.0.backward": {"input": leaves("backward.input", [grad]),
                                      "output": leaves("backward.output", [grad_in])}}
    path = root / "dump.json"
    path.write_text(json.dumps({"task": "tensor", "level": "L1", "framework": "pytorch", "dump_data_dir": None,
                                "data": data}))
    return path


def test_a_replayed_backward_follows_the_ties_its_forward_recorded(pytester: pytest.Pytester) -> None:
    """Indices that break ties another valid way pass the forward; the backward's gradient went where they point,
    so the bench's goes there too. A gradient scaled, or sent where the recorded indices do not point, fails."""
    replay = ("--msprobe-mode", "replay", *LEAN)
    pytester.runpytest(str(_tied_topk_dump(pytester.path / "valid")), *replay,
                       "--msprobe-out", "valid").assert_outcomes(passed=2)
    recs = api_records(pytester, "valid")
    assert recs["Torch.topk.0.forward"]["outputs"][1]["check"] == "ties"
    assert recs["Torch.topk.0.forward"]["layer1_status"] == "error"  # the indices differ from the bench's
    for planted in ("scaled", "misrouted"):
        result = pytester.runpytest(str(_tied_topk_dump(pytester.path / planted, planted)), *replay,
                                    "--msprobe-out", planted)
        result.assert_outcomes(passed=1, failed=1)
        assert api_records(pytester, planted)["Torch.topk.0.backward"]["status"] == "error"
