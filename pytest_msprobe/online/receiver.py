"""The receiving end of msprobe's online TCP/TLS transport: frames into a bounded queue, acks back.

One thread accepts; one thread per connection reads frames with blocking `recv_into` through a 1 MiB buffer
(_Reader: many small frames per system call, large bodies straight into their own bytearray; the GIL is
released while the kernel copies) and puts each body on a `queue.Queue` of `queue_size` calls. When the queue
stays full for BUSY_AFTER_S the client gets `BUSY_` once and the frame waits for room (msprobe's rule), so
the memory held is the queue plus one frame and the buffer per connection.

A frame that cannot be one of msprobe's (a length over `max_frame`, a zero length, a CRC field that is not
8 hex digits, a rank or step beyond 2**31), a half frame and a dropped connection end that connection only,
in one logged line; a bad CRC gets `ERROR` and the resend is taken. A sequence number the client skipped (a
frame msprobe 8.1.2's client lost before the wire) gets `ERROR` when it stops, so that it sends the call
again (Receiver._stop). The session is over when every client that sent data has sent `STOP_` (or dropped),
and at least `clients` of them did: then `KILL_` goes to each.
Torch-free: the bodies stay bytes here; loading them is safeload.py's job, in the consumer.
"""
from __future__ import annotations

import queue
import select
import socket
import ssl
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

from . import protocol
from .protocol import BUSY, ERROR, KILL, OK, OVER, STOP

_RECENT = 4096  # (sequence, rank, step) keys remembered per connection to drop resent duplicates
KEEPALIVE_S = 0.2  # a quiet TLS client's last ack is repeated this often (Receiver._wait_for_frame) ...
KEEPALIVE_REPEATS = 50  # ... at most this many times per quiet spell: msprobe 8.1.2's client drops stale acks
# only while it has frames in flight, and breaks its connection when its queue of 100 acks overflows
_LIMIT = 1 << 31  # ranks and steps at or above this are garbage, not a training job
ASK_ROUNDS = 2  # ERROR acks per missing sequence number: msprobe 8.1.2 resends a call twice at most (a third
# ERROR for it crashes its ack thread: it pops the call by an int key from a table keyed by strings)
ASK_AGAIN_S = 5.0  # the second ERROR for a missing call no sooner than this after the first: msprobe 8.1.2's
# client reads one ack per 0.1 s, so its resend may take seconds to come
BUSY_AFTER_S = 0.5  # a full queue gets BUSY_ only when no room comes within this: msprobe 8.1.2's client
# spends 0.1 s on every ack it reads, a BUSY_ too, while a short wait for room costs it nothing (it has acks
# of earlier calls to read meanwhile)
GAP_WAIT_S = 20.0  # after a client's first STOP_, how long its missing calls may take to come again
_MAX_MISSING = 4096  # sequence numbers remembered as missing per connection (a hostile peer's jumps count only)


@dataclass
class Call:
    """One received body (not loaded yet) with the numbers of its frame."""

    rank: int | None  # from the frame header; None for nfs files (known once loaded)
    step: int | None
    sequence: int
    body: bytearray | bytes
    peer: str
    nfs: bool = False  # a pickle file of nfs_path (safeload.load_nfs), not a torch.save body


@dataclass
class Stats:
    """Counts of what never became a Call, for the session summary."""

    connections: int = 0
    crc_errors: int = 0  # frames answered ERROR (their resends arrive as Calls)
    duplicates: int = 0  # resent frames already taken
    refused_frames: int = 0  # frames refused before their body was read (too long, garbage)
    dropped: int = 0  # connections that ended mid-frame or on an error
    stopped_ranks: set[int] = field(default_factory=set)
    lost: int = 0  # calls a client numbered that never arrived, even after ERROR asked for them again
    lines: list[str] = field(default_factory=list)


class _Closed(Exception):
    """The peer closed the connection; `mid_frame` when it did so inside a frame."""

    def __init__(self, mid_frame: bool) -> None:
        super().__init__()
        self.mid_frame = mid_frame


class _Conn:
    def __init__(self, sock: socket.socket, peer: str) -> None:
        self.sock, self.peer = sock, peer
        self.lock = threading.Lock()
        self.data = False  # sent at least one good frame
        self.stopped = False
        self.done = False  # counted as finished (Receiver._finish)
        self.recent: OrderedDict[tuple[int, int, int], None] = OrderedDict()
        self.last_ack: tuple[bytes, int, int, int] | None = None  # the last OK___, repeated while idle
        self.repeats = 0  # keepalive repeats since the last frame
        self.reader = _Reader(sock)
        # msprobe's client numbers its frames 0, 1, 2, ... per process and sends them in that order (resends
        # come later); a number skipped is a frame it lost before the wire (Receiver._stop asks for it again)
        self.next_sequence = 0
        self.last_step = 0
        self.missing: dict[int, set[int]] = {}  # skipped sequence number -> the steps it may carry
        self.untracked = 0  # skipped numbers beyond _MAX_MISSING
        self.asked = 0  # rounds of ERROR acks for the missing ones
        self.asked_at = -float("inf")  # time.monotonic() of the last round
        self.rank = 0

    def track(self, h: protocol.Header, call: bool) -> None:
        """Note a good frame's sequence number: the numbers it skipped are missing; a resend fills its gap.
        Only calls tell the rank and step: msprobe's client numbers its STOP_ frames in the same sequence but
        gives them rank 0 and step 0."""
        if call:
            if not self.data:
                self.last_step = h.step
            self.rank = h.rank
        if h.sequence >= self.next_sequence:
            gap = h.sequence - self.next_sequence
            room = max(0, _MAX_MISSING - len(self.missing))
            steps = {self.last_step, h.step} if call else {self.last_step}
            for sequence in range(self.next_sequence, self.next_sequence + min(gap, room)):
                self.missing[sequence] = steps
            self.untracked += max(0, gap - room)
            self.next_sequence = h.sequence + 1
        else:
            self.missing.pop(h.sequence, None)
        if call:
            self.last_step = h.step

    def send(self, word: bytes, sequence: int, rank: int, step: int) -> None:
        with self.lock:
            self.sock.sendall(protocol.ack(word, sequence, rank, step))
        if word == OK:
            self.last_ack = (word, sequence, rank, step)


class Receiver:
    """Listens on (host, port); `calls` is the bounded queue the session reads; `finished` is set when
    every client has stopped."""

    def __init__(self, host: str, port: int, *, queue_size: int = 50, max_frame: int = protocol.DEFAULT_MAX_FRAME,
                 check_sum: bool = True, tls: ssl.SSLContext | None = None, clients: int = 1,
                 log: Callable[[str], None] | None = None) -> None:
        self.host, self.port = host, port
        self.calls: queue.Queue[Call] = queue.Queue(maxsize=max(1, queue_size))
        self.max_frame, self.check_sum, self.tls, self.clients = max_frame, check_sum, tls, max(1, clients)
        self.finished = threading.Event()
        self.stats = Stats()
        self._log = log
        self._lock = threading.Lock()
        self._conns: list[_Conn] = []
        self._finished_clients = 0
        self._server: socket.socket | None = None
        self._closing = False

    # ------------------------------------------------------------------ life cycle
    def start(self) -> int:
        """Bind and start accepting; returns the port (an ephemeral one for port 0)."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        self._server = socket.create_server((self.host, self.port), family=family, backlog=64)
        self.port = self._server.getsockname()[1]
        threading.Thread(target=self._accept, name="msprobe-online-accept", daemon=True).start()
        return self.port

    def close(self) -> None:
        self._closing = True
        if self._server is not None:
            try:
                self._server.close()
            except OSError:
                pass
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            _shutdown(conn.sock)

    def log(self, line: str) -> None:
        with self._lock:
            self.stats.lines.append(line)
        if self._log is not None:
            self._log(line)

    # ------------------------------------------------------------------ threads
    def _accept(self) -> None:
        assert self._server is not None
        while not self._closing:
            try:
                sock, address = self._server.accept()
            except OSError:
                return
            peer = f"{address[0]}:{address[1]}"
            threading.Thread(target=self._serve, args=(sock, peer), name=f"msprobe-online-{peer}",
                             daemon=True).start()

    def _serve(self, raw: socket.socket, peer: str) -> None:
        sock: socket.socket = raw
        if self.tls is not None:
            try:
                raw.settimeout(30)
                sock = self.tls.wrap_socket(raw, server_side=True)
                sock.settimeout(None)
            except (OSError, ssl.SSLError) as exc:
                if "EOF" not in _reason(exc):  # a port probe that connected and left says nothing
                    self.log(f"msprobe online: {peer}: TLS handshake refused: {_reason(exc)}")
                _shutdown(raw)
                return
        conn = _Conn(sock, peer)
        with self._lock:
            self._conns.append(conn)
            self.stats.connections += 1
        ended = ""
        try:
            while not self._closing:
                if not self._frame(conn):
                    break
        except _Closed as exc:
            if exc.mid_frame:
                ended = "closed in the middle of a frame"
        except _Garbage as exc:
            ended = str(exc)
        except (OSError, ssl.SSLError) as exc:
            ended = f"connection error: {_reason(exc)}"
        except Exception as exc:  # never let a peer's bytes kill the thread silently
            ended = f"unexpected {type(exc).__name__}: {exc}"
        if ended and not self._closing:
            with self._lock:
                self.stats.dropped += 1
            self.log(f"msprobe online: {peer}: {ended}; this connection is ended, the others go on")
        elif conn.data and not conn.stopped and not conn.asked and not self._closing:
            self.log(f"msprobe online: {peer}: closed without STOP_")
        _shutdown(sock)
        with self._lock:
            if conn in self._conns:
                self._conns.remove(conn)
        if conn.data:
            self._finish(conn, stopped=False)  # no-op when it stopped already
        else:
            self._check_done()

    def _frame(self, conn: _Conn) -> bool:
        """Read and answer one frame; False when the peer closed cleanly between frames."""
        reader = conn.reader
        if not reader.buffered() and not self._wait_for_frame(conn):
            return False
        conn.repeats = 0
        lead = protocol.HEADER.size + (protocol.CRC_WIDTH if self.check_sum else 0)
        if not reader.fill(lead, at_start=True):
            return False
        h = protocol.parse_header(reader.take(protocol.HEADER.size))
        if h.rank >= _LIMIT or h.step >= _LIMIT:
            raise _Garbage(f"frame header with rank {h.rank}, step {h.step}: not a frame of msprobe's client")
        if h.length == 0 or h.length > self.max_frame:
            with self._lock:
                self.stats.refused_frames += 1
            raise _Garbage(f"frame of {h.length} bytes (rank {h.rank}, step {h.step}, sequence {h.sequence}) "
                           f"refused unread: the limit is {self.max_frame} bytes (--msprobe-online-max-frame)")
        crc = b""
        if self.check_sum:
            crc = bytes(reader.take(protocol.CRC_WIDTH))
            if not protocol.valid_crc_field(crc):
                raise _Garbage(f"CRC field {crc!r} is not 8 hex digits: not a frame of msprobe's client")
        body = reader.body(h.length)
        if self.check_sum and protocol.crc_text(body) != crc:
            with self._lock:
                self.stats.crc_errors += 1
            conn.send(ERROR, h.sequence, h.rank, h.step)
            return True
        conn.track(h, call=body != STOP)
        if body == STOP:
            self._stop(conn, h)
            return True
        key = (h.sequence, h.rank, h.step)
        if key in conn.recent:
            with self._lock:
                self.stats.duplicates += 1
            conn.send(OK, h.sequence, h.rank, h.step)
            return True
        conn.recent[key] = None
        if len(conn.recent) > _RECENT:
            conn.recent.popitem(last=False)
        conn.data = True
        call = Call(h.rank, h.step, h.sequence, body, conn.peer)
        try:
            self.calls.put(call, timeout=BUSY_AFTER_S)
        except queue.Full:
            conn.send(BUSY, h.sequence, h.rank, h.step)
            while True:
                try:
                    self.calls.put(call, timeout=0.2)
                    break
                except queue.Full:
                    if self._closing:
                        return False
        conn.send(OK, h.sequence, h.rank, h.step)
        return True

    def _wait_for_frame(self, conn: _Conn) -> bool:
        """Wait for the next frame's first byte. While a TLS client that has sent data is quiet, its last ack
        is repeated every KEEPALIVE_S, KEEPALIVE_REPEATS times: msprobe 8.1.2's TLS client starts its batched
        twisted transfers from a thread that does not wake its reactor, and a transfer then finishes only
        when something arrives (a repeated ack of a frame it already dropped from its resend table is
        ignored by it). Over plain TCP the next read blocks instead (close() shuts the socket down, which ends
        it). False: closed cleanly."""
        sock = conn.sock
        if self.tls is None:
            return not self._closing
        while not self._closing:
            if isinstance(sock, ssl.SSLSocket) and sock.pending():
                return True
            readable, _, _ = select.select([sock], [], [], KEEPALIVE_S)
            if readable:
                return True
            if self.tls is not None and conn.data and not conn.stopped and conn.last_ack is not None \
                    and conn.repeats < KEEPALIVE_REPEATS:
                conn.repeats += 1
                conn.send(*conn.last_ack)
        return False

    def _stop(self, conn: _Conn, h: protocol.Header) -> None:
        """STOP_: OVER_, and the client is done, unless calls it numbered never arrived. msprobe 8.1.2's client
        writes to its twisted transport from its sending thread while the reactor thread flushes it, and now
        and then a frame is lost in its buffer, never sent and never resent (it has no resend timer): each
        such number gets ERROR (ASK_ROUNDS at most), which makes it send the call again from its table of
        unacknowledged calls. It repeats STOP_ every 2 s: a later STOP_ finds the gap filled, or asks again
        (after ASK_AGAIN_S); after GAP_WAIT_S what is still missing is counted as lost."""
        if not conn.missing:
            conn.send(OVER, h.sequence, h.rank, h.step)
            self._finish(conn)
            return
        if conn.asked < ASK_ROUNDS and time.monotonic() - conn.asked_at >= ASK_AGAIN_S:
            conn.asked += 1
            conn.asked_at = time.monotonic()
            for sequence, steps in sorted(conn.missing.items()):
                for step in sorted(steps):
                    conn.send(ERROR, sequence, conn.rank, step)
            if conn.asked == 1:
                self.log(f"msprobe online: {conn.peer}: rank {conn.rank} stopped with {len(conn.missing)} call(s) it "
                         f"numbered never received ({_numbers(conn.missing)}): asked for them again")
                timer = threading.Timer(GAP_WAIT_S, self._finish, args=(conn,))
                timer.daemon = True
                timer.start()
        conn.send(OVER, h.sequence, h.rank, h.step)

    def _finish(self, conn: _Conn, stopped: bool = True) -> None:
        """The client is done (it stopped, or its connection ended): what it numbered and never sent is
        counted and logged, once."""
        with self._lock:
            if conn.done:
                return
            conn.done = True
            self._finished_clients += 1
            if stopped:
                conn.stopped = True
                self.stats.stopped_ranks.add(conn.rank)
            lost = len(conn.missing) + conn.untracked
            self.stats.lost += lost
        if lost:
            asked = ", though ERROR asked for them again" if conn.asked else ""
            self.log(f"msprobe online: {conn.peer}: rank {conn.rank}: {lost} call(s) it numbered never arrived "
                     f"({_numbers(conn.missing)}){asked}: counted as lost")
        elif conn.asked:
            self.log(f"msprobe online: {conn.peer}: rank {conn.rank}: every call asked for again arrived")
        self._check_done()

    def _check_done(self) -> None:
        with self._lock:
            if self.finished.is_set() or self._finished_clients < self.clients:
                return
            if any(c.data and not c.stopped for c in self._conns):
                return
            conns = [c for c in self._conns if c.stopped]
            self.finished.set()
        for c in conns:
            try:
                c.send(KILL, protocol.KILL_SEQUENCE, 0, 0)
            except OSError:
                pass


class _Garbage(Exception):
    """Bytes that are not a frame of msprobe's client: the connection is ended."""


class _Reader:
    """A connection's bytes with few copies and few system calls. Headers and small bodies come out of one
    `recv_into` of up to BUFFER bytes, which often holds several frames (one system call for many small
    calls); a large body gets its buffered start copied and the rest received straight into its own
    bytearray. The socket's receive buffer is left to the kernel's autotuning (a fixed SO_RCVBUF turns it off)."""

    BUFFER = 1 << 20

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.view = memoryview(bytearray(self.BUFFER))
        self.start = self.end = 0

    def buffered(self) -> int:
        return self.end - self.start

    def fill(self, size: int, at_start: bool = False) -> bool:
        """Have at least `size` (<= BUFFER) bytes buffered; False on a clean close before any byte of them
        when `at_start`, else _Closed."""
        if self.end - self.start >= size:
            return True
        if self.start == self.end:
            self.start = self.end = 0
        elif self.start + size > self.BUFFER:  # move the unread tail to the front
            tail = self.end - self.start
            self.view[:tail] = self.view[self.start:self.end]
            self.start, self.end = 0, tail
        while self.end - self.start < size:
            n = self.sock.recv_into(self.view[self.end:])
            if n == 0:
                if at_start and self.end == self.start:
                    return False
                raise _Closed(mid_frame=True)
            self.end += n
        return True

    def take(self, size: int) -> memoryview:
        """The next `size` buffered bytes (a view, valid until the next fill)."""
        view = self.view[self.start:self.start + size]
        self.start += size
        return view

    def body(self, size: int) -> bytes | bytearray:
        """The next `size` bytes as the call's own buffer."""
        if size <= self.BUFFER // 4:  # small: through the buffer, which picks up the next frames too
            self.fill(size)
            return bytes(self.take(size))
        body = bytearray(size)
        target = memoryview(body)
        got = min(self.end - self.start, size)
        target[:got] = self.take(got)
        while got < size:
            n = self.sock.recv_into(target[got:])
            if n == 0:
                raise _Closed(mid_frame=True)
            got += n
        return body


def _numbers(missing: dict[int, set[int]]) -> str:
    shown = sorted(missing)[:10]
    more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
    return "sequence " + ", ".join(map(str, shown)) + more if shown else "sequence numbers beyond the limit"


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


def _reason(exc: BaseException) -> str:
    text = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    detail = getattr(exc, "verify_message", None)  # e.g. "certificate revoked", "unable to get local issuer"
    return f"{text} ({detail})" if detail else str(text)
