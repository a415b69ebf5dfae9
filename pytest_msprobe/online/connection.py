"""One peer connection of the online receiver: what it has sent (its sequence numbers, the gaps msprobe 8.1.2's
client leaves), whether it is a client yet, and its reads through one buffer (Reader).

A connection becomes a client only once the session has accepted a call from it (Receiver.accept): a port
probe, a peer that sends garbage or only bodies the unpickler refuses never counts, so it cannot end the
session nor stand for a rank. Torch-free.
"""
from __future__ import annotations

import socket
import threading
import time
from collections import OrderedDict

from . import protocol
from .protocol import OK

_RECENT = 4096  # (sequence, rank, step) keys remembered per connection to drop resent duplicates
_MAX_MISSING = 4096  # sequence numbers remembered as missing per connection (a hostile peer's jumps count only)
STALL_HINT_S = 10.0  # a client still connected, quiet between frames this long when the session ends, may be
# msprobe 8.1.2's stalled one (it sends about 10 calls a second): its summary line says what to do


class Closed(Exception):
    """The peer closed the connection; `mid_frame` when it did so inside a frame."""

    def __init__(self, mid_frame: bool) -> None:
        super().__init__()
        self.mid_frame = mid_frame


class Garbage(Exception):
    """Bytes that are not a frame of msprobe's client: the connection is ended and never counts as a client."""


class Conn:
    def __init__(self, sock: socket.socket, peer: str) -> None:
        self.sock, self.peer = sock, peer
        self.lock = threading.Lock()
        self.opened = time.monotonic()
        self.data = False  # sent at least one good call frame
        self.client = False  # the session accepted a call of it (Receiver.accept)
        self.bad = False  # ended on bytes that are not msprobe's frames: never a client
        self.open = True
        self.ended = ""  # why the connection ended, when not between frames
        self.stopped = False
        self.done = False  # counted as finished (Receiver._finish)
        self.arrived = 0  # call frames taken (resent duplicates not counted)
        self.consumed = 0  # bytes of whole frames read: what the peer sent beyond is an unfinished frame
        self.current: protocol.Header | None = None  # the header of the frame being read, once it is in ...
        self.current_size = 0  # ... and that frame's size in bytes, header included
        self.last_sequence: int | None = None  # of the last whole call frame
        self.last_frame_at = self.opened  # time.monotonic() when the last whole frame was read
        self.stops = 0  # STOP_ frames: msprobe's client numbers them in the same sequence as its calls
        self.recent: OrderedDict[tuple[int, int, int], None] = OrderedDict()
        self.last_ack: tuple[bytes, int, int, int] | None = None  # the last OK___, repeated while idle
        self.repeats = 0  # keepalive repeats since the last frame
        self.reader = Reader(sock)
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
        else:
            self.stops += 1
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

    def duplicate(self, h: protocol.Header) -> bool:
        """Whether this call frame was taken already (a resend whose first copy arrived); else remember it."""
        key = (h.sequence, h.rank, h.step)
        if key in self.recent:
            return True
        self.recent[key] = None
        if len(self.recent) > _RECENT:
            self.recent.popitem(last=False)
        return False

    def send(self, word: bytes, sequence: int, rank: int, step: int, repeat: bool = True) -> None:
        """An ack; the last OK___ is kept to be repeated while the client is quiet (unless not `repeat`)."""
        with self.lock:
            self.sock.sendall(protocol.ack(word, sequence, rank, step))
        if word == OK and repeat:
            self.last_ack = (word, sequence, rank, step)

    def lost(self) -> int:
        return len(self.missing) + self.untracked

    def unfinished(self) -> int:
        """Bytes received beyond the last whole frame: the start of a frame that never finished (so far)."""
        return self.reader.received - self.consumed

    def account(self, idle: bool = False) -> list[str]:
        """What this client numbered, what arrived and how it ended, in a line of the summary; for a client
        that ended (or was left) without its STOP_, a second line: the call it cut off, or where it went quiet
        (`idle`: the session ended because no call came)."""
        numbered = max(0, self.next_sequence - self.stops)  # its calls and its STOP_ frames share the numbers
        lost = self.lost()
        head = f"msprobe online: rank{self.rank} client {self.peer}"
        if self.stopped:
            how = "stopped" + (f"; {lost} call(s) it numbered never arrived, though asked for again" if lost else "")
            return [f"{head}: numbered {numbered} call(s), {self.arrived} arrived; {how}"]
        why = f" ({self.ended})" if self.ended else ""
        how = f"ended without its STOP_: the connection closed{why}" if not self.open else \
            "no STOP_: still connected when the session ended"
        if lost:
            how += f"; {lost} call(s) it numbered never arrived"
        return [f"{head}: numbered {numbered} call(s), {self.arrived} arrived; {how}", f"{head}: {self.cut_off(idle)}"]

    def cut_off(self, idle: bool = False) -> str:
        """Where the stream of a client without its STOP_ ends: a call that came in part, not checked, or no
        byte after its last whole frame (what msprobe 8.1.2's stalled sending thread leaves: the calls it
        dumped after that are still in its queue, never sent)."""
        got, h = self.unfinished(), self.current
        if h is not None:
            return (f"1 call arrived incomplete, not checked: sequence {h.sequence} (rank {h.rank}, step {h.step}), "
                    f"{got:,} of its {self.current_size:,} bytes")
        if got:
            return f"1 frame arrived incomplete, not checked: {got} byte(s), less than its header"
        after = f"its call with sequence {self.last_sequence}" if self.last_sequence is not None else "its last frame"
        if self.open and not idle and time.monotonic() - self.last_frame_at < STALL_HINT_S:
            return f"no byte came after {after}"  # the session ended while it was sending, not while it was stuck
        return (f"no byte came after {after}. If its log says `send_queue put send_data timeout`, msprobe 8.1.2's "
                "client stalled there (a race in its twisted FileSender) and the calls it dumped after that never "
                "left it: apply examples/online_client/sender_fix.py before it starts (docs/how-to/online.md, "
                "\"msprobe 8.1.2's client: what to expect\")")


class Reader:
    """A connection's bytes with few copies and few system calls. Headers and small bodies come out of one
    `recv_into` of up to BUFFER bytes, which often holds several frames (one system call for many small
    calls); a large body gets its buffered start copied and the rest received straight into its own
    bytearray. The socket's receive buffer is left to the kernel's autotuning (a fixed SO_RCVBUF turns it off).
    The buffer is made on the first read: a connection that never sends costs no memory."""

    BUFFER = 1 << 20

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.view = memoryview(b"")
        self.start = self.end = 0
        self.received = 0  # bytes the peer sent, all told

    def buffered(self) -> int:
        return self.end - self.start

    def fill(self, size: int, at_start: bool = False) -> bool:
        """Have at least `size` (<= BUFFER) bytes buffered; False on a clean close before any byte of them
        when `at_start`, else Closed."""
        if self.end - self.start >= size:
            return True
        if not len(self.view):  # nothing read yet: wait for the first bytes before a buffer is made
            first = self.sock.recv(max(size, 1 << 16))  # up to BUFFER: a frame's first byte brings what came with it
            self.received += len(first)
            if not first:
                if at_start:
                    return False
                raise Closed(mid_frame=True)
            self.view = memoryview(bytearray(self.BUFFER))
            self.view[:len(first)] = first
            self.start, self.end = 0, len(first)
            if self.end >= size:
                return True
        if self.start == self.end:
            self.start = self.end = 0
        elif self.start + size > self.BUFFER:  # move the unread tail to the front
            tail = self.end - self.start
            self.view[:tail] = self.view[self.start:self.end]
            self.start, self.end = 0, tail
        while self.end - self.start < size:
            n = self.sock.recv_into(self.view[self.end:])
            self.received += n
            if n == 0:
                if at_start and self.end == self.start:
                    return False
                raise Closed(mid_frame=True)
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
            self.received += n
            if n == 0:
                raise Closed(mid_frame=True)
            got += n
        return body


def listed(names: list[str]) -> str:
    """The first ten names, and how many more."""
    more = f" and {len(names) - 10} more" if len(names) > 10 else ""
    return ", ".join(names[:10]) + more


def numbers(missing: dict[int, set[int]]) -> str:
    shown = [str(n) for n in sorted(missing)]
    return "sequence " + listed(shown) if shown else "sequence numbers beyond the limit"


def shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


def reason(exc: BaseException) -> str:
    text = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    detail = getattr(exc, "verify_message", None)  # e.g. "certificate revoked", "unable to get local issuer"
    return f"{text} ({detail})" if detail else str(text)
