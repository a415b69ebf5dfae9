from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session", autouse=True)
def _imported_once() -> None:
    """What the suite's in-process runs need imported before the first of them, done before the first test of
    tests/ and only then: pytest loads this file for `pytest --msprobe-api-info dump.json` from the repository
    root too (testpaths), the README's first command, which needs none of it (at import, it cost that command
    about 2 s of its 3 s with numba's cache warm, and hid a cold cache's compilation outside pytest's timer).

    - pytester's in-process runs drop modules first imported inside them, and torch must never be imported
      twice in one process (its C extension crashes);
    - the same for numba, which the strict checks' kernel imports on the first check and which imports more of
      itself on its first compilation: one check here (a second import of numba in one process fails: its code
      generator meets classes of both imports);
    - --msprobe-fuzz imports hypothesis inside in-process runs; it is a test extra;
    - torch._dynamo, which an optimizer imports on its first use (the in-process check's tests build one inside
      pytester's tests): its import registers torch's test operator library, which a second import refuses
      ("Only a single TORCH_LIBRARY can be used to register the namespace _inductor_test")."""
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401

    import bench_functions  # noqa: F401
    import pytest_msprobe.check.rerun  # noqa: F401
    from tests.helpers import strict_warm_up

    strict_warm_up()
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
