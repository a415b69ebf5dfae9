"""Synthetic msprobe dumps of any size with a transformer layer's op mix.

    python -m benchmarks gen_dump OUT_DIR --entries 100000 [--mode statistics|tensor] [--dtype bfloat16]
           [--hidden 64 --seq 16 --batch 2]

Each transformer layer records, in call order, the calls a real training step dumps (layer norms,
q/k/v/o projections, attention scores, softmax, dropout, residual adds, the MLP with silu gating)
with forward and backward entries and statistics computed from real tensors of those shapes, so
inputs generated from them look like the recorded ones. A few layers are computed and then repeated
with new call indices up to the requested size. `--mode tensor` also saves every tensor to
dump_tensor_data/ (.pt), as msprobe's tensor task does.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch


def _stats(t: torch.Tensor) -> dict[str, Any]:
    if t.dtype == torch.bool:
        return {"Max": bool(t.any()), "Min": bool(t.all()), "Mean": None, "Norm": None}
    f = t.float()
    return {"Max": f.max().item(), "Min": f.min().item(), "Mean": f.mean().item(), "Norm": f.norm().item()}


class Writer:
    def __init__(self, out: Path, mode: str) -> None:
        self.out, self.mode = out, mode
        self.data: dict[str, dict[str, Any]] = {}
        self.counters: dict[str, int] = {}
        if mode == "tensor":
            (out / "dump_tensor_data").mkdir(parents=True, exist_ok=True)

    def tensor(self, t: torch.Tensor, name: str, requires_grad: bool = False) -> dict[str, Any]:
        enc = {"type": "torch.Tensor", "dtype": str(t.dtype), "shape": list(t.shape), **_stats(t),
               "requires_grad": requires_grad}
        if self.mode == "tensor":
            enc["data_name"] = f"{name}.pt"
            torch.save(t.contiguous().clone(), self.out / "dump_tensor_data" / f"{name}.pt")
        return enc

    def call(self, api: str, args: list[Any], kwargs: dict[str, Any], out: torch.Tensor | tuple[torch.Tensor, ...],
             grads: list[torch.Tensor] | None = None) -> None:
        index = self.counters.get(api, 0)
        self.counters[api] = index + 1
        base = f"{api}.{index}"

        def enc(value: Any, where: str) -> Any:
            if isinstance(value, torch.Tensor):
                return self.tensor(value, where, value.is_floating_point())
            if isinstance(value, (list, tuple)):
                return [enc(v, f"{where}.{i}") for i, v in enumerate(value)]
            if value is None:
                return None
            return {"type": type(value).__name__, "value": value}

        outputs = out if isinstance(out, tuple) else (out,)
        self.data[f"{base}.forward"] = {
            "input_args": [enc(a, f"{base}.forward.input.{i}") for i, a in enumerate(args)],
            "input_kwargs": {k: enc(v, f"{base}.forward.input.{k}") for k, v in kwargs.items()},
            "output": [enc(o, f"{base}.forward.output.{i}") for i, o in enumerate(outputs)],
        }
        if grads is not None:
            self.data[f"{base}.backward"] = {
                "input": [self.tensor(torch.randn_like(o) * 1e-3, f"{base}.backward.input.{i}")
                          for i, o in enumerate(outputs[:1])],
                "output": [self.tensor(g, f"{base}.backward.output.{i}") for i, g in enumerate(grads)],
            }


def layer(w: Writer, x: torch.Tensor, hidden: int, dtype: torch.dtype) -> torch.Tensor:
    F = torch.nn.functional
    gamma = torch.ones(hidden, dtype=dtype)
    h = F.layer_norm(x, (hidden,), gamma, torch.zeros(hidden, dtype=dtype))
    w.call("Functional.layer_norm", [x, [hidden], gamma, torch.zeros(hidden, dtype=dtype), 1e-5], {}, h, [x, gamma])
    qkv = []
    for _ in range(3):
        weight = (torch.randn(hidden, hidden) * hidden ** -0.5).to(dtype)
        y = F.linear(h, weight)
        w.call("Functional.linear", [h, weight], {}, y, [h, weight])
        qkv.append(y)
    q, k, v = qkv
    scores = torch.matmul(q, k.transpose(-1, -2)) * hidden ** -0.5
    w.call("Torch.matmul", [q, k.transpose(-1, -2)], {}, scores, [q, k])
    probs = F.softmax(scores.float(), dim=-1).to(dtype)
    w.call("Functional.softmax", [scores], {"dim": -1}, probs, [scores])
    probs = F.dropout(probs, 0.1, True)
    w.call("Functional.dropout", [probs, 0.1, True, False], {}, probs, [probs])
    ctx = torch.matmul(probs, v)
    w.call("Torch.matmul", [probs, v], {}, ctx, [probs, v])
    wo = (torch.randn(hidden, hidden) * hidden ** -0.5).to(dtype)
    attn = F.linear(ctx, wo)
    w.call("Functional.linear", [ctx, wo], {}, attn, [ctx, wo])
    x = x + attn
    w.call("Tensor.__add__", [x, attn], {}, x, [x, attn])
    h = F.layer_norm(x, (hidden,))
    w.call("Functional.layer_norm", [x, [hidden]], {}, h, [x])
    up = (torch.randn(4 * hidden, hidden) * hidden ** -0.5).to(dtype)
    gate = F.linear(h, up)
    w.call("Functional.linear", [h, up], {}, gate, [h, up])
    act = F.silu(gate)
    w.call("Functional.silu", [gate], {}, act, [gate])
    prod = act * gate
    w.call("Tensor.__mul__", [act, gate], {}, prod, [act, gate])
    down = (torch.randn(hidden, 4 * hidden) * (4 * hidden) ** -0.5).to(dtype)
    mlp = F.linear(prod, down)
    w.call("Functional.linear", [prod, down], {}, mlp, [prod, down])
    x = x + mlp
    w.call("Tensor.__add__", [x, mlp], {}, x, [x, mlp])
    return x


LAYERS = 8


def _replicate(recorded: dict[str, Any], entries: int) -> dict[str, Any]:
    """Repeat the recorded layers, renumbering call indices so every entry name stays unique and each
    backward entry keeps its forward partner; saved tensors are shared between the copies."""
    from pytest_msprobe.dump.reader import parse_entry_name

    per_api: dict[str, int] = {}
    for name in recorded:
        parsed = parse_entry_name(name)
        key = f"{parsed.api_type}.{parsed.api_name}"
        per_api[key] = max(per_api.get(key, 0), int(parsed.index) + 1)
    data: dict[str, Any] = {}
    copy = 0
    while len(data) < entries:
        for name, entry in recorded.items():
            parsed = parse_entry_name(name)
            key = f"{parsed.api_type}.{parsed.api_name}"
            data[f"{key}.{int(parsed.index) + copy * per_api[key]}.{parsed.direction}"] = entry
            if len(data) == entries:
                break
        copy += 1
    return data


def generate(out: Path, entries: int, mode: str = "statistics", dtype: str = "float32",
             hidden: int = 64, seq: int = 16, batch: int = 2) -> Path:
    torch.manual_seed(0)
    torch_dtype = getattr(torch, dtype)
    out.mkdir(parents=True, exist_ok=True)
    w = Writer(out, mode)
    x = torch.randn(batch, seq, hidden).to(torch_dtype)
    for _ in range(LAYERS):  # real statistics for a few layers ...
        x = layer(w, x, hidden, torch_dtype)
        x = x / x.float().std().to(torch_dtype)  # keep activations in range over many layers
    data = _replicate(w.data, entries)  # ... repeated (with new call indices) up to the requested size
    doc = {"task": mode, "level": "L1", "framework": "pytorch",
           "dump_data_dir": str(out / "dump_tensor_data") if mode == "tensor" else None, "data": data}
    (out / "dump.json").write_text(json.dumps(doc, indent=1))
    return out / "dump.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--entries", type=int, default=1000)
    parser.add_argument("--mode", choices=("statistics", "tensor"), default="statistics")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--seq", type=int, default=16)
    parser.add_argument("--batch", type=int, default=2)
    args = parser.parse_args()
    path = generate(args.out, args.entries, args.mode, args.dtype, args.hidden, args.seq, args.batch)
    print(f"{path}: {args.entries} entries, {path.stat().st_size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
