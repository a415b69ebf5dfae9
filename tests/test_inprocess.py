"""The in-process check (`pytest_msprobe.checking`): a training step's calls are checked as it runs, beside it.

Planted bugs and correct accelerator-like kernels are armed around the step only (as the planted suite arms
them inside the device-call boundary): the step's calls run them, the bench in the worker processes never
does. Each test starts real worker processes; none depends on a host's BLAS rounding (every verdict below is
one the planted suite holds on every host).
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import pytest_msprobe
from evals.planted.mode import armed_mode
from evals.planted.registry import BY_NAME
from pytest_msprobe.inprocess.checker import CheckFailed
from pytest_msprobe.inprocess.dispatch import DispatchError, PtdbgDispatch
from pytest_msprobe.inprocess.queue import Budget
from pytest_msprobe.inprocess.selection import Selection

ROOT = Path(__file__).resolve().parent.parent


def _mlp() -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 16))
    model = model.to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
    return model, opt, torch.randn(32, 64, dtype=torch.bfloat16)


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> torch.Tensor:
    y = torch.nn.functional.softmax(model(x), dim=-1).float()
    loss = (y * y).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.detach()


@contextlib.contextmanager
def _armed(*names: str) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for name in names:
            stack.enter_context(armed_mode(BY_NAME[name], torch.bfloat16))
        yield


def _records(out: Path) -> list[dict[str, Any]]:
    (path,) = out.glob("msprobe_records_*.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_step_computes_the_same_bits_with_and_without_checking(tmp_path: Path) -> None:
    model, opt, x = _mlp()
    plain = [_step(model, opt, x) for _ in range(2)]
    want = [p.detach().clone() for p in model.parameters()]
    model, opt, x = _mlp()
    with pytest_msprobe.checking(out=tmp_path / "out", workers=1) as checker:
        checked = [_step(model, opt, x)]
        checker.step()
        checked.append(_step(model, opt, x))
    assert all(torch.equal(a, b) for a, b in zip(plain, checked))
    assert all(torch.equal(a, b) for a, b in zip(want, model.parameters()))
    records = _records(tmp_path / "out")
    assert checker.summary is not None and checker.summary.ok
    assert {r["status"] for r in records} <= {"pass", "SKIP"}
    names = [r["api"] for r in records]
    assert "Functional.linear.1" in names and "Aten.mm.0" in names  # forward by API, backward by aten op
    assert any(r["dump"].endswith("step1/rank0/dump.json") for r in records)  # step() numbers the next step


def test_a_planted_bug_is_caught_and_its_kept_calls_replay_red(tmp_path: Path, pytester: pytest.Pytester) -> None:
    model, opt, x = _mlp()
    with _armed("softmax-lownorm"), pytest.raises(CheckFailed) as failed:
        with pytest_msprobe.checking(out=tmp_path / "out", workers=1, quiet=True):
            _step(model, opt, x)
    summary = failed.value.summary
    bad = [r for r in summary.records if r.status == "error"]
    assert [r.api for r in bad] == ["Functional.softmax.0"]
    assert summary.replay is not None and "--msprobe-mode replay" in summary.replay
    dump = tmp_path / "out" / "dump" / "step0" / "rank0" / "dump.json"
    assert list(json.loads(dump.read_text())["data"]) == ["Functional.softmax.0.forward"]  # only the failing call
    assert not (tmp_path / "out" / "calls").exists()
    result = pytester.runpytest_subprocess(*summary.replay.split()[1:], "-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["FAILED *dump.json::Functional.softmax.0.forward*"])


def test_correct_accelerator_kernels_are_not_flagged(tmp_path: Path) -> None:
    model, opt, x = _mlp()
    with _armed("splitk-matmul", "softmax-lse", "cuda-fma-optimizer", "cuda-contractions"):
        with pytest_msprobe.checking(out=tmp_path / "out", workers=2, device="cuda", quiet=True) as checker:
            _step(model, opt, x)
    records = _records(tmp_path / "out")
    assert [r["api"] for r in records if r["status"] == "error"] == []
    assert checker.summary is not None and checker.summary.counts["pass"] > 30
    assert all(r.get("contract") in (None, "cuda") for r in records)


def test_an_exception_in_the_step_leaves_what_was_checked(tmp_path: Path) -> None:
    x = torch.randn(64, 64)
    with pytest.raises(RuntimeError, match="the step's own"):
        with pytest_msprobe.checking(out=tmp_path / "out", workers=1, quiet=True):
            torch.matmul(x, x)
            torch.exp(x)
            raise RuntimeError("the step's own error")
    records = _records(tmp_path / "out")
    assert [r["api"] for r in records] == ["Torch.matmul.0", "Torch.exp.0"]
    assert {r["status"] for r in records} == {"pass"}
    assert list(tmp_path.joinpath("out").glob("accuracy_checking_details_*.csv"))


def test_a_full_queue_counts_calls_as_not_checked_when_the_step_may_not_wait(tmp_path: Path) -> None:
    x = torch.randn(256, 256)  # 256 KiB per tensor: a call holds 512 KiB of a 600 KiB queue
    with pytest.raises(CheckFailed, match="not checked"):
        with pytest_msprobe.checking(out=tmp_path / "out", workers=1, queue_bytes=600 << 10, when_full="skip",
                                     quiet=True):
            for _ in range(20):
                torch.exp(x)
    records = _records(tmp_path / "out")
    assert len(records) == 20  # every call has its record: checked, or not checked and saying why
    unchecked = [r for r in records if r.get("not_checked")]
    assert unchecked and all("queue was full" in r["message"] and r["status"] == "SKIP" for r in unchecked)
    assert {r["status"] for r in records if not r.get("not_checked")} == {"pass"}


def test_a_step_that_may_wait_has_every_call_checked_within_the_bound(tmp_path: Path) -> None:
    x = torch.randn(256, 256)
    with pytest_msprobe.checking(out=tmp_path / "out", workers=1, queue_bytes=600 << 10, quiet=True) as checker:
        for _ in range(12):
            torch.exp(x)
    assert checker.summary is not None and checker.summary.ok and checker.summary.counts["pass"] == 12
    assert checker.budget.peak <= 600 << 10


def test_a_worker_killed_mid_check_fails_only_its_call(tmp_path: Path) -> None:
    a, b = torch.randn(512, 4096, dtype=torch.bfloat16), torch.randn(4096, 4096, dtype=torch.bfloat16)
    killed: list[int] = []

    def kill_a_busy_worker(checker: Any) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not killed:
            pool = checker.feeder.pool
            busy = [w for w in (pool.workers if pool is not None else []) if w.task is not None and w.ready]
            if busy:
                killed.append(busy[0].process.pid)
                os.kill(busy[0].process.pid, signal.SIGKILL)
            time.sleep(0.01)

    with pytest.raises(CheckFailed, match="1 not checked"):
        with pytest_msprobe.checking(out=tmp_path / "out", workers=1, quiet=True) as checker:
            killer = threading.Thread(target=kill_a_busy_worker, args=(checker,))
            killer.start()
            torch.matmul(a, b)
            killer.join()
            torch.exp(a)  # checked by the fresh worker
    records = _records(tmp_path / "out")
    assert killed
    assert [(r["api"], bool(r.get("not_checked"))) for r in records] == [("Torch.matmul.0", True),
                                                                         ("Torch.exp.0", False)]
    assert "SIGKILL" in records[0]["message"] and records[1]["status"] == "pass"


def test_sample_and_apis_choose_the_calls(tmp_path: Path) -> None:
    x = torch.randn(8, 8)
    with pytest_msprobe.checking(out=tmp_path / "out", workers=1, sample=3, apis=["exp", "Torch.mul.1"],
                                 backward=False, quiet=True) as checker:
        for _ in range(7):
            torch.exp(x)
            torch.mul(x, x)
            torch.sin(x)
    assert [r["api"] for r in _records(tmp_path / "out")] == ["Torch.exp.0", "Torch.exp.3", "Torch.exp.6"]
    assert checker.sampling().calls == 14  # exp and mul were seen; sin is not selected at all
    assert "(1 in 3 per API)" in (checker.summary.line if checker.summary else "")


def test_an_in_place_call_the_sample_leaves_out_is_not_copied(tmp_path: Path) -> None:
    x = torch.zeros(4, 4)
    checker = pytest_msprobe.checking(out=tmp_path / "out", workers=1, sample=4, backward=False, quiet=True)
    copied: list[tuple[int, ...]] = []
    own_copy = checker.capture.copy
    checker.capture.copy = lambda t: copied.append(tuple(t.shape)) or own_copy(t)
    with checker:
        for _ in range(8):
            x.add_(1.0)
    assert [r["api"] for r in _records(tmp_path / "out")] == ["Tensor.add_.0", "Tensor.add_.4"]
    assert copied == [(4, 4), (4, 4)]  # its input before the call, for the two checked calls only
    assert torch.equal(x, torch.full((4, 4), 8.0))


def test_selection_reads_msprobe_list_entries() -> None:
    s = Selection(["Functional.linear.2.forward", "relu"])
    assert s.wants_api("Functional.linear") and s.wants_call("Functional.linear.2")
    assert not s.wants_call("Functional.linear.1")
    assert s.wants_call("Functional.relu.7") and s.wants_call("Tensor.relu_.0") and not s.wants_api("Torch.exp")
    assert Selection(None).wants_call("anything.0")
    with pytest.raises(ValueError, match="apis="):
        Selection([""])


def test_the_budget_holds_its_bound_unless_one_call_is_larger() -> None:
    budget = Budget(100)
    assert budget.reserve(60, wait=False) and not budget.reserve(60, wait=False)
    budget.release(60)
    assert budget.reserve(250, wait=False)  # alone, a call larger than the bound still goes
    assert not budget.reserve(1, wait=False)
    budget.release(250)
    assert budget.held == 0 and budget.peak == 250


def test_bad_options_get_one_line() -> None:
    with pytest.raises(ValueError, match=r"checking\(\): sample=0: a positive whole number; when_full='drop'"):
        pytest_msprobe.checking(sample=0, when_full="drop")
    with pytest.raises(ValueError, match="level='ops'"):
        pytest_msprobe.checking(level="ops")


def test_ptdbg_dispatch_takes_msprobe_arguments(tmp_path: Path) -> None:
    with pytest.raises(DispatchError, match="dump_path is required"):
        PtdbgDispatch(dump_mode="auto")
    with pytest.raises(DispatchError, match="no such folder"):
        PtdbgDispatch(dump_mode="auto", dump_path=str(tmp_path / "absent"))
    with pytest.raises(DispatchError, match="dump_mode='some'"):
        PtdbgDispatch(dump_mode="some", dump_path=str(tmp_path))
    x = torch.randn(16, 16)
    with PtdbgDispatch(dump_mode="list", api_list=["mm", "not_an_op"], dump_path=str(tmp_path), tag="t",
                       process_num=1):
        torch.mm(x, x).exp()
    (folder,) = tmp_path.glob("msprobe_t_rank0_*")
    records = _records(folder)
    assert [r["api"] for r in records] == ["Aten.mm.0", "Aten.exp.0"]
    kept = json.loads((folder / "dump" / "step0" / "rank0" / "dump.json").read_text())["data"]
    assert list(kept) == ["Aten.mm.0.forward"]  # api_list: what stays on disk; every op is checked


def test_run_checks_a_training_script_without_a_main_guard(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import sys, torch
        if sys.argv[1] == "bug":  # the device's silu kernel rounds its sigmoid to bf16 first: the planted bug
            lib = torch.library.Library("aten", "IMPL")
            lib.impl("silu", lambda x: x * torch.sigmoid(x), "CPU")
        torch.manual_seed(0)
        torch.nn.functional.silu(torch.randn(64, 256, dtype=torch.bfloat16))
        print("trained")
    """))
    runs = {}
    for arg in ("bug", "fine"):
        runs[arg] = subprocess.run([sys.executable, "-m", "pytest_msprobe", "run", "--workers", "1", "--out",
                                    str(tmp_path / arg), str(script), arg],
                                   capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert runs["bug"].returncode == 1, runs["bug"].stderr
    assert runs["fine"].returncode == 0, runs["fine"].stderr
    for run in runs.values():
        assert run.stdout.count("trained") == 1  # the workers did not run the script again
    assert "1 error" in runs["bug"].stderr and "FAILED" in runs["bug"].stderr


def test_operators_are_named_as_msprobe_names_them_and_restored_after() -> None:
    from pytest_msprobe.online.capture import Capture

    seen: list[tuple[str, Any]] = []
    a, b = torch.ones(3), torch.full((3,), 2.0)
    before = {name: torch.Tensor.__dict__.get(name) for name in ("__add__", "__iadd__", "__rpow__")}
    with Capture(lambda api, args, kwargs, out: seen.append((api, args))):
        _ = a + b, a / b, a == b, 10 ** a, a.add(b), torch.add(a, b)
        a += b
    assert [api for api, _ in seen] == ["Tensor.__add__", "Tensor.__truediv__", "Tensor.__eq__", "Tensor.__rpow__",
                                        "Tensor.add", "Torch.add", "Tensor.__iadd__"]
    assert torch.equal(seen[-1][1][0], torch.ones(3))  # an in-place operator's input as it was before the call
    assert {name: torch.Tensor.__dict__.get(name) for name in before} == before


def test_a_passing_call_reaches_its_worker_through_shared_memory_not_files(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_msprobe.online import spool

    saved: list[Any] = []
    monkeypatch.setattr(spool.torch, "save", lambda *a, **k: saved.append(a[1]))
    x = torch.randn(256, 256)  # 256 KiB: copied into shared memory
    with pytest_msprobe.checking(out=tmp_path / "out", workers=1, quiet=True) as checker:
        torch.exp(x)
        torch.sigmoid(x[:4, :4])  # a small one (after x[:4, :4] itself): ordinary host copies
    assert checker.summary is not None and checker.summary.counts["pass"] == 3
    assert saved == []


def test_a_held_tensor_stands_for_its_file(tmp_path: Path) -> None:
    from pytest_msprobe.online import spool
    from pytest_msprobe.online.checking import check_call, online_specs
    from pytest_msprobe.online.safeload import ApiData
    from pytest_msprobe.settings import CheckOptions

    x = torch.randn(8, 8)
    held: dict[str, Any] = {}
    dump_json, _ = spool.write(ApiData("Torch.exp.0", [x], {}, torch.exp(x)), tmp_path / "one", held=held)
    assert not (tmp_path / "one" / "dump_tensor_data").exists() and len(held) == 2
    options, specs = CheckOptions(device="cpu", mode="replay"), online_specs(None)
    record = check_call(dump_json, "Torch.exp.0.forward", options, specs, held)
    assert record.status == "pass" and record.data == "real"
    wrong = {name: torch.zeros(3) for name in held}
    record = check_call(dump_json, "Torch.exp.0.forward", options, specs, wrong)
    assert record.status == "SKIP" and "the tensor given for it has shape [3]" in record.message


def test_torch_npu_functions_are_named_npu_when_the_step_imported_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    from pytest_msprobe.online.capture import Capture

    def npu_scale(x: torch.Tensor) -> torch.Tensor:  # as torch_npu's bindings do: modes see the call
        if torch.overrides.has_torch_function((x,)):
            return torch.overrides.handle_torch_function(npu_scale, (x,), x)
        return x * 2

    fake = types.ModuleType("torch_npu")
    fake.npu_scale = npu_scale  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch_npu", fake)
    seen: list[str] = []
    x = torch.ones(2)
    with Capture(lambda api, args, kwargs, out: seen.append(api), backward=False):
        npu_scale(x)
    assert seen == ["NPU.npu_scale"]


def test_the_example_loop_passes_and_its_bug_fails_as_the_page_shows(tmp_path: Path) -> None:
    from tests.doc_samples import missing_from

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    runs = {}
    for arg in ("fine", "bug"):
        (tmp_path / arg).mkdir()
        flags = ["--bug"] if arg == "bug" else []
        runs[arg] = subprocess.run([sys.executable, str(ROOT / "examples/in_training/train.py"), *flags],
                                   capture_output=True, text=True, cwd=tmp_path / arg, env=env, timeout=600)
    assert runs["fine"].returncode == 0 and " 0 not checked" in runs["fine"].stderr, runs["fine"].stderr[-2000:]
    assert runs["bug"].returncode == 1
    shown = missing_from(runs["bug"].stderr, "docs/how-to/check-a-training-step.md", 0)
    assert shown is None, runs["bug"].stderr[-2000:]
    replay = subprocess.run([sys.executable, "-m", "pytest", "msprobe_inprocess/dump", "--msprobe-mode", "replay",
                             "-p", "no:cacheprovider", "-q"], capture_output=True, text=True, cwd=tmp_path / "bug",
                            env=env, timeout=600)
    assert replay.returncode == 1 and "2 failed" in replay.stdout, replay.stdout[-2000:]


def test_as_a_decorator_each_call_of_the_function_is_one_checked_block(tmp_path: Path) -> None:
    @pytest_msprobe.checking(out=tmp_path / "out", workers=1, quiet=True)
    def train_step(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x)

    x = torch.randn(16, 16)
    assert torch.equal(train_step(x), torch.tanh(x))
    assert [r["api"] for r in _records(tmp_path / "out")] == ["Torch.tanh.0"]


def test_the_training_process_does_not_load_the_checks_compiled_code(tmp_path: Path) -> None:
    """The workers compile and run the checks; the step's process only captures, so numba (some 60 MiB of it)
    stays out of it."""
    code = textwrap.dedent("""
        import sys, torch, pytest_msprobe
        with pytest_msprobe.checking(out=sys.argv[1], workers=1, quiet=True):
            torch.nn.functional.silu(torch.randn(64, 64))
        print(sorted(m for m in ("numba", "llvmlite", "pytest_msprobe.check", "pytest") if m in sys.modules))
    """)
    run = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=300,
                         cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"
