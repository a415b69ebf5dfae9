"""msprobe's metric statistics in torch ops where the device output lives (metrics/on_device.py), against the
compiled host pass (metrics/fused.py), on the CPU: the same code path an accelerator takes.

Maxima, positions and counts must be the host's exactly (the ULP errors' included, from numpy's log2 and exp2
tables); the sums are torch's float64 ones, so the float64 sums agree to about 1e-15 and the host's pairwise sums
in B to a float32 sum's rounding. Outputs the pass leaves to the host (non-finite elements, an fp16 output beside
a float64 bench) give None.
"""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_msprobe.check.compare import stored
from pytest_msprobe.metrics import fused, on_device, stats, storage
from pytest_msprobe.verdict import standards

from .helpers import EXAMPLES, copy_dump

FLOAT64_SUMS = ("dot_db", "dot_dd", "dot_bb", "sum_rel_normal")  # float64 sums in another order on either side
PAIRWISE_IN_B = ("pairwise_rel_normal", "sum_sq_normal", "sum_ulp")  # numpy's pairwise sum in B on the host
ULP = {torch.bfloat16: (7, -126), torch.float16: (10, -14), torch.float32: (23, -126)}
OUTPUTS = [(torch.bfloat16, torch.float32), (torch.bfloat16, torch.float64), (torch.float16, torch.float32),
           (torch.float32, torch.float64), (torch.float16, torch.float64)]


def case(n: int, seed: int, dtype: torch.dtype, bench_dtype: torch.dtype, specials: list[tuple[int, str]],
         off: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A bench and a device output of it, rounded, every `off`-th element one step off; `specials` put zeros,
    subnormals, values just below a power of two (where numpy's log2 rounds up), huge or non-finite values."""
    rng = np.random.default_rng(seed)
    bench = torch.from_numpy(rng.standard_normal(n) * np.exp2(rng.integers(-20, 20, n))).to(bench_dtype)
    wide = torch.finfo(bench_dtype)
    for at, kind in specials:
        bench[at % n] = {"zero": 0.0, "tiny": wide.tiny / 4, "below": 2.0 ** (at % 40 - 20) * (1 - wide.eps / 2),
                         "huge": 1e30, "nan": math.nan, "inf": -math.inf}[kind]
    device = bench.to(dtype)
    device[::off] = torch.nextafter(device[::off].float(), torch.tensor(math.inf)).to(dtype)
    return bench, device


def host_and_device(bench: torch.Tensor, device: torch.Tensor, ulp: bool, binary: bool) -> tuple[Any, Any]:
    values = stored(device)[1]
    dev_dtype = np.dtype(np.float32) if storage.is_bits(values) else values.dtype
    work = np.dtype(np.float32) if device.dtype == torch.bfloat16 else bench.numpy().dtype
    limits = stats.Limits(2.0 ** -10, 2.0 ** -10, 2.0 ** -16, 2.0 ** -8, (0.01, 0.001, 0.0001),
                          (*ULP[device.dtype], 1.0) if ulp else None, binary)
    return (fused.compute(bench.numpy(), values, dev_dtype, limits, work),
            on_device.compute(bench, device, dev_dtype, limits, work))


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 70_000), seed=st.integers(0, 2**16), output=st.sampled_from(OUTPUTS), ulp=st.booleans(),
       binary=st.booleans(), off=st.integers(1, 9),
       specials=st.lists(st.tuples(st.integers(0, 2**20), st.sampled_from(["zero", "tiny", "below", "huge"])),
                         max_size=40))
def test_the_device_statistics_are_the_hosts(n: int, seed: int, output: tuple[torch.dtype, torch.dtype], ulp: bool,
                                             binary: bool, off: int, specials: list[tuple[int, str]]) -> None:
    host, device = host_and_device(*case(n, seed, *output, specials, off), ulp, binary)
    if host.n_nonfinite or output == (torch.float16, torch.float64):  # "huge" overflows fp16 and bf16's bench_dev
        assert device is None
        return
    assert device is not None
    for field in dataclasses.fields(host):
        a, b = getattr(host, field.name), getattr(device, field.name)
        if isinstance(a, float) and math.isnan(a):  # a zero error times an infinite scale (ULP: a bench far below
            assert math.isnan(b), field.name     # the smallest exponent)
        elif field.name in FLOAT64_SUMS:
            assert math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-300), field.name
        elif field.name in PAIRWISE_IN_B and a is not None:
            assert math.isclose(a, b, rel_tol=1e-5 if host_work(output) == np.float32 else 1e-12,
                                abs_tol=1e-30), field.name
        else:
            assert a == b, (field.name, a, b)


def host_work(output: tuple[torch.dtype, torch.dtype]) -> Any:
    return np.float32 if output[0] == torch.bfloat16 or output[1] == torch.float32 else np.float64


@pytest.mark.parametrize("kind", ["nan", "inf"])
def test_a_non_finite_output_is_left_to_the_host(kind: str) -> None:
    bench, device = case(5000, 1, torch.bfloat16, torch.float32, [(17, kind)], 3)
    host, on = host_and_device(bench, device, True, False)
    assert host.n_nonfinite == 1 and on is None
    # and its row is the host's, column for column (NaN included)
    rows = [json.dumps(standards.compare_structure("x", [bench], [device], judging=standards.Judging("matmul"), converter=stored,
                                                   on=where)[0].to_dict(), sort_keys=True)
            for where in (None, torch.device("cpu"))]
    assert rows[0] == rows[1] and "NaN" in rows[0]


def test_a_failing_accelerator_hands_the_metrics_to_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """An op the accelerator lacks: the row is the host's and the device type is noted (strict.torch_pass.unsupported,
    which warns once); on the CPU the same failure is a bug and is raised."""
    bench, device = case(5000, 2, torch.bfloat16, torch.float32, [], 3)

    def lacking(*args: Any) -> Any:
        raise RuntimeError("no float64 sum here")

    host = standards.compare_structure("x", [bench], [device], judging=standards.Judging("add"), converter=stored)[0].to_dict()
    monkeypatch.setattr(on_device, "compute", lacking)
    with pytest.raises(RuntimeError, match="no float64"):
        standards.compare_structure("x", [bench], [device], judging=standards.Judging("add"), converter=stored, on=torch.device("cpu"))
    noted: list[Any] = []
    monkeypatch.setattr("pytest_msprobe.verdict.strict.torch_pass.unsupported", lambda on, exc: noted.append(on))
    row = standards.compare_structure("x", [bench], [device], judging=standards.Judging("add"), converter=stored,
                                      on=torch.device("cpu"))[0]
    assert row.to_dict() == host and noted == [torch.device("cpu")]


def test_a_run_with_the_checks_on_the_device_takes_msprobes_statistics_there(pytester: pytest.Pytester,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """msprobe_checks_on=device: every float output's statistics come from the device pass, none from the host's
    compiled one; msprobe_checks_on=host: the reverse."""
    dump = copy_dump(pytester, EXAMPLES / "mlp_bf16_statistics" / "step0" / "rank0", "mlp")
    calls = {"device": 0, "host": 0}
    device_compute, host_compute = on_device.compute, fused.compute

    def on_the_device(*args: Any) -> Any:
        calls["device"] += 1
        return device_compute(*args)

    def on_the_host(*args: Any) -> Any:
        calls["host"] += 1
        return host_compute(*args)

    monkeypatch.setattr(on_device, "compute", on_the_device)
    monkeypatch.setattr(fused, "compute", on_the_host)
    seen = {}
    for where in ("device", "host"):
        calls.update(device=0, host=0)
        result = pytester.runpytest(str(dump), "--msprobe-device", "cpu", "-o", f"msprobe_checks_on={where}",
                                    "-o", "msprobe_helper_thread=off", "-p", "no:cacheprovider", "--msprobe-out", where)
        assert result.ret == 0
        seen[where] = dict(calls)
    assert seen["device"]["device"] >= 15 and seen["device"]["host"] == 0, seen
    assert seen["host"] == {"device": 0, "host": seen["device"]["device"]}, seen
