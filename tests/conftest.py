from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest

# pytester's in-process runs drop modules first imported inside them; torch must never be
# re-imported in one process (its C extension crashes), so import it once up front.
import torch  # noqa: F401

import bench_functions  # noqa: F401
import pytest_msprobe.check.rerun  # noqa: F401
from tests.helpers import strict_warm_up

# the same for numba, which the strict checks' kernel imports on the first check and which imports more
# of itself on its first compilation: one check here, before any in-process run (a second import of numba
# in one process fails: its code generator meets classes of both imports)
strict_warm_up()

# --msprobe-fuzz imports hypothesis inside in-process runs. It is a test extra: pytest also loads this
# file (testpaths) for `pytest --msprobe-api-info dump.json` after a plain `pip install -e .`, where
# the test modules that need hypothesis are not collected.
with contextlib.suppress(ImportError):
    import hypothesis  # noqa: F401


# Dump fixtures under tests/ are data, not something to collect when running our own suite.
collect_ignore_glob = ["data/*"]


@pytest.fixture
def write_dump(tmp_path: Path):
    """Write a dump.json (optionally with tensor files) into tmp_path and return its path."""

    def write(data: dict[str, Any], *, task: str = "statistics", framework: str | None = "pytorch",
              folder: str = "dump", raw: str | None = None, **header: Any) -> Path:
        d = tmp_path / folder
        d.mkdir(parents=True, exist_ok=True)
        path = d / "dump.json"
        if raw is not None:
            path.write_text(raw)
            return path
        doc: dict[str, Any] = {"task": task, "level": "L1", "dump_data_dir": None}
        if framework is not None:
            doc["framework"] = framework
        doc.update(header)
        doc["data"] = data
        path.write_text(json.dumps(doc, indent=1))
        return path

    return write
