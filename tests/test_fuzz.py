"""--msprobe-fuzz: draws within and at the edges of the recorded statistics, constraints kept, shrinking, seeds."""
from __future__ import annotations

import math
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_msprobe.session.fuzz import materialize, strategy, tensor_space
from tests.helpers import make_dump, tensor
from tests.triage_helpers import PLANTED, relu_fp16

LEAN = ("-p", "no:cacheprovider")


def _values(space):  # noqa: ANN001, ANN202
    return {repr(v) for v, _ in space.edges}


def test_edges_lie_in_the_recorded_range_and_non_finite_values_only_when_recorded() -> None:
    space = tensor_space("input_args.0", tensor("torch.float16", [4, 4], 3.0, -3.0), False)
    expected = (3.0, -3.0, 2.998046875, -2.998046875, 0.0, -0.0, 2.0 ** -14, 2.0 ** -24)  # ULP inside, tiny, subnormal
    assert {repr(x) for x in expected} <= _values(space)
    assert not any(math.isinf(v) or math.isnan(v) or abs(v) > 3 for v, _ in space.edges)
    positive = tensor_space("x", tensor("torch.bfloat16", [8], 2.0, 1.0), False)
    assert _values(positive) == {repr(x) for x in (2.0, 1.0, 1.9921875, 1.0078125)}  # one bf16 ULP inside
    wide = tensor_space("x", tensor("torch.float32", [8], math.inf, -1.0), False)
    assert repr(math.inf) in _values(wide) and repr(float(torch.finfo(torch.float32).max)) in _values(wide)
    assert repr(-math.inf) not in _values(wide)
    nan = tensor_space("x", tensor("torch.float32", [8], math.nan, -1.0), False)
    assert "nan" in {repr(v) for v, _ in nan.edges}
    index = tensor_space("x", tensor("torch.int64", [8], 9, 0), False)
    assert (index.lo, index.hi) == (0.0, 9.0) and _values(index) == {"9.0", "0.0", "8.0", "1.0"}
    target = tensor_space("x", tensor("torch.int64", [8], 4, -100), True)  # cross_entropy targets stay >= 0
    assert target.lo == 0.0
    assert tensor_space("x", tensor("torch.float32", [0]), False) is None


@settings(max_examples=40, deadline=None, database=None)
@given(st.data())
def test_drawn_tensors_keep_dtype_shape_range_masks_and_indices(data: st.DataObject) -> None:
    for leaf in (tensor("torch.bfloat16", [3, 5], 3.0, -3.0), tensor("torch.float16", [2, 3, 4], 1.0, 0.5),
                 tensor("torch.int64", [6], 9, 0), tensor("torch.bool", [4, 4], False, False),
                 tensor("torch.bool", [4, 4], True, False)):
        space = tensor_space("x", leaf, False)
        t = materialize(space, data.draw(strategy(space)))
        assert str(t.dtype) == leaf["dtype"] and list(t.shape) == leaf["shape"]
        values = t.double()
        assert bool(((values >= space.lo) & (values <= space.hi)).all()), (leaf, t)
        if leaf["dtype"] == "torch.bool" and leaf["Max"] is False:
            assert not bool(t.any())


def test_transposed_layout_keeps_the_values() -> None:
    space = tensor_space("x", tensor("torch.float32", [4, 6], 3.0, -3.0), False)
    recipe = {"base": "uniform", "seed": 7, "specials": [(5, 3.0)], "transposed": False}
    plain, strided = materialize(space, recipe), materialize(space, {**recipe, "transposed": True})
    assert plain.is_contiguous() and not strided.is_contiguous() and torch.equal(plain, strided)
    assert plain.view(-1)[5] == 3.0


def test_fuzz_items_are_extra_selectable_items_and_pass_on_a_correct_kernel(pytester: pytest.Pytester) -> None:
    data = {**relu_fp16(),
            "Functional.embedding.0.forward": {"input_args": [tensor("torch.int64", [6], 9, 0),
                                                              tensor("torch.float32", [10, 4], 1.0, -1.0)],
                                               "input_kwargs": {}, "output": [tensor("torch.float32", [6, 4])]},
            "Functional.relu.0.backward": {"input": [tensor("torch.float16", [4, 4])], "output": [None]}}
    dump = make_dump(pytester, data)
    ids = [line for line in pytester.runpytest(str(dump), "--collect-only", "-q", "--msprobe-fuzz", "5").outlines
           if "::" in line]
    assert ids == ["d/dump.json::Functional.relu.0.forward", "d/dump.json::Functional.relu.0.forward[fuzz]",
                   "d/dump.json::Functional.embedding.0.forward", "d/dump.json::Functional.embedding.0.forward[fuzz]",
                   "d/dump.json::Functional.relu.0.backward"]
    result = pytester.runpytest(str(dump), "--msprobe-fuzz", "15", "-m", "fuzz", "--msprobe-standard", "strict", *LEAN)
    result.assert_outcomes(passed=2, deselected=3)  # indices stayed in [0, 9]: embedding never raised
    result.stdout.fnmatch_lines(["*fuzz: 2 API(s), 15 examples each, 0 failing; seeds from run seed 1234*"])
    alone = pytester.runpytest(f"{dump}::Functional.embedding.0.forward[fuzz]", "--msprobe-fuzz", "3", *LEAN)
    alone.assert_outcomes(passed=1)


def test_a_failure_near_the_recorded_max_is_found_shrunk_and_reproduced_by_its_seed(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(PLANTED)
    dump = make_dump(pytester, relu_fp16())
    args = (str(dump), "--msprobe-fuzz", "40", "--msprobe-standard", "strict", *LEAN)
    first = pytester.runpytest(*args)
    first.assert_outcomes(passed=1, failed=1)  # the item itself passes: its random inputs miss the bug
    text = first.stdout.str()
    shrunk = re.search(r"shrunk to:\n  (.*)\n", text)
    assert shrunk, text
    # a small example: a zero background and one element one ULP below the recorded Max (2.998 in fp16)
    assert re.fullmatch(r"input_args\.0 float16\[4, 4\]: every element 0, contiguous; \[\d, \d\] = 2\.998046875 "
                        r"\(one ULP below the recorded Max\)", shrunk.group(1)), shrunk.group(1)
    seed = re.search(r"seed (\d+)\); shrunk to", text).group(1)
    assert re.search(r"repro: python \S+/msprobe_results/repro/d__Functional\.relu\.0\.forward_fuzz\.py", text)
    again = pytester.runpytest(f"{dump}::Functional.relu.0.forward[fuzz]", *args[1:])
    again.assert_outcomes(failed=1)
    assert re.search(r"shrunk to:\n  (.*)\n", again.stdout.str()).group(1) == shrunk.group(1)
    assert f"seed {seed}); shrunk to" in again.stdout.str()
    other = pytester.runpytest(*args, "--msprobe-seed", "99")
    assert f"seed {seed}" not in other.stdout.str()  # the fuzz seed follows the run seed
