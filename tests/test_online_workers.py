"""ini `msprobe_online_workers` N: the online session checks in N worker processes and reports in arrival order.

End to end with our own sender (tests/test_online_session.py's client, a bug planted in its gelu) and with a
raw-socket client: the records of 2 workers equal those of one process; the per-rank summary still adds up
(checked, skipped with reasons, refused); a worker that segfaults fails only its call and the session goes
on; the options are checked.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.online_helpers import Client, free_port
from tests.test_online_session import ROOT, SAFETY, _client, _env, _sent

pytest.importorskip("torch")

VOLATILE = ("timings", "rerun", "item_id")  # when it ran, and the paths of each run's own --msprobe-out


def _records(folder: Path, drop: tuple[str, ...] = VOLATILE) -> dict[str, dict[str, Any]]:
    lines = next(folder.glob("msprobe_records_*.jsonl")).read_text().splitlines()
    out = {}
    for line in lines:
        record = json.loads(line)
        out[record["nodeid"]] = {k: v for k, v in record.items() if k not in drop}
    return out


def _failed(result: pytest.RunResult) -> list[str]:
    return sorted(r.nodeid for r in result.reprec.getreports("pytest_runtest_logreport")  # type: ignore[attr-defined]
                  if r.when == "call" and r.failed)


def test_two_workers_give_the_records_of_one_process(pytester: pytest.Pytester) -> None:
    runs = {}
    for workers in ("1", "2"):
        folder = pytester.path / f"shared{workers}"
        client = _client(pytester, f"nfs://{folder}", "--bug")
        result = pytester.runpytest_inprocess("--msprobe-online", f"nfs://{folder}", "-p", "no:cacheprovider",
                                              *SAFETY, "-o", f"msprobe_online_workers={workers}",
                                              "--msprobe-out", f"out{workers}")
        sent = _sent(client)
        assert _failed(result) == ["online/rank0/step0::Functional.gelu.0.forward",
                                   "online/rank0/step1::Functional.gelu.0.forward"]
        result.assert_outcomes(passed=sent - 2, failed=2)
        result.stdout.fnmatch_lines([f"msprobe online: rank0: received {sent} = checked {sent} + skipped 0 + "
                                     "refused 0"])
        runs[workers] = _records(pytester.path / f"out{workers}")
        order = [r.nodeid for r in result.reprec.getreports("pytest_runtest_logreport")  # type: ignore[attr-defined]
                 if r.when == "call"]
        for step in {n.split("::")[0] for n in order}:  # each step's calls in arrival order (two steps may interleave:
            # a call's file is taken once it has stayed the same for 0.2 s, so step1's first may come before step0's last)
            seq = [runs[workers][n]["order"] for n in order if n.split("::")[0] == step]
            assert seq == sorted(seq), (step, seq)
    result.stdout.fnmatch_lines(["*checked in 2 worker processes*"])
    assert len(runs["1"]) == sent
    differ = {n: {k: (v, runs["2"].get(n, {}).get(k)) for k, v in r.items() if runs["2"].get(n, {}).get(k) != v}
              for n, r in runs["1"].items() if runs["2"].get(n) != r}
    assert not differ and runs["1"].keys() == runs["2"].keys(), differ
    assert runs["2"]["online/rank0/step1::Functional.gelu.0.forward"]["status"] == "error"


_RAW_CLIENT = '''
import os, socket, sys
sys.path.insert(0, {root!r})
import torch
from pytest_msprobe.online import protocol, safeload
from pytest_msprobe.online.sender import encode
class Evil:
    def __reduce__(self):
        return os.system, ("touch pwned",)
x = torch.linspace(-2, 2, 64)
calls = [safeload.ApiData("Functional.relu.0", (x,), {}, torch.relu(x), 0, 0),
         safeload.ApiData("Tensor.stride.0", (x,), {}, (1,), 0, 0),
         safeload.ApiData("Functional.relu.1", (Evil(),), {}, None, 0, 0),
         safeload.ApiData("Functional.gelu.0", (x,), {}, torch.nn.functional.gelu(x), 0, 1),
         safeload.ApiData("Functional.gelu.1", (x,), {}, torch.nn.functional.gelu(x) * 1.01, 0, 1)]
with socket.create_connection(("127.0.0.1", int(sys.argv[1]))) as s:
    for i, call in enumerate(calls):
        s.sendall(protocol.frame(encode(call), i, call.rank))
        print("ACK", protocol.parse_ack(s.recv(29))[0].decode())
    s.sendall(protocol.frame(protocol.STOP, len(calls)))
    print("ACK", protocol.parse_ack(s.recv(29))[0].decode())
'''.replace("{root!r}", repr(str(ROOT)))


def test_summary_adds_up_per_rank_with_workers(pytester: pytest.Pytester) -> None:
    port = free_port()
    client = Client([sys.executable, "-c", _RAW_CLIENT, str(port)], port, pytester.path, _env())
    client.start()
    result = pytester.runpytest_inprocess("--msprobe-online", f"tcp://127.0.0.1:{port}", "-p", "no:cacheprovider",
                                          *SAFETY, "-o", "msprobe_online_workers=2")
    client.join(120)
    assert client.output().count("ACK OK___") == 5, client.output()
    result.stdout.fnmatch_lines([
        "msprobe online: rank0: received 3 = checked 1 + skipped 1 + refused 1",
        "*skipped 1: Tensor.stride: a metadata call*",
        "*refused 1: UnpicklingError:*posix.system*",
        "msprobe online: rank1: received 2 = checked 2 + skipped 0 + refused 0"])
    assert _failed(result) == ["online/rank1/step0::Functional.gelu.1.forward"]
    assert result.ret == 1
    assert not (pytester.path / "pwned").exists()


_CRASH = '''
import multiprocessing, faulthandler
import torch

_gelu = torch.nn.functional.gelu

def gelu(*args, **kwargs):
    """A kernel that segfaults, in the online session's worker processes only."""
    if multiprocessing.current_process().name.startswith("msprobe-online-worker"):
        faulthandler._sigsegv()
    return _gelu(*args, **kwargs)

torch.nn.functional.gelu = gelu
'''


def test_a_crashing_worker_fails_its_call_and_the_session_goes_on(pytester: pytest.Pytester,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    plant = pytester.path / "plant"
    plant.mkdir()
    (plant / "sitecustomize.py").write_text(_CRASH)
    folder = pytester.path / "shared"
    client = _client(pytester, f"nfs://{folder}")  # no bug, and no plant: the client's own gelu is fine
    monkeypatch.setenv("PYTHONPATH", f"{plant}:{ROOT}")
    result = pytester.runpytest_subprocess("--msprobe-online", f"nfs://{folder}", "-p", "no:cacheprovider",
                                           *SAFETY, "-o", "msprobe_online_workers=2")
    sent = _sent(client)
    result.assert_outcomes(passed=sent - 2, failed=2)
    result.stdout.fnmatch_lines([
        "*worker crashed while running Functional.gelu.0.forward (online worker * died: signal SIGSEGV)*",
        f"msprobe online: rank0: received {sent} = checked {sent} + skipped 0 + refused 0"])
    records = _records(pytester.path / "msprobe_results")
    gelu = records["online/rank0/step1::Functional.gelu.0.forward"]
    assert gelu["status"] == "error" and gelu["crashed"] is True
    assert sum(r["status"] == "pass" for r in records.values()) == sent - 2


def test_bad_worker_counts_are_usage_errors(pytester: pytest.Pytester) -> None:
    for value in ("0", "two"):
        result = pytester.runpytest_inprocess("--msprobe-online", "tcp://127.0.0.1:0", "-o",
                                              f"msprobe_online_workers={value}", "-p", "no:cacheprovider", *SAFETY)
        result.stderr.fnmatch_lines([f"*ini msprobe_online_workers: '{value}' is not a positive integer*"])
    result = pytester.runpytest_inprocess("--msprobe-online", "tcp://127.0.0.1:0", "-n", "2", "-p",
                                          "no:cacheprovider", *SAFETY)
    result.stderr.fnmatch_lines(["*leave -n out (-o msprobe_online_workers=N checks them in N processes)*"])


@pytest.mark.parametrize("workers", ["1", "2"])
def test_reports_of_a_failing_online_call(pytester: pytest.Pytester, workers: str) -> None:
    """pytest-html's report, --msprobe-save-error-data and --msprobe-repro for the planted gelu bug."""
    pytest.importorskip("pytest_html")
    folder = pytester.path / "shared"
    client = _client(pytester, f"nfs://{folder}", "--bug")
    result = pytester.runpytest_inprocess("--msprobe-online", f"nfs://{folder}", "-p", "no:cacheprovider", *SAFETY,
                                          "-o", f"msprobe_online_workers={workers}", "--html", "report.html",
                                          "--msprobe-save-error-data", "errors", "--msprobe-repro", "repro",
                                          "--msprobe-html", "msprobe.html")
    sent = _sent(client)
    result.assert_outcomes(passed=sent - 2, failed=2)
    gelus = ["online/rank0/step0::Functional.gelu.0.forward", "online/rank0/step1::Functional.gelu.0.forward"]
    assert _failed(result) == gelus
    records = _records(pytester.path / "msprobe_results", drop=())
    import torch

    from pytest_msprobe.dump.reader import load_dump

    for nodeid in gelus:  # the saved error data holds this call's inputs and outputs, as the client sent them
        record = records[nodeid]
        saved = pytester.path / "errors" / record["error_data"]["dir"] / "dump.json"
        doc = json.loads(saved.read_text())
        sent_call = load_dump(Path(record["item_id"].split("::")[0]))  # the kept one-call dump
        entries = {k: v for k, v in doc["data"].items() if k.startswith("Functional.gelu.0")}
        assert len(entries) == 1, (nodeid, list(doc["data"]))
        entry = next(iter(entries.values()))
        tensors = saved.parent / "dump_tensor_data"
        original = json.loads(Path(record["item_id"].split("::")[0]).read_text())["data"]["Functional.gelu.0.forward"]
        original_dir = Path(sent_call.path).parent / "dump_tensor_data"
        for key in ("input_args", "output"):
            mine, theirs = entry[key][0], original[key][0]
            assert torch.equal(torch.load(tensors / mine["data_name"]), torch.load(original_dir / theirs["data_name"]))
        assert saved.parent.relative_to(pytester.path / "errors").as_posix() == nodeid.split("::")[0]
    replay = pytester.runpytest_inprocess("errors", "--msprobe-mode", "replay", "-p", "no:cacheprovider",
                                          "--msprobe-out", "replayed")
    replay.assert_outcomes(failed=2)  # the saved data fails the same way offline
    repro = [Path(records[n]["repro"]) for n in gelus]
    assert len(set(repro)) == 2
    for script in repro:  # the script fails the same way
        run = pytester.run(sys.executable, str(script))
        assert run.ret != 0 and "Functional.gelu.0" in run.stdout.str() + run.stderr.str(), run.stdout.str()
        assert "error" in run.stdout.str() + run.stderr.str()
    html = (pytester.path / "report.html").read_text()
    for nodeid in gelus:  # pytest-html's row: the call and its failure
        assert nodeid in html
    assert "Functional.gelu.0.forward: error" in html and "gross error" in html
    own = (pytester.path / "msprobe.html").read_text()  # --msprobe-html's page lists both, with their plots
    assert all(nodeid in own for nodeid in gelus) and own.count("<svg") >= 2


_FLOOD = '''
import socket, sys, threading
sys.path.insert(0, {root!r})
import torch
from pytest_msprobe.online import protocol, safeload
from pytest_msprobe.online.sender import encode
torch.manual_seed(0)
x, w = torch.randn(64, 512), torch.randn(512, 512)
factor = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0  # 1.01: a device whose linear is off by 1 %
body = encode(safeload.ApiData("Functional.linear.0", (x, w), {}, torch.nn.functional.linear(x, w) * factor, 0, 0))
acks = []
with socket.create_connection(("127.0.0.1", int(sys.argv[1]))) as s:
    def read():
        buf = b""
        while acks.count("OK___") < 40:
            chunk = s.recv(4096)
            if not chunk:
                return
            buf += chunk
            while len(buf) >= 29:
                acks.append(buf[:5].decode())
                buf = buf[29:]
    reader = threading.Thread(target=read)
    reader.start()
    for i in range(40):  # back to back, without waiting for the acks
        s.sendall(protocol.frame(body.replace(b"Functional.linear.0", f"Functional.linear.{i % 10}".encode()), i,
                                 step=i // 10))
    reader.join(300)
    s.sendall(protocol.frame(protocol.STOP, 40))
    print("ACKS", " ".join(acks))
'''.replace("{root!r}", repr(str(ROOT)))


def test_a_full_queue_still_gets_busy_with_workers(pytester: pytest.Pytester) -> None:
    port = free_port()
    client = Client([sys.executable, "-c", _FLOOD, str(port)], port, pytester.path, _env())
    client.start()
    result = pytester.runpytest_inprocess("--msprobe-online", f"tcp://127.0.0.1:{port}", "-p", "no:cacheprovider",
                                          *SAFETY, "-o", "msprobe_online_workers=2", "-o", "msprobe_online_queue=2")
    client.join(300)
    acks = client.output().split("ACKS", 1)[1].split()
    assert acks.count("OK___") == 40 and acks.count("BUSY_") >= 1, client.output()
    result.assert_outcomes(passed=40)
    result.stdout.fnmatch_lines(["msprobe online: rank0: received 40 = checked 40 + skipped 0 + refused 0"])


def test_pool_answers_a_check_that_raises_and_keeps_serving(tmp_path: Path) -> None:
    """A check that raises in a worker comes back as its traceback; the worker takes the next call."""
    from pytest_msprobe.online.checking import CheckerPool
    from pytest_msprobe.settings import CheckOptions

    pool = CheckerPool(1, CheckOptions(mode="replay"))
    try:
        pool.submit("missing", tmp_path / "nothing" / "dump.json", "Functional.relu.0.forward")
        pool.submit("again", tmp_path / "nothing" / "dump.json", "Functional.relu.1.forward")
        answers: dict[str, tuple[str, Any]] = {}
        for _ in range(600):
            answers.update(pool.results(0.5))
            if len(answers) == 2:
                break
        assert set(answers) == {"missing", "again"}
        assert all(kind == "raised" and "dump.json" in text for kind, text in answers.values()), answers
        assert pool.crashed == 0 and pool.started == 1
    finally:
        pool.close()
    assert not any(w.process.is_alive() for w in pool.workers)


def test_stopping_at_the_first_failure_still_accounts_for_every_call(pytester: pytest.Pytester) -> None:
    """-x with workers: the calls already out to the workers are counted as skipped, with the reason."""
    import re

    port = free_port()
    client = Client([sys.executable, "-c", _FLOOD, str(port), "1.01"], port, pytester.path, _env())
    client.start()
    result = pytester.runpytest_inprocess("--msprobe-online", f"tcp://127.0.0.1:{port}", "-p", "no:cacheprovider",
                                          *SAFETY, "-o", "msprobe_online_workers=2", "-x")
    client.join(300)
    result.assert_outcomes(failed=1)
    line = next(ln for ln in result.outlines if ln.startswith("msprobe online: rank0: received"))
    received, checked, skipped, refused = map(int, re.findall(r"\d+", line.split("rank0:", 1)[1]))
    assert received == checked + skipped + refused and checked == 1 and refused == 0, line
    if skipped:
        result.stdout.fnmatch_lines([f"*skipped {skipped}: not reported: the session stopped early (-x*"])


def test_workers_are_pinned_to_the_devices_in_turn(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """With --msprobe-devices, worker k runs on device k mod n alone, indexing into the variable the caller set."""
    from pytest_msprobe.session.devices import child_slots

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6")
    monkeypatch.delenv("ASCEND_RT_VISIBLE_DEVICES", raising=False)
    config = pytester.parseconfigure("--msprobe-devices", "1", "2")
    slots = child_slots(config, 3)
    assert slots is not None
    assert [env["CUDA_VISIBLE_DEVICES"] for env, _ in slots] == ["5", "6", "5"]
    assert [env["ASCEND_RT_VISIBLE_DEVICES"] for env, _ in slots] == ["1", "2", "1"]
    assert all(index == 0 for _, index in slots)
    assert child_slots(pytester.parseconfigure(), 2) is None  # no devices given: the session's own device


def test_workers_that_cannot_start_end_the_session_in_one_line(pytester: pytest.Pytester,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    plant = pytester.path / "plant"
    plant.mkdir()
    (plant / "sitecustomize.py").write_text("import os, sys\nif '--multiprocessing-fork' in sys.argv:\n"
                                            "    os._exit(3)  # every spawned worker dies as it starts\n")
    monkeypatch.setenv("PYTHONPATH", f"{plant}:{ROOT}")
    result = pytester.runpytest_subprocess("--msprobe-online", "tcp://127.0.0.1:0", "-p", "no:cacheprovider",
                                           *SAFETY, "-o", "msprobe_online_workers=2")
    result.stdout.fnmatch_lines(["*Interrupted: msprobe online: the online workers die as they start (exit code 3);"
                                 " -o msprobe_online_workers=1 checks in the session's own process*"])
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.INTERRUPTED
