"""Ill-conditioned elementwise functions (lgamma, digamma, polygamma) judged by their mixed forward-backward error
where a ULP of the argument moves them by more than their forward bound, by the usual check elsewhere
(check/conditioning.py), through a replayed tensor dump: the recorded output is a kernel's that is not torch's."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Callable

import pytest
import torch

from pytest_msprobe.check.conditioning import spacing
from tests.helpers import records

LEAN = ("-p", "no:cacheprovider", "--msprobe-mode", "replay")
Kernel = Callable[[torch.Tensor], torch.Tensor]
# the zeros of lgamma (1, 2 and two negative ones) and of digamma (its positive root and four negative ones)
ZEROS = (1.0, 2.0, -2.4570247382208006, -2.7476826467274127, 1.4616321449683622, -0.5040830082644554,
         -1.5734984731623904, -2.6107208684441446, -3.6352933664369010)


def arguments() -> torch.Tensor:
    """fp32 arguments over [-4.4, 4.4] away from the poles, and dense around the zeros."""
    gen = torch.Generator().manual_seed(0)
    x = torch.empty(4096, dtype=torch.float64).uniform_(-4.4, 4.4, generator=gen)
    x = x[(x > 0.05) | ((x - x.round()).abs() > 0.05)]
    around = (torch.tensor(ZEROS, dtype=torch.float64)[:, None] +
              torch.linspace(-3e-3, 3e-3, 64, dtype=torch.float64)[None]).reshape(-1)
    return torch.cat([x, around]).float()


def signs(x: torch.Tensor, seed: int) -> torch.Tensor:
    return torch.randint(-1, 2, x.shape, generator=torch.Generator().manual_seed(seed)).double()


def backward_stable(f: Kernel) -> Kernel:
    """A correct kernel by the principle: f of an argument within one fp32 ULP, correctly rounded."""
    def kernel(x: torch.Tensor) -> torch.Tensor:
        x64 = x.double()
        return f(x64 + signs(x, 1) * spacing(x64, torch.float32)).float()
    return kernel


def with_a_last_bit(f: Kernel) -> Kernel:
    """The same, then one ULP either way, as a kernel whose last step rounds otherwise."""
    def kernel(x: torch.Tensor) -> torch.Tensor:
        y, s = backward_stable(f)(x), signs(x, 2)
        up, down = torch.full_like(y, math.inf), torch.full_like(y, -math.inf)
        return torch.where(s > 0, torch.nextafter(y, up), torch.where(s < 0, torch.nextafter(y, down), y))
    return kernel


def tensor_dump(root: Path, api: str, kernel: Kernel, order: int | None = None) -> Path:
    """A PyTorch tensor dump of one fp32 call (`order`: polygamma's n, its first argument), its output the
    kernel's."""
    x = arguments()
    y = kernel(x)
    folder = root / "dump_tensor_data"
    folder.mkdir(parents=True)

    def leaf(t: torch.Tensor, name: str) -> dict[str, object]:
        torch.save(t.clone(), folder / name)
        return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": list(t.shape), "Max": float(t.max()),
                "Min": float(t.min()), "Mean": float(t.mean()), "Norm": float(t.norm()), "requires_grad": False,
                "data_name": name}

    first = [] if order is None else [{"type": "int", "value": order}]
    entry = {"input_args": [*first, leaf(x, f"Torch.{api}.0.forward.input.{len(first)}.pt")], "input_kwargs": {},
             "output": [leaf(y, f"Torch.{api}.0.forward.output.0.pt")]}
    path = root / "dump.json"
    path.write_text(json.dumps({"task": "tensor", "level": "L1", "framework": "pytorch", "dump_data_dir": None,
                                "data": {f"Torch.{api}.0.forward": entry}}))
    return path


def _row(pytester: pytest.Pytester, dump: Path, contract: str, out: str) -> tuple[str, dict[str, object]]:
    pytester.runpytest(str(dump), *LEAN, "--msprobe-contract", contract, "--msprobe-out", out)
    (record,) = records(pytester, out)
    return record["status"], record["outputs"][0]


@pytest.mark.parametrize("contract", ["torch", "cuda"])
@pytest.mark.parametrize("api, f", [("lgamma", torch.lgamma), ("digamma", torch.digamma)])
def test_a_backward_stable_kernel_passes_where_its_forward_error_is_large(pytester: pytest.Pytester, api: str,
                                                                          f: Kernel, contract: str) -> None:
    """f of an argument within one ULP, correctly rounded: near the zeros that is many ULPs of the result from the
    bench, so the usual check fails it (the row was judged again), and the mixed error passes it."""
    status, row = _row(pytester, tensor_dump(pytester.path / "d", api, backward_stable(f)), contract, "out")
    assert (status, row["check"]) == ("pass", "argument_backward_error"), row["verdict_message"]
    assert "pass the usual check" in str(row["verdict_message"])


def test_polygammas_order_is_read_from_its_arguments(pytester: pytest.Pytester) -> None:
    """polygamma(2, x) has zeros between its negative poles: there, judged with its own order (digamma's intervals
    would not hold them), every element is polygamma of an argument within a ULP."""
    def tetragamma(x: torch.Tensor) -> torch.Tensor:
        return torch.polygamma(2, x)

    _, row = _row(pytester, tensor_dump(pytester.path / "d", "polygamma", backward_stable(tetragamma), order=2),
                  "torch", "out")
    judged = re.search(r"error: (\d+) of (\d+) element", str(row["verdict_message"]))
    assert row["check"] == "argument_backward_error" and judged, row["verdict_message"]
    assert judged.group(1) == judged.group(2) and int(judged.group(1)) > 1000


def test_a_last_bit_beside_the_argument_passes_too(pytester: pytest.Pytester) -> None:
    status, row = _row(pytester, tensor_dump(pytester.path / "d", "digamma", with_a_last_bit(torch.digamma)),
                       "torch", "out")
    assert (status, row["check"]) == ("pass", "argument_backward_error"), row["verdict_message"]


def _truncated(f: Kernel) -> Kernel:
    def kernel(x: torch.Tensor) -> torch.Tensor:
        y = f(x.double()).float()
        return torch.where(y != 0, torch.nextafter(y, torch.zeros_like(y)), y)  # one ULP towards zero, everywhere
    return kernel


@pytest.mark.parametrize("api, kernel, where", [
    ("lgamma", lambda x: (torch.lgamma(x.double()) * (1 + 1e-4)).float(), "fail the usual check: gross error"),
    ("digamma", lambda x: torch.digamma(x.to(torch.bfloat16).double()).float(), "fail the usual check: gross"),
    ("lgamma", _truncated(torch.lgamma), "fail the usual check: mean error"),
    ("digamma", _truncated(torch.digamma), "fail the usual check: bias: errors biased towards zero"),
])
def test_planted_bugs_fail_where_the_function_is_ill_or_well_conditioned(pytester: pytest.Pytester, api: str,
                                                                         kernel: Kernel, where: str) -> None:
    """A relative error of 1e-4, an argument read in bf16, and results truncated by one ULP (a bias the
    well-conditioned elements show) all fail, each where it shows."""
    status, row = _row(pytester, tensor_dump(pytester.path / "d", api, kernel), "torch", "out")
    assert (status, row["check"]) == ("error", "argument_backward_error")
    assert where in str(row["verdict_message"]), row["verdict_message"]


def test_the_spacing_is_one_ulp_of_the_dtype() -> None:
    v = torch.tensor([1.0, 1.5, -3.0, 2.0**-130, 0.0, math.inf, math.nan], dtype=torch.float64)
    assert spacing(v, torch.float32).tolist() == [2.0**-23, 2.0**-23, 2.0**-22, 2.0**-149, 2.0**-149, math.inf,
                                                  math.inf]
    assert spacing(v[:3], torch.bfloat16).tolist() == [2.0**-7, 2.0**-7, 2.0**-6]
    fp32 = torch.tensor([1.0, 1.5, -3.0], dtype=torch.float32)
    assert spacing(fp32.double(), torch.float32).tolist() == (torch.nextafter(fp32.abs(), torch.full_like(
        fp32, math.inf)) - fp32.abs()).double().tolist()
