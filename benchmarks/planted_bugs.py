"""Detection and false-alarm matrix of each standard on correct kernels and planted precision bugs.

    python benchmarks/planted_bugs.py [--seeds 3]

`original` and `msprobe` are judged without a reference device except where noted; `msprobe+ref`
gives msprobe's benchmark/ULP algorithms the fp32-computing reference, like a GPU leg would.
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_msprobe import judge, standards  # noqa: E402
from pytest_msprobe.specs import load_specs  # noqa: E402
from tests.planted_bugs import beyond_rounding, cases  # noqa: E402

BF16_AS_FP32 = "torch.bfloat16"


def verdict(case, standard: str, specs) -> str:
    bench_dtype = "torch.float64"
    row = standards.compare_tensor("x", case.bench, case.device.astype("float32") if case.dtype == BF16_AS_FP32
                                   else case.device.astype({"torch.float16": "float16", "torch.float32": "float32"}.get(case.dtype, "float32")),
                                   bench_dtype=bench_dtype, device_dtype=case.dtype, api_name=case.api, specs=specs)
    ref_row = None
    if standard == "msprobe+ref":
        ref_row = standards.compare_tensor("x", case.bench, case.reference.astype("float32"), bench_dtype=bench_dtype,
                                           device_dtype=case.dtype, api_name=case.api, specs=specs)
    name = {"msprobe+ref": "msprobe"}.get(standard, standard)
    judge.decide(row, name, api_name=case.api, specs=specs, ref_row=ref_row,
                 arrays=(case.bench, case.device, case.reference, case.sensitivity), reference_results=None)
    return row.verdict


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    specs = load_specs()
    standards_ = ("original", "msprobe", "msprobe+ref", "strict")
    caught: dict[str, int] = defaultdict(int)
    alarms: dict[str, int] = defaultdict(int)
    n_bugs = n_correct = 0
    table: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for seed in range(args.seeds):
        all_cases = list(cases(seed))
        correct = {(c.api, c.dtype, c.bench.shape): c.device for c in all_cases if c.kind == "correct:torch"}
        for case in all_cases:
            results = {s: verdict(case, s, specs) for s in standards_}
            flagged = {s: results[s] in ("error", "Warning") for s in standards_}
            if not case.is_bug:
                n_correct += 1
                for s in standards_:
                    alarms[s] += flagged[s]
                continue
            cell = table[(case.kind, case.dtype)]
            cell["total"] += 1
            for s in standards_:
                cell[s] += flagged[s]
            if beyond_rounding(case, correct[(case.api, case.dtype, case.bench.shape)]):
                cell["beyond"] += 1
                n_bugs += 1
                for s in standards_:
                    caught[s] += flagged[s]
    print(f"{n_correct} correct kernels, {sum(c['total'] for c in table.values())} planted bugs of which {n_bugs} "
          f"move results by more than 1 ULP (fp16/bf16/fp32, {args.seeds} seeds)\n")
    print(f"{'standard':12} {'detected (beyond rounding)':>27} {'false alarms':>14}")
    for s in standards_:
        print(f"{s:12} {caught[s] / max(n_bugs, 1):27.1%} {alarms[s]:>7}/{n_correct}")
    print(f"\n{'bug':26} {'dtype':9} {'beyond':>6} " + " ".join(f"{s:>11}" for s in standards_))
    for (kind, dtype), cell in sorted(table.items()):
        print(f"{kind:26} {dtype[6:]:9} {cell['beyond']:>3}/{cell['total']:<2} "
              + " ".join(f"{cell[s]:>8}/{cell['total']:<2}" for s in standards_))


if __name__ == "__main__":
    main()
