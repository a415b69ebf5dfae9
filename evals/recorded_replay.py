"""A dump recorded with accelerator-like kernels, replayed on CPU: how many items fail where every kernel is correct.

    MSPROBE_VENV/bin/python -m evals recorded_replay record --out DIR [--arms a,b] [--torch-only]
    python -m evals recorded_replay replay DIR

Why: replay compares the outputs saved in a tensor dump with the bench run on the recorded inputs. A dump
recorded on a GPU holds outputs of kernels that are correct by CUDA's contract but not torch's CPU kernels'
(other summation orders, ULP-bounded maths, ties resolved otherwise); replayed with `--msprobe-contract
cuda` every such item must pass. This records one training step of a small Llama-style decoder with a
Mixtral-style MoE MLP (ReLU and softmax routers, `topk` over experts with ties, tokens gathered per expert,
outputs combined with `index_add_` and `scatter_add_`) twice with msprobe's own dumper (L1, task tensor):
under the correct kernels of `evals/planted/accelerator/` (DIR/accelerator) and under torch's own
(DIR/torch, the control), then replays both and prints items, passed, failed and skipped per dump with
each failure's first message line.

`record` runs in the venv that holds mindstudio-probe (see benchmarks/make_dumps.py), one child process
per dump (msprobe's debugger is a process-wide singleton); `replay` runs in this project's venv.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Callable, cast

from .models import llama_parts

ROOT = Path(__file__).resolve().parent.parent
DUMPS = ("accelerator", "torch")
SIZES = {"vocab": 128, "hidden": 64, "heads": 4, "inner": 64, "layers": 2, "experts": 4, "top": 2,
         "seq": 32, "batch": 1}


def dump_file(out: Path, which: str) -> Path:
    return out / which / "step0" / "rank0" / "dump.json"


# --------------------------------------------------------------------------- the model (child only)


def build_moe(dt: Any, sizes: dict[str, int] | None = None) -> tuple[Any, Callable[[], Any]]:
    """A Llama-style decoder whose MLP is a Mixtral-style mixture of experts; layer 0 routes by ReLU (zeros
    tie in topk), layer 1 by softmax; layer 0 combines with index_add_, layer 1 with scatter_add_. `sizes`
    replaces SIZES' entries (a benchmark's larger model)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    c = {**SIZES, **(sizes or {})}
    hidden, heads, hd, experts, top = c["hidden"], c["heads"], c["hidden"] // c["heads"], c["experts"], c["top"]

    RMSNorm, rope = llama_parts(hidden)

    class Expert(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gate = nn.Linear(hidden, c["inner"], bias=False)
            self.up = nn.Linear(hidden, c["inner"], bias=False)
            self.down = nn.Linear(c["inner"], hidden, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return cast(torch.Tensor, self.down(F.silu(self.gate(x)) * self.up(x)))

    class MoE(nn.Module):
        def __init__(self, relu: bool) -> None:
            super().__init__()
            self.relu = relu
            self.router = nn.Linear(hidden, experts, bias=False)
            self.experts = nn.ModuleList(Expert() for _ in range(experts))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, s, _ = x.shape
            h = x.reshape(b * s, hidden)
            logits = self.router(h)
            if self.relu:  # most logits clamp to 0: the zeros tie for the second (or first) place
                probs = F.relu(logits)
                weights, chosen = torch.topk(probs, top, dim=-1)
                weights = weights / (weights.sum(-1, keepdim=True) + 1e-3)
            else:
                probs = F.softmax(logits, dim=-1)
                weights, chosen = torch.topk(probs, top, dim=-1)
                weights = weights / weights.sum(-1, keepdim=True)
            out = torch.zeros_like(h)
            for e, expert in enumerate(self.experts):
                token, slot = torch.where(chosen == e)
                if token.numel() == 0:
                    continue
                y = expert(h[token]) * weights[token, slot].unsqueeze(-1)
                if self.relu:
                    out.index_add_(0, token, y)
                else:
                    out.scatter_add_(0, token.unsqueeze(-1).expand(-1, hidden), y)
            return out.view(b, s, hidden)

    class Block(nn.Module):
        def __init__(self, relu: bool) -> None:
            super().__init__()
            self.n1, self.n2 = RMSNorm(), RMSNorm()
            self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
            self.o = nn.Linear(hidden, hidden, bias=False)
            self.moe = MoE(relu)

        def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
            b, s, _ = x.shape
            q, k, v = self.qkv(self.n1(x)).view(b, s, 3, heads, hd).transpose(1, 3).unbind(2)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.o(att.transpose(1, 2).reshape(b, s, hidden))
            return cast(torch.Tensor, x + self.moe(self.n2(x)))

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(c["vocab"], hidden)
            self.blocks = nn.ModuleList(Block(relu=i % 2 == 0) for i in range(c["layers"]))
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
            return cast(torch.Tensor, self.head(self.norm(x)))

    model = Model().to(dt)
    ids = torch.randint(c["vocab"], (c["batch"], c["seq"] + 1))

    def loss() -> Any:
        logits = model(ids[:, :-1])
        return F.cross_entropy(logits.float().view(-1, c["vocab"]), ids[:, 1:].reshape(-1))
    return model, loss


def child(which: str, out: Path, arm_names: list[str], dtypes: list[str]) -> None:
    """Record one training step into out/which with msprobe's PrecisionDebugger, under the named arms."""
    import contextlib

    import torch

    # the arms key torch's own functions: built before msprobe wraps any of them
    from evals.planted.mode import armed_mode
    from evals.planted.registry import BY_NAME
    arms = [BY_NAME[n] for n in arm_names]
    from msprobe.pytorch import PrecisionDebugger

    torch.manual_seed(0)
    model, loss_fn = build_moe(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    cfg = {"task": "tensor", "dump_path": str(out / which), "rank": [], "step": [0], "level": "L1",
           "tensor": {"scope": [], "list": [], "data_mode": ["all"]}}
    cfg_path = out / f".{which}.config.json"
    cfg_path.write_text(json.dumps(cfg, indent=1))
    debugger = PrecisionDebugger(config_path=str(cfg_path))
    debugger.start(model=model, rank_id=0)
    with contextlib.ExitStack() as armed:
        for arm in arms:
            for dt in dtypes:
                armed.enter_context(armed_mode(arm, getattr(torch, dt)))
        loss = loss_fn()
        loss.backward()
        opt.step()
        opt.zero_grad()
    debugger.stop()
    debugger.step()
    cfg_path.unlink()
    print(f"{which}: loss {loss.item():.6f}")


def record(out: Path, arm_names: list[str], dtypes: list[str], torch_only: bool) -> int:
    """One child per dump; prints entries and seconds of each."""
    out.mkdir(parents=True, exist_ok=True)
    failed = 0
    for which in ("torch",) if torch_only else DUMPS:
        target = out / which
        if target.exists():
            subprocess.run(["rm", "-rf", "--", str(target)], check=True)
        names = arm_names if which == "accelerator" else []
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "evals.recorded_replay", "child", which, "--out", str(out),
                               "--arms", ",".join(names), "--dtypes", ",".join(dtypes)],
                              cwd=ROOT, check=False, capture_output=True, text=True,
                              env={**os.environ, "PYTHONHASHSEED": "0"})
        seconds = time.perf_counter() - t0
        path = dump_file(out, which)
        entries = len(json.loads(path.read_text())["data"]) if path.is_file() else 0
        if proc.returncode != 0 or not entries:
            failed += 1
            print(proc.stdout + proc.stderr, file=sys.stderr)
        loss = proc.stdout.strip().splitlines()[-1:] if proc.stdout.strip() else [""]
        print(f"{which:12s} rc={proc.returncode} entries={entries:5d} s={seconds:6.1f} arms={','.join(names) or '-'} "
              f"{loss[0]}", flush=True)
    return 1 if failed else 0


# --------------------------------------------------------------------------- replay (project venv)


def _first_line(text: str | None) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[0] if lines else ""


def skip_reason(node: Any) -> str:
    """A skip's message without its item's name, shapes and counts: the reasons group across items."""
    text = _first_line(node.get("message") or node.text).split(": ", 1)[-1]
    return re.sub(r"\d+", "N", re.sub(r"\[[^\]]*\]", "[..]", text))[:110]


def replay_one(out: Path, which: str, workers: str) -> dict[str, Any]:
    """`pytest DUMP --msprobe-mode replay --msprobe-contract cuda`, read back from its JUnit XML."""
    results = out / f"results-{which}"
    junit = results / "junit.xml"
    cmd = [sys.executable, "-m", "pytest", str(dump_file(out, which)), "--msprobe-mode", "replay",
           "--msprobe-contract", "cuda", "-n", workers, "-p", "no:randomly", "-q", "--msprobe-out", str(results),
           f"--junitxml={junit}"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, check=False, capture_output=True, text=True)
    row: dict[str, Any] = {"dump": which, "rc": proc.returncode, "seconds": time.perf_counter() - t0,
                           "command": " ".join(cmd), "failures": [], "skips": {}}
    if not junit.is_file():
        row["error"] = _first_line(proc.stderr) or proc.stdout.strip().splitlines()[-1:]
        return row
    cases = ET.parse(junit).getroot().iter("testcase")
    counts = {"items": 0, "passed": 0, "failed": 0, "skipped": 0}
    for case in cases:
        counts["items"] += 1
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if bad is not None:
            counts["failed"] += 1
            row["failures"].append((case.get("name", ""), _first_line(bad.get("message")) or _first_line(bad.text)))
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
            reason = skip_reason(case.find("skipped"))
            row["skips"][reason] = row["skips"].get(reason, 0) + 1
        else:
            counts["passed"] += 1
    row.update(counts)
    return row


def replay(out: Path, workers: str) -> int:
    rows = [replay_one(out, which, workers) for which in DUMPS if dump_file(out, which).is_file()]
    print("| dump | items | passed | failed | skipped | seconds |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['dump']} | {r.get('items', '-')} | {r.get('passed', '-')} | {r.get('failed', '-')} | "
              f"{r.get('skipped', '-')} | {r['seconds']:.1f} |")
    for r in rows:
        if r.get("error"):
            print(f"\n{r['dump']}: no results (rc {r['rc']}): {r['error']}\n  {r['command']}")
        for name, message in r["failures"]:
            print(f"{r['dump']}: FAILED {name}: {message}")
    for r in rows:
        for reason, count in sorted(r["skips"].items(), key=lambda kv: -kv[1]):
            print(f"{r['dump']}: {count} skipped: {reason}")
    (out / "replay.json").write_text(json.dumps(rows, indent=1))
    return 0 if rows and all(r.get("failed") == 0 and not r.get("error") for r in rows) else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="record both dumps (msprobe venv)")
    rec.add_argument("--out", type=Path, required=True)
    rec.add_argument("--arms", default=None, help="accelerator arms, comma-separated (default: every correct one)")
    rec.add_argument("--dtypes", default="bfloat16",
                     help="the dtypes armed, comma-separated (default bfloat16; calls whose first float tensor is "
                          "fp32, e.g. RMSNorm's statistics, run torch's kernels unless float32 is named)")
    rec.add_argument("--torch-only", action="store_true", help="record only the torch dump (torch's own kernels)")
    kid = sub.add_parser("child")
    kid.add_argument("which", choices=DUMPS)
    kid.add_argument("--out", type=Path, required=True)
    kid.add_argument("--arms", default="")
    kid.add_argument("--dtypes", default="bfloat16")
    rep = sub.add_parser("replay", help="replay both dumps with --msprobe-contract cuda (project venv)")
    rep.add_argument("out", type=Path)
    rep.add_argument("-n", dest="workers", default="2")
    args = ap.parse_args(argv)
    if args.command == "child":
        child(args.which, args.out.resolve(), [a for a in args.arms.split(",") if a], args.dtypes.split(","))
        return 0
    if args.command == "record":
        if args.arms is None:
            from evals.planted.accelerator import ACCELERATOR_ARMS
            names = [a.name for a in ACCELERATOR_ARMS if a.kind != "unsupported"]
        else:
            names = [a for a in args.arms.split(",") if a]
        return record(args.out.resolve(), names, args.dtypes.split(","), args.torch_only)
    return replay(args.out.resolve(), args.workers)


if __name__ == "__main__":
    sys.exit(main())
