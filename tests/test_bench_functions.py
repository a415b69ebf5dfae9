"""bench_functions: every reference against an independent float64 formulation, every backward against autograd.

The independent formulations are written here from the torch_npu docs (masks with triu/tril as the docs'
own example builds them, attention with scaled_dot_product_attention and an explicit float mask, rotary by
complex multiplication, norms by hand, optimizers with torch.optim), never by calling into the module
under test.
"""
from __future__ import annotations

import importlib.metadata
import inspect
import json
import math
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bench_functions
from bench_functions import (
    BenchUnsupported,
    activations,
    attention,
    attention_tiles,
    matmul,
    moe,
    norms,
    optimizers,
    rotary,
    tensor_ops,
)
from pytest_msprobe.specs.loader import load_specs

from .helpers import EXAMPLES, tensor

F64 = torch.float64
MAX = 2147483647
PROP = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ATTENTION_PROP = settings(PROP, max_examples=60)


def rand(*shape: int, gen: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen, dtype=F64) * scale).requires_grad_(True)


def grads(out: torch.Tensor, inputs: list[torch.Tensor], cot: torch.Tensor) -> list[torch.Tensor]:
    got = torch.autograd.grad(out, inputs, cot, allow_unused=True)
    return [torch.zeros_like(i) if g is None else g for g, i in zip(got, inputs)]


def close(a: Any, b: Any, tol: float = 1e-10) -> None:
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


@contextmanager
def blocks(bq: int, bk: int) -> Iterator[None]:
    """Tiles smaller than the sequences, so the online softmax really crosses blocks."""
    old = attention_tiles.BLOCK_Q, attention_tiles.BLOCK_K
    attention_tiles.BLOCK_Q, attention_tiles.BLOCK_K = bq, bk
    try:
        yield
    finally:
        attention_tiles.BLOCK_Q, attention_tiles.BLOCK_K = old


# ----------------------------------------------------------------------------- registry

def test_every_declared_op_resolves_and_every_backward_is_declared() -> None:
    declared = load_specs()["bench_functions"]
    for name, entry in declared.items():
        assert callable(bench_functions.get(name)), name
        if "backward" in entry:
            assert entry["backward"] in declared and bench_functions.get_backward(name) is bench_functions.get(
                entry["backward"])
    assert set(declared) <= set(bench_functions.names())
    assert bench_functions.get("fast_gelu") is activations.npu_fast_gelu  # torch_npu.fast_gelu alias
    assert bench_functions.get("npu_not_an_op") is None


def test_register_wins_over_the_declaration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench_functions, "_REGISTRY", {})
    mine = bench_functions.register("npu_rms_norm")(lambda x, g, epsilon=1e-6: x)
    assert bench_functions.get("npu_rms_norm") is mine
    bench_functions.register("npu_brand_new")(mine)
    assert "npu_brand_new" in bench_functions.names()


def test_entry_points_load_lazily_modules_and_callables_and_survive_broken_ones(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "ep_bench_mod.py").write_text(
        "import bench_functions\n"
        "bench_functions.register('npu_from_module')(lambda x: x * 2)\n"
        "def ready():\n"
        "    bench_functions.register('npu_from_callable')(lambda x: x + 1)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    group = bench_functions.ENTRY_POINT_GROUP
    eps = [importlib.metadata.EntryPoint("mod", "ep_bench_mod", group),
           importlib.metadata.EntryPoint("fn", "ep_bench_mod:ready", group),
           importlib.metadata.EntryPoint("broken", "ep_no_such_module_xyz", group)]
    monkeypatch.setattr(bench_functions, "_REGISTRY", {})
    monkeypatch.setattr(bench_functions, "_entry_points_loaded", False)
    monkeypatch.setattr(bench_functions, "_entry_points", lambda: eps)
    try:
        with pytest.warns(UserWarning, match="broken"):
            assert bench_functions.get("npu_from_module")(3) == 6  # loaded on first use, not at import
        assert bench_functions.get("npu_from_callable")(1) == 2
        assert {"npu_from_module", "npu_from_callable"} <= set(bench_functions.names())
    finally:
        sys.modules.pop("ep_bench_mod", None)


def test_example_custom_bench_runs_from_its_conftest(pytester: pytest.Pytester) -> None:
    pytester.copy_example(str(EXAMPLES / "custom_bench"))
    result = pytester.runpytest("step0", "--msprobe-device", "cpu", "--msprobe-out", "out")
    result.assert_outcomes()  # no NPU here: both items only checked the reference (counted apart from passed)
    assert result.parseoutcomes()["reference"] == 2


def test_defaults_are_torch_npus() -> None:
    def defaults(fn: Any) -> dict[str, Any]:
        return {k: p.default for k, p in inspect.signature(fn).parameters.items() if p.default is not p.empty}

    fa = defaults(attention.npu_fusion_attention)  # torch_npu docs, npu_fusion_attention 参数说明
    assert (fa["scale"], fa["keep_prob"], fa["pre_tockens"], fa["next_tockens"], fa["sparse_mode"]) == \
        (1.0, 1.0, MAX, MAX, 0)
    assert defaults(attention.npu_fusion_attention_grad)["scale_value"] == 1.0
    assert defaults(attention.npu_fusion_attention_v2)["pse_type"] == 1
    assert defaults(norms.npu_rms_norm)["epsilon"] == 1e-6 and defaults(norms.npu_add_rms_norm)["epsilon"] == 1e-6
    assert defaults(norms.npu_layer_norm_eval)["eps"] == 1e-5 and defaults(norms.npu_group_norm_silu)["eps"] == 1e-5
    assert defaults(rotary.npu_rotary_mul)["rotary_mode"] == "half"
    assert defaults(activations.npu_swiglu)["dim"] == -1
    assert defaults(activations.npu_scaled_masked_softmax) == {"scale": 1.0, "fixed_triu_mask": False}
    assert defaults(moe.npu_moe_gating_top_k_softmax) == {"finished": None, "k": 1}
    assert defaults(tensor_ops.npu_sort_v2) == {"dim": -1, "descending": False, "out": None}
    gmm = defaults(matmul.npu_grouped_matmul)
    assert (gmm["split_item"], gmm["group_list_type"]) == (0, 0)


# ----------------------------------------------------------------------------- output post-processing

@pytest.mark.parametrize("group_list, kind, valid", [
    (torch.tensor([2, 5]), 0, 5), (torch.tensor([2, 3]), 1, 5), ([3, 5], None, 5),
    (torch.tensor([[0, 2], [1, 1]]), 2, 3)])
def test_grouped_matmul_rows_past_the_group_list_are_zeroed(group_list: Any, kind: Any, valid: int) -> None:
    stale = torch.full((7, 3), float("nan"))
    stale[:valid] = 1.0
    kwargs = {"group_list": group_list, **({} if kind is None else {"group_list_type": kind})}
    (out,) = bench_functions.postprocess("npu_grouped_matmul", [stale], [], kwargs, "device")
    assert torch.equal(out[:valid], torch.ones(valid, 3)) and torch.equal(out[valid:], torch.zeros(7 - valid, 3))


def test_postprocess_keeps_other_ops_and_selects_outputs() -> None:
    outs = [torch.ones(3), torch.zeros(2), 7]
    assert bench_functions.postprocess("npu_rms_norm", outs, [], {}, "device") is outs
    assert bench_functions.postprocess("npu_fusion_attention_v2", outs, [], {}, "bench") == [outs[0]]
    assert bench_functions.postprocess("npu_grouped_matmul", outs, [], {}, "device") == outs  # no group_list


def test_grouped_matmul_item_runs_end_to_end(pytester: pytest.Pytester) -> None:
    x, w = tensor("torch.float32", [8, 4]), tensor("torch.float32", [4, 3])
    integer = lambda value: {"type": "int", "value": value}  # noqa: E731
    data = {"NPU.npu_grouped_matmul.0.forward": {
        "input_args": [[x], [w, w]],
        "input_kwargs": {"group_list": tensor("torch.int64", [2], mx=3, mn=3), "group_list_type": integer(1),
                         "split_item": integer(3)},
        "output": [[tensor("torch.float32", [8, 3])]]}}
    dump = pytester.path / "gmm" / "dump.json"
    dump.parent.mkdir()
    dump.write_text(json.dumps({"task": "statistics", "level": "L1", "framework": "pytorch", "data": data}))
    result = pytester.runpytest(str(dump), "--msprobe-device", "cpu")
    result.assert_outcomes()
    assert result.parseoutcomes()["reference"] == 1  # "1 reference-only": the bench ran on both sides


# ----------------------------------------------------------------------------- attention: independent form

def masked_by_rule(mode: int, sq: int, sk: int, pre: int, nxt: int, prefix: int | None) -> torch.Tensor:
    """True = masked, built the way the torch_npu docs build their example masks (triu / tril)."""
    ones = torch.ones(sq, sk, dtype=torch.bool)
    if mode == 0:
        return torch.triu(ones, nxt + 1) | torch.tril(ones, -pre - 1)
    if mode == 2:
        return torch.triu(ones, 1)
    if mode == 3:
        return torch.triu(ones, sk - sq + 1)
    if mode == 4:
        return torch.triu(ones, nxt + sk - sq + 1) | torch.tril(ones, -pre + sk - sq - 1)
    if mode in (5, 6):
        m = torch.triu(ones, sk - sq + 1)
        m[:, :prefix] = False
        return m
    return torch.zeros(sq, sk, dtype=torch.bool)


def naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor, bias: torch.Tensor | None,
          scale: float, pse_type: int = 1) -> torch.Tensor:
    """BNSD attention with scaled_dot_product_attention and an explicit float mask, kv heads repeated."""
    g = q.shape[1] // k.shape[1]
    float_mask = torch.zeros(keep.shape, dtype=F64).masked_fill(~keep, float("-inf"))
    if bias is not None:
        float_mask = float_mask + (bias * scale if pse_type == 1 else bias)
    return F.scaled_dot_product_attention(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1),
                                          attn_mask=float_mask, scale=scale)


def naive_stats(q: torch.Tensor, k: torch.Tensor, keep: torch.Tensor, scale: float) -> tuple[torch.Tensor, ...]:
    s = q @ k.repeat_interleave(q.shape[1] // k.shape[1], 1).transpose(-1, -2) * scale
    s = s.masked_fill(~keep, float("-inf"))
    m = s.amax(-1)
    return m, torch.exp(s - m.unsqueeze(-1)).sum(-1)


def to_layout(x: torch.Tensor, layout: str) -> torch.Tensor:
    """BNSD -> layout, written per layout (independent of attention.to_heads)."""
    b, n, s, d = x.shape
    if layout == "BSH":
        return x.transpose(1, 2).reshape(b, s, n * d)
    if layout == "SBH":
        return x.permute(2, 0, 1, 3).reshape(s, b, n * d)
    return x.transpose(1, 2) if layout == "BSND" else x


@st.composite
def dense_case(draw: Any) -> dict[str, Any]:
    b, n2, g = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 3))
    sq, sk, d = draw(st.integers(1, 8)), draw(st.integers(1, 8)), draw(st.integers(1, 4))
    mode = draw(st.integers(0, 6))
    tokens = st.one_of(st.just(MAX), st.integers(-3, 9))
    return {"b": b, "n2": n2, "n1": n2 * g, "sq": sq, "sk": sk, "d": d, "dv": draw(st.integers(1, d)),
            "layout": draw(st.sampled_from(["BSH", "SBH", "BSND", "BNSD"])), "mode": mode,
            "pre": draw(tokens), "nxt": draw(tokens), "has_mask": draw(st.booleans()),
            "mask_shape": draw(st.sampled_from(["SS", "11SS", "B1SS", "BNSS"])),
            "pse": draw(st.sampled_from([None, "BNSS", "1NSS", "BN1S"])), "pse_type": draw(st.sampled_from([0, 1])),
            "scale": draw(st.floats(0.1, 2.0)), "blocks": (draw(st.integers(1, 4)), draw(st.integers(1, 4))),
            "seed": draw(st.integers(0, 2**16))}


@ATTENTION_PROP
@given(dense_case())
def test_dense_attention_matches_sdpa_forward_stats_and_grads(c: dict[str, Any]) -> None:
    gen = torch.Generator().manual_seed(c["seed"])
    b, n1, n2, sq, sk = c["b"], c["n1"], c["n2"], c["sq"], c["sk"]
    q, k, v = rand(b, n1, sq, c["d"], gen=gen), rand(b, n2, sk, c["d"], gen=gen), rand(b, n2, sk, c["dv"], gen=gen)
    mode = c["mode"]
    prefix = [int(torch.randint(0, sk + 1, (), generator=gen)) for _ in range(b)]
    mask_shape = {"SS": (sq, sk), "11SS": (1, 1, sq, sk), "B1SS": (b, 1, sq, sk), "BNSS": (b, n1, sq, sk)}
    given_mask = torch.rand(mask_shape[c["mask_shape"]], generator=gen) < 0.3 if mode in (0, 1) else \
        torch.triu(torch.ones(2048, 2048, dtype=torch.bool), 1)  # the compressed mask of modes 2-6
    atten_mask = given_mask if c["has_mask"] else None
    keep = torch.ones(b, n1, sq, sk, dtype=torch.bool)
    mask4 = given_mask if given_mask.dim() == 4 else given_mask[None, None]
    if atten_mask is not None:
        for i in range(b):
            keep[i] &= ~masked_by_rule(mode, sq, sk, c["pre"], c["nxt"], prefix[i])
            if mode in (0, 1):
                keep[i] &= ~mask4[i if mask4.shape[0] > 1 else 0]
    pse_shape = {None: None, "BNSS": (b, n1, sq, sk), "1NSS": (1, n1, sq, sk), "BN1S": (b, n1, 1, sk)}[c["pse"]]
    pse = None if pse_shape is None else rand(*pse_shape, gen=gen)
    kwargs: dict[str, Any] = {"pse": pse, "atten_mask": atten_mask, "scale": c["scale"], "sparse_mode": mode,
                              "prefix": prefix, "pse_type": c["pse_type"]}
    with blocks(*c["blocks"]):
        if not bool(keep.any(-1).all()):
            with pytest.raises(BenchUnsupported, match="fully masked"):
                attention.npu_fusion_attention_v2(to_layout(q, c["layout"]), to_layout(k, c["layout"]),
                                                  to_layout(v, c["layout"]), n1, c["layout"], pre_tokens=c["pre"],
                                                  next_tokens=c["nxt"], **kwargs)
            return
        got = attention.npu_fusion_attention_v2(to_layout(q, c["layout"]), to_layout(k, c["layout"]),
                                                to_layout(v, c["layout"]), n1, c["layout"], pre_tokens=c["pre"],
                                                next_tokens=c["nxt"], **kwargs)
        if c["pse_type"] == 1:  # the same call through the v1 entry point (no pse_type argument)
            v1 = attention.npu_fusion_attention(to_layout(q, c["layout"]), to_layout(k, c["layout"]),
                                                to_layout(v, c["layout"]), n1, c["layout"], pse=pse,
                                                atten_mask=atten_mask, scale=c["scale"], sparse_mode=mode,
                                                prefix=prefix, pre_tockens=c["pre"], next_tockens=c["nxt"])
            close(v1[0], got[0], 0)
    want = naive(q, k, v, keep, pse, c["scale"], c["pse_type"])
    close(got[0], to_layout(want, c["layout"]))
    if pse is None:
        row_max, row_sum = naive_stats(q, k, keep, c["scale"])
        assert got[1].shape == (b, n1, sq, 8) and got[1].dtype == torch.float32
        close(got[1], row_max.unsqueeze(-1).expand(-1, -1, -1, 8).float(), 1e-5)
        close(got[2], row_sum.unsqueeze(-1).expand(-1, -1, -1, 8).float(), 1e-5)
    assert got[6] == b * n1 * sq * sk
    cot = torch.randn(want.shape, generator=gen, dtype=F64)
    leaves = [q, k, v] + ([pse] if pse is not None else [])
    close(grads(got[0], leaves, to_layout(cot, c["layout"])), grads(want, leaves, cot), 1e-9)


@st.composite
def varlen_case(draw: Any) -> dict[str, Any]:
    nb = draw(st.integers(1, 3))
    lq = draw(st.lists(st.integers(0, 6), min_size=nb, max_size=nb))
    lk = [draw(st.integers(1 if n else 0, 6)) for n in lq]
    n2 = draw(st.integers(1, 2))
    return {"lq": lq, "lk": lk, "n2": n2, "n1": n2 * draw(st.integers(1, 2)), "d": draw(st.integers(1, 3)),
            "mode": draw(st.sampled_from([0, 1, 2, 3, 4, 6, 7, 8])), "pre": draw(st.integers(0, 8)),
            "nxt": draw(st.integers(-2, 6)), "scale": draw(st.floats(0.2, 1.5)),
            "blocks": (draw(st.integers(1, 3)), draw(st.integers(1, 3))), "seed": draw(st.integers(0, 2**16))}


@ATTENTION_PROP
@given(varlen_case())
def test_tnd_varlen_is_each_batch_on_its_own(c: dict[str, Any]) -> None:
    gen = torch.Generator().manual_seed(c["seed"])
    lq, lk, n1, n2, d, mode = c["lq"], c["lk"], c["n1"], c["n2"], c["d"], c["mode"]
    q, k, v = rand(sum(lq), n1, d, gen=gen), rand(sum(lk), n2, d, gen=gen), rand(sum(lk), n2, d, gen=gen)
    prefix = [int(torch.randint(0, n + 1, (), generator=gen)) for n in lk]
    given_mask = torch.rand(max(lq), max(lk), generator=gen) < 0.3 if mode in (0, 1) else \
        torch.triu(torch.ones(2048, 2048, dtype=torch.bool), 1)
    nonempty = [i for i, n in enumerate(lq) if n]
    band = {7: nonempty[-1] if nonempty else None, 8: nonempty[0] if nonempty else None}.get(mode)
    cum = lambda xs: [sum(xs[:i + 1]) for i in range(len(xs))]  # noqa: E731
    pieces, ok, qo, ko = [], True, 0, 0
    for i, (sq, sk) in enumerate(zip(lq, lk)):
        rule = 4 if i == band else {7: 3, 8: 2}.get(mode, mode)  # [FA] modes 7/8: one band batch, the rest causal
        masked = masked_by_rule(rule, sq, sk, c["pre"], c["nxt"], prefix[i])
        if mode in (0, 1):
            masked |= given_mask[:sq, :sk]
        keep = ~masked[None, None]
        ok &= bool(keep.any(-1).all())
        qb, kb, vb = (t.transpose(0, 1)[None] for t in (q[qo:qo + sq], k[ko:ko + sk], v[ko:ko + sk]))
        if sq and ok:
            pieces.append(naive(qb, kb, vb, keep, None, c["scale"])[0].transpose(0, 1))
        qo, ko = qo + sq, ko + sk
    with blocks(*c["blocks"]):
        call = lambda: attention.npu_fusion_attention(  # noqa: E731
            q, k, v, n1, "TND", atten_mask=given_mask, scale=c["scale"], sparse_mode=mode, prefix=prefix,
            pre_tockens=c["pre"], next_tockens=c["nxt"], actual_seq_qlen=cum(lq), actual_seq_kvlen=cum(lk))
        if not ok:
            with pytest.raises(BenchUnsupported):
                call()
            return
        got = call()
    want = torch.cat(pieces) if pieces else q.new_zeros(0, n1, d)
    close(got[0], want)
    assert got[1].shape == (n1, sum(lq), 8)  # [FA] softmax_layout: NTD unless "TND" is asked for
    if want.numel():
        cot = torch.randn(want.shape, generator=gen, dtype=F64)
        close(grads(got[0], [q, k, v], cot), grads(want, [q, k, v], cot), 1e-9)


def test_layout_round_trips_and_head_grouping() -> None:
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 6, 5, 3, generator=gen, dtype=F64)  # BNSD
    for layout in ("BSH", "SBH", "BSND", "BNSD"):
        heads = attention.to_heads(to_layout(x, layout), layout, 6)
        assert torch.equal(heads, x.transpose(0, 1).reshape(6, 10, 3))  # (N, B*S, D), batch-major rows
        assert torch.equal(attention.from_heads(heads, layout, 2), to_layout(x, layout))
    t = torch.randn(7, 4, 3, generator=gen)
    assert torch.equal(attention.from_heads(attention.to_heads(t, "TND", 4), "TND", 0), t)
    # GQA: query head h reads kv head h // (N1 / N2): equal to repeating each kv head for its group
    q, k, v = (torch.randn(1, n, 4, 2, generator=gen, dtype=F64) for n in (6, 2, 2))
    out = attention.npu_fusion_attention(q, k, v, 6, "BNSD")[0]
    for h in range(6):
        close(out[:, h], F.scaled_dot_product_attention(q[:, h], k[:, h // 3], v[:, h // 3], scale=1.0))


def test_tiled_equals_one_block_and_keeps_no_score_matrix() -> None:
    gen = torch.Generator().manual_seed(5)
    n, s, d = 2, 96, 4
    q, k, v = (rand(1, n, s, d, gen=gen) for _ in range(3))
    mask = torch.triu(torch.ones(2048, 2048, dtype=torch.bool), 1)
    with blocks(s, s):
        whole = attention.npu_fusion_attention(q, k, v, n, "BNSD", atten_mask=mask, sparse_mode=3)[0]
    saved: list[int] = []
    with blocks(16, 24), torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        tiled = attention.npu_fusion_attention(q, k, v, n, "BNSD", atten_mask=mask, sparse_mode=3)[0]
    close(tiled, whole)
    assert max(saved) <= n * s * d < n * s * s  # autograd holds Q, K, V, O and row statistics only


def test_attention_computes_in_its_inputs_precision() -> None:
    """fp32 inputs (a bf16 device's bench) are computed in fp32, not fp64 then rounded, and stay within
    fp32 accumulation error of the fp64 result; fp64 inputs are computed in fp64."""
    gen = torch.Generator().manual_seed(3)
    q, k, v, dy = (rand(1, 2, 300, 64, gen=gen).detach().float().double() for _ in range(4))  # fp32-exact
    results = {}
    for dtype in (torch.float32, torch.float64):
        qq, kk, vv = (t.detach().to(dtype, copy=True).requires_grad_() for t in (q, k, v))
        out = attention.npu_fusion_attention(qq, kk, vv, 2, "BNSD", scale=0.125)[0]
        out.backward(dy.detach().to(dtype))
        assert out.dtype == qq.grad.dtype == dtype
        results[dtype] = [t.detach() for t in (out, qq.grad, kk.grad, vv.grad)]
    for low, high in zip(results[torch.float32], results[torch.float64]):
        assert not torch.equal(low, high.float())  # really computed in fp32
        torch.testing.assert_close(low.double(), high, rtol=1e-5, atol=1e-6)


def test_attention_gradcheck_with_pse_gqa_and_band() -> None:
    gen = torch.Generator().manual_seed(7)
    q, k, v = rand(1, 4, 5, 3, gen=gen), rand(1, 2, 6, 3, gen=gen), rand(1, 2, 6, 2, gen=gen)
    pse = rand(1, 4, 1, 6, gen=gen)
    mask = torch.triu(torch.ones(2048, 2048, dtype=torch.bool), 1)
    with blocks(2, 4):
        fn = lambda q, k, v, pse: attention.npu_fusion_attention(  # noqa: E731
            q, k, v, 4, "BNSD", pse=pse, atten_mask=mask, scale=0.7, sparse_mode=4, pre_tockens=3,
            next_tockens=1)[0]
        assert torch.autograd.gradcheck(fn, (q, k, v, pse), fast_mode=True)


def test_fusion_attention_grad_is_the_autograd_of_the_forward() -> None:
    gen = torch.Generator().manual_seed(11)
    q, k, v = rand(2, 5, 8, gen=gen), rand(2, 7, 4, gen=gen), rand(2, 7, 4, gen=gen)  # BSH, N1=4, N2=2, D=2
    pse = rand(2, 4, 5, 7, gen=gen)
    mask = torch.rand(5, 7, generator=gen) < 0.2
    mask[:, 0] = False
    dy = torch.randn(2, 5, 8, generator=gen, dtype=F64)
    kw = {"pse": pse, "atten_mask": mask, "sparse_mode": 1}
    with blocks(2, 3):
        out = attention.npu_fusion_attention(q, k, v, 4, "BSH", scale=0.4, **kw)[0]
        dq, dk, dv, dpse = attention.npu_fusion_attention_grad(q, k, v, dy, 4, "BSH", scale_value=0.4, **kw)
    close([dq, dk, dv, dpse], grads(out, [q, k, v, pse], dy))


def test_compressed_alibi_pse_equals_the_full_one() -> None:
    """[FA] pse: for Sq > 1024 causal, passing ori_pse[:, :, -1024:, :] equals passing the whole alibi."""
    gen = torch.Generator().manual_seed(13)
    n, s, d = 2, 1030, 2
    q, k, v = (rand(1, n, s, d, gen=gen, scale=0.5) for _ in range(3))
    slopes = torch.tensor([0.5, 0.25], dtype=F64, requires_grad=True)
    pos = torch.arange(s, dtype=F64)
    alibi = lambda: -slopes.view(1, n, 1, 1) * (pos.view(-1, 1) - pos.view(1, -1)).clamp(min=0)  # noqa: E731
    mask = torch.triu(torch.ones(2048, 2048, dtype=torch.bool), 1)
    got = attention.npu_fusion_attention(q, k, v, n, "BNSD", pse=alibi()[:, :, -1024:], atten_mask=mask,
                                         sparse_mode=3)[0]
    keep = ~torch.triu(torch.ones(s, s, dtype=torch.bool), 1)
    want = naive(q, k, v, keep, alibi(), 1.0)
    close(got, want)
    cot = torch.randn(want.shape, generator=gen, dtype=F64)
    close(grads(got, [q, slopes], cot), grads(want, [q, slopes], cot), 1e-8)


@pytest.mark.parametrize("call, reason", [
    ({"keep_prob": 0.9}, "keep_prob=0.9"), ({"padding_mask": torch.ones(1)}, "padding_mask")])
def test_attention_skips_what_it_cannot_reproduce(call: dict[str, Any], reason: str) -> None:
    q = torch.randn(1, 1, 2, 2, dtype=F64)
    with pytest.raises(BenchUnsupported, match=reason):
        attention.npu_fusion_attention(q, q, q, 1, "BNSD", **call)
    with pytest.raises(BenchUnsupported, match="pse_type=2"):
        attention.npu_fusion_attention_v2(q, q, q, 1, "BNSD", pse=torch.ones(1), pse_type=2)


# ----------------------------------------------------------------------------- norms

@PROP
@given(st.integers(0, 2**16), st.integers(1, 2), st.sampled_from([1e-6, 1e-3]))
def test_rms_norm_by_hand_and_its_backward(seed: int, gamma_dims: int, eps: float) -> None:
    gen = torch.Generator().manual_seed(seed)
    x, gamma = rand(3, 4, 5, gen=gen), rand(*(4, 5)[2 - gamma_dims:], gen=gen)
    dims = tuple(range(3 - gamma_dims, 3))
    rstd = 1 / torch.sqrt((x * x).sum(dims, keepdim=True) / math.prod(gamma.shape) + eps)
    want = x * rstd * gamma
    y, got_rstd = norms.npu_rms_norm(x, gamma, eps) if eps != 1e-6 else norms.npu_rms_norm(x, gamma)
    close(y, want)
    close(got_rstd, rstd.float().detach(), 1e-6)
    assert got_rstd.dtype == torch.float32
    dy = torch.randn(3, 4, 5, generator=gen, dtype=F64)
    dx, dgamma = norms.npu_rms_norm_backward(dy, x, gamma, rstd.detach())
    by_autograd = grads(want, [x, gamma], dy)
    close([dx, dgamma], by_autograd)
    close(grads(y, [x, gamma], dy), by_autograd)
    y2, rstd2, xsum = norms.npu_add_rms_norm(x, 2 * x, gamma, eps)
    close(xsum, 3 * x)
    close(y2, norms.npu_rms_norm(3 * x, gamma, eps)[0])
    assert rstd2.dtype == torch.float32 and rstd2.shape == rstd.shape


def test_norm_gradchecks() -> None:
    gen = torch.Generator().manual_seed(1)
    x, gamma, w, bias = rand(2, 4, 3, gen=gen), rand(3, gen=gen), rand(4, gen=gen), rand(4, gen=gen)
    assert torch.autograd.gradcheck(lambda x, g: norms.npu_rms_norm(x, g)[0], (x, gamma))
    assert torch.autograd.gradcheck(lambda x, w, b: norms.npu_group_norm_silu(x, w, b, 2)[0], (x, w, bias))


def test_layer_norm_eval_uses_weight_bias_and_eps() -> None:
    gen = torch.Generator().manual_seed(2)
    x, w, b = rand(3, 6, gen=gen), rand(6, gen=gen), rand(6, gen=gen)
    mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
    close(norms.npu_layer_norm_eval(x, [6], w, b, 0.5), (x - mean) / torch.sqrt(var + 0.5) * w + b)
    close(norms.npu_layer_norm_eval(x, [6]), (x - mean) / torch.sqrt(var + 1e-5))


@PROP
@given(st.integers(0, 2**16), st.integers(1, 3), st.integers(1, 3), st.integers(1, 3), st.integers(2, 4),
       st.booleans())
def test_group_norm_silu_by_hand(seed: int, n: int, group: int, per_group: int, spatial: int, affine: bool) -> None:
    gen = torch.Generator().manual_seed(seed)
    c = group * per_group
    x = rand(n, c, spatial, gen=gen)
    w, b = (rand(c, gen=gen), rand(c, gen=gen)) if affine else (None, None)
    out, mean, rstd = norms.npu_group_norm_silu(x, w, b, group, 0.01)
    close(out, F.silu(F.group_norm(x, group, w, b, 0.01)))
    groups = x.reshape(n, group, -1)
    close(mean, groups.mean(-1))
    close(rstd, 1 / torch.sqrt(((groups - groups.mean(-1, keepdim=True)) ** 2).mean(-1) + 0.01))
    assert mean.shape == rstd.shape == (n, group)


# ----------------------------------------------------------------------------- rotary

@PROP
@given(st.integers(0, 2**16), st.sampled_from(["half", "interleave"]), st.sampled_from(
    ["BNSD:11SD", "BNSD:B1SD", "BNSD:BNSD", "BSND:1S1D", "BSND:BS1D", "BSND:BSND", "SBND:S11D", "SBND:SB1D"]))
def test_rotary_is_complex_multiplication(seed: int, mode: str, layouts: str) -> None:
    gen = torch.Generator().manual_seed(seed)
    dims = dict(zip("BNSD", (2, 3, 4, 6)))
    x_layout, r_layout = layouts.split(":")
    x = rand(*(dims[c] for c in x_layout), gen=gen)
    r_shape = [dims[c] if c != "1" else 1 for c in r_layout]
    theta = torch.randn(*r_shape[:-1], 3, generator=gen, dtype=F64)
    if mode == "half":
        r1, r2 = torch.cat((theta.cos(), theta.cos()), -1), torch.cat((theta.sin(), theta.sin()), -1)
        z = torch.complex(x[..., :3], x[..., 3:]) * torch.polar(torch.ones_like(theta), theta)
        want = torch.cat((z.real, z.imag), -1)
    else:
        r1, r2 = theta.cos().repeat_interleave(2, -1), theta.sin().repeat_interleave(2, -1)
        z = torch.view_as_complex(x.reshape(*x.shape[:-1], 3, 2).contiguous()) * torch.polar(torch.ones_like(theta),
                                                                                                theta)
        want = torch.view_as_real(z).flatten(-2)
    r1, r2 = r1.requires_grad_(True), r2.requires_grad_(True)
    got = rotary.npu_rotary_mul(x, r1, r2, rotary_mode=mode)
    close(got, want)
    g = torch.randn(x.shape, generator=gen, dtype=F64)
    close(list(rotary.npu_rotary_mul_backward(g, x, r1, r2, mode)), grads(got, [x, r1, r2], g))
    small = x[:1, :1].detach().clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda a, b, c: rotary.npu_rotary_mul(a, b, c, mode), (small, r1, r2))


# ----------------------------------------------------------------------------- activations

@PROP
@given(st.integers(0, 2**16), st.integers(1, 4), st.integers(1, 5), st.floats(0.1, 8.0))
def test_activations_by_formula_and_backwards(seed: int, rows: int, half: int, spread: float) -> None:
    gen = torch.Generator().manual_seed(seed)
    x = rand(rows, 2 * half, gen=gen, scale=spread)
    g = torch.randn(rows, 2 * half, generator=gen, dtype=F64)
    fast = x / (1 + torch.exp(-1.702 * x))  # torch_npu docs, Atlas A2 formula
    close(activations.npu_fast_gelu(x), fast)
    close(bench_functions.get("fast_gelu")(x), fast)
    close(activations.npu_fast_gelu_backward(g, x), grads(fast, [x], g)[0])
    a, b = x[:, :half], x[:, half:]
    swi = a / (1 + torch.exp(-a)) * b
    close(activations.npu_swiglu(x), swi)
    close(activations.npu_swiglu_backward(g[:, :half], x), grads(swi, [x], g[:, :half])[0])
    close(activations.npu_swiglu(x.t(), dim=0), swi.t())
    close(activations.npu_mish(x), x * torch.tanh(torch.log1p(torch.exp(x))))


def test_activation_gradchecks_and_extremes() -> None:
    x = torch.linspace(-5, 5, 8, dtype=F64).view(1, 8).requires_grad_(True)
    for fn in (activations.npu_fast_gelu, activations.npu_swiglu, activations.npu_mish):
        assert torch.autograd.gradcheck(fn, (x,))
    assert torch.isfinite(activations.npu_fast_gelu(torch.tensor([-800.0, 800.0], dtype=F64))).all()


@PROP
@given(st.integers(0, 2**16), st.sampled_from([(1, 1), (2, 1), (1, 3), (2, 3)]), st.integers(1, 5), st.integers(1, 7),
       st.floats(0.0, 0.6), st.floats(0.1, 2.0))
def test_scaled_masked_softmax_by_hand_and_backward(seed: int, bn: tuple[int, int], rows: int, cols: int,
                                                     density: float, scale: float) -> None:
    gen = torch.Generator().manual_seed(seed)
    x = rand(2, 3, rows, cols, gen=gen)
    mask = torch.rand(*bn, rows, cols, generator=gen) < density  # broadcast to x, as the docs require
    if not bool((~mask).any(-1).all()):
        with pytest.raises(BenchUnsupported, match="entirely masked"):
            activations.npu_scaled_masked_softmax(x, mask, scale)
        return
    e = torch.exp(scale * x).masked_fill(mask, 0.0)
    want = e / e.sum(-1, keepdim=True)
    got = activations.npu_scaled_masked_softmax(x, mask, scale)
    close(got, want)
    g = torch.randn(x.shape, generator=gen, dtype=F64)
    close(activations.npu_scaled_masked_softmax_backward(g, got.detach(), mask, scale), grads(want, [x], g)[0])


def test_scaled_masked_softmax_gradcheck_and_skips() -> None:
    x = torch.randn(1, 2, 3, 4, dtype=F64, requires_grad=True)
    mask = torch.tensor([[False, True, False, True]]).expand(3, 4).clone()
    assert torch.autograd.gradcheck(lambda t: activations.npu_scaled_masked_softmax(t, mask, 0.7), (x,))
    mask[1] = True
    with pytest.raises(BenchUnsupported, match="entirely masked"):
        activations.npu_scaled_masked_softmax(x, mask)
    with pytest.raises(BenchUnsupported, match="fixed_triu_mask"):
        activations.npu_scaled_masked_softmax(x, mask, fixed_triu_mask=True)


# ----------------------------------------------------------------------------- matmul family

def test_linear_and_its_backward() -> None:
    gen = torch.Generator().manual_seed(9)
    x, w, b = rand(5, 3, gen=gen), rand(4, 3, gen=gen), rand(4, gen=gen)
    want = x @ w.t() + b
    close(matmul.npu_linear(x, w, b), want)
    g = torch.randn(5, 4, generator=gen, dtype=F64)
    close(list(matmul.npu_linear_backward(g, x, w)), grads(want, [x, w], g))


@PROP
@given(st.integers(0, 2**16), st.sampled_from([(1, 1), (2, 1), (1, 2), (3, 1), (3, 2), (1, 3), (2, 3), (3, 3),
                                               (4, 3), (2, 4)]), st.booleans(), st.booleans())
def test_matmul_backward_for_every_rank_combination(seed: int, ranks: tuple[int, int], m0: bool, m1: bool) -> None:
    gen = torch.Generator().manual_seed(seed)
    shapes = {1: ((3,), (3,)), 2: ((2, 3), (3, 4)), 3: ((5, 2, 3), (5, 3, 4)), 4: ((2, 5, 2, 3), (1, 5, 3, 4))}
    a = rand(*shapes[ranks[0]][0], gen=gen)
    b = rand(*(shapes[ranks[1]][1] if ranks[1] > 1 else (3,)), gen=gen)
    out = torch.matmul(a, b)
    g = torch.randn(out.shape, generator=gen, dtype=F64)
    ga, gb = matmul.matmul_backward(g, a, b, [m0, m1])
    want = grads(out, [a, b], g)
    assert (ga is None) != m0 and (gb is None) != m1
    close([x for x in (ga, gb) if x is not None], [w for w, m in zip(want, (m0, m1)) if m])


@PROP
@given(st.integers(0, 2**16), st.lists(st.integers(0, 3), min_size=2, max_size=4), st.integers(0, 3),
       st.sampled_from(["counts", "cumsum", "list"]), st.booleans())
def test_grouped_matmul_by_groups(seed: int, counts: list[int], stale: int, kind: str, with_bias: bool) -> None:
    gen = torch.Generator().manual_seed(seed)
    g, rows = len(counts), sum(counts) + stale
    x, ws = rand(rows, 3, gen=gen), [rand(3, 2, gen=gen) for _ in range(g)]
    bs = [rand(2, gen=gen) for _ in range(g)] if with_bias else None
    starts = [sum(counts[:i]) for i in range(g)]
    per_group = [x[a:a + n] @ w + (bs[i] if bs else 0) for i, (a, n, w) in enumerate(zip(starts, counts, ws))]
    cumsum = [a + n for a, n in zip(starts, counts)]
    group_list, kw = {"counts": (torch.tensor(counts), {"group_list_type": 1}),
                      "cumsum": (torch.tensor(cumsum), {"group_list_type": 0}), "list": (cumsum, {})}[kind]
    (got,) = matmul.npu_grouped_matmul([x], ws, bias=bs, group_list=group_list, split_item=3, **kw)
    close(got, torch.cat(per_group + [x.new_zeros(stale, 2)]))  # rows past the groups: zeros (see postprocess)
    one_weight = matmul.npu_grouped_matmul([x], [torch.stack(ws)], bias=[torch.stack(bs)] if bs else None,
                                           group_list=group_list, group_type=0, **kw)  # split_item 0: per group
    close(one_weight, per_group)
    close(matmul.npu_grouped_matmul([x, x[:2]], ws[:2]), [x @ ws[0], x[:2] @ ws[1]])
    with pytest.raises(BenchUnsupported, match="quantised"):
        matmul.npu_grouped_matmul([x], ws, scale=[torch.ones(2)], group_list=cumsum)


# ----------------------------------------------------------------------------- layout ops, sort, moe

def test_confusion_transpose_docs_examples_and_backward() -> None:
    x = torch.rand(2, 3, 4, 6, dtype=F64, requires_grad=True)
    y = tensor_ops.npu_confusion_transpose(x, (0, 2, 1, 3), (2, 4, 18), True)
    assert y.shape == (2, 4, 18) and torch.equal(y, x.permute(0, 2, 1, 3).reshape(2, 4, 18))
    y2 = tensor_ops.npu_confusion_transpose(x, (0, 2, 1), (2, 12, 6), False)
    assert y2.shape == (2, 6, 12) and torch.equal(y2, x.reshape(2, 12, 6).permute(0, 2, 1))
    for out, inp, first in ((y, x, True), (y2, x, False)):
        g = torch.randn(out.shape, dtype=F64)
        # torch_npu's autograd calls the backward with (grad, perm, self.sizes(), not transpose_first)
        back = tensor_ops.npu_confusion_transpose_backward(g, (0, 2, 1, 3) if first else (0, 2, 1), inp.shape,
                                                           not first)
        close(back, grads(out, [inp], g)[0])


@PROP
@given(st.integers(0, 2**16), st.sampled_from([(4,), (2, 3)]), st.integers(1, 8), st.data())
def test_sort_v2_and_moe_gating(seed: int, lead: tuple[int, ...], experts: int, data: Any) -> None:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(*lead, experts, generator=gen, dtype=F64)
    assert torch.equal(tensor_ops.npu_sort_v2(x), torch.from_numpy(np.sort(x.numpy(), -1)))
    out = torch.empty(0, dtype=F64)
    assert tensor_ops.npu_sort_v2(x, descending=True, out=out) is out and torch.equal(out, x.sort(-1, True).values)
    k = data.draw(st.integers(1, experts))
    y, idx, row = moe.npu_moe_gating_top_k_softmax(x.float(), None, k=k)
    p = torch.exp(x) / torch.exp(x).sum(-1, keepdim=True)
    top = p.topk(k, -1)
    close(y, top.values.float(), 1e-6)
    assert torch.equal(idx, top.indices.int()) and idx.dtype == row.dtype == torch.int32 and y.dtype == torch.float32
    rows = math.prod(lead)  # [MOE] rowIdxOut = arange(rows * k).reshape(k, rows).T, rows = every leading position
    flat = row.reshape(rows, k)
    assert [[int(flat[r, c]) for c in range(k)] for r in range(rows)] == [[c * rows + r for c in range(k)]
                                                                        for r in range(rows)]


def test_moe_gating_skips_finished_rows() -> None:
    x = torch.randn(4, 3, dtype=F64)
    assert moe.npu_moe_gating_top_k_softmax(x, torch.zeros(4, dtype=torch.bool))[0].shape == (4, 1)
    with pytest.raises(BenchUnsupported, match="finished"):
        moe.npu_moe_gating_top_k_softmax(x, torch.tensor([False, True, False, False]), 2)


# ----------------------------------------------------------------------------- optimizers

@pytest.mark.parametrize("amsgrad, maximize", [(False, False), (True, False), (False, True)])
def test_apply_adam_w_is_torch_adamw_step_t(amsgrad: bool, maximize: bool) -> None:
    gen = torch.Generator().manual_seed(14)
    var, m, v, grad = (torch.randn(5, 3, generator=gen, dtype=F64) for _ in range(4))
    v, vmax = v.abs(), v.abs() * 1.5
    lr, wd, b1, b2, eps, t = 0.01, 0.1, 0.9, 0.99, 1e-8, 4
    param = torch.nn.Parameter(var.clone())
    opt = torch.optim.AdamW([param], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd, amsgrad=amsgrad,
                            maximize=maximize, foreach=False)
    param.grad = grad.clone()
    opt.state[param].update(step=torch.tensor(float(t - 1)), exp_avg=m.clone(), exp_avg_sq=v.clone(),
                            **({"max_exp_avg_sq": vmax.clone()} if amsgrad else {}))
    opt.step()
    state = (var.clone(), m.clone(), v.clone())
    # torch_npu docs: beta*_power is beta^(t-1); the op multiplies it by beta once more
    got = optimizers.npu_apply_adam_w(b1 ** (t - 1), b2 ** (t - 1), lr, wd, b1, b2, eps, grad,
                                      vmax if amsgrad else None, amsgrad, maximize, out=state)
    assert got[0] is state[0]
    close(list(got), [param.detach(), opt.state[param]["exp_avg"], opt.state[param]["exp_avg_sq"]])


def test_apply_adam_is_tf_apply_adam() -> None:
    gen = torch.Generator().manual_seed(15)
    var, m, v, grad = (torch.randn(4, generator=gen, dtype=F64) for _ in range(4))
    v = v.abs()
    lr, b1, b2, t = 0.01, 0.9, 0.999, 3
    param = torch.nn.Parameter(var.clone())
    opt = torch.optim.Adam([param], lr=lr, betas=(b1, b2), eps=0.0, foreach=False)  # same update when eps = 0
    param.grad = grad.clone()
    opt.state[param].update(step=torch.tensor(float(t - 1)), exp_avg=m.clone(), exp_avg_sq=v.clone())
    opt.step()
    got = optimizers.npu_apply_adam(b1 ** t, b2 ** t, lr, b1, b2, 0.0, grad, False, False,
                                    out=(var.clone(), m.clone(), v.clone()))
    close(list(got), [param.detach(), opt.state[param]["exp_avg"], opt.state[param]["exp_avg_sq"]])
    m1, v1 = b1 * m + (1 - b1) * grad, b2 * v + (1 - b2) * grad ** 2  # nesterov, TF ApplyAdam's formula
    lr_t = lr * math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
    nest = optimizers.npu_apply_adam(b1 ** t, b2 ** t, lr, b1, b2, 1e-8, grad, False, True,
                                     out=(var.clone(), m.clone(), v.clone()))
    close(nest[0], var - lr_t * (b1 * m1 + (1 - b1) * grad) / (torch.sqrt(v1) + 1e-8))


def test_custom_bench_example_is_documented() -> None:
    page = Path(__file__).resolve().parents[1] / "docs" / "how-to" / "own-bench-function.md"
    text = page.read_text(encoding="utf-8")
    assert "pytest_msprobe.bench_functions" in text and "examples/custom_bench" in text
