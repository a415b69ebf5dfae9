"""The machine a benchmark ran on, as every benchmark prints it: a figure means little without its CPU."""
from __future__ import annotations

import platform
from pathlib import Path


def cpu_model() -> str:
    """The CPU model and whether it has native bf16 (AVX512-BF16 or AMX-BF16, or aarch64's BF16)."""
    model, flags = platform.processor() or platform.machine(), ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and ":" in line:
                model = line.split(":", 1)[1].strip()
            if line.startswith(("flags", "Features")) and ":" in line:
                flags = line.split(":", 1)[1]
    except OSError:
        pass
    native = any(f in flags.split() for f in ("avx512_bf16", "amx_bf16", "bf16"))
    return f"{model}, native bf16: {'yes' if native else 'no'}"
