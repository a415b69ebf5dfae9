"""inputs/draw.py: the compiled uniform draw gives numpy's values bit for bit, and leaves the generator
where numpy's draw would, so every later draw of the item is unchanged too."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pytest_msprobe.inputs import build as build_module
from pytest_msprobe.inputs.build import build
from pytest_msprobe.inputs.draw import uniform_into
from tests.helpers import tensor
from tests.test_inputs import ctx_for

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def numpy_draw(rng: np.random.Generator, n: int, lo: float, hi: float, dtype: torch.dtype) -> torch.Tensor:
    """The draw inputs/build.py made before the compiled pass, kept as the oracle."""
    u = rng.random(dtype=np.float32, out=np.empty(n, np.float32))
    u *= hi - lo
    u += lo
    np.minimum(u, hi, out=u)
    return torch.from_numpy(u).to(dtype)


def compiled_draw(rng: np.random.Generator, n: int, lo: float, hi: float, dtype: torch.dtype) -> torch.Tensor:
    result = torch.empty(n, dtype=dtype)
    if dtype == torch.bfloat16:
        uniform_into(rng, result.view(torch.uint16).numpy(), lo, hi)
    elif dtype == torch.float32:
        uniform_into(rng, result.numpy(), lo, hi)
    else:
        buffer = np.empty(n, np.float32)
        uniform_into(rng, buffer, lo, hi)
        result.copy_(torch.from_numpy(buffer))
    return result


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


bounds = st.floats(-1e30, 1e30, allow_subnormal=True) | st.sampled_from([0.0, -0.0, 1e-40, -1e-45])


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32), before=st.integers(0, 3), n=st.integers(0, 40_000), a=bounds, b=bounds,
       dtype=st.sampled_from(DTYPES))
@example(seed=1, before=1, n=1, a=-0.0, b=0.0, dtype=torch.bfloat16)  # the buffered half word only
@example(seed=2, before=0, n=5, a=-3.0, b=-0.0, dtype=torch.float32)  # values equal to a hi of -0.0
def test_compiled_draw_is_numpy_draw_bit_for_bit(seed: int, before: int, n: int, a: float, b: float,
                                                 dtype: torch.dtype) -> None:
    lo, hi = min(a, b), max(a, b)
    if hi - lo > torch.finfo(dtype).max / 2:  # build.py draws such ranges in float64, not here
        hi = lo + torch.finfo(dtype).max / 4
    ours, theirs = np.random.default_rng(seed), np.random.default_rng(seed)
    ours.random(before, dtype=np.float32)  # an odd count leaves half a 64-bit word buffered
    theirs.random(before, dtype=np.float32)
    assert torch.equal(bits(compiled_draw(ours, n, lo, hi, dtype)), bits(numpy_draw(theirs, n, lo, hi, dtype)))
    # the generator is left where numpy leaves it: the next draws (float32 and float64) are the same
    assert np.array_equal(ours.random(3, dtype=np.float32), theirs.random(3, dtype=np.float32))
    assert ours.random() == theirs.random()


@pytest.mark.parametrize("dtype", ["torch.bfloat16", "torch.float16", "torch.float32", "torch.float64"])
def test_built_tensors_do_not_depend_on_the_compiled_path(write_dump, monkeypatch, dtype: str) -> None:
    """Whole arguments (odd sizes, a chunked tensor, a small one between) are the same values with the
    compiled pass and without it."""
    path = write_dump({})
    enc = [tensor(dtype, [5, 1001], mx=7.5, mn=-2.25), tensor(dtype, [3], mx=1.0, mn=0.0),
           tensor(dtype, [(1 << 20) + 3], mx=0.5, mn=-0.5), tensor(dtype, [4097], mx=1e-3, mn=-1e-3)]
    compiled = build(enc, ctx_for(path, seed=11), "args")
    monkeypatch.setattr(build_module, "MIN_ELEMENTS", 1 << 62)  # numpy's own draw everywhere
    plain = build(enc, ctx_for(path, seed=11), "args")
    assert all(torch.equal(bits(x) if x.element_size() < 8 else x, bits(y) if y.element_size() < 8 else y)
               for x, y in zip(compiled, plain))
    assert compiled[0].reshape(-1)[0].item() == -2.25 and compiled[0].reshape(-1)[-1].item() == 7.5
