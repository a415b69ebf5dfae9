"""Sums with a subtraction inside (api_specs/error_model.yaml `term_sizes`): softmax's backward data, as aten
records it (an online or in-training dump), is y * (g - sum(g * y)). A kernel that adds the row's sum in another
order moves an element where g cancels against the sum by many of its own ULPs, and passes; one that adds the
sum in bf16, or drops it, fails."""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from pytest_msprobe.online.checking import check_call, online_specs
from pytest_msprobe.runs.term_sizes import log_softmax_backward_data, softmax_backward_data
from pytest_msprobe.settings import CheckOptions
from tests.helpers import tensor

SOFTMAX, LOG_SOFTMAX = "Aten._softmax_backward_data", "Aten._log_softmax_backward_data"


def _row_sum(t: torch.Tensor, order: str) -> torch.Tensor:
    """The last dimension's sum in fp32 in the order a kernel chooses: blocks of 32, the blocks added from the end
    (`blocked`); every partial sum rounded to bf16 (`bf16`); not at all (`dropped`)."""
    if order == "blocked":
        return t.unflatten(-1, (-1, 32)).sum(-1).flip(-1).cumsum(-1)[..., -1:]
    if order == "bf16":
        return t.bfloat16().cumsum(-1, dtype=torch.bfloat16)[..., -1:].float()
    return torch.zeros_like(t[..., :1])


def kernel(api: str, order: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The call as a kernel computing in fp32 with its own row sum would return it, in the input dtype."""
    def run(g: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        gf, yf = g.float(), y.float()
        dx = yf * (gf - _row_sum(gf * yf, order)) if api == SOFTMAX else gf - yf.exp() * _row_sum(gf, order)
        return dx.to(g.dtype)
    return run


def tensor_dump(root: Path, dtype: torch.dtype, order: str) -> Path:
    """A tensor dump of both calls on a realistic row of 1024 (probabilities of randn logits, randn gradients),
    their outputs from the kernel of `order`."""
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(64, 1024, generator=gen) * 2
    grad = torch.randn(64, 1024, generator=gen).to(dtype)
    folder = root / "dump_tensor_data"
    folder.mkdir(parents=True)
    data = {}
    for api, y in ((SOFTMAX, logits.softmax(-1).to(dtype)), (LOG_SOFTMAX, logits.log_softmax(-1).to(dtype))):
        entry: dict[str, object] = {"input_kwargs": {}}
        for key, tensors in (("input_args", [grad, y]), ("output", [kernel(api, order)(grad, y)])):
            leaves: list[object] = []
            for i, t in enumerate(tensors):
                name = f"{api}.0.forward.{key.split('_')[0]}.{i}.pt"
                torch.save(t.clone(), folder / name)
                leaves.append(tensor(str(dtype), list(t.shape), float(t.max()), float(t.min()), data_name=name))
            entry[key] = leaves
        entry["input_args"] += [{"type": "int", "value": -1}, {"type": "torch.dtype", "value": str(dtype)}]  # type: ignore[operator]
        data[f"{api}.0.forward"] = entry
    path = root / "dump.json"
    path.write_text(json.dumps({"task": "tensor", "level": "L1", "framework": "pytorch", "dump_data_dir": None,
                                "data": data}))
    return path


def verdicts(dump: Path) -> dict[str, str]:
    """Each call's verdict, checked as an online session checks a received aten call."""
    options = CheckOptions(device="cpu", mode="replay")
    recs = {api: check_call(dump, f"{api}.0.forward", options, online_specs(None)) for api in (SOFTMAX, LOG_SOFTMAX)}
    assert all("magnitude_s" in rec.timings for rec in recs.values()), recs
    return {api: rec.status for api, rec in recs.items()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_another_summation_order_passes_a_sum_lost_fails(tmp_path: Path, dtype: torch.dtype) -> None:
    assert verdicts(tensor_dump(tmp_path / "blocked", dtype, "blocked")) == {SOFTMAX: "pass", LOG_SOFTMAX: "pass"}
    # fp32's own rounding hides a bf16 sum no more than a 16-bit output's does: planted in fp32 only
    for order in ("bf16", "dropped") if dtype == torch.float32 else ("dropped",):
        assert verdicts(tensor_dump(tmp_path / order, dtype, order)) == {SOFTMAX: "error", LOG_SOFTMAX: "error"}, order


def test_the_term_sizes_bound_the_terms_where_the_api_on_their_sizes_cancels() -> None:
    g = torch.tensor([[1.0, -1.0, 0.5]], dtype=torch.float64)
    y = torch.tensor([[0.5, 0.25, 0.25]], dtype=torch.float64)
    s = (g.abs() * y).sum(-1, keepdim=True)
    assert torch.equal(softmax_backward_data(g, y, -1), y * (g.abs() + s))
    # the API itself on |g| and |y| subtracts the sum: smaller than the terms everywhere, near zero where |g| meets it
    api_on_sizes = torch.ops.aten._softmax_backward_data(g.abs(), y, -1, torch.float64)
    assert bool((api_on_sizes.abs() < softmax_backward_data(g, y, -1)).all())
    assert torch.allclose(log_softmax_backward_data(g, y.log(), -1), g.abs() + y * g.abs().sum(-1, keepdim=True))
