"""--msprobe-save-error-data and --msprobe-repro: saved data replays as a dump; scripts print the item's numbers."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.helpers import by_api, make_dump, records
from tests.triage_helpers import (
    PLANTED,
    assert_same_numbers,
    gelu_bf16,
    matmul_fp16,
    relu_fp16,
    replay_line,
    run_script,
    site_dir,
)

LEAN = ("-p", "no:cacheprovider")


def _data_names(node: object) -> list[str]:
    if isinstance(node, dict):
        own = [node["data_name"]] if isinstance(node.get("data_name"), str) else []
        return own + [n for v in node.values() for n in _data_names(v)]
    if isinstance(node, list):
        return [n for v in node for n in _data_names(v)]
    return []


def test_saved_error_data_is_a_dump_that_fails_the_same_way(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(PLANTED)
    dump = make_dump(pytester, gelu_bf16())
    first = pytester.runpytest(str(dump), "--msprobe-standard", "strict", "--msprobe-save-error-data", "err", *LEAN)
    first.assert_outcomes(failed=2)
    err = pytester.path / "err"
    first.stdout.fnmatch_lines(["*msprobe error data*"])
    assert replay_line(first.stdout.str(), err.resolve()) in first.stdout.lines
    doc = json.loads((err / "dump.json").read_text())
    assert doc["task"] == "tensor" and doc["framework"] == "pytorch" and doc["dump_data_dir"]
    assert list(doc["data"]) == ["Functional.gelu.0.forward", "Functional.gelu.0.backward"]
    assert json.loads((err / "construct.json").read_text()) == {}
    assert set(json.loads((err / "stack.json").read_text())) == set(doc["data"])
    fwd, bwd = doc["data"]["Functional.gelu.0.forward"], doc["data"]["Functional.gelu.0.backward"]
    # msprobe's names; the forward item's copy of the inputs wins, the backward item's copy is removed
    assert fwd["input_args"][0]["data_name"] == "Functional.gelu.0.forward.input.0.pt"
    assert fwd["input_args"][0]["requires_grad"] is True and fwd["input_args"][0]["dtype"] == "torch.bfloat16"
    assert fwd["output"][0]["data_name"] == "Functional.gelu.0.forward.output.0.pt"
    assert bwd["input"][0]["data_name"] == "Functional.gelu.0.backward.input.0.pt"
    assert bwd["output"][0]["data_name"] == "Functional.gelu.0.backward.output.0.pt"
    files = sorted(p.name for p in (err / "dump_tensor_data").iterdir())
    assert sorted(_data_names(doc["data"])) == sorted(f for f in files if ".bench." not in f)
    assert "Functional.gelu.0.forward.output.bench.0.pt" in files
    assert "Functional.gelu.0.backward.output.bench.0.pt" in files
    assert not [f for f in files if "forward_input" in f or f.startswith(".")]
    saved = torch.load(err / "dump_tensor_data" / "Functional.gelu.0.backward.output.bench.0.pt", weights_only=True)
    # the bench's gradient as the bench computed it: strict computes an elementwise function's bf16 bench in fp64
    assert saved.dtype == torch.float64 and saved.shape == (16, 16) and saved.is_contiguous()
    index = json.loads((err / "error_data_index.json").read_text())
    bench_grads = index["d/dump.json::Functional.gelu.0.backward"]["bench_grads"]
    assert bench_grads == ["Functional.gelu.0.backward.output.bench.0.pt"]

    before = by_api(records(pytester))
    again = pytester.runpytest(str(err), "--msprobe-standard", "strict", "--msprobe-out", "replay", *LEAN)
    again.assert_outcomes(failed=2)
    after = by_api(records(pytester, "replay"))
    for key, old in before.items():
        new = after[key]
        assert new["data"] == "real" and new["status"] == old["status"] == "error"
        for a, b in zip(old["outputs"], new["outputs"]):
            assert a["name"] == b["name"] and a["worst"] == b["worst"] and a["verdict"] == b["verdict"]
            assert a["metrics"] == b["metrics"] and a["reference"]["max_err"] == b["reference"]["max_err"]


@pytest.mark.parametrize("standard", ["strict", "original", "msprobe"])
def test_repro_scripts_print_the_numbers_the_item_reported(pytester: pytest.Pytester, standard: str) -> None:
    pytester.makeconftest(PLANTED)
    data = gelu_bf16() if standard == "strict" else matmul_fp16()
    dump = make_dump(pytester, data)
    result = pytester.runpytest(str(dump), "--msprobe-standard", standard, "--msprobe-repro", "rep", *LEAN)
    failing = [r for r in records(pytester) if r["status"] == "error"]
    assert failing and len(failing) == result.parseoutcomes()["failed"]
    result.stdout.fnmatch_lines(["*msprobe repro*", "python *rep/d__*.py"])
    planted, plain = site_dir(pytester.path), site_dir(pytester.path, planted=False)
    for record in failing:
        script = Path(record["repro"])
        # the script runs the plugin's own check (there is no copy of it to drift)
        assert script.parent == pytester.path / "rep" and "from pytest_msprobe.triage.repro import main" in script.read_text()
        rc, out = run_script(script, planted, "--json")
        assert rc == 1 and assert_same_numbers(out, record) >= 5
        rc, text = run_script(script, plain)  # the same call with a correct kernel: the fix is verified
        assert rc == 0 and "verdict: pass" in text, text
    if standard != "strict":  # [512, 256] fp16 inputs: past the embedding budget, beside the script
        assert (pytester.path / "rep" / "d__Torch.matmul.0.forward.pt").is_file()


def test_under_xdist_workers_write_item_files_and_the_controller_writes_dump_json(pytester: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    pytester.makeconftest(PLANTED)
    dump = make_dump(pytester, {**gelu_bf16(), **matmul_fp16(), **relu_fp16()})
    result = pytester.runpytest_subprocess(str(dump), "-n", "2", "-p", "xdist", "-o", "msprobe_min_work_per_worker=0",
                                           "-p", "no:hypothesispytest",
                                           "-p", "no:benchmark", "--msprobe-standard", "strict",
                                           "--msprobe-save-error-data", "err", "--msprobe-repro", "rep",
                                           "--msprobe-fuzz", "30", "-m", "not (fuzz and Torch)",
                                           "--msprobe-html", "report.html", *LEAN)
    result.assert_outcomes(failed=5, passed=1)  # matmul[fuzz] deselected (xdist does not count it)
    doc = json.loads((pytester.path / "err" / "dump.json").read_text())
    assert sorted(doc["data"]) == ["Functional.gelu.0.backward", "Functional.gelu.0.forward", "Torch.matmul.0.forward"]
    fuzz = json.loads((pytester.path / "err" / "fuzz" / "dump.json").read_text())
    assert sorted(fuzz["data"]) == ["Functional.gelu.0.forward", "Functional.relu.0.forward"]
    scripts = sorted(p.name for p in (pytester.path / "rep").glob("*.py"))
    assert scripts == ["d__Functional.gelu.0.backward.py", "d__Functional.gelu.0.forward.py",
                       "d__Functional.gelu.0.forward_fuzz.py", "d__Functional.relu.0.forward_fuzz.py",
                       "d__Torch.matmul.0.forward.py"]
    assert not list((pytester.path / "err").rglob(".*tmp"))
    page = (pytester.path / "report.html").read_text(encoding="utf-8")
    assert page.count('<section class="failure"') == 5  # summaries and fuzz results crossed from the workers


def test_several_dumps_get_one_folder_each(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(PLANTED)
    dumps = [make_dump(pytester, gelu_bf16(), name=f"step0/rank{r}") for r in (0, 1)]
    first = pytester.runpytest(*map(str, dumps), "--msprobe-standard", "strict", "--msprobe-save-error-data", "err",
                               *LEAN)
    first.assert_outcomes(failed=4)
    for r in (0, 1):
        doc = json.loads((pytester.path / "err" / "step0" / f"rank{r}" / "dump.json").read_text())
        assert list(doc["data"]) == ["Functional.gelu.0.forward", "Functional.gelu.0.backward"]
    assert not (pytester.path / "err" / "dump.json").exists()
    pytester.runpytest(str(pytester.path / "err"), "--msprobe-standard", "strict", *LEAN).assert_outcomes(failed=4)


KERNEL = """
import torch


def gelu(x, *args, **kwargs):  # rounds towards zero in bf16 instead of to nearest
    exact = torch.nn.functional.gelu(x.float(), *args, **kwargs)
    return (exact.view(torch.int32) & -65536).view(torch.float32).to(x.dtype)


KERNELS = {"Functional.gelu": gelu}
"""


def test_a_substituted_kernel_is_replayed_by_its_repro_script(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(kern=KERNEL)
    dump = make_dump(pytester, {"Functional.gelu.0.forward": gelu_bf16([64, 64])["Functional.gelu.0.forward"]})
    result = pytester.runpytest(str(dump), "--msprobe-standard", "strict", "--msprobe-kernels", "kern.py:KERNELS",
                                "--msprobe-repro", "rep", *LEAN)
    result.assert_outcomes(failed=1)
    (record,) = records(pytester)
    assert record["kernel"] and "biased towards zero" in record["outputs"][0]["verdict_message"]
    rc, out = run_script(Path(record["repro"]), site_dir(pytester.path, planted=False), "--json")  # no planted bug
    assert rc == 1 and assert_same_numbers(out, record) >= 10
