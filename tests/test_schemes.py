"""A vendor kernel's scheme that the contract names (api_specs/contracts.yaml `schemes`, runs/schemes.py):
PyTorch's CUDA embedding backward for at most 3,072 indices adds each block of 32 indices into the bf16 gradient,
one rounding per block. Under `--msprobe-contract cuda` such a kernel passes; under `torch` it fails, and so does
the same kernel with a term lost."""
from __future__ import annotations

import pytest

from tests.helpers import device_side_conftest, make_dump, records, tensor

# the device's embedding: torch's forward, and a backward as CUDA's feature kernel computes it
BLOCKED = """
import torch
import torch.nn.functional as F

DROP = {drop}


class Blocked(torch.autograd.Function):
    @staticmethod
    def forward(ctx, indices, weight, freq):
        ctx.save_for_backward(indices)
        ctx.rows, ctx.dtype, ctx.freq = weight.shape[0], weight.dtype, freq
        return torch.nn.functional.embedding(indices, weight.detach())

    @staticmethod
    def backward(ctx, g):
        (indices,) = ctx.saved_tensors
        flat, rows = indices.reshape(-1), g.reshape(-1, g.shape[-1]).float()
        if ctx.freq:  # each row's terms divided by how often its index occurs, as torch does
            rows = rows / torch.bincount(flat, minlength=ctx.rows)[flat].float()[:, None]
        grad = torch.zeros(ctx.rows, g.shape[-1], dtype=ctx.dtype)
        for start in range(0, flat.numel(), 32):  # each block summed in fp32, then added into the bf16 gradient
            part = torch.zeros(ctx.rows, g.shape[-1], dtype=torch.float32)
            stop = min(start + 32, flat.numel()) - (DROP if start == 0 else 0)
            part.index_add_(0, flat[start:stop], rows[start:stop])
            grad = (grad.float() + part).to(ctx.dtype)
        return None, grad, None


def embedding(orig, indices, weight, *args, **kwargs):
    return Blocked.apply(indices, weight, bool(kwargs.get("scale_grad_by_freq")))


IMPLS = {{F.embedding: embedding}}
"""


def _dump(pytester: pytest.Pytester) -> None:
    """Functional.embedding of 2,048 tokens over a vocabulary of 64, bf16: each row added in some 32 blocks."""
    t = "torch.bfloat16"
    ids = {"type": "torch.Tensor", "dtype": "torch.int64", "shape": [1, 2048], "Max": 63, "Min": 0,
           "requires_grad": False}
    make_dump(pytester, {
        "Functional.embedding.0.forward": {"input_args": [ids, tensor(t, [64, 256], requires_grad=True)],
                                           "input_kwargs": {}, "output": [tensor(t, [1, 2048, 256])]},
        "Functional.embedding.0.backward": {"input": [tensor(t, [1, 2048, 256])], "output": [None, tensor(t, [64, 256])]},
    })


def _run(pytester: pytest.Pytester, contract: str, out: str) -> dict[str, object]:
    pytester.runpytest("d", "-p", "no:cacheprovider", "--msprobe-contract", contract, "--msprobe-out", out,
                       "-k", "backward")
    (record,) = records(pytester, out)
    return record


def test_the_blocked_scheme_passes_under_the_contract_that_names_it(pytester: pytest.Pytester) -> None:
    _dump(pytester)
    pytester.makeconftest(device_side_conftest(BLOCKED.format(drop=0)))
    cuda, torch_ = _run(pytester, "cuda", "cuda"), _run(pytester, "torch", "torch")
    assert cuda["status"] == "pass", cuda["message"]
    assert torch_["status"] == "error", torch_  # no order of fp32 additions rounds 32 times in bf16


def test_another_kernels_call_is_not_judged_by_the_scheme(pytester: pytest.Pytester) -> None:
    """With scale_grad_by_freq CUDA runs its sorted kernel instead, whose sums are fp32's: a blocked kernel, which
    scales the terms as torch does, fails under cuda there."""
    _dump(pytester)
    path = pytester.path / "d" / "dump.json"
    path.write_text(path.read_text().replace('"input_kwargs": {}', '"input_kwargs": {"scale_grad_by_freq": '
                                                                    '{"type": "bool", "value": true}}', 1))
    pytester.makeconftest(device_side_conftest(BLOCKED.format(drop=0)))
    assert _run(pytester, "cuda", "cuda")["status"] == "error"


def test_a_lost_term_fails_under_the_scheme(pytester: pytest.Pytester) -> None:
    _dump(pytester)
    pytester.makeconftest(device_side_conftest(BLOCKED.format(drop=1)))
    assert _run(pytester, "cuda", "cuda")["status"] == "error"
