"""The online session with mindstudio-probe 8.1.2's own NPU-side client, which runs on CPU in a virtualenv of its
own (it needs twisted, pyOpenSSL==24.2.1, cryptography<44, service_identity==24.1.0; .ci/run builds it):

    MSPROBE81_PYTHON=.ci/venv-msprobe81/bin/python pytest tests/test_online_msprobe.py

Over TCP, TLS and nfs_path: every call the client sent is accounted for (its log names each call it sends or
could not save); a gelu bug planted in the client's model fails exactly the gelu call; the online verdicts equal
those of an offline replay of the same step recorded by the same client as an L1 tensor dump. Two ranks at once
(two client processes, gloo on CPU) each stream a Llama-style step of more than 400 calls to one session, and
each rank's received count equals the calls its client wrote to its connection, counted inside the client.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.doc_samples import missing_from
from tests.online_helpers import Client, free_port, make_certs

# relative to where pytest starts (the repository root), as the docstring runs it; the client runs elsewhere
PYTHON = os.path.abspath(os.environ["MSPROBE81_PYTHON"]) if os.environ.get("MSPROBE81_PYTHON") else ""
pytestmark = pytest.mark.skipif(not PYTHON or not Path(PYTHON).is_file(),
                                reason="set MSPROBE81_PYTHON to the python of a virtualenv with mindstudio-probe==8.1.2 "
                                       "and its online client's packages (.ci/run builds .ci/venv-msprobe81)")
SCRIPT = Path(__file__).parent / "data" / "online" / "msprobe81_client.py"
ROOT = Path(__file__).resolve().parent.parent
SAFETY = ("-o", "msprobe_online_idle=150", "-p", "no:cacheprovider")
EXAMPLE = ROOT / "examples" / "online_client"


def _client(pytester: pytest.Pytester, *args: str, port: int | None = None,
            env: dict[str, str] | None = None) -> Client:
    client = Client([PYTHON, str(SCRIPT), *args], port, pytester.path, {**os.environ, **(env or {})}, timeout=400)
    client.start()
    return client


def _sent(client: Client) -> list[str]:
    """The calls the client put on the wire: each one it logged as dumped, less those it could not save."""
    client.join(450)
    out = client.output()
    assert "CLIENT DONE" in out, out[-3000:]
    dumped = re.findall(r"tools is dumping api: (\S+), rank", out)
    unsaved = set(re.findall(r"\] (\S+) can not be saved, skip", out))
    return [name for name in dumped if name not in unsaved]


def _records(folder: Path) -> dict[str, dict[str, Any]]:
    path = next(folder.glob("msprobe_records_*.jsonl"))
    return {r["api"]: r for r in map(json.loads, path.read_text().splitlines()) if r.get("direction") == "forward"}


def test_tcp_planted_bug_fails_exactly_gelu_and_matches_offline_replay(pytester: pytest.Pytester) -> None:
    port = free_port()
    client = _client(pytester, "--mode", "tcp", "--port", str(port), "--bug", port=port)
    online = pytester.runpytest_inprocess("--msprobe-online", f"tcp://127.0.0.1:{port}", "--msprobe-out", "online",
                                          *SAFETY)
    sent = _sent(client)
    assert len(sent) > 80  # forward, aten backward, Tensor.to/stride, the optimizer's add_
    online.stdout.fnmatch_lines([f"msprobe online: rank0: received {len(sent)} = checked * + skipped * + refused 0"])
    failed = [r.nodeid for r in online.reprec.getreports("pytest_runtest_logreport")  # type: ignore[attr-defined]
              if r.when == "call" and r.failed]
    assert failed == ["online/rank0/step0::Functional.gelu.0.forward"]
    assert online.ret == 1
    checked = _records(pytester.path / "online")
    assert {n for n in checked if n.startswith("Aten.")} >= {"Aten.mm.0", "Aten.gelu_backward.0", "Aten.mse_loss_backward.0"}
    assert all(checked[n]["status"] == "pass" for n in checked if n.startswith("Aten."))

    # the same step recorded by the same client as an L1 tensor dump, replayed offline
    dump = _client(pytester, "--mode", "dump", "--dump", "dump_path", "--bug")
    dump.join(300)
    assert "CLIENT DONE" in dump.output(), dump.output()[-3000:]
    offline = pytester.runpytest_inprocess(str(pytester.path / "dump_path" / "step0" / "rank" / "dump.json"),
                                           "--msprobe-mode", "replay", "--msprobe-out", "offline", "-p",
                                           "no:cacheprovider")
    replayed = _records(pytester.path / "offline")
    common = [n for n in replayed if n in checked and checked[n]["status"] != "SKIP"]
    assert {"Functional.linear.0", "Functional.gelu.0", "Functional.linear.1", "Functional.mse_loss.0"} <= set(common)
    for name in common:
        a, b = checked[name], replayed[name]
        assert (a["status"], a["message"]) == (b["status"], b["message"]), name
        assert [(o["verdict"], o["metrics"]) for o in a["outputs"]] == \
            [(o["verdict"], o["metrics"]) for o in b["outputs"]], name
    assert offline.ret == 1


def test_nfs_path_every_call_accounted(pytester: pytest.Pytester) -> None:
    folder = pytester.path / "shared"
    folder.mkdir()
    client = _client(pytester, "--mode", "nfs", "--nfs", str(folder))
    result = pytester.runpytest_inprocess("--msprobe-online", f"nfs://{folder}", *SAFETY)
    sent = _sent(client)
    result.stdout.fnmatch_lines([f"msprobe online: rank0: received {len(sent)} = *+ refused 0"])
    assert result.ret == 0 and not any(folder.iterdir())


@pytest.mark.skipif(shutil.which("openssl") is None, reason="the openssl command line makes the test certificates")
def test_tls_every_call_accounted(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    certs = pytester.path / "tls"
    make_certs(certs, server_passphrase="server-pass")
    monkeypatch.setenv("MSPROBE_TLS_PASSPHRASE", "server-pass")
    port = free_port()
    client = _client(pytester, "--mode", "tls", "--port", str(port), "--tls", str(certs), port=port)
    result = pytester.runpytest_inprocess("--msprobe-online", f"tls://127.0.0.1:{port}", "-o",
                                          f"msprobe_online_tls={certs}", *SAFETY)
    sent = _sent(client)
    result.stdout.fnmatch_lines([f"msprobe online: rank0: received {len(sent)} = *+ refused 0"])
    assert result.ret == 0


def test_gpu_side_config_as_it_is(pytester: pytest.Pytester) -> None:
    """msprobe's GPU-side run_ut config with is_online, unchanged: host/port, rank_list, white_list."""
    port = free_port()
    (pytester.path / "config.json").write_text(json.dumps({"task": "run_ut", "run_ut": {
        "white_list": ["linear", "gelu"], "black_list": [], "error_data_path": "./", "is_online": True,
        "nfs_path": "", "host": "127.0.0.1", "port": port, "rank_list": [0], "tls_path": ""}}))
    client = _client(pytester, "--mode", "tcp", "--port", str(port), port=port)
    result = pytester.runpytest_inprocess("--msprobe-config", "config.json", *SAFETY)
    sent = _sent(client)
    kept = [n for n in sent if n.split(".")[1] in ("linear", "gelu")]
    result.assert_outcomes(passed=len(kept))
    result.stdout.fnmatch_lines([f"msprobe online: rank0: received {len(sent)} = checked {len(kept)} + skipped "
                                 f"{len(sent) - len(kept)} + refused 0"])


def _wire(client: Client) -> int:
    """Calls the client wrote to its connection, counted in the client (msprobe81_client.py --trace wraps its
    send function): each sequence number once, as a resend reuses it."""
    client.join(450)
    out = client.output()
    assert "CLIENT DONE" in out, out[-3000:]
    return len(set(re.findall(r"WIRE SEND CALL (\d+) ", out)))


@pytest.mark.slow
def test_two_ranks_at_once_every_call_accounted(pytester: pytest.Pytester) -> None:
    """Rank 1's client loses its frame 300 before the wire, as msprobe 8.1.2's client now and then does by
    itself (its sending thread writes to twisted's buffer while the reactor thread swaps it): the session asks
    for it again when the client stops, and the client sends it from its table of unacknowledged calls."""
    port = free_port()
    init = f"file://{pytester.path / 'gloo_init'}"
    clients = [_client(pytester, "--mode", "tcp", "--port", str(port), "--model", "llama", "--layers", "1",
                       "--world", "2", "--rank", str(rank), "--init", init, "--trace", *(["--lose", "300"] * rank),
                       port=port) for rank in (0, 1)]
    result = pytester.runpytest_inprocess("--msprobe-online", f"tcp://127.0.0.1:{port}", "-o",
                                          "msprobe_online_clients=2", *SAFETY)
    wrote = [_wire(c) for c in clients]
    assert min(wrote) >= 400, wrote
    assert [len(_sent(c)) for c in clients] == wrote  # its log agrees: every call it dumped went out
    result.stdout.fnmatch_lines([f"msprobe online: rank{rank}: received {n} = checked * + skipped * + refused 0"
                                 for rank, n in enumerate(wrote)])
    assert "WIRE LOST 300" in clients[1].output()
    result.stdout.fnmatch_lines(["msprobe online: *: rank 1 stopped with * call(s) it numbered never received *",
                                 "msprobe online: *: rank 1: every call asked for again arrived"])
    assert "lost by a client" not in result.stdout.str()
    assert result.ret == 0


def test_the_tcp_client_stall_is_a_shared_file_sender_race(pytester: pytest.Pytester) -> None:
    """Why msprobe 8.1.2's TCP client stalls for good now and then (docs/how-to/online.md): with its one shared
    twisted FileSender, a transfer begun between the previous one's `deferred.callback()` and `deferred = None`
    loses its Deferred, which its sending thread waits for; a FileSender per transfer does not."""
    import subprocess

    script = Path(__file__).parent / "data" / "online" / "filesender_race.py"
    out = subprocess.run([PYTHON, str(script)], capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.split() == ["SHARED", "False", "FRESH", "True"], out


def test_the_unfixed_tcp_client_stalls_with_its_later_calls_unsent_and_the_summary_says_so(
        pytester: pytest.Pytester) -> None:
    """msprobe 8.1.2's TCP client as it ships (no sender fix), made to stall at its 18th transfer's end (its
    FileSender race, the window widened): the transfer begun in the race is sent whole, so each of the 19 frames
    it began arrived whole and became an item, and the calls after them never left the client (its own trace:
    the next in its sending thread, 20 more in its queue, nothing in twisted's buffer). The session, ended by
    msprobe_online_idle, says where the stream stopped and what to do, and fails."""
    import subprocess

    port = free_port()
    client = subprocess.Popen([PYTHON, str(SCRIPT), "--mode", "tcp", "--port", str(port), "--unfixed", "--stall-at",
                               "18", "--trace"], cwd=pytester.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
    try:
        result = pytester.runpytest_inprocess("--msprobe-online", f"tcp://127.0.0.1:{port}", "-o",
                                              "msprobe_online_idle=25", "-p", "no:cacheprovider")
        lines: list[str] = []
        for line in client.stdout or ():  # the client's trace says what it holds once it has sent nothing for 20 s
            lines.append(line)
            if line.startswith("WIRE STALL"):
                break
    finally:
        client.kill()
        client.communicate()
    out = "".join(lines)
    begun = re.findall(r"WIRE BEGUN CALL (\d+)", out)
    assert begun == [str(i) for i in range(19)], out[-3000:]
    assert re.search(r"^WIRE SEND CALL 19 ", out, re.M)  # taken by its sending thread, never begun
    stall = re.search(r"^WIRE STALL .* send_queue 20 \[(.*?)\] .* begun (\d+) written (\d+) unflushed 0 unread 0$",
                      out, re.M)
    assert stall, out[-3000:]
    assert stall[1] == ", ".join(map(str, range(20, 40))) and stall[2] == stall[3]  # all it began left it
    assert len(re.findall(r"tools is dumping api: ", out)) > 19 + 1  # its log names calls that never arrived
    result.stdout.fnmatch_lines([
        "msprobe online: rank0: received 19 = checked * + skipped * + refused 0",
        "msprobe online: rank0 client 127.0.0.1:*: numbered 19 call(s), 19 arrived; no STOP_: still connected when "
        "the session ended",
        "msprobe online: rank0 client 127.0.0.1:*: no byte came after its call with sequence 18. If its log says "
        "`send_queue put send_data timeout`, msprobe 8.1.2's client stalled there * examples/online_client/"
        "sender_fix.py *",
        "msprobe online: ended after 25 s without a call, before every client stopped*"])
    assert result.ret == 1


def _example(pytester: pytest.Pytester, port: int, launcher: list[str], clients: int) -> pytest.RunResult:
    """examples/online_client/train.py with its config_tcp.json on `port`, started as `launcher` does, against
    a session waiting for `clients`."""
    folder = pytester.path / f"example_{clients}"
    shutil.copytree(EXAMPLE, folder)
    config = json.loads((folder / "config_tcp.json").read_text())
    config["tensor"]["port"] = port
    (folder / "config_tcp.json").write_text(json.dumps(config))
    client = Client([PYTHON, *launcher, "train.py", "config_tcp.json"], port, folder, dict(os.environ), timeout=400)
    client.start()
    result = pytester.runpytest_inprocess("--msprobe-online", f"tcp://127.0.0.1:{port}", "-o",
                                          f"msprobe_online_clients={clients}", "--msprobe-out", f"out_{clients}", *SAFETY)
    client.join(450)
    assert client.result is not None and client.result.returncode == 0, client.output()[-3000:]
    return result


def test_the_example_client_one_process_and_two_ranks(pytester: pytest.Pytester) -> None:
    """The runnable client of docs/how-to/online.md, as the page runs it: its summary and counts are the page's."""
    page = " ".join((ROOT / "docs/how-to/online.md").read_text(encoding="utf-8").split())
    one = _example(pytester, free_port(), [], 1)
    one.assert_outcomes(passed=18, skipped=72)
    assert missing_from(one.stdout.str(), "docs/how-to/online.md", 2) is None, one.stdout.str()[-3000:]
    assert one.ret == 0 and "`18 passed, 72 skipped`" in page
    two = _example(pytester, free_port(), ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"], 2)
    two.assert_outcomes(passed=36, skipped=144)
    two.stdout.fnmatch_lines([f"msprobe online: rank{r} client 127.0.0.1:*: numbered 90 call(s), 90 arrived; stopped"
                              for r in (0, 1)], consecutive=False)
    assert two.ret == 0 and "`36 passed, 144 skipped`" in page and "`numbered 90 call(s), 90 arrived; stopped`" in page

