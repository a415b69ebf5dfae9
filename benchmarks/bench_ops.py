"""Bench time against device time for large single ops, per standard.

    OMP_NUM_THREADS=1 python -m benchmarks bench_ops [--standards msprobe strict] [--only attention]
    OMP_NUM_THREADS=1 python -m benchmarks bench_ops --shared      # the largest ops of ../shared/dumps
    python -m benchmarks bench_ops --accuracy [--seq 2048]          # is an fp32 attention bench enough?

Every op is checked in-process by `check.check_entry` (device: CPU), forward and backward items,
one thread like an xdist worker. Printed per item: the device run (forward + backward), the bench
run (forward + backward), the third runs of the chosen standard (`strict`: the fp32 reference and
its two perturbed twins; shown as "ref"), the comparison, and the whole check.

The default op set is a 7B-class transformer layer at a reduced token count (bf16 and fp32 linear,
bf16 attention with S=2048, a bf16 conv and an fp32 transposed conv, fp32 bmm): the sizes where a
CPU bench, not the device, decides how long a check takes.

--accuracy measures the error of the attention reference computed in fp32 instead of fp64 (causal,
N=8, D=128, forward and backward) in units of the finest scale any standard judges it on: strict's
per-element scale, max(one ULP of the device dtype, 2x the output change when the inputs move by one
unit roundoff of that dtype; rms of two random-sign moves, as strict's twins). A maximum well below
1 means the cheaper bench cannot decide a verdict (api_specs/apis.yaml, precision.raise_map_by_api).
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "dumps"


def _t(shape: list[int], dtype: str, grad: bool = True, low: float = -1.0, high: float = 1.0) -> dict[str, Any]:
    return {"type": "torch.Tensor", "dtype": dtype, "shape": shape, "Max": high, "Min": low, "Mean": 0.0,
            "Norm": 1.0, "requires_grad": grad}


def _op(forward: dict[str, Any], grads: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {"forward": forward, "backward": {"input": grads, "output": []}}


def large_ops() -> dict[str, dict[str, Any]]:
    bf16, fp32 = "torch.bfloat16", "torch.float32"
    tokens, hidden, heads, seq, dim = 1024, 4096, 8, 2048, 128
    ops = {
        "Functional.linear.0": _op({"input_args": [_t([tokens, hidden], bf16), _t([hidden, hidden], bf16, low=-0.02, high=0.02)],
                                    "input_kwargs": {}, "output": [_t([tokens, hidden], bf16)]},
                                   [_t([tokens, hidden], bf16, False, -1e-3, 1e-3)]),
        "Functional.linear.1": _op({"input_args": [_t([tokens, hidden], fp32), _t([hidden, hidden], fp32, low=-0.02, high=0.02)],
                                    "input_kwargs": {}, "output": [_t([tokens, hidden], fp32)]},
                                   [_t([tokens, hidden], fp32, False, -1e-3, 1e-3)]),
        "Torch.bmm.0": _op({"input_args": [_t([heads, 512, 1024], fp32), _t([heads, 1024, 512], fp32)],
                            "input_kwargs": {}, "output": [_t([heads, 512, 512], fp32)]},
                           [_t([heads, 512, 512], fp32, False)]),
        "NPU.npu_fusion_attention.0": _op(
            {"input_args": [_t([1, heads, seq, dim], bf16), _t([1, heads, seq, dim], bf16), _t([1, heads, seq, dim], bf16),
                            {"type": "int", "value": heads}, {"type": "str", "value": "BNSD"}],
             "input_kwargs": {"scale": {"type": "float", "value": dim ** -0.5},
                              "sparse_mode": {"type": "int", "value": 0}},
             "output": [_t([1, heads, seq, dim], bf16)]},
            [_t([1, heads, seq, dim], bf16, False, -1e-3, 1e-3)]),
        "Functional.conv2d.0": _op({"input_args": [_t([8, 64, 56, 56], bf16), _t([64, 64, 3, 3], bf16, low=-0.1, high=0.1)],
                                    "input_kwargs": {"padding": {"type": "int", "value": 1}},
                                    "output": [_t([8, 64, 56, 56], bf16)]},
                                   [_t([8, 64, 56, 56], bf16, False, -1e-3, 1e-3)]),
        "Functional.conv_transpose2d.0": _op(
            {"input_args": [_t([8, 64, 56, 56], fp32), _t([64, 64, 3, 3], fp32, low=-0.1, high=0.1)],
             "input_kwargs": {"padding": {"type": "int", "value": 1}}, "output": [_t([8, 64, 56, 56], fp32)]},
            [_t([8, 64, 56, 56], fp32, False, -1e-3, 1e-3)]),
    }
    return {f"{name}.{direction}": entry for name, pair in ops.items() for direction, entry in pair.items()}


def write_dump(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "dump.json"
    path.write_text(json.dumps({"task": "statistics", "level": "L1", "framework": "pytorch",
                                "dump_data_dir": None, "data": large_ops()}))
    return path


def shared_entries() -> list[tuple[Path, str]]:
    """Every entry of the shared PyTorch dumps."""
    from pytest_msprobe.dump.reader import load_dump

    return [(folder / "dump.json", name) for folder in sorted(SHARED.iterdir()) if "_pt_" in folder.name
            for name in load_dump(folder / "dump.json").entry_names()]


def attention_accuracy(seq: int) -> None:
    import numpy as np
    import torch

    from bench_functions.attention import npu_fusion_attention
    from pytest_msprobe.verdict import grid

    heads, dim = 8, 128
    gen = torch.Generator().manual_seed(0)
    q, k, v, dy = (torch.randn(1, heads, seq, dim, generator=gen).bfloat16().double() * s for s in (2, 2, 2, 1))
    mask = torch.triu(torch.ones(2048, 2048, dtype=torch.bool), 1)

    def run(inputs: list[torch.Tensor], cotangent: torch.Tensor) -> list[np.ndarray]:
        leaves = [t.clone().requires_grad_() for t in inputs]
        query, key, value = leaves
        out = npu_fusion_attention(query, key, value, heads, "BNSD", scale=dim ** -0.5, sparse_mode=2,
                                   atten_mask=mask)[0]
        out.backward(cotangent.to(out.dtype))  # type: ignore[no-untyped-call]  # Tensor.backward is unannotated
        grads = [cast(torch.Tensor, x.grad) for x in leaves]  # every leaf reaches the output
        return [t.detach().double().numpy() for t in (out, *grads)]

    exact = run([q, k, v], dy)
    fast = run([t.float() for t in (q, k, v)], dy)
    print(f"attention S={seq}: |fp32 bench - fp64 bench| in units of strict's scale")
    for dtype, eps in (("bf16", 2.0 ** -8), ("fp16", 2.0 ** -11)):
        squares = [np.zeros_like(x) for x in exact]
        for twin in range(2):
            g = torch.Generator().manual_seed(10 + twin)

            # g and eps bound now: ruff's B023
            def move(t: torch.Tensor, g: torch.Generator = g, eps: float = eps) -> torch.Tensor:
                return t * (1 + eps * (torch.randint(0, 2, t.shape, generator=g).double() * 2 - 1))

            moved = run([move(t) for t in (q, k, v)], move(dy))
            squares = [s + (m - e) ** 2 for s, m, e in zip(squares, moved, exact)]
        torch_dtype = f"torch.{'bfloat16' if dtype == 'bf16' else 'float16'}"
        for name, sq, e, f in zip(("out", "dq", "dk", "dv"), squares, exact, fast):
            scale = np.maximum(grid.ulp(grid.round_to(e, torch_dtype), torch_dtype), 2 * np.sqrt(sq / 2))
            ratio = np.abs(f - e) / scale
            print(f"  {dtype} {name}: max {ratio.max():.3g}, 99.99% {np.quantile(ratio, 0.9999):.3g}, "
                  f"median {np.median(ratio):.3g}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--standards", nargs="+", default=["msprobe", "strict"])
    parser.add_argument("--only", default="", help="substring of the entry names to run")
    parser.add_argument("--shared", action="store_true", help="the largest ops of ../shared/dumps instead")
    parser.add_argument("--count", type=int, default=8, help="--shared: how many items to print (by bench time)")
    parser.add_argument("--repeat", type=int, default=1, help="best of this many checks per item (by total)")
    parser.add_argument("--accuracy", action="store_true", help="the fp32 attention bench's error instead")
    parser.add_argument("--seq", type=int, default=2048, help="--accuracy: sequence length")
    args = parser.parse_args()
    if args.accuracy:
        return attention_accuracy(args.seq)

    import torch

    from pytest_msprobe.check import check_entry
    from pytest_msprobe.dump.reader import load_dump
    from pytest_msprobe.settings import CheckOptions
    from pytest_msprobe.specs.loader import load_specs

    torch.set_num_threads(1)
    specs = load_specs()
    with tempfile.TemporaryDirectory() as tmp:
        if args.shared:
            entries = shared_entries()
        else:
            path = write_dump(Path(tmp))
            entries = [(path, name) for name in load_dump(path).entry_names()]
        entries = [(p, n) for p, n in entries if args.only in n]
        unit, factor = ("ms", 1e3) if args.shared else ("s", 1.0)
        print(f"torch {torch.__version__}, {torch.get_num_threads()} thread; {unit} per item")
        print(f"{'entry':44} {'standard':8} {'device':>7} {'bench':>7} {'ref':>7} {'compare':>8} {'total':>7}  status")
        rows = []
        warm_up = next((e for e in entries if e[1].endswith(".backward")), None)
        if warm_up:  # the first backward of a process pays autograd's start-up (~0.3 s)
            check_entry(load_dump(warm_up[0]), warm_up[1], CheckOptions(device="cpu"), specs)
        for path, name in entries:
            dump = load_dump(path)
            for standard in args.standards:
                options = CheckOptions(device="cpu", standard=standard)
                total, record = float("inf"), {}
                for _ in range(args.repeat):
                    started = time.perf_counter()
                    attempt = check_entry(dump, name, options, specs).to_dict()
                    if time.perf_counter() - started < total:
                        total, record = time.perf_counter() - started, attempt
                t = record["timings"]
                device = t.get("device_s", 0) + t.get("device_backward_s", 0)
                bench = t.get("bench_s", 0) + t.get("bench_backward_s", 0)
                ref = sum(v for k, v in t.items() if k.startswith("reference"))
                compare = t.get("compare_s", 0) - t.get("bench_backward_s", 0) - t.get("device_backward_s", 0) \
                    - t.get("reference_backward_s", 0)
                line = (f"{name[-44:]:44} {standard:8} " + " ".join(
                    f"{x * factor:{w}.2f}" for x, w in ((device, 7), (bench, 7), (ref, 7), (compare, 8), (total, 7)))
                    + f"  {record['status']}" + (f"  {path.parent.name}" if args.shared else ""))
                rows.append((bench, line))
                if not args.shared:
                    print(line, flush=True)
        if args.shared:  # the largest ops by bench time
            for _, line in sorted(rows, key=lambda r: -r[0])[:args.count]:
                print(line)


if __name__ == "__main__":
    main()
