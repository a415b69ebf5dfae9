"""Time and peak RSS of the npu_fusion_attention reference, forward + backward on CPU.

B=1, N=8, D=128, layout BNSD, causal (sparse_mode 2 with the compressed 2048 mask) and full attention,
for S = 1k, 4k, 8k. Each size runs in a fresh subprocess, so its ru_maxrss is that size's own peak.

    python -m benchmarks bench_fusion_attention            # all sizes
    python -m benchmarks bench_fusion_attention 1024 4096  # chosen sizes
    python -m benchmarks bench_fusion_attention --float32  # the bench of a bf16 attention (it computes
                                                           # in its inputs' dtype; default float64)
"""
from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIZES = (1024, 4096, 8192)
B, N, D = 1, 8, 128


def measure(seq: int, causal: bool, dtype_name: str) -> dict[str, float]:
    """One forward + backward; runs inside the child process."""
    import torch

    from bench_functions.attention import npu_fusion_attention

    torch.manual_seed(0)
    q, k, v = (torch.randn(B, N, seq, D, dtype=getattr(torch, dtype_name), requires_grad=True) for _ in range(3))
    mask = torch.triu(torch.ones(2048, 2048, dtype=torch.bool), diagonal=1) if causal else None
    started = time.perf_counter()
    out = npu_fusion_attention(q, k, v, N, "BNSD", atten_mask=mask, scale=D ** -0.5, sparse_mode=2 if causal else 0)[0]
    forward = time.perf_counter() - started
    out.backward(torch.ones_like(out))  # type: ignore[no-untyped-call]  # Tensor.backward is unannotated
    total = time.perf_counter() - started
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {"seq": seq, "causal": causal, "forward_s": forward, "total_s": total, "peak_rss_mib": peak_kib / 1024}


def main(argv: list[str]) -> None:
    if argv[:1] == ["--child"]:
        print(json.dumps(measure(int(argv[1]), argv[2] == "causal", argv[3])))
        return
    dtype = "float32" if "--float32" in argv else "float64"
    sizes = [int(a) for a in argv if a != "--float32"] or list(SIZES)
    print(f"npu_fusion_attention reference, {dtype}, B={B} N={N} D={D}, forward + backward, one process per run")
    print(f"{'S':>6} {'mask':>7} {'forward s':>10} {'fwd+bwd s':>10} {'peak RSS MiB':>13}")
    for seq in sizes:
        for mask in ("causal", "full"):
            done = subprocess.run([sys.executable, "-m", "benchmarks", "bench_fusion_attention", "--child", str(seq), mask,
                                   dtype], check=True, capture_output=True, text=True, cwd=ROOT)
            r = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"{r['seq']:>6} {mask:>7} {r['forward_s']:>10.1f} {r['total_s']:>10.1f} {r['peak_rss_mib']:>13.0f}",
                  flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
