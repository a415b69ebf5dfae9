"""`python -m pytest_msprobe script 'dump.json::ENTRY'`: a standalone script of any recorded call (msprobe's
op_generate), passing or failing, that runs the call with pytest_msprobe's own check, --iter-times times."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_msprobe.__main__ import main
from tests.helpers import EXAMPLES, by_api, copy_dump, make_dump, records, tensor

PT_TENSOR = EXAMPLES / "mlp_fp32_tensor" / "step0" / "rank0"
BF16_STATISTICS = EXAMPLES / "mlp_bf16_statistics" / "step0" / "rank0"
LEAN = ("-p", "no:cacheprovider")


def run(script: Path, *args: str) -> tuple[int, Any]:
    proc = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=300, check=False,
                          cwd=script.parent)
    if "--json" in args:
        assert proc.stdout.strip(), proc.stderr
        return proc.returncode, json.loads(proc.stdout)
    return proc.returncode, proc.stdout + proc.stderr


def same_numbers(record: dict[str, Any], item: dict[str, Any]) -> None:
    assert record["status"] == item["status"] and record["seed"] == item["seed"] and record["impl"] == item["impl"]
    assert [(o["name"], o["status"], o["verdict"], o["metrics"], o["worst"]) for o in record["outputs"]] == \
        [(o["name"], o["status"], o["verdict"], o["metrics"], o["worst"]) for o in item["outputs"]]


@pytest.mark.parametrize("source, entries", [
    (PT_TENSOR, ["Functional.linear.0.forward", "Functional.linear.1.backward"]),     # real data
    (BF16_STATISTICS, ["Functional.gelu.0.forward", "Functional.layer_norm.0.backward"]),  # random from statistics
])
def test_a_script_of_any_item_gives_the_items_numbers(pytester: pytest.Pytester, source: Path,
                                                      entries: list[str]) -> None:
    dump = copy_dump(pytester, source, "d")
    pytester.runpytest(str(dump), "--msprobe-standard", "strict", *LEAN)
    items = by_api(records(pytester))
    for entry in entries:
        out = pytester.path / "scripts" / f"{entry}.py"
        assert main(["script", f"{dump}::{entry}", "-o", str(out), "--standard", "strict", "--iter-times", "2"]) == 0
        text = out.read_text()
        assert "from pytest_msprobe.triage.script import run_embedded" in text and "\ndef " not in text  # no copied code
        rc, result = run(out, "--json")
        assert rc == (1 if items[entry]["status"] == "error" else 0) and result["runs_agree"] is True
        assert len(result["records"]) == 2
        for record in result["records"]:
            same_numbers(record, items[entry])
    rc, text = run(pytester.path / "scripts" / f"{entries[0]}.py", "--iter-times", "3")
    assert rc == 0 and "runs: 3, all agree; device time per run: min" in text and "verdict: pass" in text


def test_a_failing_call_and_large_tensors_beside_the_script(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(kern="import torch\nKERNELS = {'Torch.matmul': lambda a, b: torch.matmul(a, b) * 1.01}\n")
    data = {"Torch.matmul.0.forward": {
        "input_args": [tensor("torch.float32", [256, 512], data_name="a.pt"),
                       tensor("torch.float32", [512, 64], data_name="b.pt")],
        "input_kwargs": {}, "output": [tensor("torch.float32", [256, 64])]}}
    dump = make_dump(pytester, data, task="tensor")
    import torch

    (dump.parent / "dump_tensor_data").mkdir()
    torch.save(torch.randn(256, 512), dump.parent / "dump_tensor_data" / "a.pt")
    torch.save(torch.randn(512, 64), dump.parent / "dump_tensor_data" / "b.pt")
    pytester.runpytest(str(dump), "--msprobe-kernels", "kern.py:KERNELS", *LEAN).assert_outcomes(failed=1)
    (item,) = records(pytester)
    out = pytester.path / "m.py"
    target = f"{dump}::Torch.matmul.0.forward"
    from pytest_msprobe.settings import CheckOptions
    from pytest_msprobe.triage.script import write

    write(target, out, CheckOptions(device="auto", kernels=str(pytester.path / "kern.py") + ":KERNELS"))
    assert (pytester.path / "m.data" / "dump_tensor_data" / "a.pt").is_file()  # 512 KiB: beside the script
    rc, result = run(out, "--json")
    assert rc == 1 and result["status"] == "error"
    same_numbers(result["records"][0], item)
    rc, text = run(out)
    assert rc == 1 and "verdict: error" in text and "Torch.matmul.0.forward.output.0  torch.float32 -> error" in text


def test_bad_targets_are_clear(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dump = PT_TENSOR / "dump.json"
    for target, message in ((str(dump), "expected DUMP_JSON::ENTRY"),
                            (f"{dump}::Functional.linear.9.forward", "no entry Functional.linear.9.forward (did you "
                                                                     "mean Functional.linear.1.forward, "),
                            (f"{tmp_path}/none.json::Functional.relu.0.forward", "cannot read dump file")):
        with pytest.raises(SystemExit, match=message.replace("(", r"\(")):
            main(["script", target, "-o", str(tmp_path / "s.py")])
    with pytest.raises(SystemExit, match="--iter-times must be at least 1"):
        main(["script", f"{dump}::Functional.linear.0.forward", "--iter-times", "0", "-o", str(tmp_path / "s.py")])
