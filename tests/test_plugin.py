"""End to end through pytester: collection, node ids, verdicts, reports, bad input, xdist."""
from __future__ import annotations

import csv
import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import (
    EXAMPLES,
    SHARED_DUMPS,
    by_api,
    copy_dump,
    device_side_conftest,
    make_dump,
    records,
    shared_dump_dirs,
    tensor,
)

TENSOR_EXAMPLE = EXAMPLES / "mlp_fp32_tensor" / "step0" / "rank0"
BF16_EXAMPLE = EXAMPLES / "mlp_bf16_statistics" / "step0" / "rank0"










def unary(api: str, dtype: str = "torch.float32", shape: list[int] | None = None, **kw: Any) -> dict[str, Any]:
    out = tensor(dtype, shape)
    return {"input_args": [tensor(dtype, shape, **kw)], "input_kwargs": {}, "output": [out]}


# --------------------------------------------------------------------------- collection


def test_one_item_per_entry_with_stable_ids(pytester: pytest.Pytester) -> None:
    dump = copy_dump(pytester, TENSOR_EXAMPLE, "step0")
    first = pytester.runpytest("--collect-only", "-q", "--msprobe-api-info", str(dump))
    second = pytester.runpytest("--collect-only", "-q", str(dump), "--msprobe-seed", "99", "--msprobe-device", "cpu")
    ids = [line for line in first.outlines if "::" in line]
    entries = json.loads(dump.read_text())["data"]
    assert ids == [f"step0/dump.json::{name}" for name in entries]
    assert ids == [line for line in second.outlines if "::" in line]  # no seed/device in node ids


def test_directory_argument_collects_dump_json_but_testpaths_do_not(pytester: pytest.Pytester) -> None:
    copy_dump(pytester, TENSOR_EXAMPLE, "dumps/step0/rank0")
    copy_dump(pytester, BF16_EXAMPLE, "dumps/step0/rank1")
    result = pytester.runpytest("--collect-only", "-q", "dumps")
    result.stdout.fnmatch_lines(["*36 tests collected*"])
    pytester.makeini("[pytest]\ntestpaths = dumps\n")
    result = pytester.runpytest("--collect-only", "-q")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED


def test_markers_select_type_direction_dtype(pytester: pytest.Pytester) -> None:
    dump = copy_dump(pytester, BF16_EXAMPLE, "bf16")
    result = pytester.runpytest("--collect-only", "-q", str(dump), "-m", "Functional and backward and bfloat16",
                                "--strict-markers")
    ids = [line for line in result.outlines if "::" in line]
    assert ids and all("Functional." in i and i.endswith(".backward") for i in ids)
    assert len(ids) == 6
    result = pytester.runpytest("--collect-only", "-q", str(dump), "-k", "linear and forward")
    assert [line.split("::")[1] for line in result.outlines if "::" in line] == [
        "Functional.linear.0.forward", "Functional.linear.1.forward"]


def test_broken_dump_is_a_collection_error_and_others_still_run(pytester: pytest.Pytester) -> None:
    good = make_dump(pytester, {"Functional.relu.0.forward": unary("relu")}, "good")
    bad = pytester.path / "bad" / "dump.json"
    bad.parent.mkdir()
    bad.write_text('{"task": "statistics", "data": {"Functional.relu.0.forward": {"input_args": [')
    result = pytester.runpytest(str(good), str(bad))
    result.stdout.fnmatch_lines(["*bad/dump.json: not valid JSON at line 1*truncated*"])
    result.assert_outcomes(passed=1, errors=1)


# --------------------------------------------------------------------------- running


GC_PROBE = """
import gc, json
import pytest

seen = {}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):  # around the plugin's own (its first item imports torch)
    if not seen:
        seen["full_passes"] = gc.get_stats()[2]["collections"]
    try:
        return (yield)
    finally:
        if "frozen" not in seen:
            seen["full_passes"] = gc.get_stats()[2]["collections"] - seen["full_passes"]
            seen["frozen"] = gc.get_freeze_count()
            with open("gc.json", "w") as f:
                json.dump(seen, f)
"""


def test_the_first_items_imports_pay_no_cyclic_collection(pytester: pytest.Pytester) -> None:
    """torch and the checks (about 10^6 objects) are imported and warmed up at the first item with the
    cyclic collector paused, then frozen out of its way: each full pass over them cost 0.1-0.2 s, and the
    first item paid four of them."""
    dump = copy_dump(pytester, BF16_EXAMPLE, "mlp")
    pytester.makeconftest(GC_PROBE)
    result = pytester.runpytest_subprocess(str(dump), "--msprobe-device", "cpu", "-p", "no:randomly", "-n", "0")
    assert result.ret == 0, result.stdout.str()
    seen = json.loads((pytester.path / "gc.json").read_text())
    assert seen["full_passes"] == 0 and seen["frozen"] > 100_000


def test_real_tensor_dump_runs_and_writes_msprobe_files(pytester: pytest.Pytester) -> None:
    dump = copy_dump(pytester, TENSOR_EXAMPLE, "mlp")
    result = pytester.runpytest("--msprobe-api-info", str(dump), "--msprobe-device", "cpu", "-rs")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0, result.stdout.str()
    recs = by_api(records(pytester))
    assert len(recs) == 18
    assert all(r["data"] == "real" for r in recs.values() if r["status"] != "SKIP")
    linear = recs["Functional.linear.0.forward"]
    assert linear["status"] == "pass" and linear["outputs"][0]["metrics"]["cosine"] > 0.9999999
    # a backward item compares the gradients of every input that requires grad (weight and bias here)
    grads = recs["Functional.linear.0.backward"]["outputs"]
    assert [o["name"] for o in grads] == ["Functional.linear.0.backward.output.1", "Functional.linear.0.backward.output.2"]
    assert [o["shape"] for o in grads] == [[32, 16], [32]]
    out = pytester.path / "msprobe_results"
    (result_csv,) = out.glob("accuracy_checking_result_*.csv")
    (details_csv,) = out.glob("accuracy_checking_details_*.csv")
    assert result_csv.read_bytes().startswith(b"\xef\xbb\xbf")  # utf-8-sig like msprobe
    rows = list(csv.reader(result_csv.open(encoding="utf-8-sig")))
    assert rows[0] == ["API name", "Forward Test Success", "Backward Test Success", "Message"]
    assert ["Functional.linear.0", "pass", "pass"] in rows
    details = list(csv.reader(details_csv.open(encoding="utf-8-sig")))
    assert details[0][4] == "余弦相似度" and len(details[0]) == 23
    result.stdout.fnmatch_lines(["*msprobe: seed 1234, device cpu*", "*== msprobe ==*", "*accuracy_checking_result_*"])


def test_item_reruns_alone_with_the_same_numbers(pytester: pytest.Pytester) -> None:
    dump = copy_dump(pytester, BF16_EXAMPLE, "bf16")
    pytester.runpytest(str(dump), "--msprobe-out", "full")
    full = by_api(records(pytester, "full"))
    pytester.runpytest(str(dump), "--msprobe-out", "one", "-k", "gelu and forward")
    (alone,) = records(pytester, "one")
    assert alone["seed"] == full["Functional.gelu.0.forward"]["seed"]
    assert alone["outputs"] == full["Functional.gelu.0.forward"]["outputs"]
    pytester.runpytest(str(dump), "--msprobe-out", "other", "-k", "gelu and forward", "--msprobe-seed", "5")
    (other,) = records(pytester, "other")
    assert other["outputs"][0]["metrics"] != alone["outputs"][0]["metrics"]


def test_bf16_warning_is_visible_and_can_fail(pytester: pytest.Pytester) -> None:
    data = {"Tensor.add.0.forward": {"input_args": [tensor("torch.bfloat16", [64, 64], mx=8.0, mn=1.0)] * 2,
                                     "input_kwargs": {}, "output": [tensor("torch.bfloat16", [64, 64])]}}
    dump = make_dump(pytester, data)
    result = pytester.runpytest(str(dump), "-v", "--msprobe-standard", "original")
    result.stdout.fnmatch_lines(["*Tensor.add.0.forward WARNED*", "*1 warned*"])
    assert result.ret == 0
    result = pytester.runpytest(str(dump), "-o", "msprobe_warning_as_error=true", "--msprobe-standard", "original")
    result.assert_outcomes(failed=1)
    # msprobe's new standard judges add by its absolute threshold: exact bf16 rounding passes
    pytester.runpytest(str(dump), "--msprobe-standard", "msprobe").assert_outcomes(passed=1)


def corrupt_gelu(pytester: pytest.Pytester) -> None:
    """A conftest whose F.gelu is 5% off inside the device call (the bench and strict's torch run are not)."""
    pytester.makeconftest(device_side_conftest("""
        import torch.nn.functional as F
        IMPLS = {F.gelu: lambda orig, x, *a, **k: orig(x, *a, **k) * 1.05}
    """))


def test_planted_bug_fails_with_readable_report(pytester: pytest.Pytester) -> None:
    corrupt_gelu(pytester)  # the device runs gelu in fp32, the bench in fp64
    dump = make_dump(pytester, {"Functional.gelu.0.forward": unary("gelu", shape=[32, 32], mx=3.0, mn=0.5)})
    result = pytester.runpytest(str(dump))
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    for expected in ("output.0", "(32, 32)", "seed:", "rerun: pytest", "Functional.gelu.0.forward", "--msprobe-seed"):
        assert expected in text
    (rec,) = records(pytester)
    assert rec["status"] == "error"


def test_exception_is_a_failure_with_traceback_never_a_pass(pytester: pytest.Pytester) -> None:
    data = {"Functional.linear.0.forward": {
        "input_args": [tensor(shape=[4, 8]), tensor(shape=[3, 5])], "input_kwargs": {}, "output": []}}
    result = pytester.runpytest(str(make_dump(pytester, data)))
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*RuntimeError*", "*device run raised RuntimeError*"])


def test_bad_entries_skip_with_specific_reasons(pytester: pytest.Pytester) -> None:
    data = {
        "Functional.no_such_api.0.forward": unary("x"),
        "Distributed.all_reduce.0.forward": unary("x"),
        "VF.lstm.0.forward": unary("x"),
        "Aten.add.Tensor.0.forward": unary("x"),
        "Torch.randn.0.forward": {"input_args": [{"type": "int", "value": 3}], "input_kwargs": {}, "output": []},
        "Functional.relu.0.forward": unary("relu", shape=[1 << 20, 1 << 20]),
        "Functional.silu.0.forward": {"input_args": [{}], "input_kwargs": {}, "output": []},
        "Functional.gelu.0.forward": unary("gelu", mx=None, mn=None),
        "Torch.tanh.0.forward": {"input_args": [tensor(data_name="../../etc/passwd")], "input_kwargs": {}},
        "Torch.sigmoid.0.forward": {"input_args": [tensor(data_name="gone.pt")], "input_kwargs": {}},
        "Functional.elu.0.backward": {"input": [tensor()], "output": [tensor()]},
        "Tensor.to.0.forward": unary("to"),
        "NPU.npu_no_bench.0.forward": unary("x"),
        "Functional.softplus.0.forward": unary("softplus"),
    }
    dump = make_dump(pytester, data, task="tensor")
    (dump.parent / "dump_tensor_data").mkdir()
    result = pytester.runpytest(str(dump), "-rs")
    result.assert_outcomes(passed=1, skipped=13)
    for reason in ("no such API in torch", "process group", "torch._VF", "overload names", "random-number API",
                   "GiB", "recorded as {}", "are not numbers", "outside the dump folder", "gone.pt is missing",
                   "no forward entry", "uninitialised memory", "no bench function for npu_no_bench"):
        assert reason in result.stdout.str(), reason


def test_npu_ops_run_bench_functions_and_say_so(pytester: pytest.Pytester) -> None:
    data = {"NPU.npu_rms_norm.0.forward": {
        "input_args": [tensor("torch.float32", [4, 64], mx=2.0, mn=-2.0), tensor("torch.float32", [64], mx=1.5, mn=0.5)],
        "input_kwargs": {}, "output": [tensor("torch.float32", [4, 64]), tensor("torch.float32", [4, 1])]}}
    data["Functional.relu.0.forward"] = unary("relu")
    result = pytester.runpytest(str(make_dump(pytester, data)), "--msprobe-device", "cpu", "-v")
    result.assert_outcomes(passed=1)  # relu; the NPU op is counted apart
    assert result.parseoutcomes()["reference"] == 1  # "1 passed, 1 reference-only"
    result.stdout.fnmatch_lines(["*NPU.npu_rms_norm.0.forward PASSED (reference only)*",
                                 "*Functional.relu.0.forward PASSED*",
                                 "items (strict verdicts): 0 SKIP, 0 Warning, 0 error, 1 pass",
                                 "1 items checked only the reference (1 pass): NPU ops without an NPU*"])
    rec = by_api(records(pytester))["NPU.npu_rms_norm.0.forward"]
    assert "reference-vs-reference" in " ".join(rec["notes"]) and rec["impl"].startswith("bench_functions.")
    assert len(rec["outputs"]) == 2 and rec["reference_only"] is True
    (details,) = (pytester.path / "msprobe_results").glob("accuracy_checking_details_*.csv")
    messages = {row[0]: row[-1] for row in csv.reader(details.open(encoding="utf-8-sig"))}
    assert messages["NPU.npu_rms_norm.0.forward.output.0"].startswith("[reference only: the device side ran the bench")
    assert not messages["Functional.relu.0.forward.output.0"].startswith("[reference only")


def test_npu_device_without_torch_npu_skips_clearly(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest(str(make_dump(pytester, {"Functional.relu.0.forward": unary("relu")})),
                                "--msprobe-device", "npu", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*--msprobe-device npu: torch_npu cannot be imported*"])


def test_xdist_gives_the_same_records_and_one_set_of_files(pytester: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    dump = copy_dump(pytester, BF16_EXAMPLE, "bf16")
    # msprobe's standard: its run also writes the api_precision_compare pair
    pytester.runpytest(str(dump), "--msprobe-out", "serial", "--msprobe-standard", "msprobe",
                                           "-o", "msprobe_min_work_per_worker=0")  # a small dump: start the workers
    result = pytester.runpytest_subprocess(str(dump), "--msprobe-out", "parallel", "-n", "2", "-p", "xdist",
                                           "--msprobe-standard", "msprobe",
                                           "-o", "msprobe_min_work_per_worker=0")  # a small dump: start the workers
    assert result.ret in (0, 1), result.stdout.str()
    serial, parallel = records(pytester, "serial"), records(pytester, "parallel")
    strip = ("timings",)
    assert [{k: v for k, v in r.items() if k not in strip} for r in serial] == \
        [{k: v for k, v in r.items() if k not in strip} for r in parallel]
    assert len(list((pytester.path / "parallel").glob("*.csv"))) == 4  # run_ut pair + api_precision_compare pair


@pytest.mark.skipif(not SHARED_DUMPS.is_dir(), reason="../shared/dumps is not beside this checkout")
@pytest.mark.parametrize("folder", shared_dump_dirs("pt"), ids=lambda p: p.name)
def test_shared_pytorch_dumps_run_without_crash_type_errors(pytester: pytest.Pytester, folder: Path) -> None:
    dump = copy_dump(pytester, folder, folder.name)
    result = pytester.runpytest(str(dump), "--msprobe-device", "cpu")
    entries = json.loads(dump.read_text())["data"]
    recs = records(pytester)
    assert sorted(f"{r['api']}.{r['direction']}" for r in recs) == sorted(entries)
    assert not [r for r in recs if r.get("traceback")], result.stdout.str()
    if "fp32" in folder.name:  # correct CPU kernels are never 'error' on fp32 dumps
        assert not [r["api"] for r in recs if r["status"] == "error"], result.stdout.str()


def test_bench_precision_option_raises_the_bench_and_reruns_with_it(pytester: pytest.Pytester) -> None:
    corrupt_gelu(pytester)  # the device side; the bench runs in fp32 or fp64
    dump = make_dump(pytester, {"Functional.gelu.0.forward": unary("gelu", "torch.bfloat16", [32, 32], mx=3.0, mn=0.5)})
    # msprobe's rule raises bf16 to fp32; strict (the default) computes elementwise functions' bench in fp64
    pytester.runpytest(str(dump), "--msprobe-out", "auto", "--msprobe-standard", "msprobe").assert_outcomes(failed=1)
    assert records(pytester, "auto")[0]["outputs"][0]["bench_dtype"] == "torch.float32"
    pytester.runpytest(str(dump), "--msprobe-out", "strict").assert_outcomes(failed=1)
    assert records(pytester, "strict")[0]["outputs"][0]["bench_dtype"] == "torch.float64"
    result = pytester.runpytest(str(dump), "--msprobe-out", "fp64", "-o", "msprobe_bench_precision=fp64")
    result.assert_outcomes(failed=1)
    assert records(pytester, "fp64")[0]["outputs"][0]["bench_dtype"] == "torch.float64"
    result.stdout.fnmatch_lines(["*rerun: pytest*-o msprobe_bench_precision=fp64*"])
    result = pytester.runpytest(str(dump), "-o", "msprobe_bench_precision=fp32")
    result.stderr.fnmatch_lines(["*ini msprobe_bench_precision: 'fp32' is not one of auto, fp64*"])


# --------------------------------------------------------------------------- the command line

MAX_OPTIONS = 20  # what --help's msprobe group may show; every other setting is an ini key


def test_help_shows_a_short_msprobe_group_and_every_ini_key(pytester: pytest.Pytester) -> None:
    from pytest_msprobe.session.ini_keys import KEYS

    result = pytester.runpytest_subprocess("--help")
    assert result.ret == 0
    text = result.stdout.str()
    group = text.split("\nmsprobe API precision checks", 1)[1].split("\n\n", 1)[0]  # groups end at a blank line
    shown = re.findall(r"^  (--msprobe-[\w-]+)", group, re.M)
    assert 10 <= len(shown) <= MAX_OPTIONS, shown
    assert set(re.findall(r"^\s+(--msprobe-[\w-]+)", text, re.M)) == set(shown)  # none in another group
    ini_section = re.split(r"^\[pytest\]", text, maxsplit=1, flags=re.M)[1]
    for key in KEYS:
        assert key.flag not in text, f"{key.flag} is shown"  # parsed, hidden
        assert re.search(rf"^\s+{key.name} \((string|bool)\)", ini_section, re.M), key.name


def test_a_former_option_still_works_and_says_its_replacement_once(pytester: pytest.Pytester) -> None:
    from tests.doc_samples import missing_from

    pytest.importorskip("xdist")
    corrupt_gelu(pytester)
    dump = make_dump(pytester, {"Functional.gelu.0.forward": unary("gelu", "torch.bfloat16", [32, 32], mx=3.0, mn=0.5)})
    common = (str(dump), "--msprobe-standard", "msprobe")  # its bench is fp32 unless told fp64
    # the former spelling wins over -o, as the option won over its ini key; under -n 2 the controller says it once
    result = pytester.runpytest_subprocess(*common, "--msprobe-bench-precision", "fp64", "-o",
                                           "msprobe_bench_precision=auto", "--msprobe-out", "old", "-n", "2", "-p",
                                           "xdist", "-o", "msprobe_min_work_per_worker=0")
    result.assert_outcomes(failed=1)
    assert records(pytester, "old")[0]["outputs"][0]["bench_dtype"] == "torch.float64"
    said = [line for line in result.stderr.lines + result.stdout.lines if "deprecated" in line]
    assert said == ["msprobe: --msprobe-bench-precision is deprecated; use -o msprobe_bench_precision=fp64 "
                    "(ini key msprobe_bench_precision)"], said
    assert missing_from(result.stderr.str(), "docs/reference/options.md", 0) is None
    rerun = next(line for line in result.stdout.lines if line.startswith("rerun: "))
    assert "-o msprobe_bench_precision=fp64" in rerun and "--msprobe-bench-precision" not in rerun
    again = pytester.runpytest_subprocess(*shlex.split(rerun[len("rerun: pytest "):]), "--msprobe-out", "again")
    again.assert_outcomes(failed=1)  # the printed command reproduces the verdict, in the new spelling
    assert records(pytester, "again")[0]["outputs"][0]["bench_dtype"] == "torch.float64"
    assert "deprecated" not in again.stderr.str() + again.stdout.str()
    pytester.runpytest(*common, "--msprobe-out", "new").assert_outcomes(failed=1)
    assert records(pytester, "new")[0]["outputs"][0]["bench_dtype"] == "torch.float32"  # the default, to compare


def test_a_printed_command_respells_the_former_options() -> None:
    from pytest_msprobe.session.ini_keys import respell

    assert respell(["d/dump.json", "--msprobe-threads", "2", "--msprobe-timeout=5", "--msprobe-filter-api",
                    "--msprobe-out", "out", "-o", "msprobe_seed=3", "--msprobe-device=cpu"]) == \
        ["d/dump.json", "-o", "msprobe_threads=2", "-o", "msprobe_timeout=5", "-o", "msprobe_filter_api=true",
         "--msprobe-out", "out", "-o", "msprobe_seed=3", "--msprobe-device=cpu"]


def test_a_failing_reference_only_item_says_so(pytester: pytest.Pytester) -> None:
    pytester.makeconftest("import bench_functions, torch\n"
                          "bench_functions.register('npu_dtype_bug')("
                          "lambda x: x * 2 if x.dtype == torch.bfloat16 else x)\n")
    data = {"NPU.npu_dtype_bug.0.forward": unary("x", "torch.bfloat16", [8, 8])}
    # msprobe's standard: strict's torch run of a reference-only item on the CPU is the device side's own
    # computation (the bench function in the device dtype), so it cannot fail there
    result = pytester.runpytest(str(make_dump(pytester, data)), "--msprobe-device", "cpu", "--msprobe-standard",
                                "msprobe", "-v", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*NPU.npu_dtype_bug.0.forward FAILED (reference only)*",
                                 "*[[]reference only: the device side ran the bench function, no vendor kernel]*",
                                 "1 items checked only the reference (1 error)*"])


@pytest.mark.parametrize("dtype, asked", [("torch.float32", "torch.float32"), ("torch.bfloat16", "torch.bfloat16")])
def test_a_result_dtype_argument_is_raised_with_the_bench(pytester: pytest.Pytester, dtype: str, asked: str) -> None:
    """vector_norm(x, dtype=...) of the input's own dtype: the raised bench would refuse the narrower
    dtype (`should be convertible without narrowing`), so the bench raises it too."""
    data = {"Torch.vector_norm.0.forward": {
        "input_args": [tensor(dtype, [16, 64])],
        "input_kwargs": {"ord": {"type": "int", "value": 2}, "dtype": {"type": "torch.dtype", "value": asked}},
        "output": [tensor(dtype, [])]}}
    pytester.runpytest(str(make_dump(pytester, data)), "-p", "no:cacheprovider").assert_outcomes(passed=1)
    (record,) = records(pytester)
    assert record["outputs"][0]["bench_dtype"] == ("torch.float64" if dtype == "torch.float32" else "torch.float32")


def test_rerun_command_is_the_quoted_command_line_and_follows_the_settings(pytestconfig: pytest.Config) -> None:
    """rerun_command quotes its options once per process: the line is shlex.join of the whole command, and a
    replaced CheckOptions (the journal adopts a resumed run's seed at configure) is picked up."""
    import dataclasses
    import shlex

    from pytest_msprobe.session.items import _rerun_options, rerun_command
    from pytest_msprobe.session.stash import SETTINGS_KEY

    target = "dumps/a b/dump.json::Functional.relu.0.forward"
    line = rerun_command(pytestconfig, target, "--msprobe-fuzz", "5")
    assert line == shlex.join(["pytest", target, *_rerun_options(pytestconfig), "--msprobe-fuzz", "5"])
    assert shlex.split(line)[:2] == ["pytest", target]
    settings = pytestconfig.stash[SETTINGS_KEY]
    before = settings.check_options
    try:
        settings.check_options = dataclasses.replace(before, run_seed=987654)
        assert "--msprobe-seed 987654 " in rerun_command(pytestconfig, target)
    finally:
        settings.check_options = before
    assert f"--msprobe-seed {before.run_seed} " in rerun_command(pytestconfig, target)
