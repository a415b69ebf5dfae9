"""Warming the compiled passes up: the package's warm-up per standard, and the tests' warm-up, which keeps numba
compiling after a pytester in-process run restores sys.modules."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pytest_msprobe.check import compare
from pytest_msprobe.verdict import judge, standards

SCRIPT = textwrap.dedent("""
    import sys
    import numba
    import numpy as np
    from tests.helpers import numba_compiler_loaded

    @numba.njit(cache=True)
    def cached(a):
        return a.sum()

    cached(np.zeros(3))  # the second process only loads it, as an xdist worker loads the kernels
    if sys.argv[1] == "warm":
        numba_compiler_loaded()
    before = dict(sys.modules)  # what pytester's in-process run keeps
    numba.njit(cache=False)(lambda a: a.max())(np.zeros(3))  # a signature compiled inside that run
    for name in [k for k in sys.modules if k not in before]:
        del sys.modules[name]
    numba.njit(cache=False)(lambda a, b: a.min() + b)(np.zeros(3, np.float32), 1.0)  # a later test's compile
    print("compiled")
""")


def run(tmp_path: Path, mode: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, str(script), mode], capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.parametrize("mode", ["warm", "cold"])
def test_a_compile_after_restored_modules_needs_the_compiler_loaded_first(tmp_path: Path, mode: str) -> None:
    assert run(tmp_path, mode).returncode == 0  # the first process writes the cache
    second = run(tmp_path, mode)
    if mode == "warm":
        assert second.returncode == 0 and "compiled" in second.stdout, second.stderr[-2000:]
    else:  # what the warm-up prevents, so this test can tell
        assert second.returncode != 0 and "duplicate registration" in second.stderr


def test_warm_up_loads_the_strict_pass_when_first_asked_for_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that warmed up for msprobe's standard (an in-process run) still loads the strict pass when a
    later run asks for strict, and each pass only once."""
    calls: list[tuple[str, str, str]] = []
    monkeypatch.setattr(compare, "_WARMED", set())
    monkeypatch.setattr(standards, "compare_tensor",
                        lambda name, b, d, **k: calls.append(("metrics", str(b.dtype), str(d.dtype))))
    monkeypatch.setattr(judge, "strict_verdict",
                        lambda arrays, *a: calls.append(("strict", str(arrays.bench.dtype), str(arrays.device.dtype))))
    compare.warm_up("msprobe")
    compare.warm_up("msprobe")
    # bf16 outputs as their storage (uint16), fp16 ones as numpy's float16 (the passes read it as int16): the
    # signatures a run's items use
    metrics = [("metrics", "float32", "uint16"), ("metrics", "float32", "float16"), ("metrics", "float64", "uint16"),
               ("metrics", "float64", "float16")]
    assert calls == metrics
    compare.warm_up("strict")
    compare.warm_up("strict")
    assert calls == metrics + [("strict", bench, device) for device in ("uint16", "float16")
                               for bench in ("float32", "float64")]  # a float32 bench and a float64 one, once
