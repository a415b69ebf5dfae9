"""The receiving end of msprobe's online TCP/TLS transport: frames into a bounded queue, acks back.

One thread accepts; one thread per connection reads frames with blocking `recv_into` through a 1 MiB buffer
(connection.Reader: many small frames per system call, large bodies straight into their own bytearray; the
GIL is released while the kernel copies) and puts each body on a `queue.Queue` of `queue_size` calls. When
the queue stays full for BUSY_AFTER_S the client gets `BUSY_` once and the frame waits for room (msprobe's
rule), so the memory held is the queue plus one frame and the buffer per connection. At most
`max_connections` connections are open at once; at the bound a new one takes the place of the oldest that has
sent nothing for a while, else it is closed as it comes, with one line.

A frame that cannot be one of msprobe's (a length over `max_frame`, a zero length, a CRC field that is not
8 hex digits, a rank or step beyond 2**31), a half frame, a frame that stalls for FRAME_STALL_S and a
dropped connection end that connection only, in one logged line; a bad CRC gets `ERROR` and the resend is
taken. A sequence number the client skipped (a frame msprobe 8.1.2's client lost before the wire) gets
`ERROR` when it stops, so that it sends the call again (Receiver._stop).

A connection is a client only once the session accepted a call of it (`accept`, after loading it); one that
ended on bytes that are not frames never is. The session is over when every client has ended (sent `STOP_`,
or its connection closed) and the expected ones did: each rank of `ranks` (msprobe's rank_list), else at
least `clients` of them. Then `KILL_` goes to each. A client that ended without its `STOP_`, or with calls
it numbered missing, is in `unstopped()`/`stats.lost`, which fail the session.
Torch-free: the bodies stay bytes here; loading them is safeload.py's job, in the consumer.
"""
from __future__ import annotations

import queue
import select
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from . import protocol
from .connection import Closed, Conn, Garbage, numbers, reason, shutdown
from .protocol import BUSY, ERROR, KILL, OK, OVER, STOP

KEEPALIVE_S = 0.2  # a quiet TLS client's last ack is repeated this often (Receiver._wait_for_frame) ...
KEEPALIVE_REPEATS = 50  # ... at most this many times per quiet spell: msprobe 8.1.2's client drops stale acks
# only while it has frames in flight, and breaks its connection when its queue of 100 acks overflows
FIRST_REPEATS = 90  # before a TLS client's first frame, a neutral ack (OK___ for a sequence number no call has)
# this many times: its first transfer stalls as the later ones do; its ack queue (100) is read only once it has
# a call in flight, so these wait there, harmless, and are dropped unread then
NEUTRAL = (protocol.OK, (1 << 64) - 1, 0, 0)
_LIMIT = 1 << 31  # ranks and steps at or above this are garbage, not a training job
ASK_ROUNDS = 2  # ERROR acks per missing sequence number: msprobe 8.1.2 resends a call twice at most (a third
# ERROR for it crashes its ack thread: it pops the call by an int key from a table keyed by strings)
ASK_AGAIN_S = 5.0  # the second ERROR for a missing call no sooner than this after the first: msprobe 8.1.2's
# client reads one ack per 0.1 s, so its resend may take seconds to come
BUSY_AFTER_S = 0.5  # a full queue gets BUSY_ only when no room comes within this: msprobe 8.1.2's client
# spends 0.1 s on every ack it reads, a BUSY_ too, while a short wait for room costs it nothing (it has acks
# of earlier calls to read meanwhile)
GAP_WAIT_S = 20.0  # after a client's first STOP_, how long its missing calls may take to come again
FRAME_STALL_S = 30.0  # a frame begun must go on arriving: no byte of it for this long ends the connection (a
# peer that sends half a header and then nothing holds no thread for ever); between frames a client may be
# quiet as long as it likes (a training step between two calls)
SAID_AT_MOST = 20  # connections ended on bad input that get their own line; the rest are counted
MAX_CONNECTIONS = 128  # open connections at most (or 4 per expected client, if more): a job opens one per rank,
# so this leaves room for probes and reconnects, while what silent peers can hold stays at 128 threads and
# 128 read buffers (1 MiB each, made on a connection's first byte)
SILENT_AFTER_S = 2.0  # at the bound, a connection that has sent no byte for this long since it opened makes room
# for a new one (the oldest first): a real client sends its first frame at once, so silent strangers cannot hold
# the session's connections against it


@dataclass
class Call:
    """One received body (not loaded yet) with the numbers of its frame."""

    rank: int | None  # from the frame header; None for nfs files (known once loaded)
    step: int | None
    sequence: int
    body: bytearray | bytes
    peer: str
    nfs: bool = False  # a pickle file of nfs_path (safeload.load_nfs), not a torch.save body
    conn: Any = field(default=None, repr=False, compare=False)  # the connection.Conn it came on (TCP/TLS)


@dataclass
class Stats:
    """Counts of what never became a Call, for the session summary."""

    connections: int = 0
    crc_errors: int = 0  # frames answered ERROR (their resends arrive as Calls)
    duplicates: int = 0  # resent frames already taken
    refused_frames: int = 0  # frames refused before their body was read (too long, garbage)
    dropped: int = 0  # connections that ended mid-frame or on an error
    turned_away: int = 0  # connections closed at once: MAX_CONNECTIONS were open
    evicted: int = 0  # silent connections closed to make room for a new one at the bound
    stopped_ranks: set[int] = field(default_factory=set)
    lost: int = 0  # calls a client numbered that never arrived, even after ERROR asked for them again
    lines: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Admission:
    """What a receiver lets in, over TCP or shared storage alike: its queue's length in calls, a body's largest
    size, and the clients (or the ranks) whose end ends the session."""

    queue_size: int = 50
    max_frame: int = protocol.DEFAULT_MAX_FRAME
    clients: int = 1
    ranks: tuple[int, ...] | None = None


ADMIT_ONE = Admission()  # one client, the default queue and frame limit


class Receiver:
    """Listens on (host, port); `calls` is the bounded queue the session reads; `finished` is set when
    every client has ended and the expected ones did."""

    def __init__(self, host: str, port: int, admission: Admission = ADMIT_ONE, *, check_sum: bool = True,
                 tls: ssl.SSLContext | None = None, log: Callable[[str], None] | None = None) -> None:
        self.host, self.port = host, port
        self.calls: queue.Queue[Call] = queue.Queue(maxsize=max(1, admission.queue_size))
        self.max_frame, self.check_sum, self.tls = admission.max_frame, check_sum, tls
        self.clients = max(1, admission.clients)
        ranks = admission.ranks
        self.ranks = frozenset(ranks) if ranks else None
        self.max_connections = max(MAX_CONNECTIONS, 4 * max(self.clients, len(self.ranks or ())))
        self.finished = threading.Event()
        self.stats = Stats()
        self._log = log
        self._lock = threading.Lock()
        self._conns: list[Conn] = []  # open
        self._clients: list[Conn] = []  # every connection that became a client, open or ended
        self._open = 0  # accepted sockets not yet ended (TLS handshakes included)
        self._full = False  # MAX_CONNECTIONS reached and said so; reset when one ends
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
            shutdown(conn.sock)

    def log(self, line: str) -> None:
        with self._lock:
            self.stats.lines.append(line)
        if self._log is not None:
            self._log(line)

    # ------------------------------------------------------------------ what the session tells and asks
    def accept(self, call: Call) -> None:
        """The session loaded `call`: its connection is a client (unless it ended on garbage)."""
        conn = call.conn
        if conn is None or conn.client or conn.bad:
            return
        with self._lock:
            conn.client = True
            self._clients.append(conn)
            if conn.done:  # it ended before the session got to its calls
                self.stats.lost += conn.lost()
        self._check_done()

    def is_client(self, call: Call) -> bool:
        return call.conn is None or bool(call.conn.client)

    def unstopped(self) -> list[Conn]:
        """Clients whose connection ended without their STOP_: their rank's calls after the last are unknown."""
        with self._lock:
            return [c for c in self._clients if not c.stopped and not c.open]

    def client_lines(self, idle: bool = False) -> list[str]:
        """Per client: what it numbered, what arrived, how it ended or, still connected without its STOP_,
        where it went quiet (the session is ending; `idle`: because no call came)."""
        with self._lock:
            clients = list(self._clients)
        return [line for c in sorted(clients, key=lambda c: (c.rank, c.opened)) for line in c.account(idle)]

    def waiting_for(self) -> str:
        """Who the session is waiting for, for the line said when the clients go quiet."""
        with self._lock:
            waiting = [c for c in self._clients if not c.done]
            strangers = sum(1 for c in self._conns if not c.client)
            ended = {c.rank for c in self._clients if c.done}
            count = len([c for c in self._clients if c.done])
        parts = [f"rank{c.rank} client {c.peer} ({c.arrived} call(s) arrived, no STOP_ yet)" for c in waiting]
        if self.ranks is not None:
            parts += [f"rank{r} (no call accepted yet)" for r in sorted(self.ranks - ended - {c.rank for c in waiting})]
        elif count + len(waiting) < self.clients:
            parts.append(f"{self.clients - count - len(waiting)} more client(s) (no call accepted yet)")
        if strangers:
            parts.append(f"{strangers} open connection(s) without an accepted call")
        return "; ".join(parts) or "nothing"

    # ------------------------------------------------------------------ threads
    def _accept(self) -> None:
        assert self._server is not None
        while not self._closing:
            try:
                sock, address = self._server.accept()
            except OSError:
                return
            peer = f"{address[0]}:{address[1]}"
            with self._lock:
                self.stats.connections += 1
                full = self._open >= self.max_connections
                say = full and not self._full
                self._full = self._full or full
                silent = self._silent() if full else None
                if silent is not None:
                    self.stats.evicted += 1
                    try:  # its thread reads the end, closes it and gives its place back
                        silent.sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    full = False
                if full:
                    self.stats.turned_away += 1
                else:
                    self._open += 1
            if full:
                shutdown(sock)
                if say:
                    self.log(f"msprobe online: {self.max_connections} connections are open, the most this session "
                             f"holds: {peer} and further ones are closed at once until one ends")
                continue
            threading.Thread(target=self._serve, args=(sock, peer), name=f"msprobe-online-{peer}",
                             daemon=True).start()

    def _silent(self) -> Conn | None:
        """The oldest open connection that has sent no byte for SILENT_AFTER_S (under the lock)."""
        now = time.monotonic()
        silent = [c for c in self._conns if c.open and not c.client and not c.data and not len(c.reader.view)
                  and now - c.opened >= SILENT_AFTER_S]
        return min(silent, key=lambda c: c.opened, default=None)

    def _serve(self, raw: socket.socket, peer: str) -> None:
        try:
            self._connection(raw, peer)
        finally:
            with self._lock:
                self._open -= 1
                if self._open < self.max_connections:
                    self._full = False

    def _connection(self, raw: socket.socket, peer: str) -> None:
        sock: socket.socket = raw
        if self.tls is not None:
            try:
                raw.settimeout(30)
                sock = self.tls.wrap_socket(raw, server_side=True)
                sock.settimeout(None)
            except (OSError, ssl.SSLError) as exc:
                if "EOF" not in reason(exc):  # a port probe that connected and left says nothing
                    self.log(f"msprobe online: {peer}: TLS handshake refused: {reason(exc)}")
                shutdown(raw)
                return
        conn = Conn(sock, peer)
        with self._lock:
            self._conns.append(conn)
        ended = ""
        try:
            while not self._closing:
                if not self._frame(conn):
                    break
        except Closed as exc:
            if exc.mid_frame:
                ended = "closed in the middle of a frame"
        except Garbage as exc:
            ended, conn.bad = str(exc), True
        except socket.timeout:
            ended = f"a frame begun, then no byte of it for {FRAME_STALL_S:g} s"
        except (OSError, ssl.SSLError) as exc:
            ended = f"connection error: {reason(exc)}"
        except Exception as exc:  # never let a peer's bytes kill the thread silently
            ended = f"unexpected {type(exc).__name__}: {exc}"
        conn.ended = ended
        if ended and not self._closing:
            with self._lock:
                self.stats.dropped += 1
                said = self.stats.dropped
            if said <= SAID_AT_MOST:
                self.log(f"msprobe online: {peer}: {ended}; this connection is ended, the others go on")
            elif said == SAID_AT_MOST + 1:
                self.log(f"msprobe online: more than {SAID_AT_MOST} connections ended on bad input: the rest are "
                         "counted in the summary, not shown")
        elif conn.data and not conn.stopped and not conn.asked and not self._closing:
            self.log(f"msprobe online: {peer}: closed without STOP_")
        shutdown(sock)
        with self._lock:
            conn.open = False
            if conn in self._conns:
                self._conns.remove(conn)
        self._finish(conn, stopped=False)  # no-op when it stopped already

    def _frame(self, conn: Conn) -> bool:
        """Read and answer one frame; False when the peer closed cleanly between frames."""
        reader = conn.reader
        if not reader.buffered():
            if not self._wait_for_frame(conn):
                return False
            # over TCP the frame's first byte is waited for without a timeout: between frames a client may be
            # quiet as long as it likes (a training step, or a stalled client whose account says where it stopped)
            if self.tls is None and not reader.fill(1, at_start=True):
                return False
        conn.repeats = 0
        conn.sock.settimeout(FRAME_STALL_S)  # the frame has begun: the rest must come
        lead = protocol.HEADER.size + (protocol.CRC_WIDTH if self.check_sum else 0)
        if not reader.fill(lead, at_start=True):
            return False
        h = protocol.parse_header(reader.take(protocol.HEADER.size))
        conn.current, conn.current_size = h, lead + h.length
        if h.rank >= _LIMIT or h.step >= _LIMIT:
            raise Garbage(f"frame header with rank {h.rank}, step {h.step}: not a frame of msprobe's client")
        if h.length == 0 or h.length > self.max_frame:
            with self._lock:
                self.stats.refused_frames += 1
            raise Garbage(f"frame of {h.length} bytes (rank {h.rank}, step {h.step}, sequence {h.sequence}) "
                          f"refused unread: the limit is {self.max_frame} bytes (msprobe_online_max_frame)")
        crc = b""
        if self.check_sum:
            crc = bytes(reader.take(protocol.CRC_WIDTH))
            if not protocol.valid_crc_field(crc):
                raise Garbage(f"CRC field {crc!r} is not 8 hex digits: not a frame of msprobe's client")
        body = reader.body(h.length)
        conn.sock.settimeout(None)
        conn.consumed += conn.current_size
        conn.current, conn.last_frame_at = None, time.monotonic()
        if self.check_sum and protocol.crc_text(body) != crc:
            with self._lock:
                self.stats.crc_errors += 1
            conn.send(ERROR, h.sequence, h.rank, h.step)
            return True
        conn.track(h, call=body != STOP)
        if body == STOP:
            self._stop(conn, h)
            return True
        if conn.duplicate(h):
            with self._lock:
                self.stats.duplicates += 1
            conn.send(OK, h.sequence, h.rank, h.step)
            return True
        conn.data = True
        conn.arrived += 1
        conn.last_sequence = h.sequence
        return self._put(conn, h, Call(h.rank, h.step, h.sequence, body, conn.peer, conn=conn))

    def _put(self, conn: Conn, h: protocol.Header, call: Call) -> bool:
        """Queue the call and ack it; BUSY_ first when no room comes within BUSY_AFTER_S."""
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

    def _wait_for_frame(self, conn: Conn) -> bool:
        """Wait for the next frame's first byte. While a TLS client that has sent data is quiet, its last ack
        is repeated every KEEPALIVE_S, KEEPALIVE_REPEATS times (before its first frame a NEUTRAL ack,
        FIRST_REPEATS times): msprobe 8.1.2's TLS client starts its batched twisted transfers from a thread that
        does not wake its reactor, and a transfer then finishes only when something arrives (a repeated ack of a
        frame it already dropped from its resend table is ignored by it). Over plain TCP the next read blocks instead (close() shuts the socket down, which ends
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
            if conn.stopped:
                continue
            if conn.last_ack is not None and conn.repeats < KEEPALIVE_REPEATS:
                conn.repeats += 1
                conn.send(*conn.last_ack)
            elif conn.last_ack is None and conn.repeats < FIRST_REPEATS:
                conn.repeats += 1
                conn.send(*NEUTRAL, repeat=False)
        return False

    def _stop(self, conn: Conn, h: protocol.Header) -> None:
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
                         f"numbered never received ({numbers(conn.missing)}): asked for them again")
                timer = threading.Timer(GAP_WAIT_S, self._finish, args=(conn,))
                timer.daemon = True
                timer.start()
        conn.send(OVER, h.sequence, h.rank, h.step)

    def _finish(self, conn: Conn, stopped: bool = True) -> None:
        """The connection is done (it stopped, or it ended): what it numbered and never sent is counted and
        logged, once; whether it counts as a client is the session's word (accept), now or later."""
        with self._lock:
            if conn.done:
                return
            conn.done = True
            if stopped:
                conn.stopped = True
                self.stats.stopped_ranks.add(conn.rank)
            lost = conn.lost() if conn.data else 0
            if conn.client:  # else counted by accept(), if it ever becomes one
                self.stats.lost += lost
        if lost:
            asked = ", though ERROR asked for them again" if conn.asked else ""
            self.log(f"msprobe online: {conn.peer}: rank {conn.rank}: {lost} call(s) it numbered never arrived "
                     f"({numbers(conn.missing)}){asked}: counted as lost")
        elif conn.asked:
            self.log(f"msprobe online: {conn.peer}: rank {conn.rank}: every call asked for again arrived")
        self._check_done()

    def _check_done(self) -> None:
        """Over when no client is still going and the expected ones have ended: a peer that is not a client
        (a probe, garbage, refused bodies only) neither ends the session nor keeps it open."""
        with self._lock:
            if self.finished.is_set() or any(not c.done for c in self._clients):
                return
            ended = [c for c in self._clients if c.done and not c.bad]  # garbage at its end: it never counts
            if self.ranks is not None:
                if not self.ranks <= {c.rank for c in ended}:
                    return
            elif len(ended) < self.clients:
                return
            conns = [c for c in self._conns if c.stopped]
            self.finished.set()
        for c in conns:
            try:
                c.send(KILL, protocol.KILL_SEQUENCE, 0, 0)
            except OSError:
                pass
