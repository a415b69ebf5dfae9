"""What the terminal says about a run: skips grouped by reason with what to do (and pytest's -rs lines at the dump,
naming the item), failure headings that name the dump when there are several, the items' verdicts labelled apart
from msprobe's Layer-1 Status in the CSVs, the item seed only where it drew the inputs, and a first line of each
failure that says something once pytest's short summary cuts it to the terminal's width."""
from __future__ import annotations

import csv
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from pytest_msprobe.records.record import Record
from tests.helpers import EXAMPLES, copy_dump, make_dump, records, tensor, two_ranks_same_names

LEAN = ("-p", "no:cacheprovider", "-p", "no:hypothesispytest")
XDIST = ("-n", "2", "-p", "xdist", "--msprobe-min-work-per-worker", "0")


def unary(**kw: Any) -> dict[str, Any]:
    return {"input_args": [tensor(**kw)], "input_kwargs": {}, "output": [tensor(**kw)]}


def unknown_and_missing(pytester: pytest.Pytester) -> None:
    """Two dumps: `unknown/` with two APIs no torch has and a relu that passes; `tensor/`, the mlp tensor example
    without gelu's forward input file (gelu's forward and backward items need it)."""
    make_dump(pytester, {"Torch.no_such_api.0.forward": unary(), "Tensor.no_such_method.0.forward": unary(),
                         "Functional.relu.0.forward": unary()}, name="unknown")
    copy_dump(pytester, EXAMPLES / "mlp_fp32_tensor" / "step0" / "rank0", "tensor")
    (pytester.path / "tensor" / "dump_tensor_data" / "Functional.gelu.0.forward.input.0.pt").unlink()


def msprobe_section(text: str) -> list[str]:
    section = text.split("= msprobe =", 1)[1]
    return re.split(r"\n=+ ", section, maxsplit=1)[0].splitlines()[1:]


@pytest.mark.parametrize("xdist", [(), XDIST], ids=["one process", "xdist"])
def test_skips_are_grouped_by_reason_with_what_to_do_and_rs_names_each_item(pytester: pytest.Pytester,
                                                                            xdist: tuple[str, ...]) -> None:
    unknown_and_missing(pytester)
    result = pytester.runpytest_subprocess("unknown", "tensor", "-k", "relu or gelu or no_such", "-rs", *xdist, *LEAN)
    result.assert_outcomes(passed=1, skipped=4)
    recs = {(Path(r["dump"]).parent.name, f"{r['api']}.{r['direction']}"): r for r in records(pytester)}
    skipped = sorted(k for k, r in recs.items() if r["status"] == "SKIP")
    assert skipped == [("tensor", "Functional.gelu.0.backward"), ("tensor", "Functional.gelu.0.forward"),
                       ("unknown", "Tensor.no_such_method.0.forward"), ("unknown", "Torch.no_such_api.0.forward")]
    section = msprobe_section(result.stdout.str())
    at = section.index("skipped 4 item(s), by reason (pytest -rs names each item):")
    assert sorted(section[at + 1:at + 3]) == [
        "  missing tensor file (2: Functional.gelu): the dump's dump_tensor_data/ folder is incomplete: copy it "
        "whole with its dump.json",
        "  unknown API, not in the installed torch (2: Torch.no_such_api, Tensor.no_such_method): dumped with "
        "another torch version? check with the one the model ran on"]
    out = result.stdout.str()
    # pytest's own lines: at the dump, each naming its entry; never at the line of the plugin that raised the skip
    result.stdout.fnmatch_lines_random([
        "SKIPPED [[]1] unknown/dump.json:1: Torch.no_such_api.0.forward: no such API in torch *",
        "SKIPPED [[]1] unknown/dump.json:1: Tensor.no_such_method.0.forward: no such API in torch *",
        "SKIPPED [[]1] tensor/dump.json:1: Functional.gelu.0.forward: *tensor file *gelu.0.forward.input.0.pt is "
        "missing",
        "SKIPPED [[]1] tensor/dump.json:1: Functional.gelu.0.backward: *is missing"])
    assert "items.py" not in out and "Torch.no_such_api.0.forward: Torch.no_such_api" not in out


def test_a_resumed_run_says_the_same_of_its_skips(pytester: pytest.Pytester) -> None:
    """Skips taken from the journal (--msprobe-resume) are reported as a run reports them."""
    make_dump(pytester, {"Torch.no_such_api.0.forward": unary(), "Functional.relu.0.forward": unary()})
    pytester.runpytest_subprocess("d", *LEAN).assert_outcomes(passed=1, skipped=1)
    result = pytester.runpytest_subprocess("d", "--msprobe-resume", "-rs", *LEAN)
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*2 taken from the journal (--msprobe-resume)*",
                                 "skipped 1 item(s), by reason (pytest -rs names each item):",
                                 "  unknown API, not in the installed torch (1: Torch.no_such_api): *",
                                 "SKIPPED [[]1] d/dump.json:1: Torch.no_such_api.0.forward: no such API in torch *"])


@pytest.mark.parametrize("xdist", [(), XDIST], ids=["one process", "xdist"])
def test_with_several_dumps_a_failure_heading_names_its_dump(pytester: pytest.Pytester,
                                                             xdist: tuple[str, ...]) -> None:
    two_ranks_same_names(pytester)  # rank1's gelu fails; rank0 has the same calls
    result = pytester.runpytest_subprocess("step0", *xdist, *LEAN)
    result.assert_outcomes(passed=3, failed=1)
    headings = [line for line in result.stdout.lines if line.startswith("_") and "msprobe" in line]
    assert [line.strip("_ ") for line in headings] == ["msprobe: rank1 Functional.gelu.0.forward"]
    result.stdout.fnmatch_lines(["FAILED step0/rank1/dump.json::Functional.gelu.0.forward*"])


def test_with_one_dump_the_heading_is_the_entry(pytester: pytest.Pytester) -> None:
    two_ranks_same_names(pytester)
    result = pytester.runpytest_subprocess("step0/rank1", *LEAN)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["_* msprobe: Functional.gelu.0.forward _*"])


def test_a_resumed_failure_keeps_its_dump_in_the_heading(pytester: pytest.Pytester) -> None:
    two_ranks_same_names(pytester)
    pytester.runpytest_subprocess("step0", *LEAN).assert_outcomes(passed=3, failed=1)
    result = pytester.runpytest_subprocess("step0", "--msprobe-resume", *LEAN)
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines(["_* msprobe: rank1 Functional.gelu.0.forward _*"])


def test_items_verdicts_and_the_csvs_layer1_status_are_labelled_apart(pytester: pytest.Pytester) -> None:
    """gelu 0.05 % off: strict's error, run_ut's Warning; two relus that pass both. Each line's numbers are what it
    names: the records' statuses, and the Status cells of the details CSV."""
    pytester.makeconftest("""
        import pytest, torch.nn.functional as F
        from torch.overrides import TorchFunctionMode

        class Off(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                y = func(*args, **(kwargs or {}))
                return y * 1.0005 if func is F.gelu else y

        @pytest.hookimpl(wrapper=True)
        def pytest_msprobe_device_call(phase):
            if phase != "forward":
                return (yield)
            with Off():
                return (yield)
    """)
    gelu = {"input_args": [tensor("torch.float32", [64, 64], 3.0, -3.0)], "input_kwargs": {},
            "output": [tensor("torch.float32", [64, 64])]}
    make_dump(pytester, {"Functional.gelu.0.forward": gelu, "Functional.relu.0.forward": unary(),
                         "Functional.relu.1.forward": unary()})
    result = pytester.runpytest_subprocess("d", *LEAN)
    result.assert_outcomes(passed=2, failed=1)
    statuses = [r["status"] for r in records(pytester)]
    (details,) = (pytester.path / "msprobe_results").glob("accuracy_checking_details_*.csv")
    cells = [row["Status"] for row in csv.DictReader(details.open(encoding="utf-8-sig"))]
    assert statuses.count("Warning") == 0 and cells.count("Warning") == 1  # what the two lines must tell apart

    def counted(values: list[str]) -> str:
        return ", ".join(f"{values.count(s)} {s}" for s in ("SKIP", "Warning", "error", "pass"))

    section = msprobe_section(result.stdout.str())
    assert section[0] == f"items (strict verdicts): {counted(statuses)}"
    assert section[1] == ("details CSV rows (msprobe's Layer-1 Status, original standard; one per output): "
                          f"{counted(cells)}")


def test_a_replayed_failure_prints_no_item_seed_a_drawn_one_does(pytester: pytest.Pytester) -> None:
    """The mint tensor example's silu fails replayed from its saved tensors: no seed made its inputs. A statistics
    dump's failure draws them from the item seed, and says so."""
    copy_dump(pytester, EXAMPLES / "mint_mlp_fp32_tensor" / "step0" / "rank0", "replayed")
    result = pytester.runpytest_subprocess("replayed", "-k", "silu and forward", *LEAN)
    result.assert_outcomes(failed=1)
    (record,) = [r for r in records(pytester) if r["status"] == "error"]
    assert record["data"] == "real"
    assert "item seed:" not in result.stdout.str()
    result.stdout.fnmatch_lines(["rerun: pytest *MintFunctional.silu.0.forward*"])
    shutil.rmtree(pytester.path / "msprobe_results")

    two_ranks_same_names(pytester)
    drawn = pytester.runpytest_subprocess("step0/rank1", *LEAN)
    drawn.assert_outcomes(passed=1, failed=1)
    (record,) = [r for r in records(pytester) if r["status"] == "error"]
    assert record["data"] == "random"
    drawn.stdout.fnmatch_lines([f"item seed: {record['seed']} (this call's inputs, *"])


def test_the_short_summary_keeps_the_reason_of_a_failure(pytester: pytest.Pytester,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """pytest's `FAILED <node id> - <first line>` is cut to the terminal's width: the first line is the verdict and
    the worst output's reason, not the API's name again or a traceback's first line."""
    monkeypatch.setenv("COLUMNS", "150")
    for name in ("CI", "BUILD_NUMBER"):  # on a CI pytest prints the whole message
        monkeypatch.delenv(name, raising=False)
    two_ranks_same_names(pytester)
    result = pytester.runpytest_subprocess("step0/rank1", *LEAN)
    result.assert_outcomes(passed=1, failed=1)
    (line,) = [x for x in result.stdout.lines if x.startswith("FAILED ")]
    assert line.startswith("FAILED step0/rank1/dump.json::Functional.gelu.0.forward - error: output.0: "), line
    assert len(line) <= 150


# --------------------------------------------------------------------------- the pure parts


def skipped(api: str, message: str, status: str = "SKIP") -> Record:
    return Record.from_dict({"api": api, "direction": "forward", "seed": 0, "status": status, "message": message})


def test_a_skip_reason_names_its_entry_once() -> None:
    from pytest_msprobe.reports.summary import skip_message, skip_reason

    entry = "Torch.foo.0.forward"
    assert skip_reason(skipped("Torch.foo.0", "Torch.foo: no such API"), entry) == f"{entry}: no such API"
    assert skip_reason(skipped("Torch.foo.0", "Torch.foo.0: x"), entry) == f"{entry}: x"
    assert skip_reason(skipped("Torch.foo.0", f"{entry}.input_args[0]: tensor file f is missing"), entry) == \
        f"{entry}.input_args[0]: tensor file f is missing"  # names the argument too: kept whole
    assert skip_reason(skipped("Torch.foo.0", "Torch.fo: another call's"), entry) == f"{entry}: Torch.fo: another call's"
    assert skip_reason(skipped("Mint.add.0", "MindSpore is not installed: pip"), "Mint.add.0.forward") == \
        "Mint.add.0.forward: MindSpore is not installed: pip"
    assert skip_reason(skipped("Torch.foo.0", "Torch.foo.0.forward: nothing to fuzz"), f"{entry}[fuzz]") == \
        f"{entry}[fuzz]: nothing to fuzz"
    # a skipped [fuzz] item's result is no record: its message alone reads the same
    assert skip_message("Torch.foo.0.forward: nothing to fuzz", f"{entry}[fuzz]") == f"{entry}[fuzz]: nothing to fuzz"
    assert skip_message(None, entry) == f"{entry}: skipped"


def test_skips_group_by_reason_most_first_with_the_first_apis() -> None:
    from pytest_msprobe.reports.summary import SKIP_NAMES_SHOWN, skip_lines

    recs = [skipped(f"Torch.f{i}.0", f"Torch.f{i}: no such API in torch 9.9 (dumped with another version?)")
            for i in range(SKIP_NAMES_SHOWN + 1)]
    recs += [skipped("Functional.gelu.0", "Functional.gelu.0.forward.input_args[0]: tensor file /a.pt is missing"),
             skipped("Distributed.all_reduce.0", "Distributed.all_reduce.0: needs a process group"),
             skipped("Distributed.all_reduce.1", "Distributed.all_reduce.1: needs a process group"),
             skipped("Functional.relu.0", "x", status="pass")]
    lines = skip_lines(recs)
    assert lines[0] == f"skipped {SKIP_NAMES_SHOWN + 4} item(s), by reason (pytest -rs names each item):"
    names = ", ".join(f"Torch.f{i}" for i in range(SKIP_NAMES_SHOWN))
    assert lines[1] == (f"  unknown API, not in the installed torch ({SKIP_NAMES_SHOWN + 1}: {names}, …): "
                        "dumped with another torch version? check with the one the model ran on")
    # a reason no group knows: its own group, without the call's name, so that its calls group; no advice made up
    assert lines[2] == "  needs a process group (2: Distributed.all_reduce)"
    assert lines[3].startswith("  missing tensor file (1: Functional.gelu): ")
    assert len(lines) == 4
    assert skip_lines([skipped("Torch.a.0", "x", status="pass")]) == []


def test_past_the_groups_shown_the_rest_is_counted() -> None:
    from pytest_msprobe.reports.summary import SKIP_GROUPS_SHOWN, skip_lines

    recs = [skipped(f"Torch.f{i}.0", f"reason number {i}") for i in range(SKIP_GROUPS_SHOWN + 2)]
    lines = skip_lines(recs)
    assert len(lines) == 1 + SKIP_GROUPS_SHOWN + 1
    assert lines[-1] == "  … 2 more in 2 other group(s) of reasons"
