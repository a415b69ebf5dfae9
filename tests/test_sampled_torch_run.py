"""The sampled torch run of 16-bit conv and attention backward items (error_model.yaml sampled_torch_run)."""
from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from pytest_msprobe.check import check_entry
from pytest_msprobe.dump.reader import load_dump
from pytest_msprobe.runs.third_run import ReferenceRun, sample_rows, sampled_attention
from pytest_msprobe.settings import CheckOptions
from pytest_msprobe.specs.loader import load_specs
from tests.helpers import tensor

SPECS = load_specs()


@given(st.integers(1, 5000), st.floats(0.01, 1.0))
def test_sample_rows_are_spread_and_keep_both_ends(n: int, fraction: float) -> None:
    rows = sample_rows(n, fraction)
    assert rows[0] == 0 and rows[-1] == n - 1
    assert bool((rows[1:] > rows[:-1]).all())  # sorted, unique
    assert min(n, 2) <= rows.numel() <= min(n, max(2, int(n * fraction) + 1))


def test_sampled_attention_computes_its_heads_as_the_full_call_does() -> None:
    q, k, v = (torch.randn(2, 4, 64, 32, dtype=torch.bfloat16) for _ in range(3))
    sampled: dict[int, Any] = {}
    out = sampled_attention(F.scaled_dot_product_attention, sampled, 0.25, q, k, v, is_causal=True)
    full = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    rows, total = sampled[0]
    assert total == 8 and rows.tolist() == [0, 7] and set(sampled) == {0, 1, 2}
    flat_out, flat_full = out.reshape(8, 64, 32), full.reshape(8, 64, 32)
    assert torch.equal(flat_out[rows], flat_full[rows])  # bitwise: the same fused kernel
    assert not flat_out[1:7].any()
    grouped: dict[int, Any] = {}  # heads shared by groups of queries do not split: the whole call
    k2, v2 = k[:, :2], v[:, :2]
    out = sampled_attention(F.scaled_dot_product_attention, grouped, 0.25, q, k2, v2, enable_gqa=True)
    assert not grouped and torch.equal(out, F.scaled_dot_product_attention(q, k2, v2, enable_gqa=True))


def test_completion_keeps_computed_rows_and_borrows_errors_for_the_others() -> None:
    bench = torch.randn(4, 3, dtype=torch.float64).float()
    grad = torch.zeros(4, 3, dtype=torch.bfloat16)
    grad[[0, 3]] = (bench[[0, 3]] * 1.01).to(torch.bfloat16)  # the run computed rows 0 and 3
    run = ReferenceRun(None, None, None, None, "", sampled={5: (torch.tensor([0, 3]), 4)})  # type: ignore[arg-type]
    (done,), (mask,) = run.complete([grad], [bench], [5])
    assert torch.equal(done[[0, 3]], grad[[0, 3]])
    error = grad[[0, 3]].float() - bench[[0, 3]]
    assert torch.equal(done[1], (bench[1] + error[1]).to(torch.bfloat16))  # row 1 borrows row 3's error
    assert torch.equal(done[2], (bench[2] + error[0]).to(torch.bfloat16))  # row 2 borrows row 0's
    assert mask.tolist() == [[False] * 3, [True] * 3, [True] * 3, [False] * 3]
    (same,), (none,) = run.complete([grad], [bench], [4])  # another argument: untouched
    assert same is grad and none is None


def test_fp32_backward_items_get_the_whole_torch_run(write_dump) -> None:
    """Only 16-bit kernels are slow enough to sample; an element's own torch error judges it otherwise."""
    q = [1, 4, 64, 32]
    data = {"Functional.scaled_dot_product_attention.0.forward": {
        "input_args": [tensor("torch.float32", q, requires_grad=True) for _ in range(3)], "input_kwargs": {},
        "output": [tensor("torch.float32", q)]},
        "Functional.scaled_dot_product_attention.0.backward": {"input": [tensor("torch.float32", q)], "output": []}}
    record = check_entry(load_dump(write_dump(data)), "Functional.scaled_dot_product_attention.0.backward",
                         CheckOptions(device="cpu", standard="strict"), SPECS)
    assert record.status == "pass" and record.reference == "torch's kernel on cpu, device dtype"


ONE_HEAD_OFF = """
import torch, torch.nn.functional as F
def attention(q, k, v, **kw):  # head 2 of 8 (a row the sampled torch run leaves out) scales q by 1.25
    scale = torch.ones(1, q.shape[1], 1, 1, dtype=q.dtype)
    scale[0, 2] = 1.25
    return F.scaled_dot_product_attention(q * scale, k, v, **kw)
KERNELS = {"Functional.scaled_dot_product_attention": attention}
"""


@pytest.mark.parametrize("dtype", ["torch.bfloat16", "torch.float16"])
def test_sampled_runs_pass_torch_and_fail_a_bug_in_a_row_they_did_not_compute(write_dump, tmp_path,
                                                                                dtype: str) -> None:
    q = [1, 8, 128, 64]
    data = {
        "Functional.scaled_dot_product_attention.0.forward": {
            "input_args": [tensor(dtype, q, requires_grad=True) for _ in range(3)],
            "input_kwargs": {"is_causal": {"type": "bool", "value": True}}, "output": [tensor(dtype, q)]},
        "Functional.scaled_dot_product_attention.0.backward": {"input": [tensor(dtype, q, mx=1e-3, mn=-1e-3)],
                                                               "output": []},
        "Functional.conv2d.0.forward": {
            "input_args": [tensor(dtype, [8, 16, 12, 12], requires_grad=True),
                           tensor(dtype, [32, 16, 3, 3], mx=0.2, mn=-0.2, requires_grad=True),
                           tensor(dtype, [32], requires_grad=True)],
            "input_kwargs": {}, "output": [tensor(dtype, [8, 32, 10, 10])]},
        "Functional.conv2d.0.backward": {"input": [tensor(dtype, [8, 32, 10, 10])], "output": []}}
    dump = load_dump(write_dump(data))
    for name in ("Functional.scaled_dot_product_attention.0.backward", "Functional.conv2d.0.backward"):
        record = check_entry(dump, name, CheckOptions(device="cpu", standard="strict"), SPECS)
        assert record.status == "pass", record.outputs
        assert "sampled" in record.reference
    (tmp_path / "off.py").write_text(ONE_HEAD_OFF)
    options = CheckOptions(device="cpu", standard="strict", kernels=f"{tmp_path / 'off.py'}:KERNELS")
    record = check_entry(dump, "Functional.scaled_dot_product_attention.0.backward", options, SPECS)
    assert record.status == "error"
    query_grad = record.outputs[0]
    assert query_grad.verdict == "error" and "gross error" in query_grad.verdict_message
    index = int(query_grad.verdict_message.split("at flat index ")[1].split(":")[0])
    assert index // (128 * 64) == 2  # the worst element sits in head 2, whose torch run was estimated
