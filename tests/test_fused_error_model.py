"""The error model of fused NPU ops: the `strict` standard's third run of an NPU op is its reference with
the roundings a sound 16-bit kernel makes (api_specs/bench_functions.yaml `rounded`), so sound kernels
(flash attention with P in the input dtype, Hugging Face's RMSNorm) pass while kernel bugs still fail,
forward and backward. The kernels are the fused-op suite's (evals/planted/fused.py).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import bench_functions
from bench_functions import activations, attention, norms, rotary
from evals.planted import fused_dump
from tests.helpers import ROOT, api_records

SPEC = "evals.planted.fused:TABLES"


def check(dump: Path, arm: str | None, apis: set[str] | None = None) -> dict[str, dict[str, Any]]:
    from evals.planted_fused import run

    return run(dump, f"{SPEC}.{arm}" if arm else None, "strict", apis)


@pytest.fixture(scope="module")
def dump_bf16(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Attention at 512 tokens (B 1, N 4, D 64, BNSD, the size at which a sound flash kernel failed),
    RMSNorm, rotary and SwiGLU of a small layer, bf16, forward and backward."""
    d = fused_dump.Dump()
    torch.manual_seed(0)
    dt = torch.bfloat16
    d.call("npu_fusion_attention", [*(torch.randn(1, 4, 512, 64).to(dt) for _ in range(3)), 4, "BNSD"],
           {"scale": 0.125}, grad=(0, 1, 2))
    fused_dump.norms_and_mlp(d, dt, "small")
    return d.write(tmp_path_factory.mktemp("fused") / "bf16")


def statuses(records: dict[str, dict[str, Any]]) -> dict[str, str]:
    return {k: r["status"] for k, r in records.items()}


def test_every_rounded_reference_resolves_and_a_registered_reference_drops_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    declared = bench_functions._specs()["rounded"]
    assert {"npu_fusion_attention", "npu_rms_norm", "npu_rotary_mul", "npu_swiglu", "npu_group_norm_silu"} <= set(declared)
    for name in declared:
        assert name in bench_functions.names() and callable(bench_functions.get_rounded(name))
    assert bench_functions.get_rounded("npu_fast_gelu") is None
    monkeypatch.setitem(bench_functions._REGISTRY, "npu_rms_norm", norms.npu_rms_norm)
    assert bench_functions.get_rounded("npu_rms_norm") is None  # a user's own reference has no rounded form


def test_rounded_attention_rounds_p_only_in_16_bit() -> None:
    torch.manual_seed(1)
    q, k, v = (torch.randn(1, 2, 96, 32) for _ in range(3))
    plain = attention.npu_fusion_attention(q, k, v, 2, "BNSD", scale=0.2)[0]
    assert torch.equal(attention.npu_fusion_attention_rounded(q, k, v, 2, "BNSD", scale=0.2)[0], plain)
    qb, kb, vb = (x.bfloat16() for x in (q, k, v))
    got = attention.npu_fusion_attention_rounded(qb, kb, vb, 2, "BNSD", scale=0.2)[0]
    s = (qb.float() @ kb.float().transpose(-1, -2)) * 0.2  # one tile: the online softmax is the two-pass one
    p = torch.exp(s - s.amax(-1, keepdim=True))
    want = ((p.bfloat16().float() @ vb.float()) / p.sum(-1, keepdim=True)).bfloat16()
    assert torch.equal(got, want)
    assert not torch.equal(got, attention.npu_fusion_attention(qb, kb, vb, 2, "BNSD", scale=0.2)[0])


def test_rounded_attention_backward_moves_delta_by_the_size_of_the_stored_outputs_rounding() -> None:
    torch.manual_seed(4)
    q, k, v, dy = (torch.randn(1, 2, 64, 32) for _ in range(4))

    def grads(fn: Any, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        leaves = [x.to(dtype).requires_grad_(True) for x in (q, k, v)]
        out = fn(*leaves, 2, "BNSD", scale=0.2)[0]
        return tuple(torch.autograd.grad(out, leaves, dy.to(dtype)))

    for a, b in zip(grads(attention.npu_fusion_attention_rounded, torch.float32),
                    grads(attention.npu_fusion_attention, torch.float32)):
        assert torch.equal(a, b)  # fp32 inputs: nothing is rounded
    plan = attention.Call(q.bfloat16(), k, v, 2, "BNSD", pse=None, padding_mask=None, atten_mask=None, scale=0.2,
                          keep_prob=1.0, pre=0, nxt=0, prefix=None, actual_seq_qlen=None, actual_seq_kvlen=None,
                          sparse_mode=0).plan
    plan.rounding = torch.bfloat16
    out = torch.tensor([[1.0, 3.0]])
    unit = torch.tensor([[2.0 ** -7, 2.0 ** -6]])  # bf16 spacing at 1 and at 3
    grad = torch.tensor([[2.0, -1.0]])
    assert torch.equal(plan.delta_rounding(out, grad), 0.5 * (grad * unit).square().sum(-1).sqrt())


def test_rounded_norm_rotary_swiglu_are_the_eager_forms_and_their_backwards_their_autograd() -> None:
    torch.manual_seed(2)
    dt = torch.bfloat16
    x, gamma = torch.randn(6, 64).to(dt), (1 + 0.1 * torch.randn(64)).to(dt)
    xf = x.float()
    hf = gamma * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(dt)  # LlamaRMSNorm
    y, rstd = norms.npu_rms_norm_rounded(x, gamma)
    assert torch.equal(y, hf)
    dy = torch.randn(6, 64).to(dt)
    xl, gl = x.clone().requires_grad_(True), gamma.clone().requires_grad_(True)
    auto = torch.autograd.grad(norms.npu_rms_norm_rounded(xl, gl)[0], (xl, gl), dy)
    got = norms.npu_rms_norm_backward_rounded(dy, x, gamma, rstd)
    for a, b in zip(auto, got):  # the same roundings; fp32 summation orders may differ by an ULP
        torch.testing.assert_close(a.float(), b.float(), rtol=2 ** -7, atol=1e-3)
    xs = torch.randn(6, 128).to(dt)
    a, b = xs.chunk(2, -1)
    assert torch.equal(activations.npu_swiglu_rounded(xs), F.silu(a) * b)
    xl = xs.clone().requires_grad_(True)
    g = torch.randn(6, 64).to(dt)
    (auto_x,) = torch.autograd.grad(activations.npu_swiglu_rounded(xl), xl, g)
    assert torch.equal(activations.npu_swiglu_backward_rounded(g, xs), auto_x)
    xr, r1, r2 = torch.randn(2, 5, 3, 64).to(dt), torch.randn(1, 5, 1, 64).to(dt), torch.randn(1, 5, 1, 64).to(dt)
    assert torch.equal(rotary.npu_rotary_mul_rounded(xr, r1, r2), xr * r1 + rotary.rotate(xr, "half") * r2)


def test_sound_flash_and_hf_rmsnorm_failed_without_the_rounded_reference(dump_bf16: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The suite's measurement, at a test's size: with the plain reference as the third run ("torch
    run: 0") these sound kernels fail; with the rounded one they pass (next test)."""
    monkeypatch.setattr(bench_functions, "get_rounded", lambda name: None)
    flash = check(dump_bf16, "flash_p16", {"NPU.npu_fusion_attention"})
    assert flash["NPU.npu_fusion_attention.0.backward"]["status"] == "error"
    rms = check(dump_bf16, "rms_hf", {"NPU.npu_rms_norm"})
    assert rms["NPU.npu_rms_norm.0.forward"]["status"] == "error"
    assert "mean error: 0.143 > limit 0.1 (torch run: 8.85e-06)" in rms["NPU.npu_rms_norm.0.forward"]["outputs"][0][
        "verdict_message"]  # the plain reference loses
    # nothing (9e-6 ULP on average)


@pytest.mark.parametrize("arm", ["flash_p16", "flash_p16_ds16", "flash_fp32", "rms_hf", "rotary_eager",
                                 "swiglu_eager", "fp32"])
def test_sound_kernels_pass_forward_and_backward(dump_bf16: Path, arm: str) -> None:
    got = check(dump_bf16, arm)
    assert got and {k for k in got if k.endswith(".backward")}, got
    assert set(statuses(got).values()) == {"pass"}, {k: r["message"] or r["outputs"] for k, r in got.items()
                                                     if r["status"] != "pass"}
    assert all("sound kernel's roundings" in r["reference"] for r in got.values())


@pytest.mark.parametrize(("arm", "items"), [
    ("flash_rowsum16", ["NPU.npu_fusion_attention.0.forward", "NPU.npu_fusion_attention.0.backward"]),
    ("flash_scale", ["NPU.npu_fusion_attention.0.forward", "NPU.npu_fusion_attention.0.backward"]),
    ("flash_dk_scale", ["NPU.npu_fusion_attention.0.backward"]),
    ("rms_msq16", ["NPU.npu_rms_norm.0.forward", "NPU.npu_rms_norm.0.backward"]),  # backward: the row check
    ("rotary_sign", ["NPU.npu_rotary_mul.0.forward", "NPU.npu_rotary_mul.0.backward"]),
    ("rotary_back", ["NPU.npu_rotary_mul.0.backward"]),
    ("swiglu_swap", ["NPU.npu_swiglu.0.forward", "NPU.npu_swiglu.0.backward"]),
    ("swiglu_dsilu", ["NPU.npu_swiglu.0.backward"]),
    ("truncate", ["NPU.npu_rms_norm.0.forward", "NPU.npu_rotary_mul.0.forward", "NPU.npu_swiglu.0.forward"]),
])
def test_fused_kernel_bugs_fail(dump_bf16: Path, arm: str, items: list[str]) -> None:
    got = check(dump_bf16, arm)
    assert {i: got[i]["status"] for i in items} == {i: "error" for i in items}


FLASH_CONFTEST = """
import sys
sys.path.insert(0, {root!r})
"""


@pytest.mark.parametrize("workers", [(), ("-n", "2")])
def test_end_to_end_a_sound_flash_kernel_passes_and_a_buggy_one_fails(pytester: pytest.Pytester,
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      workers: tuple[str, ...]) -> None:
    torch.manual_seed(3)
    d = fused_dump.Dump()
    d.call("npu_fusion_attention", [*(torch.randn(1, 2, 256, 64).bfloat16() for _ in range(3)), 2, "BNSD"],
           {"scale": 0.125}, grad=(0, 1, 2))
    dump = d.write(pytester.path / "attn")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    sound = pytester.runpytest_subprocess(str(dump), "--msprobe-kernels", f"{SPEC}.flash_p16", *workers)
    assert sound.parseoutcomes() == {"passed": 2}, sound.stdout.str()
    records = api_records(pytester)
    assert records["NPU.npu_fusion_attention.0.backward"]["impl"].endswith("(substituted)")
    buggy = pytester.runpytest_subprocess(str(dump), "--msprobe-kernels", f"{SPEC}.flash_rowsum16", *workers,
                                          "--msprobe-out", "buggy")
    assert buggy.parseoutcomes().get("failed") == 2, buggy.stdout.str()
    buggy.stdout.fnmatch_lines(["*NPU.npu_fusion_attention.0.forward*error*"])


@pytest.mark.parametrize("workers", [(), ("-n", "2")])
def test_end_to_end_a_norm_whose_rows_share_an_error_fails_its_backward_item(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, workers: tuple[str, ...]) -> None:
    """RMSNorm's mean of squares in bf16 (each row of dx scaled by its own error) fails the backward item
    on the row check; Hugging Face's sound RMSNorm passes both items."""
    torch.manual_seed(5)
    d = fused_dump.Dump()
    d.call("npu_rms_norm", [torch.randn(2, 64, 256).bfloat16(), (1 + 0.1 * torch.randn(256)).bfloat16()],
           {"epsilon": 1e-6}, grad=(0, 1))
    dump = d.write(pytester.path / "rms")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    sound = pytester.runpytest_subprocess(str(dump), "--msprobe-kernels", f"{SPEC}.rms_hf", *workers)
    assert sound.parseoutcomes() == {"passed": 2}, sound.stdout.str()
    buggy = pytester.runpytest_subprocess(str(dump), "--msprobe-kernels", f"{SPEC}.rms_msq16", *workers,
                                          "--msprobe-out", "buggy")
    assert buggy.parseoutcomes().get("failed") == 2, buggy.stdout.str()
    backward = api_records(pytester, "buggy")["NPU.npu_rms_norm.0.backward"]
    assert any("row error: " in (o.get("verdict_message") or "") for o in backward["outputs"]), backward


def test_the_worked_example_sound_kernel_passes_and_the_bf16_rowsum_fails(pytester: pytest.Pytester) -> None:
    example = ROOT / "examples" / "fused_attention"
    kernels = example / "kernels.py"
    sound = pytester.runpytest_subprocess(str(example), "--msprobe-kernels", f"{kernels}:SOUND", "-k", "0.forward")
    assert sound.parseoutcomes() == {"passed": 1, "deselected": 3}, sound.stdout.str()
    buggy = pytester.runpytest_subprocess(str(example), "--msprobe-kernels", f"{kernels}:BUGGY", "-k", "0.forward")
    assert buggy.parseoutcomes().get("failed") == 1, buggy.stdout.str()
    buggy.stdout.fnmatch_lines(["*output.0: mean error:*torch run:*"])


def test_rms_norms_bench_is_fp64_under_strict_only() -> None:
    from pytest_msprobe.runs.precision import PrecisionPolicy, plan_precision
    from pytest_msprobe.specs.loader import load_specs

    specs = load_specs()
    x = [torch.zeros(2, 8, dtype=torch.bfloat16), torch.ones(8, dtype=torch.bfloat16)]
    for api in ("npu_rms_norm", "npu_add_rms_norm"):
        assert plan_precision(api, x, {}, torch.bfloat16, specs, PrecisionPolicy(standard="strict")).raise_to == torch.float64
        assert plan_precision(api, x, {}, torch.bfloat16, specs, PrecisionPolicy(standard="msprobe")).raise_to == torch.float32
    other = plan_precision("npu_scaled_masked_softmax", x[:1], {}, torch.bfloat16, specs, PrecisionPolicy(standard="strict"))
    assert other.raise_to == torch.float32  # another reduction keeps msprobe's raise


def test_rounded_group_norm_silu_is_the_eager_form_and_its_backward_eager_autograd() -> None:
    torch.manual_seed(3)
    dt = torch.bfloat16
    x, w, b = torch.randn(2, 8, 4, 4).to(dt), (1 + 0.1 * torch.randn(8)).to(dt), (0.1 * torch.randn(8)).to(dt)
    y, mean, rstd = norms.npu_group_norm_silu_rounded(x, w, b, 4)
    assert torch.equal(y, F.silu(F.group_norm(x, 4, w, b, 1e-5)))  # the norm's output rounded, then silu
    plain = norms.npu_group_norm_silu(x, w, b, 4)
    assert not torch.equal(y, plain[0]) and torch.equal(mean, plain[1]) and torch.equal(rstd, plain[2])
    xl, xe = (x.clone().requires_grad_(True) for _ in range(2))
    dy = torch.randn(2, 8, 4, 4).to(dt)
    (got,) = torch.autograd.grad(norms.npu_group_norm_silu_rounded(xl, w, b, 4)[0], xl, dy)
    (eager,) = torch.autograd.grad(F.silu(F.group_norm(xe, 4, w, b, 1e-5)), xe, dy)
    assert torch.equal(got, eager)


@pytest.fixture(scope="module")
def dump_gns(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """npu_group_norm_silu as the fused-op suite records it (small size), bf16, forward and backward."""
    d = fused_dump.Dump()
    torch.manual_seed(0)
    dt = torch.bfloat16
    d.call("npu_group_norm_silu", [torch.randn(2, 32, 8, 8).to(dt), (1 + 0.1 * torch.randn(32)).to(dt),
                                   (0.1 * torch.randn(32)).to(dt), 8], {}, grad=(0,))
    return d.write(tmp_path_factory.mktemp("fused") / "gns")


def test_sound_group_norm_silu_kernels_pass_and_eager_failed_without_the_rounded_reference(
        dump_gns: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    apis = {"NPU.npu_group_norm_silu"}
    for arm in ("gns_eager", "gns_silu32", "fp32"):
        got = check(dump_gns, arm, apis)
        assert set(statuses(got).values()) == {"pass"} and len(got) == 2, {k: r["outputs"] for k, r in got.items()}
    assert check(dump_gns, "grad_truncate", apis)["NPU.npu_group_norm_silu.0.backward"]["status"] == "error"
    assert check(dump_gns, "truncate", apis)["NPU.npu_group_norm_silu.0.forward"]["status"] == "error"
    monkeypatch.setattr(bench_functions, "get_rounded", lambda name: None)
    plain = check(dump_gns, "gns_eager", apis)  # the third run was the fp32-once reference: "torch run: 0"
    assert statuses(plain) == {"NPU.npu_group_norm_silu.0.forward": "error",
                               "NPU.npu_group_norm_silu.0.backward": "error"}
    assert "mean error" in plain["NPU.npu_group_norm_silu.0.backward"]["outputs"][0]["verdict_message"]
