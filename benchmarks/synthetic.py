"""A synthetic dump of many small API calls, made by replicating the bundled example MLP dumps.

Each copy renames the call index (Functional.linear.0 -> Functional.linear.<k>) so forward and
backward entries keep their pairing; the statistics, shapes and dtypes are the real recorded ones.
"""
from __future__ import annotations

import json
from pathlib import Path

from pytest_msprobe.dump import parse_entry_name

ROOT = Path(__file__).resolve().parents[1]
SOURCES = (ROOT / "examples" / "mlp_bf16_statistics" / "step0" / "rank0" / "dump.json",)


def write_synthetic_dump(folder: Path, min_items: int = 1000, sources: tuple[Path, ...] = SOURCES) -> Path:
    """Write `folder/dump.json` with at least `min_items` entries (one pytest item each)."""
    entries: list[tuple[str, dict]] = []
    for source in sources:
        entries += json.loads(source.read_text())["data"].items()
    data: dict[str, dict] = {}
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
