"""Statistics dumps of every fused NPU op in bench_functions/, at chosen sizes, for the fused-op suite.

    python -m evals fused_dump OUT --dtype bfloat16 --preset small|llama|large [--ops a,b]

Each call is run once on the reference with real random tensors and recorded as msprobe's L1
statistics dump does (forward entry; a backward entry with the input gradients for ops that have
one), so the checker draws inputs of the same range. Presets:

* small: attention 256 tokens (tests);
* llama: a Llama layer: batch 2, sequence 512, hidden 1024, 16 heads of 64, BNSD;
* large: attention at S = 2048 with GQA (8 query heads on 2 kv heads, BSND, causal sparse_mode 2),
  S 1024 x 2048 with sparse_mode 3 (8 on 2 heads, BNSD), and TND with actual_seq_qlen
  [512, 1536, 2048, 4096] (sparse_mode 3, 4 on 2 heads), head dim 128; RMSNorm, rotary (32 heads
  of 128) and SwiGLU (intermediate 11008) of a Llama-7B-wide layer, batch 2 of 512 tokens.

`small` and `llama` have RMSNorm, rotary and SwiGLU at hidden 256 / 1024 (4 / 16 heads of 64,
intermediate 512 / 2816), 128 / 1024 tokens.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any, Callable

import torch

import bench_functions


def _stats(t: torch.Tensor) -> dict[str, Any]:
    if t.numel() == 0:
        return {"Max": None, "Min": None, "Mean": None, "Norm": None}
    if t.dtype == torch.bool:
        return {"Max": bool(t.any()), "Min": bool(t.all()), "Mean": None, "Norm": None}
    f = t.double()
    return {"Max": f.max().item(), "Min": f.min().item(), "Mean": f.mean().item(), "Norm": f.norm().item()}


def enc(value: Any, grad: bool = False) -> Any:
    if isinstance(value, torch.Tensor):
        return {"type": "torch.Tensor", "dtype": str(value.dtype), "shape": list(value.shape), **_stats(value),
                "requires_grad": grad and value.is_floating_point()}
    if isinstance(value, (list, tuple)):
        return [enc(v) for v in value]
    if value is None:
        return None
    if isinstance(value, torch.dtype):
        return {"type": "torch.dtype", "value": str(value)}
    return {"type": type(value).__name__, "value": value}


class Dump:
    def __init__(self) -> None:
        self.data: dict[str, Any] = {}
        self.count: dict[str, int] = {}

    def call(self, op: str, args: list[Any], kwargs: dict[str, Any], grad: tuple[int, ...] = ()) -> None:
        """Record op(*args, **kwargs); `grad`: positions of the args that get a gradient (a backward entry)."""
        fn = bench_functions.get(op)
        assert fn is not None, op
        index = self.count.get(op, 0)
        self.count[op] = index + 1
        base = f"NPU.{op}.{index}"
        leaves = [args[i].detach().requires_grad_(True) if i in grad else a for i, a in enumerate(args)]
        with torch.set_grad_enabled(bool(grad)):
            out = fn(*leaves, **kwargs)
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        self.data[f"{base}.forward"] = {
            "input_args": [enc(a, i in grad) for i, a in enumerate(args)],
            "input_kwargs": {k: enc(v) for k, v in kwargs.items()},
            "output": [enc(o) for o in outs]}
        if grad:
            dy = torch.randn_like(outs[0], dtype=torch.float32).to(outs[0].dtype)
            grads = torch.autograd.grad(outs[0], [leaves[i] for i in grad], dy)
            self.data[f"{base}.backward"] = {"input": [enc(dy)], "output": [enc(g) for g in grads]}

    def write(self, out: Path) -> Path:
        out.mkdir(parents=True, exist_ok=True)
        path = out / "dump.json"
        path.write_text(json.dumps({"task": "statistics", "level": "L1", "framework": "pytorch",
                                    "dump_data_dir": None, "data": self.data}, indent=1))
        return path


def _rn(*shape: int, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape) * scale).to(dtype)


def attention(d: Dump, dt: torch.dtype, preset: str) -> None:
    mask2048 = torch.ones(2048, 2048, dtype=torch.bool).triu(1)  # the compressed causal mask of modes 2 and 3
    if preset == "small":
        b, n, s, hd = 1, 4, 256, 64
        q, k, v = (_rn(b, n, s, hd, dtype=dt) for _ in range(3))
        d.call("npu_fusion_attention", [q, k, v, n, "BNSD"], {"scale": hd ** -0.5}, grad=(0, 1, 2))
        kq, vq = _rn(b, s, 2, hd, dtype=dt), _rn(b, s, 2, hd, dtype=dt)
        d.call("npu_fusion_attention", [_rn(b, s, n, hd, dtype=dt), kq, vq, n, "BSND"],
               {"scale": hd ** -0.5, "atten_mask": mask2048, "sparse_mode": 2}, grad=(0, 1, 2))
        d.call("npu_fusion_attention", [_rn(b, n, 128, hd, dtype=dt), k, v, n, "BNSD"],
               {"scale": hd ** -0.5, "atten_mask": mask2048, "sparse_mode": 3}, grad=(0, 1, 2))
        lens = [100, 256]
    elif preset == "llama":
        b, n, s, hd = 2, 16, 512, 64
        d.call("npu_fusion_attention", [*(_rn(b, n, s, hd, dtype=dt) for _ in range(3)), n, "BNSD"],
               {"scale": hd ** -0.5}, grad=(0, 1, 2))
        lens = []
    else:
        hd = 128
        d.call("npu_fusion_attention", [_rn(1, 2048, 8, hd, dtype=dt), _rn(1, 2048, 2, hd, dtype=dt),
                                        _rn(1, 2048, 2, hd, dtype=dt), 8, "BSND"],
               {"scale": hd ** -0.5, "atten_mask": mask2048, "sparse_mode": 2}, grad=(0, 1, 2))
        d.call("npu_fusion_attention", [_rn(1, 8, 1024, hd, dtype=dt), _rn(1, 2, 2048, hd, dtype=dt),
                                        _rn(1, 2, 2048, hd, dtype=dt), 8, "BNSD"],
               {"scale": hd ** -0.5, "atten_mask": mask2048, "sparse_mode": 3}, grad=(0, 1, 2))
        lens = [512, 1536, 2048, 4096]
    if lens:
        t, hd_t = lens[-1], 64 if preset == "small" else 128
        n_t = 4
        d.call("npu_fusion_attention", [_rn(t, n_t, hd_t, dtype=dt), _rn(t, n_t // 2, hd_t, dtype=dt),
                                        _rn(t, n_t // 2, hd_t, dtype=dt), n_t, "TND"],
               {"scale": hd_t ** -0.5, "atten_mask": mask2048, "sparse_mode": 3, "actual_seq_qlen": lens,
                "actual_seq_kvlen": lens}, grad=(0, 1, 2))


def norms_and_mlp(d: Dump, dt: torch.dtype, preset: str) -> None:
    rows, hidden, heads, hd, inter = {"small": (128, 256, 4, 64, 512), "llama": (1024, 1024, 16, 64, 2816),
                                      "large": (1024, 4096, 32, 128, 11008)}[preset]
    x = _rn(2, rows // 2, hidden, dtype=dt)
    d.call("npu_rms_norm", [x, (1 + 0.1 * torch.randn(hidden)).to(dt)], {"epsilon": 1e-6}, grad=(0, 1))
    pos = torch.arange(rows // 2)[:, None] / 10000 ** (torch.arange(0, hd, 2) / hd)
    ang = torch.cat((pos, pos), -1)
    cos, sin = ang.cos()[None, :, None].to(dt), ang.sin()[None, :, None].to(dt)
    d.call("npu_rotary_mul", [_rn(2, rows // 2, heads, hd, dtype=dt), cos, sin], {}, grad=(0,))
    d.call("npu_swiglu", [_rn(2, rows // 2, 2 * inter, dtype=dt)], {"dim": -1}, grad=(0,))


def others(d: Dump, dt: torch.dtype) -> None:
    """Every other op in bench_functions/, at modest sizes."""
    b, n, s, hd = 1, 2, 128, 64
    q, k, v = (_rn(b, n, s, hd, dtype=dt) for _ in range(3))
    d.call("npu_fusion_attention_v2", [q, k, v, n, "BNSD"], {"scale": hd ** -0.5})
    d.call("npu_fusion_attention_grad", [q, k, v, _rn(b, n, s, hd, dtype=dt), n, "BNSD"], {"scale_value": hd ** -0.5})
    x, g = _rn(2, 64, 256, dtype=dt), (1 + 0.1 * torch.randn(256)).to(dt)
    d.call("npu_add_rms_norm", [x, _rn(2, 64, 256, dtype=dt), g], {})
    d.call("npu_layer_norm_eval", [x, [256], g, _rn(256, dtype=dt, scale=0.1)], {})
    d.call("npu_group_norm_silu", [_rn(2, 32, 8, 8, dtype=dt), g[:32], _rn(32, dtype=dt, scale=0.1), 8], {},
           grad=(0,))
    d.call("npu_fast_gelu", [_rn(2, 64, 512, dtype=dt)], {}, grad=(0,))
    d.call("npu_fast_gelu_backward", [_rn(2, 64, 512, dtype=dt), _rn(2, 64, 512, dtype=dt)], {})
    d.call("npu_mish", [_rn(2, 64, 512, dtype=dt)], {}, grad=(0,))
    mask = torch.ones(64, 64, dtype=torch.bool).triu(1)[None, None].expand(2, 1, 64, 64).contiguous()
    d.call("npu_scaled_masked_softmax", [_rn(2, 4, 64, 64, dtype=dt), mask, 0.125], {}, grad=(0,))
    y = torch.softmax(torch.randn(2, 4, 64, 64).masked_fill(mask, -math.inf), -1).to(dt)
    d.call("npu_scaled_masked_softmax_backward", [_rn(2, 4, 64, 64, dtype=dt), y, mask, 0.125], {})
    xl, w = _rn(128, 256, dtype=dt), _rn(512, 256, dtype=dt, scale=256 ** -0.5)
    d.call("npu_linear", [xl, w, _rn(512, dtype=dt, scale=0.1)], {}, grad=(0, 1))
    d.call("npu_linear_backward", [_rn(128, 512, dtype=dt), xl, w], {})
    d.call("matmul_backward", [_rn(4, 128, 512, dtype=dt), _rn(4, 128, 256, dtype=dt), w.t().contiguous(),
                               [True, True]], {})
    d.call("npu_grouped_matmul", [[xl], [_rn(2, 256, 128, dtype=dt, scale=256 ** -0.5)]],
           {"group_list": [48, 128], "split_item": 3, "group_type": 0})
    d.call("npu_confusion_transpose", [_rn(2, 64, 4, 32, dtype=dt), [0, 2, 1, 3], [2, 4, 64, 32], True], {})
    d.call("npu_confusion_transpose_backward", [_rn(2, 4, 64, 32, dtype=dt), [0, 2, 1, 3], [2, 64, 4, 32], True], {})
    d.call("npu_sort_v2", [_rn(64, 512, dtype=dt)], {"dim": -1})
    d.call("npu_moe_gating_top_k_softmax", [_rn(256, 64, dtype=dt)], {"k": 2})
    d.call("npu_dynamic_quant", [_rn(128, 256, dtype=dt)], {})
    gamma = (1 + 0.1 * torch.randn(256)).to(dt)
    xr = _rn(2, 64, 256, dtype=dt)
    rstd = torch.rsqrt(xr.float().pow(2).mean(-1, keepdim=True) + 1e-6)
    d.call("npu_rms_norm_backward", [_rn(2, 64, 256, dtype=dt), xr, gamma, rstd], {})
    pos = torch.arange(64)[:, None] / 10000 ** (torch.arange(0, 64, 2) / 64)
    ang = torch.cat((pos, pos), -1)
    d.call("npu_rotary_mul_backward", [_rn(2, 64, 4, 64, dtype=dt), _rn(2, 64, 4, 64, dtype=dt),
                                       ang.cos()[None, :, None].to(dt), ang.sin()[None, :, None].to(dt)], {})
    d.call("npu_swiglu_backward", [_rn(2, 64, 512, dtype=dt), _rn(2, 64, 1024, dtype=dt)], {"dim": -1})
    for op, extra in (("npu_apply_adam", [0.9 ** 3, 0.999 ** 3, 1e-3, 0.9, 0.999, 1e-8]),
                      ("npu_apply_adam_w", [0.9 ** 3, 0.999 ** 3, 1e-3, 0.01, 0.9, 0.999, 1e-8])):
        state = [torch.randn(64, 256), torch.randn(64, 256) * 1e-3, torch.rand(64, 256) * 1e-6]
        d.call(op, [*extra, torch.randn(64, 256) * 1e-3], {"out": state})


PARTS: dict[str, Callable[..., None]] = {"attention": attention, "main": norms_and_mlp}


def make(out: Path, dtype: str, preset: str, parts: tuple[str, ...] = ("attention", "main", "others"),
         seed: int = 0) -> Path:
    torch.manual_seed(seed)
    dt = getattr(torch, dtype)
    d = Dump()
    if "attention" in parts:
        attention(d, dt, preset)
    if "main" in parts:
        norms_and_mlp(d, dt, preset)
    if "others" in parts:
        others(d, dt)
    return d.write(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    parser.add_argument("--preset", default="small", choices=("small", "llama", "large"))
    parser.add_argument("--parts", default="attention,main,others")
    args = parser.parse_args()
    path = make(args.out, args.dtype, args.preset, tuple(args.parts.split(",")))
    print(f"{path}: {len(json.loads(path.read_text())['data'])} entries")


if __name__ == "__main__":
    main()
