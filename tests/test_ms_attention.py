"""MindSpore's flash_attention_score: checked against the npu_fusion_attention reference with MindSpore's signature.

The dump here is written the way msprobe's MindSpore dumper writes one (mindspore.Tensor, Float32 .npy for bf16),
with outputs and gradients from a naive float64 attention (softmax of the full score matrix): the tiled
reference must agree with it, and a wrong recorded output must fail.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import pytest_msprobe.check.replay  # noqa: F401  (kept across pytester's in-process runs)
import pytest_msprobe.runs.mindspore as msmap
from bench_functions.ms_attention import flash_attention_score
from pytest_msprobe.specs.loader import load_specs
from tests.helpers import api_records

MS_IMPORT_ERROR = msmap.import_error()  # MindSpore imported once, before any in-process pytester run
B, S, N, D = 1, 48, 2, 16
SCALE = 1 / math.sqrt(D)


def naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
          pse: torch.Tensor | None) -> torch.Tensor:
    """BSND attention in float64 from its definition: softmax(scale * Q K^T + pse, masked) V."""
    qh, kh, vh = (t.double().transpose(1, 2) for t in (q, k, v))  # B N S D
    scores = qh @ kh.transpose(-1, -2) * SCALE
    if pse is not None:
        scores = scores + pse.double()
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf"))
    return (torch.softmax(scores, dim=-1) @ vh).transpose(1, 2)


def ms_leaf(name: str, t: torch.Tensor, folder: Path | None) -> dict[str, Any]:
    leaf = {"type": "mindspore.Tensor", "dtype": {torch.bfloat16: "BFloat16", torch.bool: "Bool"}.get(t.dtype, "Float32"),
            "shape": list(t.shape), "Max": float(t.float().max()), "Min": float(t.float().min()),
            "Mean": float(t.float().mean()), "Norm": float(t.float().norm())}
    if folder is not None:
        np.save(folder / f"{name}.npy", (t.float() if t.dtype == torch.bfloat16 else t).numpy())  # bf16 as float32
        leaf["data_name"] = f"{name}.npy"
    return leaf


def write_dump(root: Path, wrong: bool = False, with_pse: bool = False) -> Path:
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, S, N, D).to(torch.bfloat16) for _ in range(3))
    mask = torch.triu(torch.ones(S, S, dtype=torch.bool), 1)
    pse = torch.randn(1, N, S, S).to(torch.bfloat16) if with_pse else None
    leaves = [x.detach().double().requires_grad_() for x in (q, k, v)]
    out = naive(*leaves, mask, pse)
    dout = torch.randn_like(out).to(torch.bfloat16)  # the recorded cotangent is what the backward used
    out.backward(dout.double())
    recorded = out.detach().to(torch.bfloat16).contiguous()
    if wrong:
        recorded.view(-1)[7] *= 1.5
    folder = root / "dump_tensor_data"
    folder.mkdir(parents=True)
    full = "Functional.flash_attention_score.0"
    args = [ms_leaf(f"{full}.forward.input.{i}", t, folder) for i, t in enumerate((q, k, v))] + [
        {"type": "int", "value": N}]
    kwargs = {"attn_mask": ms_leaf(f"{full}.forward.input.attn_mask", mask, folder),
              "scalar_value": {"type": "float", "value": SCALE}, "input_layout": {"type": "str", "value": "BSND"},
              "sparse_mode": {"type": "int", "value": 0}}
    if pse is not None:
        kwargs["real_shift"] = ms_leaf(f"{full}.forward.input.real_shift", pse, folder)
    data = {f"{full}.forward": {"input_args": args, "input_kwargs": kwargs,
                                "output": [ms_leaf(f"{full}.forward.output.0", recorded, folder)]},
            f"{full}.backward": {"input": [ms_leaf(f"{full}.backward.input.0", dout, folder)],
                                 "output": [ms_leaf(f"{full}.backward.output.{i}", leaf.grad.to(torch.bfloat16), folder)
                                            for i, leaf in enumerate(leaves)]}}
    path = root / "dump.json"
    path.write_text(json.dumps({"task": "tensor", "level": "L1", "framework": "mindspore",
                                "dump_data_dir": str(folder), "data": data}))
    return path


def test_the_bench_is_mindsporess_signature_on_the_fusion_attention_reference() -> None:
    torch.manual_seed(1)
    q, k, v = (torch.randn(2, 32, N * D, dtype=torch.float64) for _ in range(3))  # BSH, MindSpore's default layout
    mask = torch.triu(torch.ones(32, 32, dtype=torch.bool), 1)
    out = flash_attention_score(q, k, v, N, attn_mask=mask, scalar_value=SCALE)
    as_bsnd = [t.reshape(2, 32, N, D) for t in (q, k, v)]
    torch.testing.assert_close(out, naive(*as_bsnd, mask, None).reshape(2, 32, N * D), rtol=1e-12, atol=1e-12)
    pse = torch.randn(1, N, 32, 32, dtype=torch.float64)  # MindSpore adds real_shift after the scaling
    out = flash_attention_score(*as_bsnd, N, real_shift=pse, scalar_value=SCALE, input_layout="BSND")
    torch.testing.assert_close(out, naive(*as_bsnd, None, pse), rtol=1e-12, atol=1e-12)
    twin = msmap.torch_twin("Functional", "flash_attention_score", load_specs())
    assert twin.fn(*as_bsnd, N, scalar_value=SCALE, input_layout="BSND").shape == (2, 32, N, D)
    assert twin.label == "bench_functions.ms_attention.flash_attention_score"


@pytest.mark.parametrize("with_pse", [False, True])
def test_a_recorded_mindspore_call_replays_against_it(pytester: pytest.Pytester, with_pse: bool) -> None:
    good = write_dump(pytester.path / "good", with_pse=with_pse)
    bad = write_dump(pytester.path / "bad", wrong=True, with_pse=with_pse)
    result = pytester.runpytest(str(good), str(bad), "--msprobe-standard", "strict", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, failed=1)  # the wrong recorded output; gradients of both dumps pass
    recs = api_records(pytester)
    forward = recs["Functional.flash_attention_score.0.forward"]
    assert forward["impl"] == "outputs saved in the dump (bench bench_functions.ms_attention.flash_attention_score)"
    assert [o["bench_dtype"] for o in forward["outputs"]] == ["torch.float32"]  # raise_map_by_api, as for NPU FA
    backward = recs["Functional.flash_attention_score.0.backward"]
    assert [o["name"].rsplit(".", 1)[-1] for o in backward["outputs"]] == ["0", "1", "2"]  # dq, dk, dv by position


def test_the_default_standard_benches_bf16_attention_in_fp32(pytester: pytest.Pytester) -> None:
    dump = write_dump(pytester.path / "good")
    pytester.runpytest(str(dump), "-k", "forward", "-p", "no:cacheprovider")
    (forward,) = api_records(pytester).values()
    # strict passes the correctly rounded output; msprobe's Layer 1 on bf16 warns: the representation error
    # alone fails 双千
    assert forward["status"] == "pass" and forward["layer1_status"] == "Warning"
    assert [o["bench_dtype"] for o in forward["outputs"]] == ["torch.float32"]  # raise_map_by_api, as for NPU FA


def test_mindspore_reruns_it_where_it_has_a_kernel(pytester: pytest.Pytester) -> None:
    if MS_IMPORT_ERROR is not None:
        pytest.skip(f"MindSpore is not importable here ({MS_IMPORT_ERROR}); CI runs this in .ci/venv-ms")
    dump = write_dump(pytester.path / "good")
    result = pytester.runpytest(str(dump), "--msprobe-mode", "rerun", "-rs", "-p", "no:cacheprovider")
    recs = api_records(pytester)
    forward = recs["Functional.flash_attention_score.0.forward"]
    assert forward["mode"] == "rerun" and forward["device"].startswith("mindspore:")
    if forward["status"] == "SKIP":  # MindSpore has no CPU kernel for it: its own words
        assert "cannot run mindspore.ops.flash_attention_score on CPU" in forward["message"]
        result.assert_outcomes(skipped=2)
    else:
        assert forward["status"] == "pass" and forward["impl"].startswith("mindspore.ops.flash_attention_score")
