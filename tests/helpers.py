"""Helpers shared by the test modules."""
from __future__ import annotations

from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SHARED_DUMPS = ROOT.parent / "shared" / "dumps"
EXAMPLES = ROOT / "examples"


def shared_dump_dirs(framework: str = "pt") -> list[Path]:
    if not SHARED_DUMPS.is_dir():
        return []
    return sorted(p for p in SHARED_DUMPS.iterdir() if f"_{framework}_" in p.name)


def tensor(dtype: str = "torch.float32", shape: list[int] | None = None, mx: Any = 1.0, mn: Any = -1.0,
           requires_grad: bool = False, **extra: Any) -> dict[str, Any]:
    return {"type": "torch.Tensor", "dtype": dtype, "shape": [4, 8] if shape is None else shape,
            "Max": mx, "Min": mn, "Mean": 0.0, "Norm": 1.0, "requires_grad": requires_grad, **extra}
