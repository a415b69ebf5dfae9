"""The online receiver against raw sockets: msprobe's framing and acks, bad CRC and the resend, BUSY_ when the
queue is full, frames over the limit, garbage, half frames and dropped connections ending only their own
connection, the STOP_/OVER_/KILL_ handshake; and the restricted unpickler refusing a payload that would run
`os.system` (TCP body and nfs file) without running it."""
from __future__ import annotations

import contextlib
import io
import os
import pickle
import socket
import time
import types
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from pytest_msprobe.online import nfs, protocol, safeload  # noqa: E402
from pytest_msprobe.online.nfs import NfsReceiver  # noqa: E402
from pytest_msprobe.online.receiver import Admission, Receiver  # noqa: E402
from pytest_msprobe.online.sender import encode, encode_nfs  # noqa: E402


def _call(name: str = "Functional.relu.0", rank: int = 0, step: int = 0) -> safeload.ApiData:
    x = torch.linspace(-1, 1, 8)
    return safeload.ApiData(name, (x,), {}, torch.relu(x), step, rank)


def _start(**admission: Any) -> Receiver:
    receiver = Receiver("127.0.0.1", 0, Admission(**admission))
    receiver.start()
    return receiver


def _connect(receiver: Receiver) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", receiver.port), timeout=10)
    _LAST_OK.pop(id(sock), None)  # ids of closed sockets are reused
    return sock


_LAST_OK: dict[int, tuple[bytes, int, int, int]] = {}


def _ack(sock: socket.socket) -> tuple[bytes, int, int, int]:
    """The next ack, past the repeats of the last OK___ the receiver sends while a client is quiet."""
    while True:
        data = b""
        while len(data) < protocol.ACK.size:
            chunk = sock.recv(protocol.ACK.size - len(data))
            assert chunk, "connection closed before the ack"
            data += chunk
        ack = protocol.parse_ack(data)
        if ack[0] == protocol.OK and _LAST_OK.get(id(sock)) == ack:
            continue  # a keepalive repeat
        if ack[0] == protocol.OK:
            _LAST_OK[id(sock)] = ack
        return ack


def _accept(receiver: Receiver, n: int) -> list[Any]:
    """Take n calls off the queue and accept them as the session does once they load: their connections
    are clients from then on."""
    calls = [receiver.calls.get(timeout=5) for _ in range(n)]
    for call in calls:
        receiver.accept(call)
    return calls


def _until(condition: Any, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not condition():
        time.sleep(0.02)
    return bool(condition())


def _closed(sock: socket.socket) -> bool:
    sock.settimeout(10)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_frame_acked_ok_and_body_loads_as_apidata() -> None:
    receiver = _start()
    body = encode(_call(rank=3, step=2))
    with _connect(receiver) as sock:
        sock.sendall(protocol.frame(body, 7, rank=3, step=2))
        assert _ack(sock) == (protocol.OK, 7, 3, 2)
    call = receiver.calls.get(timeout=5)
    assert (call.rank, call.step, call.sequence) == (3, 2, 7)
    data = safeload.load_tcp(call.body)
    assert data.name == "Functional.relu.0" and torch.equal(data.result, torch.relu(data.args[0]))
    receiver.close()


def test_bad_crc_gets_error_and_the_resend_is_taken() -> None:
    receiver = _start()
    body = encode(_call())
    good = protocol.frame(body, 0)
    bad = bytearray(good)
    bad[-1] ^= 0xFF  # one flipped bit of the body: the CRC no longer matches
    with _connect(receiver) as sock:
        sock.sendall(bytes(bad))
        assert _ack(sock)[0] == protocol.ERROR
        assert receiver.calls.empty()
        sock.sendall(good)
        assert _ack(sock)[0] == protocol.OK
        sock.sendall(good)  # a duplicate resend: acked (the same OK___ again), not taken twice
        assert _until(lambda: receiver.stats.duplicates == 1)
    assert receiver.calls.qsize() == 1 and receiver.stats.crc_errors == 1
    receiver.close()


def test_full_queue_answers_busy_then_ok_when_there_is_room() -> None:
    receiver = _start(queue_size=1)
    body = encode(_call())
    with _connect(receiver) as sock:
        sock.sendall(protocol.frame(body, 0))
        assert _ack(sock)[0] == protocol.OK
        sock.sendall(protocol.frame(body, 1))
        assert _ack(sock) == (protocol.BUSY, 1, 0, 0)
        receiver.calls.get(timeout=5)  # room again
        assert _ack(sock) == (protocol.OK, 1, 0, 0)
    assert receiver.calls.get(timeout=5).sequence == 1
    receiver.close()


def test_room_coming_soon_gets_no_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    """msprobe 8.1.2's client spends 0.1 s on every ack it reads: a queue that is full for a moment (the
    session finishing a check) holds the frame without BUSY_, which would only slow the training step."""
    from pytest_msprobe.online import receiver as module

    monkeypatch.setattr(module, "BUSY_AFTER_S", 5.0)  # far longer than the test needs, even on a loaded machine
    receiver = _start(queue_size=1)
    body = encode(_call())
    with _connect(receiver) as sock:
        sock.sendall(protocol.frame(body, 0))
        assert _ack(sock)[0] == protocol.OK
        sock.sendall(protocol.frame(body, 1))
        time.sleep(0.1)
        receiver.calls.get(timeout=5)  # room within BUSY_AFTER_S
        assert _ack(sock) == (protocol.OK, 1, 0, 0)
    assert receiver.calls.get(timeout=5).sequence == 1
    receiver.close()


def test_oversized_frame_refused_unread_and_other_connections_go_on() -> None:
    receiver = _start(max_frame=1000)
    with _connect(receiver) as other, _connect(receiver) as sock:
        sock.sendall(protocol.HEADER.pack(10**6, 0, 0, 0) + b"0" * 8)  # announces 1 MB, sends nothing of it
        assert _closed(sock)
        body = b"x" * 100
        other.sendall(protocol.frame(body, 5))
        assert _ack(other)[0] == protocol.OK
    assert receiver.stats.refused_frames == 1
    assert any("refused unread" in line for line in receiver.stats.lines)
    receiver.close()


@pytest.mark.parametrize("garbage", [b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"\0" * 8,  # a CRC field that is not hex
                                     protocol.HEADER.pack(50, 0, 0, 0) + b"0000000",  # half a frame, then closed
                                     protocol.HEADER.pack(50, 0, 1 << 40, 0) + b"0" * 8])  # absurd rank
def test_garbage_and_half_frames_end_only_that_connection(garbage: bytes) -> None:
    receiver = _start()
    with _connect(receiver) as good:
        with _connect(receiver) as bad:
            bad.sendall(garbage)
            with contextlib.suppress(OSError):  # the receiver may have ended it already (ENOTCONN): that is the point
                bad.shutdown(socket.SHUT_WR)
            assert _closed(bad)
        good.sendall(protocol.frame(encode(_call()), 1))
        assert _ack(good)[0] == protocol.OK
        assert receiver.calls.qsize() == 1 and not receiver.finished.is_set()
    assert receiver.stats.dropped == 1 and receiver.stats.lines
    receiver.close()


def test_stop_gets_over_then_kill_when_every_client_stopped() -> None:
    receiver = _start(clients=2)
    with _connect(receiver) as a, _connect(receiver) as b:
        a.sendall(protocol.frame(encode(_call(rank=0)), 0, rank=0))
        b.sendall(protocol.frame(encode(_call(rank=1)), 0, rank=1))
        assert _ack(a)[0] == _ack(b)[0] == protocol.OK
        _accept(receiver, 2)
        a.sendall(protocol.frame(protocol.STOP, 1, rank=0))
        assert _ack(a)[0] == protocol.OVER
        time.sleep(0.2)
        assert not receiver.finished.is_set()  # rank 1 still sending
        b.sendall(protocol.frame(protocol.STOP, 1, rank=1))
        assert _ack(b)[0] == protocol.OVER
        assert _ack(a)[0] == _ack(b)[0] == protocol.KILL  # no repeats after OVER_: a stopped client is quiet
    assert receiver.finished.wait(5) and receiver.stats.stopped_ranks == {0, 1}
    receiver.close()


def test_a_call_the_client_numbered_but_never_sent_is_asked_for_again_at_stop() -> None:
    """msprobe 8.1.2's client sometimes loses a frame in its own twisted buffer (it writes from a thread that
    races the reactor) and never resends it by itself: the receiver sees the gap in its sequence numbers and,
    when the client stops, answers ERROR for the missing number, which makes the client send it again."""
    receiver = _start()
    with _connect(receiver) as sock:
        for sequence in (0, 2):  # 1 never comes
            sock.sendall(protocol.frame(encode(_call(rank=1, step=0)), sequence, rank=1))
            assert _ack(sock) == (protocol.OK, sequence, 1, 0)
        taken = _accept(receiver, 2)
        sock.sendall(protocol.frame(protocol.STOP, 3))  # msprobe's client gives its STOP_ frames rank 0, step 0
        assert _ack(sock) == (protocol.ERROR, 1, 1, 0)  # the rank and step of the calls: the client's key
        assert _ack(sock) == (protocol.OVER, 3, 0, 0)
        time.sleep(0.2)
        assert not receiver.finished.is_set()  # waiting for the call it asked for
        sock.sendall(protocol.frame(encode(_call(rank=1, step=0)), 1, rank=1))  # the client's resend
        assert _ack(sock) == (protocol.OK, 1, 1, 0)
        sock.sendall(protocol.frame(protocol.STOP, 4))  # msprobe's client repeats STOP_ every 2 s
        assert _ack(sock) == (protocol.OVER, 4, 0, 0)
        assert _ack(sock)[0] == protocol.KILL
    assert receiver.finished.wait(5) and receiver.stats.lost == 0
    assert sorted(c.sequence for c in taken + [receiver.calls.get(timeout=5)]) == [0, 1, 2]
    assert any("asked for them again" in line for line in receiver.stats.lines)
    receiver.close()


def test_calls_still_missing_after_two_asks_are_counted_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_msprobe.online import receiver as module

    monkeypatch.setattr(module, "ASK_AGAIN_S", 0.0)
    monkeypatch.setattr(module, "GAP_WAIT_S", 3.0)
    receiver = _start()
    with _connect(receiver) as sock:
        sock.sendall(protocol.frame(encode(_call(rank=2, step=0)), 0, rank=2))
        sock.sendall(protocol.frame(encode(_call(rank=2, step=1)), 3, rank=2, step=1))  # 1, 2 lost at a step change
        assert [_ack(sock)[:2] for _ in range(2)] == [(protocol.OK, 0), (protocol.OK, 3)]
        _accept(receiver, 2)
        for stop in (4, 5):
            sock.sendall(protocol.frame(protocol.STOP, stop))
            # each missing number with both steps it may carry: the client's table is keyed by all three
            assert {_ack(sock) for _ in range(4)} == {(protocol.ERROR, s, 2, t) for s in (1, 2) for t in (0, 1)}
            assert _ack(sock) == (protocol.OVER, stop, 0, 0)
        sock.sendall(protocol.frame(protocol.STOP, 6))  # no third ERROR: msprobe's client would crash
        assert _ack(sock) == (protocol.OVER, 6, 0, 0)
        assert not receiver.finished.is_set()  # still waiting, GAP_WAIT_S from the first ask
        assert _ack(sock)[0] == protocol.KILL
    assert receiver.finished.wait(5) and receiver.stats.lost == 2
    assert any("rank 2: 2 call(s) it numbered never arrived (sequence 1, 2)" in line for line in receiver.stats.lines)
    receiver.close()


def test_a_client_stopping_once_with_a_gap_is_done_after_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_msprobe.online import receiver as module

    monkeypatch.setattr(module, "GAP_WAIT_S", 0.3)
    receiver = _start()
    with _connect(receiver) as sock:
        sock.sendall(protocol.frame(encode(_call()), 1))  # 0 never came
        assert _ack(sock)[0] == protocol.OK
        _accept(receiver, 1)
        sock.sendall(protocol.frame(protocol.STOP, 2))
        assert _ack(sock) == (protocol.ERROR, 0, 0, 0)
        assert _ack(sock)[0] == protocol.OVER
        assert receiver.finished.wait(5) and receiver.stats.lost == 1
    receiver.close()


@pytest.mark.parametrize("size", [1, 100_000, 300_000, 3_000_000])
def test_frames_of_every_size_back_to_back_arrive_whole(size: int) -> None:
    """Many frames written at once (several per read for small ones, one larger than the read buffer): each
    body arrives whole and in order, and a bad CRC among them is still caught."""
    receiver = _start(queue_size=64, max_frame=4 << 20)
    bodies = [os.urandom(size) for _ in range(6)]
    wire = [protocol.frame(body, i) for i, body in enumerate(bodies)]
    broken = bytearray(wire[3])
    broken[-1] ^= 1
    wire[3] = bytes(broken)
    with _connect(receiver) as sock:
        sock.sendall(b"".join(wire))
        acks = [_ack(sock) for _ in range(6)]
        assert [a[:2] for a in acks] == [(protocol.OK, 0), (protocol.OK, 1), (protocol.OK, 2), (protocol.ERROR, 3),
                                         (protocol.OK, 4), (protocol.OK, 5)]
    got = [receiver.calls.get(timeout=5) for _ in range(5)]
    assert [bytes(c.body) for c in got] == [b for i, b in enumerate(bodies) if i != 3]
    receiver.close()


def test_a_probe_connection_without_data_does_not_end_the_session() -> None:
    receiver = _start()
    _connect(receiver).close()
    time.sleep(0.2)
    assert not receiver.finished.is_set()
    receiver.close()


@settings(max_examples=40, deadline=None)
@given(st.binary(min_size=1, max_size=200))
def test_random_bytes_never_reach_the_queue_or_stop_the_receiver(garbage: bytes) -> None:
    receiver = _RECEIVER
    with _connect(receiver) as sock:
        sock.sendall(garbage)
        sock.shutdown(socket.SHUT_WR)
        _closed(sock)
    with _connect(receiver) as sock:  # still serving
        sock.sendall(protocol.frame(b"y", 0))
        assert _ack(sock)[0] in (protocol.OK, protocol.BUSY)
    while not receiver.calls.empty():
        call = receiver.calls.get()
        assert call.body == b"y"


_RECEIVER = Receiver("127.0.0.1", 0, Admission(max_frame=1 << 20))
_RECEIVER.start()


class _Evil:
    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.system, (f"touch {_MARKER}",)


_MARKER = Path(os.environ.get("TMPDIR", "/tmp")) / f"msprobe-online-evil-{os.getpid()}"


def test_tcp_body_calling_os_system_is_refused_and_not_run() -> None:
    body = encode(safeload.ApiData("Functional.relu.0", (_Evil(),), {}, None, 0, 0))  # msprobe's ApiData, evil arg
    with pytest.raises(safeload.Refused, match=r"^UnpicklingError: .*GLOBAL posix.system"):
        safeload.load_tcp(body)
    assert not _MARKER.exists()


class _EvilStorage:
    """A tensor storage's bytes that are themselves a pickle calling os.system (the nested torch.load)."""

    def __reduce__(self) -> tuple[Any, tuple[bytes]]:
        return torch.storage._load_from_bytes, (pickle.dumps(_Evil(), protocol=2),)


def test_nfs_file_calling_os_system_is_refused_and_not_run() -> None:
    with pytest.raises(safeload.Refused, match="system"):
        safeload.load_nfs(pickle.dumps(_Evil()))
    with pytest.raises(safeload.Refused):  # allowed outer global, hostile nested storage bytes
        safeload.load_nfs(pickle.dumps(_EvilStorage()))
    assert not _MARKER.exists()


def test_nfs_file_round_trip_and_bad_bodies() -> None:
    data = safeload.load_nfs(encode_nfs(_call("Tensor.add.3", rank=1, step=4)))
    assert isinstance(data, safeload.ApiData) and (data.name, data.rank, data.step) == ("Tensor.add.3", 1, 4)
    assert safeload.load_nfs(encode_nfs("end")) == "end"
    with pytest.raises(safeload.Refused, match="not Type.api.index"):
        safeload.load_nfs(encode_nfs(safeload.ApiData("../../etc/passwd", (), {}, None, 0, 0)))
    with pytest.raises(safeload.Refused, match="not msprobe's ApiData"):
        safeload.load_tcp(_torch_bytes({"a": torch.zeros(1)}))


def _torch_bytes(obj: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def test_nfs_receiver_takes_files_and_markers(tmp_path: Path) -> None:
    receiver = NfsReceiver(tmp_path, Admission(max_frame=1 << 20))
    receiver.start()
    (tmp_path / "start_1").write_bytes(encode_nfs("start"))
    (tmp_path / "Functional.relu.0.pt").write_bytes(encode_nfs(_call()))
    (tmp_path / "huge.pt").write_bytes(b"\0" * (2 << 20))
    call = receiver.calls.get(timeout=5)
    assert call.nfs and safeload.load_nfs(bytes(call.body)).name == "Functional.relu.0"  # type: ignore[union-attr]
    (tmp_path / "end_2").write_bytes(encode_nfs("end"))
    assert receiver.finished.wait(5)
    assert receiver.stats.refused_frames == 1 and not list(tmp_path.iterdir())
    receiver.close()


def test_nfs_receiver_leaves_a_file_to_its_writer_until_it_is_steady(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """msprobe 8.1's client closes a call file, checks that it exists, then sets its mode: a file taken at once
    can vanish between the two and crash the client. Complete files wait until unchanged for _QUIET_S."""
    monkeypatch.setattr(nfs, "_QUIET_S", 2.0)
    receiver = NfsReceiver(tmp_path, Admission(max_frame=1 << 20))
    receiver.start()
    path = tmp_path / "Functional.relu.0.pt"
    path.write_bytes(encode_nfs(_call()))
    time.sleep(0.3)
    os.chmod(path, 0o640)  # the writer's last step: the file must still be there
    started = time.monotonic()
    call = receiver.calls.get(timeout=5)
    assert time.monotonic() - started > 1.0  # the mode change made it new again
    assert safeload.load_nfs(bytes(call.body)).name == "Functional.relu.0"  # type: ignore[union-attr]
    (tmp_path / "end_1").write_bytes(encode_nfs("end"))
    assert receiver.finished.wait(5) and not list(tmp_path.iterdir())
    receiver.close()


def test_nfs_receiver_says_when_others_can_write_to_its_folder(tmp_path: Path) -> None:
    for mode, warned in ((0o700, False), (0o775, True), (0o757, True)):
        folder = tmp_path / f"m{mode:o}"
        folder.mkdir()
        folder.chmod(mode)
        receiver = NfsReceiver(folder, Admission(max_frame=1 << 20))
        receiver.start()
        receiver.close()
        assert any("writable by its group or by others" in line for line in receiver.stats.lines) == warned, mode



def test_nfs_receiver_takes_files_in_the_order_they_were_written(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Each file's steadiness is read at its own instant: a file written later must not be taken while an earlier
    one is still short of _QUIET_S, even when the later one's clock reading crosses it first."""
    receiver = NfsReceiver(tmp_path, Admission(max_frame=1 << 20))
    first, second = tmp_path / "rank0.step0.000000000.a.pt", tmp_path / "rank0.step0.000000001.b.pt"
    first.write_bytes(encode_nfs(_call()))
    second.write_bytes(encode_nfs(_call()))
    os.utime(second, ns=(first.stat().st_mtime_ns + 1, first.stat().st_mtime_ns + 1))
    clock = iter([0.0, 0.0, 0.19, 0.21, 0.5, 0.5, 0.5, 0.5])  # the second file's reading comes later in a scan
    monkeypatch.setattr(nfs, "time", types.SimpleNamespace(monotonic=lambda: next(clock), sleep=time.sleep))
    receiver._scan()  # both first seen
    receiver._scan()  # the first at 0.19 (short of 0.2), the second at 0.21: neither is taken yet
    assert receiver.calls.empty()
    receiver._scan()
    taken = [receiver.calls.get_nowait().peer for _ in range(2)]
    assert taken == [f"nfs:{first.name}", f"nfs:{second.name}"]
