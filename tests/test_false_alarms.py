"""Correct kernels that strict must pass: flush-to-zero found by fuzzing, the bundled examples, dumps
recorded off an NPU."""
from __future__ import annotations

import shutil

import pytest

from tests.helpers import EXAMPLES

LEAN = ("-p", "no:cacheprovider")


def test_fuzzing_the_bf16_linear_passes_flush_to_zero(pytester: pytest.Pytester) -> None:
    """torch's CPU bf16 matmul flushes a subnormal result to zero (0.0 where the bench is 1.47e-39), as
    NPUs and GPUs do: the fuzz example that found it passes."""
    pytest.importorskip("hypothesis")
    shutil.copytree(EXAMPLES / "llama_tiny_bf16_statistics", pytester.path / "llama")
    result = pytester.runpytest("llama", "--msprobe-fuzz", "10", "-k", "Functional.linear and forward", *LEAN)
    result.assert_outcomes(passed=18, deselected=455)
    result.stdout.fnmatch_lines(["*fuzz: 9 API(s), 10 examples each, 0 failing*"])
