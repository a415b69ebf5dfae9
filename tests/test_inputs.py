"""Rebuilding arguments: random generation contract, degenerate statistics, saved tensors."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_msprobe.dump.reader import load_dump
from pytest_msprobe.inputs.build import BuildContext, DeviceArg, InputError, build
from tests.helpers import tensor

FLOATS = ["torch.float16", "torch.bfloat16", "torch.float32", "torch.float64"]


def ctx_for(dump_path: Path, seed: int = 0, real: bool = False, max_bytes: int = 1 << 30) -> BuildContext:
    return BuildContext(load_dump(dump_path), torch.Generator().manual_seed(seed), real, max_bytes)


@pytest.fixture
def ctx(write_dump) -> BuildContext:
    return ctx_for(write_dump({}))


@settings(max_examples=60, deadline=None)
@given(dtype=st.sampled_from(FLOATS), a=st.floats(-1e4, 1e4), b=st.floats(-1e4, 1e4),
       shape=st.lists(st.integers(1, 5), min_size=0, max_size=3))
def test_random_float_keeps_min_max_contract(tmp_path_factory, dtype: str, a: float, b: float, shape: list[int]) -> None:
    torch_dtype = getattr(torch, dtype.split(".")[1])
    lo, hi = sorted(torch.tensor([a, b], dtype=torch.float64).to(torch_dtype).double().tolist())
    path = tmp_path_factory.mktemp("d") / "dump.json"
    path.write_text('{"data": {}}')
    t = build(tensor(dtype, shape, mx=hi, mn=lo), ctx_for(path), "arg")
    assert t.dtype == torch_dtype and list(t.shape) == shape
    flat = t.reshape(-1).double()
    if flat.numel() > 1:
        assert flat[0].item() == lo
    assert flat[-1].item() == hi
    assert lo <= flat.min().item() and flat.max().item() <= hi


def test_draws_are_high_precision_not_quantised(ctx) -> None:
    t = build(tensor("torch.bfloat16", [4096], mx=1.0, mn=0.0), ctx, "arg")
    # drawn with float32 precision and rounded once: many distinct bf16 values, not the 2^8 of a bf16
    # uniform variate scaled
    assert len(torch.unique(t)) > 200


@pytest.mark.parametrize("dtype, lo, hi", [("torch.float16", -60000.0, 65000.0), ("torch.float32", -3e38, 3e38),
                                           ("torch.bfloat16", -3e38, 3e38)])
def test_range_wider_than_the_dtype_does_not_overflow(ctx, dtype: str, lo: float, hi: float) -> None:
    t = build(tensor(dtype, [10_000], mx=hi, mn=lo), ctx, "arg").double()
    assert torch.isfinite(t).all()
    assert t[0].item() <= t.min().item() and t.max().item() <= t[-1].item()
    assert (t < 0).any() and (t > 0).any()  # spread over the range, not piled at one end


def test_same_seed_same_numbers_and_distinct_arguments(write_dump) -> None:
    path = write_dump({})
    enc = [tensor(shape=[64]), tensor(shape=[64])]
    a1, b1 = build(enc, ctx_for(path, seed=7), "args")
    a2, b2 = build(enc, ctx_for(path, seed=7), "args")
    assert torch.equal(a1, a2) and torch.equal(b1, b2)
    assert not torch.equal(a1, b1)


@pytest.mark.parametrize("dtype", ["torch.bfloat16", "torch.float32"])
def test_two_threads_draw_the_same_values_chunk_by_chunk(write_dump, dtype: str) -> None:
    """Large tensors are filled in chunks, by whichever thread is free (each element depends only on its
    tensor's stream and its index): the values do not depend on how many threads fill them
    (CheckOptions.work_threads, 2 only with a spare core)."""
    path = write_dump({})
    enc = [tensor(dtype, [3, (1 << 20) + 5], mx=2.0, mn=-3.0), tensor(dtype, [3, (1 << 20) + 5], mx=2.0, mn=-3.0)]
    one = build(enc, ctx_for(path, seed=3), "args")
    threaded = ctx_for(path, seed=3)
    threaded.threads = 2
    two = build(enc, threaded, "args")
    assert all(torch.equal(x, y) for x, y in zip(one, two))
    first = one[0].reshape(-1).double()
    assert first.min().item() == -3.0 and first.max().item() == 2.0
    chunk = 1 << 20
    assert not torch.equal(first[:1000], first[chunk:chunk + 1000])  # chunks are not copies of each other
    assert not torch.equal(one[0], one[1])
    assert abs(first.mean().item() + 0.5) < 0.01  # uniform over [-3, 2]


def test_nan_statistics_do_not_make_whole_tensor_nan(ctx) -> None:
    t = build(tensor(shape=[100], mx=math.nan, mn=math.nan), ctx, "arg")
    assert int(torch.isnan(t).sum()) == 1
    assert any("NaN" in note for note in ctx.notes)


def test_inf_statistics_are_planted_not_broadcast(ctx) -> None:
    t = build(tensor(shape=[10, 10], mx=math.inf, mn=-3.0), ctx, "arg")
    assert int(torch.isinf(t).sum()) == 1 and t.reshape(-1)[-1] == math.inf
    assert t.reshape(-1)[0] == -3.0
    assert torch.isfinite(t.reshape(-1)[:-1]).all()


def test_legacy_except_inf_nan_range_is_used(ctx) -> None:
    t = build(tensor(shape=[50], mx=math.inf, mn=-math.inf, Max_except_inf_nan=2.0, Min_except_inf_nan=-2.0), ctx, "a")
    finite = t[torch.isfinite(t)]
    assert finite.min() >= -2.0 and finite.max() <= 2.0
    assert t[0] == -math.inf and t[-1] == math.inf


def test_all_infinite_tensor(ctx) -> None:
    t = build(tensor(shape=[3], mx=-math.inf, mn=-math.inf), ctx, "a")
    assert (t == -math.inf).all()


def test_integers_and_bools(ctx) -> None:
    i = build(tensor("torch.int64", [1000], mx=9, mn=2), ctx, "a")
    assert i.dtype == torch.int64 and i.min() == 2 and i.max() == 9 and i[0] == 2 and i[-1] == 9
    b = build(tensor("torch.bool", [100], mx=True, mn=False), ctx, "a")
    assert b.dtype == torch.bool and b.any() and not b.all()
    assert build(tensor("torch.bool", [5], mx=False, mn=False), ctx, "a").sum() == 0


def test_zero_dim_takes_max(ctx) -> None:
    t = build(tensor(shape=[], mx=1.5, mn=1.5), ctx, "a")
    assert t.shape == () and t.item() == 1.5


def test_empty_tensor_has_no_statistics(ctx) -> None:
    t = build(tensor(shape=[0, 3], mx=None, mn=None), ctx, "a")
    assert t.shape == (0, 3)


@pytest.mark.parametrize(
    "enc, expected",
    [
        ({"type": "int", "value": 3}, 3),
        ({"type": "float", "value": 1e-5}, 1e-5),
        ({"type": "str", "value": "BSND"}, "BSND"),
        ({"type": "slice", "value": [0, 64, None]}, slice(0, 64, None)),
        ({"type": "ellipsis", "value": "..."}, Ellipsis),
        ({"type": "torch.Size", "value": [4, 5]}, torch.Size([4, 5])),
        ({"type": "torch.dtype", "value": "torch.bfloat16"}, torch.bfloat16),
        ({"type": "torch.memory_format", "format": "channels_last"}, torch.channels_last),
        ({"type": "int64", "value": 3}, 3),
        (None, None),
    ],
)
def test_scalar_encodings(ctx, enc, expected) -> None:
    assert build(enc, ctx, "a") == expected


def test_device_and_nested(ctx) -> None:
    assert build({"type": "torch.device", "value": "npu:0"}, ctx, "a") == DeviceArg("npu:0")
    nested = build([[{"type": "int", "value": 1}], {"k": {"type": "bool", "value": True}}], ctx, "a")
    assert nested == [[1], {"k": True}]


@pytest.mark.parametrize(
    "enc, message",
    [
        ({}, "recorded as {}"),
        (tensor("torch.float32", [4], mx=None, mn=None), "not numbers"),
        (tensor("torch.float32", [4], mx="big", mn=0), "not numbers"),
        (tensor("torch.nonsense", [4]), "unknown to torch"),
        (tensor("float32", [4]), "not a torch dtype"),
        (tensor("torch.float32", [-1, 4]), "negative dimension"),
        (tensor("torch.float32", "4x4"), "not a list of integers"),
        (tensor("torch.float32", [1 << 20, 1 << 20]), "GiB"),
        (tensor("torch.complex64", [4]), "complex"),
        ({"type": "torch.ProcessGroup", "group_ranks": [0, 1]}, "process group"),
        ({"type": "weird.Object"}, "not supported"),
        ({"class_type": "torch.distributed.P2POp"}, "cannot be rebuilt"),
    ],
)
def test_bad_arguments_raise_input_error(ctx, enc, message) -> None:
    with pytest.raises(InputError, match=message):
        build(enc, ctx, "input_args.0")


def test_requires_grad_is_tracked(ctx) -> None:
    t = build(tensor(requires_grad=True), ctx, "a")
    i = build(tensor("torch.int64", requires_grad=True, mx=3, mn=0), ctx, "a")
    assert id(t) in ctx.requires_grad and id(i) not in ctx.requires_grad


def test_real_data_pt_and_npy(write_dump) -> None:
    path = write_dump({}, task="tensor")
    tdir = path.parent / "dump_tensor_data"
    tdir.mkdir()
    saved = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    torch.save(saved, tdir / "a.pt")
    np.save(tdir / "b.npy", saved.numpy())
    ctx = ctx_for(path, real=True)
    a = build(tensor(shape=[2, 3], data_name="a.pt"), ctx, "a")
    b = build(tensor("torch.bfloat16", [2, 3], data_name="b.npy"), ctx, "b")  # MindSpore-style bf16 as fp32 npy
    assert torch.equal(a, saved) and b.dtype == torch.bfloat16 and torch.equal(b.float(), saved)
    assert ctx.loaded_files == 2
    # a tensor without data_name in a tensor dump falls back to statistics
    assert build(tensor(shape=[3]), ctx, "c").shape == (3,)


@pytest.mark.parametrize(
    "name, setup, message",
    [
        ("missing.pt", None, "missing"),
        ("../dump.json", None, "outside the dump folder"),
        ("bad.pt", b"not a pickle", "cannot load"),
        ("pickled.npy", "object", "cannot load"),
        ("shape.pt", "shape", "has shape"),
        ("x.txt", b"1", "neither .pt nor .npy"),
    ],
)
def test_real_data_problems(write_dump, name, setup, message) -> None:
    path = write_dump({}, task="tensor")
    tdir = path.parent / "dump_tensor_data"
    tdir.mkdir()
    if isinstance(setup, bytes):
        (tdir / name).write_bytes(setup)
    elif setup == "object":
        np.save(tdir / name, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    elif setup == "shape":
        torch.save(torch.zeros(5), tdir / name)
    with pytest.raises(InputError, match=message):
        build(tensor(shape=[2, 3], data_name=name), ctx_for(path, real=True), "input_args.0")
