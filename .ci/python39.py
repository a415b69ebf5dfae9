"""Python 3.9, pyproject's floor (Ascend hosts run torch_npu 2.1 on it), which CI's pinned torch (a 3.11 wheel)
cannot run: every module of the package must import there, and the compiled checks must give 3.11's numbers.

    python .ci/python39.py      # prints one line: the checks' statistics of a fixed output, to compare

Without torch (the 3.9 environment has none), a stand-in takes its place for the imports only: the modules that
import torch at the top are imported for what Python itself runs there (syntax, run-time type aliases such as
`X | None`, which 3.9 rejects), not for torch's behaviour. The statistics come from the two compiled passes, which
need numpy and numba alone, on an output one ULP off at every seventh element.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import pkgutil
import sys
import traceback
import types
from typing import Any

STAND_INS = ("torch", "torch_npu", "mindspore")


class _Anything:
    """Whatever a module does with torch at import: attributes, calls, subscripts, subclassing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return _Anything()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _Anything()

    def __getitem__(self, key: Any) -> Any:
        return _Anything()

    def __iter__(self) -> Any:
        return iter(())

    def __mro_entries__(self, bases: Any) -> tuple[type, ...]:
        return (object,)


class _StandIn(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name.split(".")[0] in STAND_INS:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = lambda name: _Anything()  # type: ignore[method-assign]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def import_everything() -> list[str]:
    """Every module of the package and the bench functions; what failed, with where."""
    import bench_functions
    import pytest_msprobe

    failed = []
    for package in (pytest_msprobe, bench_functions):
        for found in pkgutil.walk_packages(package.__path__, package.__name__ + ".",
                                           onerror=lambda name: failed.append(f"{name}: {sys.exc_info()[1]!r}")):
            try:
                importlib.import_module(found.name)
            except Exception as error:  # noqa: BLE001 - each one is reported
                where = traceback.extract_tb(error.__traceback__)[-1]
                failed.append(f"{found.name}: {type(error).__name__}: {error} ({where.filename}:{where.lineno})")
    return failed


def statistics() -> str:
    """The metric pass's and the strict pass's results on a fixed bf16 output beside a float64 bench."""
    import numpy as np

    from pytest_msprobe.metrics import fused
    from pytest_msprobe.specs.loader import load_specs
    from pytest_msprobe.verdict import strict
    from pytest_msprobe.verdict.judge import element_rules as _rules

    bench = np.random.default_rng(0).standard_normal(200_000)
    bits = (strict.round_to(bench, "torch.bfloat16").astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    bits[::7] += 1
    limits = fused.Limits(2**-8, 2**-10, 2**-16, 0.0, (0.01, 0.001, 0.0001), (7, -126, 1.0), False)
    stats = fused.compute(bench.astype(np.float32), bits, np.dtype(np.float32), limits)
    result = strict.strict_compare(bench, bits, "torch.bfloat16", _rules(load_specs()["thresholds"]["strict"],
                                                                         "torch.bfloat16"))
    return f"{stats!r} {result!r}"


def main() -> int:
    if importlib.util.find_spec("torch") is None:
        sys.meta_path.insert(0, _StandIn())
    failed = import_everything()
    for line in failed:
        print(f"does not import on Python {sys.version.split()[0]}: {line}", file=sys.stderr)
    print(statistics())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
