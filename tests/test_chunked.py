"""Items too large for the memory budget (--msprobe-max-memory) are checked in pieces with the whole check's rows,
statistics and verdicts; what cannot be cut is skipped with the reason; the bench device option (cpu here)."""
from __future__ import annotations

from typing import Any

import pytest

from tests.helpers import api_records, device_side_conftest, make_dump, strict_warm_up, tensor


@pytest.fixture(autouse=True, scope="module")
def _warm() -> None:
    strict_warm_up()


def _int(v: int) -> dict[str, Any]:
    return {"type": "int", "value": v}


def _entries(dt: str) -> dict[str, Any]:
    """Forward calls of every class cut in pieces: a contraction with and without bias, a batched matmul, a
    softmax and norms along the leading dimensions, pointwise ops with a broadcast operand and with alpha."""
    def t(shape: list[int], mx: float = 2.0, mn: float = -2.0) -> dict[str, Any]:
        return tensor(dt, shape, mx=mx, mn=mn)

    def call(args: list[Any], out: list[int], kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
        return {"input_args": args, "input_kwargs": kwargs or {}, "output": [t(out)]}

    return {
        "Functional.linear.0.forward": call([t([1, 1024, 64]), t([48, 64], 0.2, -0.2)], [1, 1024, 48]),
        "Functional.linear.1.forward": call([t([1024, 64]), t([48, 64], 0.2, -0.2), t([48])], [1024, 48]),
        "Torch.matmul.0.forward": call([t([4, 512, 48]), t([48, 40])], [4, 512, 40]),
        "Functional.softmax.0.forward": call([t([4, 128, 192], 8.0, -8.0), _int(-1)], [4, 128, 192]),
        "Functional.log_softmax.0.forward": call([t([512, 192], 8.0, -8.0)], [512, 192], {"dim": _int(-1)}),
        "Functional.rms_norm.0.forward": call([t([512, 192]), [_int(192)], t([192])], [512, 192]),
        "Functional.layer_norm.0.forward": call([t([512, 192]), [_int(192)], t([192]), t([192])], [512, 192]),
        "Functional.silu.0.forward": call([t([512, 192], 6.0, -6.0)], [512, 192]),
        "Torch.add.0.forward": call([t([512, 192]), t([512, 192])], [512, 192], {"alpha": {"type": "float", "value": 0.5}}),
        "Tensor.__mul__.0.forward": call([t([512, 192]), t([192])], [512, 192]),
        # an optimizer's in-place updates, on a matrix and on a vector
        "Tensor.addcmul_.0.forward": call([t([1024, 48]), t([1024, 48]), t([1024, 48])], [1024, 48],
                                          {"value": {"type": "float", "value": -0.01}}),
        "Tensor.mul_.0.forward": call([t([512, 192], 0.0, 0.0), {"type": "float", "value": 0.9}], [512, 192]),  # zeros
        "Tensor.lerp_.0.forward": call([t([65536]), t([65536]), {"type": "float", "value": 0.1}], [65536]),
    }


# the device's silu 1 % off where x > 3, its softmax rows renormalised in bf16: failing rows, judged in pieces too
PLANTED = device_side_conftest("""
import torch
import torch.nn.functional as F
def silu(orig, x, *a, **k):
    y = orig(x, *a, **k)
    return torch.where(x > 3, y * 1.01, y)
def softmax(orig, x, *a, **k):
    y = orig(x, *a, **k)
    return (y / y.sum(-1, keepdim=True)).to(y.dtype)
IMPLS = {F.silu: silu, F.softmax: softmax}
""")

_VOLATILE = ("timings", "pieces", "notes", "entry_key")  # entry_key: a hash of the settings (the budget too)


def _same(whole: dict[str, Any], pieces: dict[str, Any]) -> None:
    """Every key but the timings and the settings' hash equal; the notes but the one that says how it was cut."""
    assert {k: v for k, v in whole.items() if k not in _VOLATILE} == \
        {k: v for k, v in pieces.items() if k not in _VOLATILE}
    assert [n for n in whole["notes"] if not n.startswith("checked in pieces of ")] == \
        [n for n in pieces["notes"] if not n.startswith("checked in pieces of ")]


@pytest.mark.parametrize("dt", ["torch.bfloat16", "torch.float32"])
@pytest.mark.parametrize("standard", ["strict", "msprobe"])
def test_items_checked_in_pieces_have_the_whole_checks_records(pytester: pytest.Pytester, dt: str,
                                                               standard: str) -> None:
    pytester.makeconftest(PLANTED)
    dump = make_dump(pytester, _entries(dt))
    common = ["-p", "no:cacheprovider", "--msprobe-standard", standard, "-o", "msprobe_helper_thread=off"]
    pytester.runpytest(str(dump), *common, "--msprobe-max-memory", "64GiB", "--msprobe-out", "whole")
    pytester.runpytest(str(dump), *common, "--msprobe-max-memory", "768KiB", "--msprobe-out", "cut")
    whole, cut = api_records(pytester, "whole"), api_records(pytester, "cut")
    assert whole.keys() == cut.keys() == {f"{k.rsplit('.', 1)[0]}.forward" for k in _entries(dt)}
    for key, record in whole.items():
        assert "pieces" not in record, key
        assert cut[key]["pieces"]["blocks"] > 1, key  # each one really cut, in several blocks
        assert cut[key]["pieces"]["need"] > cut[key]["pieces"]["budget"] == 768 * 1024
        assert record["outputs"] and record["status"] != "SKIP", (key, record["message"])
        _same(record, cut[key])
    if standard == "strict":  # the planted errors fail, whole and in pieces alike
        assert cut["Functional.silu.0.forward"]["status"] == "error"
        assert cut["Functional.linear.0.forward"]["status"] == "pass"


def test_a_composite_bounded_by_its_terms_is_cut_with_its_terms_run(pytester: pytest.Pytester) -> None:
    """Under the cuda contract gelu is judged against its terms (runs/terms.py): in pieces the terms run is cut
    along with the bench, and the records are the whole check's."""
    x = tensor("torch.float32", [1024, 96], mx=2.0, mn=-6.0)
    dump = make_dump(pytester, {"Functional.gelu.0.forward": {
        "input_args": [x], "input_kwargs": {}, "output": [tensor("torch.float32", [1024, 96])]}})
    common = ["-p", "no:cacheprovider", "--msprobe-contract", "cuda", "-o", "msprobe_helper_thread=off"]
    pytester.runpytest(str(dump), *common, "--msprobe-max-memory", "64GiB", "--msprobe-out", "whole")
    pytester.runpytest(str(dump), *common, "--msprobe-max-memory", "768KiB", "--msprobe-out", "cut")
    whole = api_records(pytester, "whole")["Functional.gelu.0.forward"]
    cut = api_records(pytester, "cut")["Functional.gelu.0.forward"]
    assert "magnitude_s" in whole["timings"] and cut["pieces"]["blocks"] > 1, cut["message"]
    _same(whole, cut)


# a correct linear whose sums take an order set by the shape of the call, as some GEMM libraries' do; in place for
# the inner run only (pytester runs it in this process)
SHAPE_DEPENDENT = """
import torch
import torch.nn.functional as F
ORIGINAL = F.linear
def linear(x, w, b=None):
    step = 8 << ((w.shape[0] + x.reshape(-1, x.shape[-1]).shape[0]) % 4)
    out = (x[..., :step].float() @ w[:, :step].float().T)
    for k in range(step, x.shape[-1], step):
        out = out + x[..., k:k + step].float() @ w[:, k:k + step].float().T
    out = out if b is None else out + b.float()
    return out.to(x.dtype)
def pytest_configure(config):
    F.linear = linear
def pytest_unconfigure(config):
    F.linear = ORIGINAL
"""


@pytest.mark.parametrize("library", ["host", "shape-dependent"])
def test_a_wide_contraction_is_cut_along_its_weight_too(pytester: pytest.Pytester, library: str) -> None:
    if library != "host":
        pytester.makeconftest(SHAPE_DEPENDENT)
    t = "torch.bfloat16"
    dump = make_dump(pytester, {"Functional.linear.0.forward": {
        "input_args": [tensor(t, [1, 600, 4096], mx=1.0, mn=-1.0), tensor(t, [2051, 4096], mx=0.1, mn=-0.1)],
        "input_kwargs": {}, "output": [tensor(t, [1, 600, 2051])]}})
    common = ["-p", "no:cacheprovider", "-o", "msprobe_helper_thread=off"]
    pytester.runpytest(str(dump), *common, "--msprobe-out", "whole")
    pytester.runpytest(str(dump), *common, "--msprobe-max-memory", "32MiB", "--msprobe-out", "cut")
    whole, cut = api_records(pytester, "whole"), api_records(pytester, "cut")
    key = "Functional.linear.0.forward"
    assert cut[key]["pieces"]["columns"] < 2051 and cut[key]["pieces"]["rows"] < 600
    _same(whole[key], cut[key])


def _backward_entries(dt: str) -> dict[str, Any]:
    """A linear and a matmul with both gradients, a linear with the weight's alone; wide enough to be cut in rows
    and in columns."""
    def t(shape: list[int], mx: float = 1.0, rg: bool = False) -> dict[str, Any]:
        return tensor(dt, shape, mx=mx, mn=-mx, requires_grad=rg)

    def pair(name: str, args: list[Any], out: list[int], grads: list[Any]) -> dict[str, Any]:
        return {f"{name}.forward": {"input_args": args, "input_kwargs": {}, "output": [t(out)]},
                f"{name}.backward": {"input": [t(out)], "output": grads}}

    return {**pair("Functional.linear.0", [t([1, 600, 320], rg=True), t([520, 320], 0.2, True)], [1, 600, 520],
                   [t([1, 600, 320]), t([520, 320])]),
            **pair("Torch.matmul.0", [t([2, 300, 320], rg=True), t([320, 400], rg=True)], [2, 300, 400],
                   [t([2, 300, 320]), t([320, 400])]),
            **pair("Functional.linear.1", [t([600, 320]), t([520, 320], 0.2, True)], [600, 520],
                   [None, t([520, 320])])}


# a correct matmul whose sums take an order set by the shape of the call (the bench's gradients are matmuls); and
# the device's linear with the first rows of its weight's gradient 2 % off
SHAPE_DEPENDENT_MATMUL = device_side_conftest("""
import torch
import torch.nn.functional as F
ORIGINAL = torch.matmul
def matmul(a, b, **k):
    if k or a.dim() != 2 or b.dim() != 2 or not a.is_floating_point():
        return ORIGINAL(a, b, **k)
    step = 8 << ((a.shape[0] + b.shape[1]) % 4)
    out = ORIGINAL(a[:, :step], b[:step])
    for k0 in range(step, a.shape[1], step):
        out = out + ORIGINAL(a[:, k0:k0 + step], b[k0:k0 + step])
    return out
class _Off(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w):
        return w.view_as(w)
    @staticmethod
    def backward(ctx, g):
        g = g.clone()
        g[:8] *= 1.02
        return g
def linear(orig, x, w, *a, **k):
    return orig(x, _Off.apply(w), *a, **k)
IMPLS = {F.linear: linear}
def pytest_configure(config):
    torch.matmul = matmul
def pytest_unconfigure(config):
    torch.matmul = ORIGINAL
""")


@pytest.mark.parametrize("dt", ["torch.bfloat16", "torch.float32"])
@pytest.mark.parametrize("library", ["host", "shape-dependent"])
def test_backward_items_of_contractions_are_cut_with_the_whole_checks_records(pytester: pytest.Pytester, dt: str,
                                                                              library: str) -> None:
    """A linear's and a matmul's input and weight gradients in pieces of rows and columns: records equal to the
    whole check's, with a GEMM library of the host's or one whose order follows the shape of the call."""
    if library != "host":
        pytester.makeconftest(SHAPE_DEPENDENT_MATMUL)
    entries = _backward_entries(dt)
    dump = make_dump(pytester, entries)
    common = ["-p", "no:cacheprovider", "-o", "msprobe_helper_thread=off"]
    pytester.runpytest(str(dump), *common, "--msprobe-max-memory", "64GiB", "--msprobe-out", "whole")
    budget = "6MiB" if dt == "torch.bfloat16" else "8MiB"  # an fp32 gradient's bench is in fp64
    pytester.runpytest(str(dump), *common, "--msprobe-max-memory", budget, "--msprobe-out", "cut")
    whole, cut = api_records(pytester, "whole"), api_records(pytester, "cut")
    backward = [k for k in entries if k.endswith(".backward")]
    assert set(backward) <= whole.keys() == cut.keys()
    for key in backward:
        assert "pieces" not in whole[key] and cut[key]["pieces"]["blocks"] > 1, (key, cut[key]["message"])
        assert [o["name"].rsplit(".", 1)[1] for o in cut[key]["outputs"]] == (["1"] if ".1." in key else ["0", "1"])
        _same(whole[key], cut[key])
    if library != "host":  # the device's weight gradient fails, whole and in pieces; its input gradient passes
        rows = {o["name"].rsplit(".", 1)[1]: o["verdict"] for o in cut["Functional.linear.0.backward"]["outputs"]}
        assert rows == {"0": "pass", "1": "error"}, rows


# the device's silu with its input's gradient 2 % off where x > 3
SILU_GRADIENT_OFF = device_side_conftest("""
import torch
import torch.nn.functional as F
class _Off(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.view_as(x)
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return torch.where(x > 3, g * 1.02, g)
def silu(orig, x, *a, **k):
    return orig(_Off.apply(x), *a, **k)
IMPLS = {F.silu: silu}
""")


@pytest.mark.parametrize("dt", ["torch.bfloat16", "torch.float32"])
def test_row_local_gradients_are_cut_with_the_whole_checks_records(pytester: pytest.Pytester, dt: str) -> None:
    """The backward of pointwise ops, a softmax and a norm whose weight takes no gradient, a block of rows at a
    time: records equal to the whole check's, the planted gradient error found in pieces too; a norm whose weight
    takes a gradient (a sum over rows) is not cut."""
    pytester.makeconftest(SILU_GRADIENT_OFF)

    def t(shape: list[int], mx: float = 1.0, rg: bool = False) -> dict[str, Any]:
        return tensor(dt, shape, mx=mx, mn=-mx, requires_grad=rg)

    def pair(name: str, args: list[Any], out: list[int], grads: list[Any]) -> dict[str, Any]:
        return {f"{name}.forward": {"input_args": args, "input_kwargs": {}, "output": [t(out)]},
                f"{name}.backward": {"input": [t(out)], "output": grads}}

    rows = [512, 192]
    entries = {**pair("Functional.silu.0", [t(rows, 6.0, True)], rows, [t(rows)]),
               **pair("Functional.softmax.0", [t([4, 128, 192], 8.0, True), _int(-1)], [4, 128, 192],
                      [t([4, 128, 192])]),
               **pair("Torch.mul.0", [t(rows, rg=True), t(rows, rg=True)], rows, [t(rows), t(rows)]),
               **pair("Functional.rms_norm.0", [t(rows, rg=True), [_int(192)], t([192])], rows, [t(rows), None]),
               **pair("Functional.layer_norm.0", [t(rows, rg=True), [_int(192)], t([192], rg=True)], rows,
                      [t(rows), t([192])])}
    dump = make_dump(pytester, entries)
    common = ["-p", "no:cacheprovider", "-o", "msprobe_helper_thread=off"]
    pytester.runpytest(str(dump), *common, "--msprobe-max-memory", "64GiB", "--msprobe-out", "whole")
    budget = "1MiB" if dt == "torch.bfloat16" else "2MiB"
    pytester.runpytest(str(dump), *common, "--msprobe-max-memory", budget, "--msprobe-out", "cut")
    whole, cut = api_records(pytester, "whole"), api_records(pytester, "cut")
    for key in (k for k in entries if k.endswith(".backward") and "layer_norm" not in k):
        assert cut[key]["pieces"]["blocks"] > 1, (key, cut[key]["message"])
        _same(whole[key], cut[key])
    assert cut["Functional.silu.0.backward"]["status"] == "error"
    assert whole["Functional.softmax.0.backward"]["status"] == "pass"
    norm = cut["Functional.layer_norm.0.backward"]
    assert norm["status"] == "SKIP" and "its gradients are not cut in pieces" in norm["message"]


def test_by_default_an_item_is_cut_to_its_dumps_largest_call_and_one_that_cannot_be_runs_whole(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default budget (no --msprobe-max-memory) keeps a process within HEADROOM times its dump's largest call
    (here the linear's own 10 MiB; the process's resident memory read as none, and the floor lowered to 4 MiB so
    that calls this small are cut): the linear is cut, with the whole check's record, and a cumsum, which cannot
    be cut, runs whole since the host has room for it."""
    from pytest_msprobe.check import chunked
    from pytest_msprobe.runs import memory

    monkeypatch.setattr(chunked, "FLOOR", 4 << 20)
    monkeypatch.setattr(memory, "resident_bytes", lambda: 0)
    t = "torch.bfloat16"
    dump = make_dump(pytester, {
        "Functional.linear.0.forward": {"input_args": [tensor(t, [1, 2048, 1024]), tensor(t, [1024, 1024], 0.1, -0.1)],
                                        "input_kwargs": {}, "output": [tensor(t, [1, 2048, 1024])]},
        "Torch.cumsum.0.forward": {"input_args": [tensor("torch.float32", [1024, 1024]), _int(0)], "input_kwargs": {},
                                   "output": [tensor("torch.float32", [1024, 1024])]}})
    common = ["-p", "no:cacheprovider", "-o", "msprobe_helper_thread=off"]
    pytester.runpytest(str(dump), *common, "--msprobe-max-memory", "64GiB", "--msprobe-out", "whole")
    result = pytester.runpytest(str(dump), *common, "--msprobe-out", "default")
    assert result.ret == 0
    whole, default = api_records(pytester, "whole"), api_records(pytester, "default")
    linear, cumsum = default["Functional.linear.0.forward"], default["Torch.cumsum.0.forward"]
    own = (2048 * 1024 * 2 + 1024 * 1024) * 2
    assert linear["pieces"]["budget"] == int(chunked.HEADROOM * own) - 2048 * 1024 * 2 < linear["pieces"]["need"]
    _same(whole["Functional.linear.0.forward"], linear)
    assert "pieces" not in cumsum and cumsum["status"] == "pass"
    assert any(n.startswith("checked whole, within the ") and "rows are not independent" in n
               for n in cumsum["notes"]), cumsum["notes"]


def test_in_pieces_under_xdist_as_in_one_process(pytester: pytest.Pytester) -> None:
    dump = make_dump(pytester, _entries("torch.bfloat16"))
    pytester.runpytest(str(dump), "-p", "no:cacheprovider", "--msprobe-max-memory", "768KiB", "--msprobe-out", "one")
    pytester.runpytest(str(dump), "-p", "no:cacheprovider", "-n", "2", "-o", "msprobe_min_work_per_worker=0",
                       "--msprobe-max-memory", "768KiB", "--msprobe-out", "two")
    one, two = api_records(pytester, "one"), api_records(pytester, "two")
    assert one.keys() == two.keys() and all("pieces" in r for r in two.values())
    for key in one:
        _same(one[key], two[key])


def test_what_cannot_be_cut_and_does_not_fit_is_skipped_with_the_reason(pytester: pytest.Pytester) -> None:
    t = "torch.float32"
    dump = make_dump(pytester, {
        "Torch.cumsum.0.forward": {"input_args": [tensor(t, [512, 96]), _int(0)], "input_kwargs": {},
                                   "output": [tensor(t, [512, 96])]},
        "Functional.silu.0.forward": {"input_args": [tensor(t, [512, 96], requires_grad=True)], "input_kwargs": {},
                                      "output": [tensor(t, [512, 96])]},
        "Functional.silu.0.backward": {"input": [tensor(t, [512, 96])], "output": [tensor(t, [512, 96])]},
    })
    result = pytester.runpytest(str(dump), "-p", "no:cacheprovider", "-rs", "--msprobe-max-memory", "64KiB")
    records = api_records(pytester)
    cumsum, backward = records["Torch.cumsum.0.forward"], records["Functional.silu.0.backward"]
    assert cumsum["status"] == backward["status"] == "SKIP"
    assert "over the memory budget of 64 KiB (--msprobe-max-memory)" in cumsum["message"]
    assert "rows are not independent" in cumsum["message"]
    for silu in (backward, records["Functional.silu.0.forward"]):  # cut by rows, but 64 rows do not fit either
        assert "even one piece" in silu["message"]
    result.assert_outcomes(skipped=3)


def test_bench_device_cpu_is_todays_bench_and_a_bad_device_is_one_usage_line(pytester: pytest.Pytester) -> None:
    dump = make_dump(pytester, _entries("torch.bfloat16"))
    pytester.runpytest(str(dump), "-p", "no:cacheprovider", "--msprobe-out", "default")
    pytester.runpytest(str(dump), "-p", "no:cacheprovider", "-o", "msprobe_bench_device=cpu", "--msprobe-out", "cpu")
    default, cpu = api_records(pytester, "default"), api_records(pytester, "cpu")
    for key, record in default.items():
        assert record["bench_device"] in ("cpu (fp32)", "cpu (fp64)")  # fp64: raise_map_by_api
        _same(record, cpu[key])
    result = pytester.runpytest(str(dump), "-p", "no:cacheprovider", "-o", "msprobe_bench_device=gpu")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: ini msprobe_bench_device: 'gpu' is not a bench device (cpu, cuda, cuda:N, "
                                 "npu, npu:N)"])
    result = pytester.runpytest(str(dump), "-p", "no:cacheprovider", "--msprobe-max-memory", "lots")
    result.stderr.fnmatch_lines(["ERROR: --msprobe-max-memory: 'lots' is not a size (e.g. 8GiB, 512MiB, 2000000000)"])


def test_an_unusable_bench_device_is_one_usage_line(pytester: pytest.Pytester) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the unusable-device line needs a machine without it")
    dump = make_dump(pytester, _entries("torch.bfloat16"))
    pytester.makeini("[pytest]\nmsprobe_bench_device = cuda\n")
    result = pytester.runpytest(str(dump), "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: ini msprobe_bench_device cuda: torch.cuda.is_available() is False on this "
                                 "machine"])


def test_the_failure_text_says_where_a_bench_off_the_cpu_ran() -> None:
    from pytest_msprobe.records.record import Record
    from pytest_msprobe.reports.failure import format_failure

    plain = {"api": "Functional.linear.0", "direction": "forward", "status": "error", "device": "cpu",
             "standard": "strict", "outputs": [], "bench_device": "cuda:0 (fp32, TF32 off)",
             "reference": "magnitude: the API on |inputs| in fp32 on cuda:0", "seed": 1}
    assert "bench: cuda:0 (fp32, TF32 off); third run: magnitude: the API on |inputs| in fp32 on cuda:0" in \
        format_failure(Record.from_dict(plain), "pytest ...").splitlines()
    on_cpu = Record.from_dict({**plain, "bench_device": "cpu (fp32)"})
    assert not any(line.startswith("bench:") for line in format_failure(on_cpu, "pytest ...").splitlines())


def test_an_fp32_outputs_bench_stays_on_a_device_without_fp64() -> None:
    import torch

    from pytest_msprobe.runs import bench_device

    assert bench_device.placement("npu:0", torch.float64, [torch.float32]) == "cpu"
    assert bench_device.placement("npu:0", torch.float32, [torch.bfloat16]) == "npu:0"
    assert bench_device.placement("cuda:1", torch.float64, [torch.float32]) == "cuda:1"
    assert bench_device.placement("npu:0", None, [torch.float64]) == "cpu"
    assert bench_device.describe("npu:0", torch.float32) == "npu:0 (fp32, HF32 off)"
    assert bench_device.describe("cpu", torch.float64) == "cpu (fp64)"


def test_tf32_is_off_inside_a_cuda_bench_and_back_after() -> None:
    import torch

    from pytest_msprobe.runs import bench_device

    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        with bench_device.ieee_fp32("cuda:0"):  # the flags alone: no GPU is touched
            assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (False, False)
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (True, True)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
