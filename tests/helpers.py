"""Helpers shared by the test modules."""
from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path
from typing import Any

import pytest

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


def copy_dump(pytester: pytest.Pytester, source: Path, name: str) -> Path:
    """A copy of a dump folder (with its tensor files) under the pytester directory."""
    shutil.copytree(source, pytester.path / name)
    return pytester.path / name / "dump.json"


def make_dump(pytester: pytest.Pytester, data: dict[str, Any], name: str = "d", task: str = "statistics",
              framework: str = "pytorch") -> Path:
    folder = pytester.path / name
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "dump.json"
    path.write_text(json.dumps({"task": task, "level": "L1", "framework": framework, "dump_data_dir": None,
                                "data": data}))
    return path


def records(pytester: pytest.Pytester, out: str = "msprobe_results") -> list[dict[str, Any]]:
    """The records of the one run that wrote into `out`."""
    files = list((pytester.path / out).glob("msprobe_records_*.jsonl"))
    assert len(files) == 1, files
    return [json.loads(line) for line in files[0].read_text().splitlines()]


def by_api(recs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {f"{r['api']}.{r['direction']}": r for r in recs}


def api_records(pytester: pytest.Pytester, out: str = "msprobe_results") -> dict[str, dict[str, Any]]:
    return by_api(records(pytester, out))


# A torch-function mode that replaces the torch functions of IMPLS ({F.gelu: fn(orig, *args, **kwargs)});
# the code that uses it defines IMPLS.
DEVICE_MODE = """
from torch.overrides import TorchFunctionMode


class DeviceSide(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        impl = IMPLS.get(func)
        return func(*args, **(kwargs or {})) if impl is None else impl(func, *args, **(kwargs or {}))
"""

_DEVICE_CALL_HOOK = """
import pytest


@pytest.hookimpl(wrapper=True)
def pytest_msprobe_device_call(phase):
    if phase != "forward":  # the backward runs the autograd graph of the replaced forward
        return (yield)
    with DeviceSide():
        return (yield)
"""


def device_side_conftest(impls: str) -> str:
    """A conftest whose replacements (`impls` defines IMPLS) apply only inside the device call of each item.

    Only the device side sees them, as with a real device's kernel: the bench and strict's torch run
    (torch's own kernel on the CPU in the device dtype) keep torch's, so a replacement that also reached
    them would be judged against itself.
    """
    return textwrap.dedent(impls) + DEVICE_MODE + _DEVICE_CALL_HOOK
# F.gelu 5% off on the device where its fp32 input reaches 2.5 (the bench and the torch run are untouched)
GELU_OFF_ABOVE_2_5 = device_side_conftest("""
import torch.nn.functional as F
def gelu(orig, x, *a, **k):
    y = orig(x, *a, **k)
    return y * 1.05 if float(x.max()) > 2.5 and str(y.dtype) == "torch.float32" else y
IMPLS = {F.gelu: gelu}
""")


def two_ranks_same_names(pytester: pytest.Pytester) -> None:
    """step0/rank0 and step0/rank1 with the same calls (gelu, relu); rank1's gelu fails, everything else passes."""
    pytester.makeconftest(GELU_OFF_ABOVE_2_5)
    for rank, top in (("rank0", 1.0), ("rank1", 3.0)):
        gelu = {"input_args": [tensor(shape=[16, 16], mx=top, mn=0.5)], "input_kwargs": {},
                "output": [tensor(shape=[16, 16])]}
        relu = {"input_args": [tensor()], "input_kwargs": {}, "output": [tensor()]}
        make_dump(pytester, {"Functional.gelu.0.forward": gelu, "Functional.relu.0.forward": relu},
                  name=f"step0/{rank}")


def numba_compiler_loaded() -> None:
    """Compile one function in this process (never cached), so numba's compiler loads every module it
    imports lazily (its target registries, `numba.core.boxing`) now. A kernel loaded from the on-disk cache
    loads none of them; the first compile inside a pytester in-process run would then import them there,
    pytester drops them from sys.modules afterwards, and the next compile re-imports them into registries
    that still hold them: "KeyError: duplicate registration" (tests/test_numba_warm_up.py)."""
    import numba
    import numpy as np

    numba.njit(cache=False)(lambda a: a.sum())(np.zeros(2))


def strict_warm_up() -> None:
    """One strict check and one of msprobe's metrics of a tiny output of each device dtype, and the random
    draw: imports numba and loads (or compiles, once per machine) the kernels' signatures, so no test's item
    pays for it inside a timeout; and numba's compiler, for the signatures a test compiles itself."""
    numba_compiler_loaded()
    import numpy as np

    from pytest_msprobe.specs.loader import load_specs
    from pytest_msprobe.verdict import grid, standards, strict
    from pytest_msprobe.verdict.judge import element_rules as _rules

    bench = np.linspace(-1.0, 1.0, 64)
    for dtype, holder in (("torch.bfloat16", np.float32), ("torch.float32", np.float32),
                          ("torch.float64", np.float64)):
        rules = _rules(load_specs()["thresholds"]["strict"], dtype)
        device = grid.round_to(bench, dtype).astype(holder)
        strict.strict_compare(bench, device, dtype, rules)
        # and msprobe's metrics' pass (metrics/numba_kernel.py), of each bench dtype it is compiled for
        b = bench.astype(np.float32 if dtype == "torch.bfloat16" else np.float64)
        standards.compare_tensor("warm", b, device, bench_dtype=str(b.dtype), device_dtype=dtype, judging=standards.Judging("add"))
    from pytest_msprobe.check.compare import warm_up

    warm_up("strict")  # and the compiled random draw, as each process does before its first item
