"""The online session end to end with our own sender (pytest_msprobe.online.send) in a separate process:
TCP, nfs_path and TLS (certificates made here with the openssl command line), a bug planted in the client's
gelu failing exactly the gelu calls, msprobe's GPU-side config (is_online, black_list), reports written,
a hostile body refused and counted, -n refused. The same session with msprobe 8.1.2's own client:
tests/test_online_msprobe.py."""
from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import threading
from pathlib import Path

import pytest

from tests.online_helpers import Client, free_port, make_certs

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parent.parent
SAFETY = ("-o", "msprobe_online_idle=90")  # a client that dies fails the test instead of hanging it

CLIENT = '''
import sys, torch
import pytest_msprobe.online as online
from torch.overrides import TorchFunctionMode

class PlantedBug(TorchFunctionMode):
    """The device's gelu is off by 1 %: what a broken kernel would return."""
    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        return out * 1.01 if func is torch.nn.functional.gelu else out

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(4, 16), torch.randn(4, 8)
bug = PlantedBug() if "--bug" in sys.argv else None
if bug is not None:
    bug.__enter__()  # outside the sender's mode: the sender records what the buggy "device" returned
with online.send(sys.argv[1], tls_path=sys.argv[2] if len(sys.argv) > 2 and sys.argv[2] != "--bug" else None) as s:
    for step in range(2):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        s.step()
print("SENT", s.sent, "ERROR", s.error)
'''


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _client(pytester: pytest.Pytester, address: str, *extra: str, port: int | None = None) -> Client:
    script = pytester.path / "client.py"
    script.write_text(CLIENT)
    client = Client([sys.executable, str(script), address, *extra], port, pytester.path, _env())
    client.start()
    return client


def _sent(client: Client) -> int:
    client.join(300)
    out = client.output()
    assert "SENT" in out, out
    sent = int(out.split("SENT", 1)[1].split()[0])
    assert "ERROR None" in out, out
    return sent


def test_tcp_session_checks_every_call_and_writes_reports(pytester: pytest.Pytester) -> None:
    port = free_port()
    client = _client(pytester, f"tcp://127.0.0.1:{port}", port=port)
    result = pytester.runpytest_inprocess("--msprobe-online", f"tcp://127.0.0.1:{port}", "-p", "no:cacheprovider", *SAFETY,
                                          "--junitxml=junit.xml", "-rs")
    sent = _sent(client)
    assert sent > 40  # two steps: linear, gelu, mse_loss forward, the aten backward, the optimizer's add_
    result.assert_outcomes(passed=sent)
    assert result.ret == 0
    result.stdout.fnmatch_lines([f"msprobe online: rank0: received {sent} = checked {sent} + skipped 0 + refused 0"])
    junit = (pytester.path / "junit.xml").read_text()
    for nodeid in ("Functional.linear.0.forward", "Aten.mm.0.forward", "Tensor.add_.0.forward"):
        assert f'name="{nodeid}"' in junit and 'classname="online.rank0.step0"' in junit
    assert 'classname="online.rank0.step1"' in junit
    details = next((pytester.path / "msprobe_results").glob("accuracy_checking_details_*step0*.csv")).read_text(
        encoding="utf-8-sig")
    assert "Functional.gelu.0.forward.output.0" in details
    assert not any((pytester.path / "msprobe_results" / "online_calls").rglob("dump.json"))  # passing calls removed


def test_planted_bug_fails_exactly_the_gelu_calls_over_nfs(pytester: pytest.Pytester) -> None:
    folder = pytester.path / "shared"
    client = _client(pytester, f"nfs://{folder}", "--bug")
    result = pytester.runpytest_inprocess("--msprobe-online", f"nfs://{folder}", "-p", "no:cacheprovider", *SAFETY,
                                          "--msprobe-repro", "repro")
    sent = _sent(client)
    failed = [r.nodeid for r in result.reprec.getreports("pytest_runtest_logreport")  # type: ignore[attr-defined]
              if r.when == "call" and r.failed]
    assert sorted(failed) == ["online/rank0/step0::Functional.gelu.0.forward",
                              "online/rank0/step1::Functional.gelu.0.forward"]
    result.assert_outcomes(passed=sent - 2, failed=2)
    assert result.ret == 1
    kept = sorted(p.parent.name for p in (pytester.path / "msprobe_results" / "online_calls").rglob("dump.json"))
    assert len(kept) == 2 and all(k.endswith("_Functional.gelu.0") for k in kept)  # failing calls kept, replayable
    assert list((pytester.path / "repro").glob("*gelu*"))
    rerun = pytester.runpytest_inprocess(str(next((pytester.path / "msprobe_results").rglob("dump.json"))),
                                         "--msprobe-mode", "replay", "-p", "no:cacheprovider", *SAFETY)
    rerun.assert_outcomes(failed=1)  # the kept call fails offline too


def test_msprobe_gpu_config_with_black_list_and_a_hostile_body(pytester: pytest.Pytester) -> None:
    """A stranger's framed, refused body (then its STOP_, then it leaves) neither ends the session nor counts
    as rank 0's: the session goes on until the real client (rank_list [0]) has stopped, counts the body apart
    and fails the run."""
    port = free_port()
    config = {"task": "run_ut", "run_ut": {"white_list": [], "black_list": ["gelu"], "error_data_path": "./",
                                           "is_online": True, "nfs_path": "", "host": "127.0.0.1", "port": port,
                                           "rank_list": [0], "tls_path": ""}}
    (pytester.path / "gpu_config.json").write_text(json.dumps(config))
    script = pytester.path / "client.py"
    script.write_text(CLIENT)
    client = Client([sys.executable, str(script), f"tcp://127.0.0.1:{port}"], port, pytester.path, _env())
    evil = Client([sys.executable, "-c", _EVIL.format(port=port)], port, pytester.path, _env())
    evil.start()
    threading.Thread(target=lambda: (evil.join(120), client.start()), daemon=True).start()  # the stranger first
    result = pytester.runpytest_inprocess("--msprobe-config", "gpu_config.json", "-p", "no:cacheprovider", *SAFETY)
    sent = _sent(client)
    assert "ACK OK___" in evil.output() and "ACK OVER_" in evil.output(), evil.output()
    result.stdout.fnmatch_lines([
        f"msprobe online: rank0: received {sent} = checked {sent - 2} + skipped 2 + refused 0",
        "*skipped 2: gelu excluded by the white_list/black_list of gpu_config.json",
        "msprobe online: 127.0.0.1:*: 1 body(ies) refused, no call accepted: not a client, not counted in a rank*",
        "msprobe online: rank0 client 127.0.0.1:*: numbered * call(s), * arrived; stopped",
        "*refused: UnpicklingError:*posix.system*"])
    assert result.ret == 1  # a refused body is not lost silently: the gate is red
    assert not (pytester.path / "pwned").exists()


_EVIL = '''
import os, socket, sys
sys.path.insert(0, {root!r})
from pytest_msprobe.online import protocol, safeload
from pytest_msprobe.online.sender import encode
class Evil:
    def __reduce__(self):
        return os.system, ("touch pwned",)
body = encode(safeload.ApiData("Functional.relu.0", (Evil(),), {{}}, None, 0, 0))
with socket.create_connection(("127.0.0.1", {port})) as s:
    s.sendall(protocol.frame(body, 0))
    print("ACK", protocol.parse_ack(s.recv(29))[0].decode())
    s.sendall(protocol.frame(protocol.STOP, 1))
    print("ACK", protocol.parse_ack(s.recv(29))[0].decode())
'''.replace("{root!r}", repr(str(ROOT)))


@pytest.mark.skipif(shutil.which("openssl") is None, reason="the openssl command line makes the test certificates")
def test_tls_session_with_client_certificates_and_a_crl(pytester: pytest.Pytester,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    certs = pytester.path / "tls"
    make_certs(certs, server_passphrase="s3cret")
    monkeypatch.setenv("MSPROBE_TLS_PASSPHRASE", "s3cret")
    port = free_port()
    client = _client(pytester, f"tls://127.0.0.1:{port}", str(certs), port=port)
    plain = Client([sys.executable, "-c", _PLAIN.format(port=port)], port, pytester.path, _env())
    plain.start()
    result = pytester.runpytest_inprocess("--msprobe-online", f"tls://127.0.0.1:{port}", "-o",
                                          f"msprobe_online_tls={certs}", "-p", "no:cacheprovider", *SAFETY)
    sent = _sent(client)
    plain.join(60)
    result.assert_outcomes(passed=sent)
    result.stdout.fnmatch_lines(["*TLS handshake refused*"])  # the plain-TCP peer gets nothing in

    revoked = pytester.path / "revoked"
    make_certs(revoked, revoke_client=True)
    port = free_port()
    client = _client(pytester, f"tls://127.0.0.1:{port}", str(revoked), port=port)
    monkeypatch.delenv("MSPROBE_TLS_PASSPHRASE")
    result = pytester.runpytest_inprocess("--msprobe-online", f"tls://127.0.0.1:{port}", "-o",
                                          f"msprobe_online_tls={revoked}", "-p", "no:cacheprovider", "-o", "msprobe_online_idle=20")
    client.join(120)
    assert "SENT 0" in client.output() or "certificate" in client.output().lower(), client.output()
    result.stdout.fnmatch_lines(["*TLS handshake refused*revoked*"])


_PLAIN = '''
import socket
with socket.create_connection(("127.0.0.1", {port})) as s:
    s.sendall(b"\\0" * 64)
    s.settimeout(10)
    try:
        s.recv(10)
    except OSError:
        pass
'''


def test_bad_online_settings_are_usage_errors(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_inprocess("--msprobe-online", "tcp://127.0.0.1:0", "--msprobe-mode", "rerun",
                                          "-p", "no:cacheprovider", *SAFETY)
    result.stderr.fnmatch_lines(["*--msprobe-online replays the device result*"])
    result = pytester.runpytest_inprocess("--msprobe-online", "tcp://10.1.2.3:5", "-p", "no:cacheprovider", *SAFETY)
    result.stderr.fnmatch_lines(["*listening beyond loopback without TLS*-o msprobe_online_listen_any=true*"])
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        result = pytester.runpytest_inprocess("--msprobe-online", f"tcp://127.0.0.1:{port}", "-p", "no:cacheprovider", *SAFETY)
        result.stderr.fnmatch_lines(["*cannot listen*"])


_HALF_CLIENT = f'''
import socket, sys, time
sys.path.insert(0, {str(ROOT)!r})
import torch
from pytest_msprobe.online import protocol, safeload
from pytest_msprobe.online.sender import encode
with socket.create_connection(("127.0.0.1", int(sys.argv[1]))) as s:
    for i in range(3):
        x = torch.linspace(-1, 1, 16)
        s.sendall(protocol.frame(encode(safeload.ApiData(f"Functional.relu.{{i}}", (x,), {{}}, torch.relu(x), 0, 0)), i))
        with open("acks.txt", "a") as fh:
            fh.write(protocol.parse_ack(s.recv(29))[0].decode() + " ")
    time.sleep(120)  # a training job that goes on: no STOP_
'''


@pytest.mark.parametrize("workers", ["1", "2"])
def test_ctrl_c_writes_the_results_so_far(pytester: pytest.Pytester, workers: str) -> None:
    import signal
    import subprocess
    import time

    port = free_port()
    session = subprocess.Popen([sys.executable, "-m", "pytest", "--msprobe-online", f"tcp://127.0.0.1:{port}",
                                "-p", "no:cacheprovider", "-o", f"msprobe_online_workers={workers}"], cwd=pytester.path,
                               env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               # as in a terminal: a run started in the background (nohup, `&`) ignores SIGINT,
                               # and its children inherit that
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    client = Client([sys.executable, "-c", _HALF_CLIENT, str(port)], port, pytester.path, _env(), timeout=150)
    client.start()
    deadline = time.monotonic() + 120
    acks = pytester.path / "acks.txt"
    while time.monotonic() < deadline and (not acks.exists() or acks.read_text().count("OK___") < 3):
        time.sleep(0.2)
    assert acks.read_text().count("OK___") == 3, client.output()
    journal = pytester.path / "msprobe_results" / "msprobe_journal.jsonl"  # a line per finished item
    while time.monotonic() < deadline and (not journal.exists() or journal.read_text().count('"nodeid"') < 3):
        time.sleep(0.2)  # the three calls are checked (an ack only says received)
    session.send_signal(signal.SIGINT)
    out, _ = session.communicate(timeout=60)
    assert session.returncode == 2, out  # pytest's "interrupted"
    assert "msprobe online: rank0: received 3 = checked 3 + skipped 0 + refused 0" in out, out
    assert "interrupted before every client stopped" in out
    records = next((pytester.path / "msprobe_results").glob("msprobe_records_*.jsonl")).read_text().splitlines()
    assert len(records) == 3
