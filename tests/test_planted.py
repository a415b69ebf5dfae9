"""End to end: a kernel bug armed inside the device-call boundary fails, a sound variant passes.

The arms and the plugin that arms them are the planted-bug suite's (evals/planted/): only the
device call sees them, as only a real device's kernel would differ.
"""
from __future__ import annotations

import pytest

from tests.helpers import EXAMPLES, ROOT, copy_dump

PLUGIN = ("-p", "evals.planted.plugin")
LLAMA = EXAMPLES / "llama_tiny_bf16_statistics" / "step0" / "rank0"  # a small Llama-style training step, msprobe 26.2's dumper


def armed(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, arm: str, *args: str) -> pytest.RunResult:
    monkeypatch.setenv("PLANTED_ARM", arm)
    monkeypatch.setenv("PLANTED_DTYPE", "torch.bfloat16")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the subprocess imports evals.planted.plugin
    dump = copy_dump(pytester, LLAMA, "llama")
    return pytester.runpytest_subprocess(str(dump), *PLUGIN, *args)


@pytest.mark.parametrize("workers", [(), ("-n", "2")])
def test_a_linear_accumulating_in_bf16_fails_by_default(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                                        workers: tuple[str, ...]) -> None:
    result = armed(pytester, monkeypatch, "lowacc-matmul", "-k", "linear", *workers)
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) >= 1, result.stdout.str()
    result.stdout.fnmatch_lines(["*standard strict*", "*Functional.linear.*: error  (device=cpu, standard=strict)*",
                                "*gross error:*"])


@pytest.mark.parametrize("arm", ["splitk-matmul", "fp64-matmul", "layernorm-twopass", "accurate-elementwise"])
def test_sound_kernels_unlike_torchs_pass(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                          arm: str) -> None:
    result = armed(pytester, monkeypatch, arm, "-k", "linear or layer_norm or silu or mul or pow")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes["passed"] >= 10, result.stdout.str()
