"""The fused-op suite's second effectiveness measure (evals/planted_fused.py): a bug's item is
effective beyond the sound variants when, on one of its outputs, the bug's mean or max |error| against
the bench exceeds every sound variant's of the same op on that item.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from evals.planted import fused_dump
from evals.planted_fused import distance, measure_beyond, run

SPEC = "evals.planted.fused:TABLES"


def test_distance_is_in_ulps_at_the_bench_rms_and_zero_for_the_bench_itself() -> None:
    bench = torch.tensor([1.0, -1.0, 1.0, -1.0], dtype=torch.float64)  # RMS 1: bf16 ULP 2**-7
    device = torch.tensor([1.0, -1.0, 1.0 + 2 ** -7, -1.0 - 3 * 2 ** -7]).to(torch.bfloat16)
    assert distance([bench], [device]) == [[1.0, 3.0]]
    assert distance([bench], [bench.to(torch.bfloat16)]) == [[0.0, 0.0]]
    nan = torch.tensor([float("nan"), 1.0], dtype=torch.float64)
    assert distance([nan], [nan.half()])[0] == [0.0, 0.0]  # NaN where the bench has NaN: no error
    assert distance([nan], [torch.tensor([1.0, 1.0]).half()]) == [[float("inf"), float("inf")]]
    assert distance([bench, None], [torch.arange(4), torch.zeros(0)]) == [None, None]  # not float, no bench


@settings(max_examples=30, deadline=None)
@given(st.floats(-20, 20), st.integers(0, 10_000))
def test_the_unit_is_one_per_output_so_scaling_both_kernels_keeps_their_order(exponent: float, seed: int) -> None:
    """The comparison between two kernels does not depend on the unit: scaling bench and both outputs by a
    power of two scales both distances alike."""
    g = torch.Generator().manual_seed(seed)
    bench = torch.randn(256, generator=g, dtype=torch.float64)
    a, b = (bench + torch.randn(256, generator=g, dtype=torch.float64) * s / 128 for s in (0.3, 0.6))
    scale = 2.0 ** int(exponent)
    plain = [distance([bench], [x.to(torch.bfloat16)])[0] for x in (a, b)]
    scaled = [distance([bench * scale], [(x * scale).to(torch.bfloat16)])[0] for x in (a, b)]
    assert plain == scaled


def _row(arm: str, kind: str, item: str = "NPU.npu_rms_norm.0.backward") -> dict[str, Any]:
    return {"arm": arm, "kind": kind, "item": item, "op": item.split(".")[1], "dump": "d", "standard": "strict"}


def test_beyond_needs_one_output_worse_than_every_sound_variant_on_mean_or_max() -> None:
    item = "NPU.npu_rms_norm.0.backward"
    runs: Any = {
        ("rms_hf", "strict", ()): {item: {"_distance": [[0.2, 1.8], [0.49, 2.4]]}},
        ("fp32", "strict", ()): {item: {"_distance": [[0.16, 1.0], [0.25, 1.6]]}},
        ("fp32", "msprobe", ()): {item: {"_distance": [[9.0, 9.0], [9.0, 9.0]]}},  # another standard's: not read
        ("rms_dgamma16", "strict", ()): {item: {"_distance": [[0.16, 1.0], [0.52, 2.0]]}},  # mean beyond
        ("rms_eps", "strict", ()): {item: {"_distance": [[0.16, 1.0], [0.25, 1.6]]}},  # within
        ("rms_msq16", "strict", ()): {item: {"_distance": [[0.1, 1.9], [0.1, 0.1]]}},  # max beyond
        ("swiglu_swap", "strict", ()): {item: {"_distance": [[5.0, 5.0]]}},  # no sound variant of the op run
    }
    rows = [_row(a, "bug") for a in ("rms_dgamma16", "rms_eps", "rms_msq16")] + [_row("rms_hf", "variant")]
    rows.append(_row("swiglu_swap", "bug", "NPU.npu_swiglu.0.backward"))
    runs[("swiglu_swap", "strict", ())] = {"NPU.npu_swiglu.0.backward": {"_distance": [[5.0, 5.0]]}}
    measure_beyond(rows, runs, "strict")
    assert [r.get("beyond") for r in rows] == [True, False, True, None, None]
    assert rows[0]["sound_distance"] == [[0.2, 1.8], [0.49, 2.4]]
    assert rows[3]["distance"] == [[0.2, 1.8], [0.49, 2.4]] and "sound_distance" not in rows[3]


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = fused_dump.Dump()
    torch.manual_seed(0)
    fused_dump.norms_and_mlp(d, torch.bfloat16, "small")
    return d.write(tmp_path_factory.mktemp("measure") / "bf16")


def test_a_swapped_swiglu_is_beyond_and_hugging_faces_rmsnorm_further_than_fp32(small: Path) -> None:
    """On real records: the run carries each output's distance; a gross bug lies beyond the sound
    variant, and the sound kernel that rounds an intermediate lies further from the bench than fp32-once."""
    swap = run(small, f"{SPEC}.swiglu_swap", "strict", {"NPU.npu_swiglu"})["NPU.npu_swiglu.0.forward"]
    eager = run(small, f"{SPEC}.swiglu_eager", "strict", {"NPU.npu_swiglu"})["NPU.npu_swiglu.0.forward"]
    assert swap["_distance"][0][0] > 10 * eager["_distance"][0][0]
    hf, fp32 = (run(small, f"{SPEC}.{a}", "strict", {"NPU.npu_rms_norm"})["NPU.npu_rms_norm.0.forward"]
                for a in ("rms_hf", "fp32"))
    assert hf["_distance"][0][0] > fp32["_distance"][0][0] > 0


def test_the_report_prints_both_measures_side_by_side(capsys: pytest.CaptureFixture[str]) -> None:
    from evals.planted_fused import report

    def row(arm: str, kind: str, standard: str, flagged: bool, beyond: bool | None) -> dict[str, Any]:
        return {**_row(arm, kind), "standard": standard, "flagged": flagged, "layer1": flagged, "dtype": "torch.bfloat16",
                "direction": "backward", "message": "", "beyond": beyond, "distance": [[0.5, 2.0]],
                "sound_distance": [[0.4, 2.5]]}

    rows = [row("rms_dgamma16", "bug", s, s == "msprobe", True) for s in ("strict", "msprobe")]
    rows += [row("rms_eps", "bug", s, False, False) for s in ("strict", "msprobe")]
    rows += [row("rms_hf", "variant", s, False, None) for s in ("strict", "msprobe")]
    report(rows, ["strict", "msprobe"])
    out = capsys.readouterr().out
    assert "| npu_rms_norm | backward | 0/2 | 1/2 | 0/2 |" in out  # changed: both bugs count
    assert "| npu_rms_norm | backward | 0/1 of 2 | 1/1 of 2 | 0/1 of 2 |" in out  # beyond: rms_eps drops out
    assert "| all | | 0/1 of 2 | 1/1 of 2 | 0/1 of 2 |" in out
    assert "- beyond rms_dgamma16 d NPU.npu_rms_norm.0.backward: 0.5/2 vs 0.4/2.5" in out
    assert "- within rms_eps d NPU.npu_rms_norm.0.backward" in out
