"""Real msprobe dumps of one training step, recorded by msprobe's own dumper on CPU.

Runs in a separate venv that holds mindstudio-probe (not this project's venv):

    python3 -m venv MSPROBE_VENV
    MSPROBE_VENV/bin/pip install "mindstudio-probe==26.2.0" "torch==2.13.0"
    MSPROBE_VENV/bin/python -m benchmarks make_dumps --out DUMPS [--only 'llama_tiny_*'] [--list]
    MSPROBE_VENV/bin/python -m benchmarks make_dumps --out DUMPS --only 'llama_7b_*' [--small]

Why: the verdict and speed work (planted bugs, false alarms, side-by-side timings) needs dumps that
msprobe itself wrote, at tiny and realistic sizes, in every dtype, so that every quirk of its
format (call naming, backward entries, optimizer calls, statistics of bf16 tensors, tensor files)
is the real one and every recorded call ran on torch's own (correct) CPU kernels.

Each dump is one training step (forward, backward, one AdamW step) of a Llama-style decoder, a conv
net or an MLP, recorded by `PrecisionDebugger` (level L1, task `statistics` or `tensor`, step 0,
rank 0), into `OUT/<model>_<size>_<dtype>_<task>/step0/rank0/dump.json`. `<dtype>` is fp32, bf16 or
fp16 (model and inputs cast to it) or `autocastbf16` (fp32 model under
`torch.autocast("cpu", dtype=torch.bfloat16)`). msprobe's debugger is a process-wide singleton,
so every dump is written by a child process of this script (`--child NAME`). A summary of every
dump made (entries, bytes, seconds, versions) is merged into `OUT/manifest.json`.

`llama_7b_bf16_statistics` has a 7B-class model's shapes (hidden 4096, 32 query heads with 8 key/value heads,
FFN 14336, vocabulary 128256, 4096 tokens) with two decoder layers: embedding, the layers, the final norm, the
lm_head, cross-entropy, backward and AdamW, in bf16. Its weights are made in bf16 (no fp32 copy), and AdamW steps
one parameter at a time, smallest first, freeing its moments and gradient after its update (the same calls).
`--small` makes it with SMALL_SEQ tokens (`llama_7b-small_bf16_statistics`), for CI. Peak resident memory and wall
time on a 2-core AMD EPYC (avx512_bf16: yes) shared with other work, 2026-11-28, `/usr/bin/time -v
MSPROBE_VENV/bin/python -m benchmarks make_dumps --out OUT --only 'llama_7b_*' [--small]`: 11.5 GiB, 7 min
51 s; with --small 11.7 GiB, 1 min 3 s. The 1.3B parameters and their gradients (5 GiB), the largest parameter's
two moments and its update's temporaries, and msprobe's statistics of them set the peak, not the tokens.

fp16 note: AdamW uses eps=1e-4 in fp16 (1e-8 underflows to 0 in fp16 and a zero gradient then
gives 0/0 = NaN in the update); every other setting is the same across dtypes.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from evals.models import llama_parts

MODELS = ("llama", "conv", "mlp")
SIZES = ("tiny", "realistic")
SMALL_SEQ = 128  # --small: the 7b dump's tokens (every weight keeps its full shape), for CI
DTYPES = ("fp32", "bf16", "fp16")


@dataclass(frozen=True)
class Spec:
    """One dump to make: which model, how big, which dtype and which msprobe task."""

    model: str
    size: str
    dtype: str
    task: str

    @property
    def name(self) -> str:
        return f"{self.model}_{self.size}_{self.dtype}_{self.task}"


def all_specs() -> list[Spec]:
    """Every dump this script knows; tensor dumps only where their size stays reasonable."""
    specs = [Spec(m, s, d, "statistics") for m in MODELS for s in SIZES for d in DTYPES]
    specs += [Spec("conv", s, "autocastbf16", "statistics") for s in SIZES]
    specs += [Spec(m, "tiny", d, "tensor") for m in MODELS for d in DTYPES]
    specs += [Spec("conv", "tiny", "autocastbf16", "tensor"), Spec("llama", "realistic", "bf16", "tensor")]
    specs += [Spec("llama", "7b", "bf16", "statistics"), Spec("llama", "7b-small", "bf16", "statistics")]
    return specs


# --------------------------------------------------------------------------- models (child only)

LLAMA = {"tiny": {"vocab": 128, "hidden": 64, "heads": 4, "inner": 176, "layers": 2, "seq": 16, "batch": 1},
         "realistic": {"vocab": 2048, "hidden": 1024, "heads": 8, "inner": 2816, "layers": 4, "seq": 512, "batch": 1},
         # a 7B-class model's shapes (Llama 3 8B's): grouped-query attention, two decoder layers
         "7b": {"vocab": 128256, "hidden": 4096, "heads": 32, "kv_heads": 8, "inner": 14336, "layers": 2,
                "seq": 4096, "batch": 1}}
LLAMA["7b-small"] = {**LLAMA["7b"], "seq": SMALL_SEQ}
class ConvShape(TypedDict):
    """One conv net's sizes: three conv layers' channels, image side, batch, classes, group_norm groups."""

    channels: tuple[int, int, int]
    image: int
    batch: int
    classes: int
    groups: int


CONV: dict[str, ConvShape] = {
    "tiny": {"channels": (8, 16, 16), "image": 8, "batch": 2, "classes": 10, "groups": 4},
    "realistic": {"channels": (64, 128, 256), "image": 56, "batch": 8, "classes": 100, "groups": 32}}
MLP = {"tiny": {"features": 16, "hidden": 32, "classes": 10, "batch": 4},
       "realistic": {"features": 1024, "hidden": 4096, "classes": 1000, "batch": 64}}


def build_llama(size: str, dt: Any) -> tuple[Any, Callable[[], Any]]:
    """A Llama-style decoder: RMSNorm (fp32 inside), rotary embeddings, causal SDPA, SwiGLU MLP."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    c = LLAMA[size]
    hidden, heads, hd = c["hidden"], c["heads"], c["hidden"] // c["heads"]

    RMSNorm, rope = llama_parts(hidden)

    class GQABlock(nn.Module):
        """Llama 3's layer: separate q, k, v projections, fewer key/value heads than query heads."""

        def __init__(self) -> None:
            super().__init__()
            kv = c["kv_heads"] * hd
            self.n1, self.n2 = RMSNorm(), RMSNorm()
            self.q, self.k = nn.Linear(hidden, hidden, bias=False), nn.Linear(hidden, kv, bias=False)
            self.v, self.o = nn.Linear(hidden, kv, bias=False), nn.Linear(hidden, hidden, bias=False)
            self.gate = nn.Linear(hidden, c["inner"], bias=False)
            self.up = nn.Linear(hidden, c["inner"], bias=False)
            self.down = nn.Linear(c["inner"], hidden, bias=False)

        def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
            b, s, _ = x.shape
            h = self.n1(x)
            q = self.q(h).view(b, s, heads, hd).transpose(1, 2)
            k = self.k(h).view(b, s, c["kv_heads"], hd).transpose(1, 2)
            v = self.v(h).view(b, s, c["kv_heads"], hd).transpose(1, 2)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            x = x + self.o(att.transpose(1, 2).reshape(b, s, hidden))
            h = self.n2(x)
            out: torch.Tensor = x + self.down(F.silu(self.gate(h)) * self.up(h))
            return out

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.n1, self.n2 = RMSNorm(), RMSNorm()
            self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
            self.o = nn.Linear(hidden, hidden, bias=False)
            self.up = nn.Linear(hidden, 2 * c["inner"], bias=False)
            self.down = nn.Linear(c["inner"], hidden, bias=False)

        def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
            b, s, _ = x.shape
            q, k, v = self.qkv(self.n1(x)).view(b, s, 3, heads, hd).transpose(1, 3).unbind(2)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.o(att.transpose(1, 2).reshape(b, s, hidden))
            g, u = self.up(self.n2(x)).chunk(2, -1)
            out: torch.Tensor = x + self.down(F.silu(g) * u)
            return out

    class Llama(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(c["vocab"], hidden)
            self.blocks = nn.ModuleList((GQABlock if "kv_heads" in c else Block)() for _ in range(c["layers"]))
            self.norm = RMSNorm()
            self.head = nn.Linear(hidden, c["vocab"], bias=False)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            s = ids.shape[1]
            inv = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
            f = torch.outer(torch.arange(s).float(), inv)
            emb = torch.cat((f, f), -1)
            cos, sin = emb.cos().to(dt), emb.sin().to(dt)
            x = self.emb(ids)
            for blk in self.blocks:
                x = blk(x, cos, sin)
            logits: torch.Tensor = self.head(self.norm(x))
            return logits

    if "kv_heads" in c:  # made in bf16 from the start: no fp32 copy of 1.3B parameters on the way
        torch.set_default_dtype(dt)
    model = Llama().to(dt)
    torch.set_default_dtype(torch.float32)
    ids = torch.randint(c["vocab"], (c["batch"], c["seq"] + 1))

    def loss() -> Any:
        logits = model(ids[:, :-1])
        return F.cross_entropy(logits.float().view(-1, c["vocab"]), ids[:, 1:].reshape(-1))
    return model, loss


def build_conv(size: str, dt: Any) -> tuple[Any, Callable[[], Any]]:
    """A small CNN: conv2d, batch_norm / group_norm, relu / gelu, max and adaptive average pools."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    c = CONV[size]
    c1, c2, c3 = c["channels"]

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(3, c1, 3, padding=1), nn.BatchNorm2d(c1)
            self.conv2, self.gn2 = nn.Conv2d(c1, c2, 3, padding=1), nn.GroupNorm(c["groups"], c2)
            self.conv3, self.bn3 = nn.Conv2d(c2, c3, 3, padding=1, bias=False), nn.BatchNorm2d(c3)
            self.fc = nn.Linear(c3, c["classes"])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
            x = F.max_pool2d(F.gelu(self.gn2(self.conv2(x))), 2)
            x = F.relu(self.bn3(self.conv3(x)))
            logits: torch.Tensor = self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))
            return logits

    autocast = dt == "autocastbf16"
    wdt = torch.float32 if autocast else dt
    model = Net().to(wdt)
    x = torch.randn(c["batch"], 3, c["image"], c["image"]).to(wdt)
    y = torch.randint(c["classes"], (c["batch"],))

    def loss() -> Any:
        if autocast:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return F.cross_entropy(model(x), y)
        return F.cross_entropy(model(x), y)
    return model, loss


def build_mlp(size: str, dt: Any) -> tuple[Any, Callable[[], Any]]:
    """An MLP classifier: linear, layer_norm, gelu, dropout p=0, log_softmax + nll and softmax + mse."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    c = MLP[size]
    h = c["hidden"]

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.ln1 = nn.Linear(c["features"], h), nn.LayerNorm(h)
            self.fc2, self.ln2 = nn.Linear(h, h), nn.LayerNorm(h)
            self.fc3 = nn.Linear(h, c["classes"])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = F.dropout(F.gelu(self.ln1(self.fc1(x))), p=0.0, training=True)
            x = F.gelu(self.ln2(self.fc2(x)))
            logits: torch.Tensor = self.fc3(x)
            return logits

    model = Net().to(dt)
    x = torch.randn(c["batch"], c["features"]).to(dt)
    y = torch.randint(c["classes"], (c["batch"],))
    target = F.one_hot(y, c["classes"]).to(dt)

    def loss() -> Any:
        logits = model(x)
        return F.nll_loss(F.log_softmax(logits, -1), y) + F.mse_loss(F.softmax(logits, -1), target)
    return model, loss


def child(spec: Spec, out: Path) -> None:
    """Record one training step of `spec` with msprobe's PrecisionDebugger into out/spec.name."""
    import torch
    from msprobe.pytorch import PrecisionDebugger

    torch.manual_seed(0)
    dt: Any = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}.get(spec.dtype, spec.dtype)
    model, loss_fn = {"llama": build_llama, "conv": build_conv, "mlp": build_mlp}[spec.model](spec.size, dt)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, eps=1e-4 if dt is torch.float16 else 1e-8,
                            foreach=False)
    dump_path = out / spec.name
    cfg = {"task": spec.task, "dump_path": str(dump_path), "rank": [], "step": [0], "level": "L1",
           "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "statistics"},
           "tensor": {"scope": [], "list": [], "data_mode": ["all"]}}
    cfg_path = out / f".{spec.name}.config.json"
    cfg_path.write_text(json.dumps(cfg, indent=1))
    debugger = PrecisionDebugger(config_path=str(cfg_path))
    debugger.start(model=model, rank_id=0)
    loss = loss_fn()
    loss.backward()
    if spec.size.startswith("7b"):
        # one parameter at a time, its moments and gradient freed after its update: the same AdamW calls
        # without 5 GiB of optimizer state alive at once (the step's peak stays near the forward's)
        del opt
        # the largest last (the embedding and the lm_head): the smaller ones' gradients are freed by then
        for p in sorted(model.parameters(), key=lambda q: q.numel()):
            one = torch.optim.AdamW([p], lr=1e-3, eps=1e-8, foreach=False)
            one.step()
            p.grad = None
            del one
    else:
        opt.step()
        opt.zero_grad()
    debugger.stop()
    debugger.step()
    cfg_path.unlink()


# --------------------------------------------------------------------------- driver


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def summarise(out: Path, name: str, seconds: float, rc: int) -> dict[str, Any]:
    """Entries, size and versions of one finished dump, for the manifest."""
    dump = out / name / "step0" / "rank0" / "dump.json"
    row: dict[str, Any] = {"name": name, "rc": rc, "seconds": round(seconds, 1)}
    if dump.is_file():
        data = json.loads(dump.read_text())["data"]
        row.update(entries=len(data), forward=sum(k.endswith(".forward") for k in data),
                   backward=sum(k.endswith(".backward") for k in data), bytes=dir_bytes(out / name))
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="where the dump folders go (needed but with --list)")
    ap.add_argument("--only", default="*", help="glob on dump names, e.g. '*_tiny_*' or 'llama_*_bf16_*'")
    ap.add_argument("--list", action="store_true", help="print the dump names and exit")
    ap.add_argument("--small", action="store_true",
                    help=f"the 7b dump with {SMALL_SEQ} tokens (every shape but the tokens' kept), for CI: "
                         "llama_7b-small_bf16_statistics")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    specs = {s.name: s for s in all_specs()}
    if args.child:
        child(specs[args.child], args.out)
        return 0
    chosen = [n for n in specs if fnmatch.fnmatch(n, args.only) and "7b-small" not in n]
    if args.small:
        chosen = [n.replace("_7b_", "_7b-small_") for n in chosen if "_7b_" in n]
    if args.list or not chosen:
        print("\n".join(chosen) if chosen else f"no dump name matches {args.only!r}")
        return 0 if chosen else 2
    if args.out is None:
        ap.error("--out DUMPS: where the dump folders go")
    args.out.mkdir(parents=True, exist_ok=True)
    manifest_path = args.out / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    from importlib.metadata import version  # fails early outside the msprobe venv:
    versions = {"torch": version("torch"), "msprobe": version("mindstudio-probe")}
    failed = 0
    for name in chosen:
        target = args.out / name
        if target.exists():
            subprocess.run(["rm", "-rf", "--", str(target)], check=True)
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, __file__, "--child", name, "--out", str(args.out)],
                              check=False, capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"})
        row = summarise(args.out, name, time.perf_counter() - t0, proc.returncode)
        row.update(versions)
        if proc.returncode != 0 or "entries" not in row:
            failed += 1
            row["error"] = proc.stderr.strip().splitlines()[-1:] if proc.stderr.strip() else ["no dump.json"]
        manifest[name] = row
        manifest_path.write_text(json.dumps(dict(sorted(manifest.items())), indent=1))
        print(f"{name:40s} rc={row['rc']} entries={row.get('entries', '-'):>5} "
              f"MiB={row.get('bytes', 0) / 2**20:8.1f} s={row['seconds']:6.1f} {row.get('error', '')}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
