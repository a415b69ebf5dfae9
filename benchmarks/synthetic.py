"""A synthetic dump of many small API calls, made by replicating the bundled example MLP dumps.

Each copy renames the call index (Functional.linear.0 -> Functional.linear.<k>) so forward and
backward entries keep their pairing; the statistics, shapes and dtypes are the real recorded ones.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pytest_msprobe.dump.reader import parse_entry_name

ROOT = Path(__file__).resolve().parents[1]
SOURCES = (ROOT / "examples" / "mlp_bf16_statistics" / "step0" / "rank0" / "dump.json",)


def write_synthetic_dump(folder: Path, min_items: int = 1000, sources: tuple[Path, ...] = SOURCES) -> Path:
    """Write `folder/dump.json` with at least `min_items` entries (one pytest item each)."""
    entries: list[tuple[str, dict[str, Any]]] = []
    for source in sources:
        entries += json.loads(source.read_text())["data"].items()
    data: dict[str, dict[str, Any]] = {}
    copy = 0
    while len(data) < min_items:
        for name, entry in entries:
            parsed = parse_entry_name(name)
            index = int(parsed.index) + 1000 * copy
            data[f"{parsed.api_type}.{parsed.api_name}.{index}.{parsed.direction}"] = entry
        copy += 1
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "dump.json"
    path.write_text(json.dumps({"task": "statistics", "level": "L1", "framework": "pytorch",
                                "dump_data_dir": None, "data": data}))
    return path


def _tensor(shape: list[int], dtype: str = "torch.float32") -> dict[str, Any]:
    return {"type": "torch.Tensor", "dtype": dtype, "shape": shape, "Max": 1.0, "Min": -1.0, "Mean": 0.0,
            "Norm": 1.0, "requires_grad": False}


def write_skewed_dump(folder: Path, small: int = 1000, large: int = 1, size: int = 2048) -> Path:
    """`small` tiny relu calls, then `large` big matmuls at the very end of the dump (the worst case
    for a scheduler that follows dump order: the big call starts when everything else is done)."""
    data = {f"Functional.relu.{i}.forward": {"input_args": [_tensor([8, 16])], "input_kwargs": {},
                                             "output": [_tensor([8, 16])]} for i in range(small)}
    for i in range(large):
        data[f"Torch.matmul.{i}.forward"] = {"input_args": [_tensor([size, size]), _tensor([size, size])],
                                             "input_kwargs": {}, "output": [_tensor([size, size])]}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "dump.json"
    path.write_text(json.dumps({"task": "statistics", "level": "L1", "framework": "pytorch",
                                "dump_data_dir": None, "data": data}))
    return path
