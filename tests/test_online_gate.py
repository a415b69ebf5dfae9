"""The online session as a CI gate, under load and attack: a connection is a client only once a call of it
loads, so probes, garbage, half headers (slow-loris), refused bodies and 1,000 connections opened and closed
neither end the session nor stall the real clients; a client that disconnects without its STOP_ fails the run
with a line saying what arrived; the open connections are bounded; the terminal says when the clients go quiet
and wraps the progress line. On the receiver with raw sockets, and end to end through pytester."""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from pytest_msprobe.online import protocol, safeload  # noqa: E402
from pytest_msprobe.online.receiver import Admission, Receiver  # noqa: E402
from pytest_msprobe.online.sender import encode  # noqa: E402
from pytest_msprobe.session import online as online_session  # noqa: E402 - before any pytester run (see QUIET)
from tests.doc_samples import missing_from  # noqa: E402
from tests.online_helpers import free_port, wait_for_port  # noqa: E402

ADDRESS = r"127\.0\.0\.1:\d+"  # a client's port, another each run
SAFETY = ("-o", "msprobe_online_idle=90", "-p", "no:cacheprovider")  # a hang fails the test instead
# QUIET: session/online.py is imported here, not first inside a pytester run: modules a run imports first are
# dropped after it, and a later run would not see a monkeypatch of them


def _body(i: int = 0, rank: int = 0, step: int = 0) -> bytes:
    x = torch.linspace(-1, 1, 8) + i
    return encode(safeload.ApiData(f"Functional.relu.{i}", (x,), {}, torch.relu(x), step, rank))


class _Evil:
    def __reduce__(self) -> Any:
        import os

        return os.system, ("touch pwned",)


def _refused_body() -> bytes:
    return encode(safeload.ApiData("Functional.relu.0", (_Evil(),), {}, None, 0, 0))


def _acks(sock: socket.socket, n: int) -> list[bytes]:
    """The words of the next n acks, past keepalive repeats (there are none over plain TCP)."""
    words, data = [], b""
    while len(words) < n:
        chunk = sock.recv(4096)
        assert chunk, "connection closed before the acks"
        data += chunk
        while len(data) >= protocol.ACK.size:
            words.append(protocol.parse_ack(data[:protocol.ACK.size])[0])
            data = data[protocol.ACK.size:]
    return words


def _start(tls: Any = None, **admission: Any) -> Receiver:
    receiver = Receiver("127.0.0.1", 0, Admission(**admission), tls=tls)
    receiver.start()
    return receiver


@contextlib.contextmanager
def _serving(**kwargs: Any) -> Iterator[tuple[Receiver, list[Any]]]:
    """A started receiver and the session's part beside it (take each call, accept it when it loads): the
    receiver and the calls taken so far; both stop on leaving, an assertion failing inside included."""
    receiver, taken, stop = _start(**kwargs), [], threading.Event()

    def run() -> None:
        while not stop.is_set():
            try:
                call = receiver.calls.get(timeout=0.05)
            except Exception:
                continue
            try:
                safeload.load_tcp(call.body)
            except safeload.Refused:
                continue
            receiver.accept(call)
            taken.append(call)

    threading.Thread(target=run, daemon=True).start()
    try:
        yield receiver, taken
    finally:
        stop.set()
        receiver.close()


# ---------------------------------------------------------------- the receiver with raw sockets
def test_a_stranger_refused_body_and_stop_do_not_end_the_session() -> None:
    with _serving() as (receiver, taken):
        with socket.create_connection(("127.0.0.1", receiver.port), timeout=10) as evil:
            evil.sendall(protocol.frame(_refused_body(), 0) + protocol.frame(protocol.STOP, 1))
            assert _acks(evil, 2) == [protocol.OK, protocol.OVER]
        with socket.create_connection(("127.0.0.1", receiver.port), timeout=10) as probe:
            probe.sendall(protocol.frame(protocol.STOP, 0))  # a STOP_ alone: no call, no client
            assert _acks(probe, 1) == [protocol.OVER]
        time.sleep(0.3)
        assert not receiver.finished.is_set()
        with socket.create_connection(("127.0.0.1", receiver.port), timeout=10) as real:
            real.sendall(protocol.frame(_body(), 0))
            assert _acks(real, 1) == [protocol.OK]
            assert _wait(lambda: len(taken) == 1)
            real.sendall(protocol.frame(protocol.STOP, 1))
            assert _acks(real, 2) == [protocol.OVER, protocol.KILL]
        assert receiver.finished.wait(5) and not receiver.unstopped()


def test_a_connection_that_ends_on_garbage_never_counts_even_after_a_call() -> None:
    with _serving() as (receiver, taken):
        with socket.create_connection(("127.0.0.1", receiver.port), timeout=10) as odd:
            odd.sendall(protocol.frame(_body(), 0))
            assert _acks(odd, 1) == [protocol.OK]
            assert _wait(lambda: len(taken) == 1)  # accepted: a client for now
            odd.sendall(b"GET / HTTP/1.1\r\n\r\n" + b"\0" * 32)  # then bytes that are no frame
            odd.settimeout(10)
            assert odd.recv(1) == b""
        time.sleep(0.3)
        assert not receiver.finished.is_set()  # it does not stand for the client the session waits for
        with socket.create_connection(("127.0.0.1", receiver.port), timeout=10) as real:
            real.sendall(protocol.frame(_body(), 0))
            assert _acks(real, 1) == [protocol.OK]
            assert _wait(lambda: len(taken) == 2)
            real.sendall(protocol.frame(protocol.STOP, 1))
            assert _acks(real, 2) == [protocol.OVER, protocol.KILL]
        assert receiver.finished.wait(5)
        assert len(receiver.unstopped()) == 1  # its calls were checked, and its end still fails the run


def test_rank_list_waits_for_each_rank() -> None:
    with _serving(ranks=(0, 1)) as (receiver, _):
        with socket.create_connection(("127.0.0.1", receiver.port), timeout=10) as a:
            a.sendall(protocol.frame(_body(rank=0), 0, rank=0))
            assert _acks(a, 1) == [protocol.OK]
            time.sleep(0.3)  # taken and accepted
            a.sendall(protocol.frame(protocol.STOP, 1))
            assert _acks(a, 1) == [protocol.OVER]
        time.sleep(0.3)
        assert not receiver.finished.is_set()
        assert "rank1 (no call accepted yet)" in receiver.waiting_for()
        with socket.create_connection(("127.0.0.1", receiver.port), timeout=10) as b:
            b.sendall(protocol.frame(_body(rank=1), 0, rank=1))
            assert _acks(b, 1) == [protocol.OK]
            time.sleep(0.3)
            b.sendall(protocol.frame(protocol.STOP, 1))
            assert _acks(b, 2) == [protocol.OVER, protocol.KILL]
        assert receiver.finished.wait(5)


def test_a_client_killed_mid_frame_ends_unstopped_with_its_account() -> None:
    with _serving() as (receiver, _):
        with socket.create_connection(("127.0.0.1", receiver.port), timeout=10) as sock:
            for i in range(5):
                sock.sendall(protocol.frame(_body(i), i))
            assert _acks(sock, 5) == [protocol.OK] * 5
            time.sleep(0.3)
            sock.sendall(protocol.frame(_body(5), 5)[:50])  # killed while writing its sixth call
        assert receiver.finished.wait(5)  # the only client ended: nothing more can come from it
        (client,) = receiver.unstopped()
        assert client.arrived == 5
        line, cut = receiver.client_lines()
        assert re.search(r"rank0 client 127\.0\.0\.1:\d+: numbered 5 call\(s\), 5 arrived; ended without its STOP_: "
                         r"the connection closed \(closed in the middle of a frame\)", line), line
        size = len(protocol.frame(_body(5), 5))  # the sixth call arrived in part: named, not left unsaid
        assert re.fullmatch(rf"msprobe online: rank0 client 127\.0\.0\.1:\d+: 1 call arrived incomplete, not checked: "
                            rf"sequence 5 \(rank 0, step 0\), 50 of its {size:,} bytes", cut), cut


def test_a_client_cut_inside_a_header_is_named_with_its_bytes() -> None:
    with _serving() as (receiver, _):
        with socket.create_connection(("127.0.0.1", receiver.port), timeout=10) as sock:
            for i in range(3):
                sock.sendall(protocol.frame(_body(i), i))
            assert _acks(sock, 3) == [protocol.OK] * 3
            sock.sendall(protocol.frame(_body(3), 3)[:20])  # killed inside its fourth frame's header
        assert receiver.finished.wait(5)
        line, cut = receiver.client_lines()
        assert "numbered 3 call(s), 3 arrived; ended without its STOP_" in line, line
        assert cut.endswith(": 1 frame arrived incomplete, not checked: 20 byte(s), less than its header"), cut


def test_slow_loris_half_header_is_ended_and_real_clients_go_on(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_msprobe.online import receiver as module

    monkeypatch.setattr(module, "FRAME_STALL_S", 1.0)
    receiver = _start()
    with socket.create_connection(("127.0.0.1", receiver.port), timeout=10) as loris, \
            socket.create_connection(("127.0.0.1", receiver.port), timeout=10) as real:
        loris.sendall(protocol.frame(_body(), 0)[:20])  # half a header, then nothing
        started = time.monotonic()
        for i in range(3):  # meanwhile a real client is served at once
            real.sendall(protocol.frame(_body(i), i))
            assert _acks(real, 1) == [protocol.OK]
        assert time.monotonic() - started < 1.0
        loris.settimeout(10)
        assert loris.recv(1) == b""  # ended by the receiver
    assert any("a frame begun, then no byte of it for 1 s" in line for line in receiver.stats.lines)
    receiver.close()


def test_open_connections_are_bounded_with_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_msprobe.online import receiver as module

    monkeypatch.setattr(module, "MAX_CONNECTIONS", 8)
    monkeypatch.setattr(module, "SILENT_AFTER_S", 600.0)  # none of them silent long enough to make room
    receiver = _start()
    silent = [socket.create_connection(("127.0.0.1", receiver.port), timeout=10) for _ in range(8)]
    assert _wait(lambda: receiver._open == 8)
    extra = [socket.create_connection(("127.0.0.1", receiver.port), timeout=10) for _ in range(3)]
    for sock in extra:
        assert sock.recv(1) == b""  # closed at once
        sock.close()
    bound_lines = [line for line in receiver.stats.lines if "the most this session holds" in line]
    assert len(bound_lines) == 1 and "8 connections are open" in bound_lines[0]
    assert receiver.stats.turned_away == 3
    silent.pop().close()
    assert _wait(lambda: receiver._open == 7)
    with socket.create_connection(("127.0.0.1", receiver.port), timeout=10) as real:  # room again
        real.sendall(protocol.frame(_body(), 0))
        assert _acks(real, 1) == [protocol.OK]
    for sock in silent:
        sock.close()
    receiver.close()


def test_silent_strangers_at_the_bound_make_room_for_a_client(monkeypatch: pytest.MonkeyPatch) -> None:
    """Connections that never send a byte cannot hold the session's places: at the bound, a new connection takes
    the oldest silent one's, so a real client still connects and is acked; one that has sent bytes keeps its place."""
    from pytest_msprobe.online import receiver as module

    monkeypatch.setattr(module, "MAX_CONNECTIONS", 4)
    monkeypatch.setattr(module, "SILENT_AFTER_S", 0.2)
    receiver = _start()
    with socket.create_connection(("127.0.0.1", receiver.port), timeout=10) as busy:
        busy.sendall(protocol.frame(_body(0), 0))
        assert _acks(busy, 1) == [protocol.OK]
        silent = [socket.create_connection(("127.0.0.1", receiver.port), timeout=10) for _ in range(3)]
        assert _wait(lambda: receiver._open == 4)
        time.sleep(0.3)
        with socket.create_connection(("127.0.0.1", receiver.port), timeout=10) as real:
            real.sendall(protocol.frame(_body(1), 1))
            assert _acks(real, 1) == [protocol.OK]
        assert silent[0].recv(1) == b""  # the oldest silent one made room
        assert receiver.stats.evicted >= 1 and receiver.stats.turned_away == 0
        busy.sendall(protocol.frame(_body(2), 2))
        assert _acks(busy, 1) == [protocol.OK]  # a connection that sent bytes keeps its place
        for sock in silent:
            sock.close()
    receiver.close()


def test_a_thousand_connections_opened_and_closed_while_a_client_sends() -> None:
    from pytest_msprobe.online import receiver as module

    with _serving() as (receiver, taken):
        storm_done = threading.Event()

        def storm() -> None:
            for i in range(1000):
                with socket.create_connection(("127.0.0.1", receiver.port), timeout=10) as s:
                    if i % 3 == 1:
                        s.sendall(b"\x00" * (i % 50))  # some with a few bytes of garbage
            storm_done.set()

        threading.Thread(target=storm, daemon=True).start()
        with socket.create_connection(("127.0.0.1", receiver.port), timeout=10) as real:
            for i in range(50):
                real.sendall(protocol.frame(_body(i), i))
                assert _acks(real, 1) == [protocol.OK]
            assert storm_done.wait(120)
            assert _wait(lambda: len(taken) == 50) and _wait(lambda: receiver.stats.connections >= 1001)
            assert not receiver.finished.is_set()  # 1,000 connections that are not clients end nothing
            real.sendall(protocol.frame(protocol.STOP, 50))
            assert _acks(real, 2) == [protocol.OVER, protocol.KILL]
        assert receiver.finished.wait(5) and not receiver.unstopped()
        assert _wait(lambda: receiver._open == 0)
        ended = [line for line in receiver.stats.lines if "this connection is ended" in line]
        assert len(ended) == module.SAID_AT_MOST  # the rest counted, not printed
        assert sum("not shown" in line for line in receiver.stats.lines) == 1


def _wait(condition: Any, timeout: float = 20) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not condition():
        time.sleep(0.02)
    return bool(condition())


# ---------------------------------------------------------------- end to end: the session's verdict
def _client(port: int, rank: int, calls: int, *, stop: bool = True, kill: bool = False, pause: float = 0.0,
            log: list[str] | None = None, after: threading.Event | None = None) -> threading.Thread:
    """A client in a thread: `calls` framed relu calls of `rank`, each waiting for its OK___; then STOP_, or
    half a frame and a dropped connection (`kill`), after `pause` seconds of quiet (or once `after` is set)."""

    def run() -> None:
        assert wait_for_port(port)
        with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
            for i in range(calls):
                sock.sendall(protocol.frame(_body(i, rank=rank), i, rank=rank))
                (word,) = _acks(sock, 1)
                if log is not None:
                    log.append(word.decode())
            time.sleep(pause)
            if after is not None:
                after.wait(120)
            with contextlib.suppress(OSError, AssertionError):  # the session may be over (a quiet client's test)
                if kill:
                    sock.sendall(protocol.frame(_body(calls, rank=rank), calls, rank=rank)[:40])
                    return
                if stop:
                    sock.sendall(protocol.frame(protocol.STOP, calls))
                    if log is not None:
                        log.extend(w.decode() for w in _acks(sock, 2))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _attacks(port: int, done: threading.Event) -> threading.Thread:
    """Refused bodies on one connection, a half header that stays, and 1,000 connections opened and closed."""

    def run() -> None:
        assert wait_for_port(port)
        loris = socket.create_connection(("127.0.0.1", port), timeout=30)
        loris.sendall(protocol.frame(_body(), 0)[:20])
        with socket.create_connection(("127.0.0.1", port), timeout=30) as evil:
            for i in range(25):
                evil.sendall(protocol.frame(_refused_body(), i))
            _acks(evil, 25)
        for _ in range(1000):
            socket.create_connection(("127.0.0.1", port), timeout=30).close()
        done.set()
        time.sleep(5)
        loris.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_two_clients_under_attack_are_all_checked(pytester: pytest.Pytester) -> None:
    port = free_port()
    attacked = threading.Event()
    _attacks(port, attacked)
    logs: list[list[str]] = [[], []]
    clients = [_client(port, rank, 120, log=logs[rank], after=attacked) for rank in (0, 1)]
    result = pytester.runpytest_inprocess("--msprobe-online", f"tcp://127.0.0.1:{port}", "-o",
                                          "msprobe_online_clients=2", *SAFETY)
    for c in clients:
        c.join(60)
    assert attacked.wait(60)
    assert [log.count("OK___") for log in logs] == [120, 120]  # never refused, never BUSY_ for long
    result.assert_outcomes(passed=240)
    result.stdout.fnmatch_lines([
        "msprobe online: rank0: received 120 = checked 120 + skipped 0 + refused 0",
        "msprobe online: rank1: received 120 = checked 120 + skipped 0 + refused 0",
        "msprobe online: 127.0.0.1:*: 25 body(ies) refused, no call accepted: not a client, not counted in a rank*",
        "msprobe online: rank0 client 127.0.0.1:*: numbered 120 call(s), 120 arrived; stopped",
        "msprobe online: rank1 client 127.0.0.1:*: numbered 120 call(s), 120 arrived; stopped"])
    assert result.ret == 1  # someone sent pickles that would run code: the gate says so
    assert not (pytester.path / "pwned").exists()
    live = result.stdout.str().split(" msprobe online ==")[0]
    assert live.count(": refused: UnpicklingError") == online_session.STRANGER_LINES  # a flood is counted, not
    assert live.count("the rest are counted in the summary, not shown") == 1  # printed line by line


def test_a_client_that_disconnects_without_stop_fails_the_run(pytester: pytest.Pytester,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 is killed in the middle of its 21st frame: that call arrived in part and is named. Rank 2 goes
    quiet between two frames for longer than a frame may stall, as msprobe 8.1.2's TCP client does when its
    sending thread waits for ever (its unsent calls stay in its queue), and is then killed: the connection is
    kept while it is quiet, and the summary says where its stream stopped and what to do."""
    from pytest_msprobe.online import receiver as module

    monkeypatch.setattr(module, "FRAME_STALL_S", 1.0)
    port = free_port()
    ok = _client(port, 0, 30)
    killed = _client(port, 1, 20, kill=True)
    stalled = _client(port, 2, 13, stop=False, pause=3)
    started = time.monotonic()
    result = pytester.runpytest_inprocess("--msprobe-online", f"tcp://127.0.0.1:{port}", "-o",
                                          "msprobe_online_clients=3", *SAFETY)
    for client in (ok, killed, stalled):
        client.join(30)
    assert time.monotonic() - started < 80  # ended on the clients' word, not on the idle timeout
    result.assert_outcomes(passed=63)
    cut = len(protocol.frame(_body(20, rank=1), 20, rank=1))
    result.stdout.fnmatch_lines([
        "msprobe online: rank0 client 127.0.0.1:*: numbered 30 call(s), 30 arrived; stopped",
        "msprobe online: rank1 client 127.0.0.1:*: numbered 20 call(s), 20 arrived; ended without its STOP_: the "
        "connection closed (closed in the middle of a frame)",
        f"msprobe online: rank1 client 127.0.0.1:*: 1 call arrived incomplete, not checked: sequence 20 (rank 1, "
        f"step 0), 40 of its {cut:,} bytes",
        "msprobe online: rank2 client 127.0.0.1:*: numbered 13 call(s), 13 arrived; ended without its STOP_: the "
        "connection closed",
        "msprobe online: rank2 client 127.0.0.1:*: no byte came after its call with sequence 12. If its log says "
        "`send_queue put send_data timeout`, msprobe 8.1.2's client stalled there * examples/online_client/"
        "sender_fix.py *"])
    out = result.stdout.str()
    assert "without a call" not in out and "a frame begun" not in out  # quiet between frames is not a stalled frame
    assert result.ret == 1
    assert missing_from(out, "docs/how-to/online.md", 0, variable=(ADDRESS, r"of its [\d,]+ bytes")) is None


def test_quiet_clients_are_named_once_with_the_idle_option(pytester: pytest.Pytester,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(online_session, "QUIET_S", 1.0)
    port = free_port()
    _client(port, 3, 90, stop=False, pause=60)  # goes quiet and never stops
    result = pytester.runpytest_inprocess("--msprobe-online", f"tcp://127.0.0.1:{port}", "-o", "msprobe_online_idle=4",
                                          "-p", "no:cacheprovider")
    out = result.stdout.str()
    live = out.split(" msprobe online ==")[0]  # before the summary, which repeats the session's log
    assert live.count("the clients are quiet") == 1, out
    result.stdout.fnmatch_lines([
        "msprobe online: no call for * s; the clients are quiet. Waiting for: rank3 client 127.0.0.1:* (90 call(s) "
        "arrived, no STOP_ yet). -o msprobe_online_idle=4 ends the session after that long without a call*",
        "msprobe online: rank3 client 127.0.0.1:*: numbered 90 call(s), 90 arrived; no STOP_: still connected when "
        "the session ended",
        "msprobe online: rank3 client 127.0.0.1:*: no byte came after its call with sequence 89. If its log says*",
        "msprobe online: ended after 4 s without a call, before every client stopped; waiting for: rank3 client*"])
    assert result.ret == 1
    progress = [line for line in out.splitlines() if re.fullmatch(r"(online )?\.+( \[\d+ calls\])?", line)]
    assert any(line.endswith(" calls]") for line in progress), out  # the progress line wraps with a count
    assert all(len(line) <= 80 for line in progress), out


def test_quiet_clients_that_stop_later_are_named_once(pytester: pytest.Pytester,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Without msprobe_online_idle the notice says how to end the session; the client's STOP_ still ends it."""
    monkeypatch.setattr(online_session, "QUIET_S", 1.0)
    port = free_port()
    client = _client(port, 1, 120, pause=4)
    watchdog = threading.Timer(150, os.kill, (os.getpid(), signal.SIGINT))  # a session that never ends fails
    watchdog.start()
    try:
        result = pytester.runpytest_inprocess("--msprobe-online", f"tcp://127.0.0.1:{port}", "-p", "no:cacheprovider")
    finally:
        watchdog.cancel()
    client.join(30)
    out = result.stdout.str()
    assert out.split(" msprobe online ==")[0].count("the clients are quiet") == 1, out
    assert missing_from(out, "docs/how-to/online.md", 1, variable=(ADDRESS, r"no call for \d+ s")) is None, out
    result.assert_outcomes(passed=120)
    assert result.ret == 0


@pytest.mark.skipif(shutil.which("openssl") is None, reason="the openssl command line makes the test certificates")
def test_a_tls_client_hears_a_neutral_ack_before_its_first_frame(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """msprobe 8.1.2's TLS client starts its first batched transfer from a thread that does not wake its
    reactor: without something arriving it sat for about 30 s (measured with its real client). Before a TLS
    client's first frame the receiver sends an OK___ for a sequence number no call has, a bounded number of
    times (its ack queue holds 100 and is read only once a call is in flight)."""
    import ssl

    from pytest_msprobe.online import endpoint
    from pytest_msprobe.online import receiver as module
    from tests.online_helpers import make_certs

    monkeypatch.setattr(module, "FIRST_REPEATS", 3)
    monkeypatch.setattr(module, "KEEPALIVE_S", 0.05)
    make_certs(tmp_path)
    receiver = _start(tls=endpoint.tls_context(tmp_path))
    context = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
    context.load_cert_chain(tmp_path / "client.crt", tmp_path / "client.key")
    context.check_hostname = False
    with socket.create_connection(("127.0.0.1", receiver.port), timeout=10) as raw, \
            context.wrap_socket(raw) as sock:
        time.sleep(0.6)
        sock.settimeout(0.5)
        data = b""
        with contextlib.suppress(socket.timeout):
            while True:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                data += chunk
        acks = [protocol.parse_ack(data[i:i + protocol.ACK.size]) for i in range(0, len(data), protocol.ACK.size)]
        assert acks == [module.NEUTRAL] * 3  # FIRST_REPEATS of them, then quiet
        sock.settimeout(10)
        sock.sendall(protocol.frame(_body(), 0))
        assert protocol.parse_ack(sock.recv(protocol.ACK.size)) == (protocol.OK, 0, 0, 0)
    receiver.close()


def test_calls_still_queued_when_the_session_stops_early_are_named(pytester: pytest.Pytester) -> None:
    """-x stops the session at the first call, which fails, while the client's 29 others wait in the queue,
    arrived whole: they are counted per rank and named, not dropped from the summary."""

    class Slow:
        """The first call's check waits until the client's 30 frames are in the queue."""

        def pytest_runtest_logstart(self, nodeid: str) -> None:
            time.sleep(2)

    port = free_port()

    def send() -> None:
        assert wait_for_port(port)
        x = torch.linspace(-1, 1, 8)
        wrong = encode(safeload.ApiData("Functional.relu.0", (x,), {}, torch.relu(x) + 1, 0, 0))
        with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
            sock.sendall(b"".join(protocol.frame(wrong if i == 0 else _body(i), i) for i in range(30)))
            with contextlib.suppress(OSError):
                while sock.recv(4096):  # the acks, until the session closes the connection
                    pass

    client = threading.Thread(target=send, daemon=True)
    client.start()
    result = pytester.runpytest_inprocess("--msprobe-online", f"tcp://127.0.0.1:{port}", "-x", *SAFETY,
                                          plugins=[Slow()])
    client.join(30)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "msprobe online: rank0: received 1 = checked 1 + skipped 0 + refused 0",
        "msprobe online: rank0 client 127.0.0.1:*: numbered 30 call(s), 30 arrived; no STOP_: still connected when "
        "the session ended",
        # where its stream stopped, without the stall hint: the session stopped, not the client
        "msprobe online: rank0 client 127.0.0.1:*: no byte came after its call with sequence 29",
        "msprobe online: rank0: 29 call(s) arrived but were still queued when the session ended, not checked "
        "(sequence 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 and 19 more)"])
    assert result.ret == 1
