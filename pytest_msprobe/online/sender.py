"""Our own online client, for msprobe 8.2 and later (which dropped the online mode): the same wire format and
bodies as msprobe 8.1's client, so the same session checks either.

    with pytest_msprobe.online.send("tcp://127.0.0.1:59208"):
        train_step()

capture.py sees the calls (the forward's torch, functional and Tensor calls; the backward's aten ops) and each
is numbered per API as msprobe numbers it (`Functional.linear.0`, `Torch.matmul.3`, `Aten.mm.1`). An in-place
call's input is copied before the call, so its check knows the input (msprobe's client sends it after the
change).

Each call is serialised in the calling thread (its tensors may change right after) and sent by a thread that
keeps at most `window` calls unacknowledged: the training step waits when the receiver falls behind. On exit
every call is acknowledged, then `STOP_` is sent and the session's `OVER_`/`KILL_` awaited.
"""
from __future__ import annotations

import io
import os
import pickle
import socket
import ssl
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..runs.leaves import map_structure
from . import protocol
from .capture import Capture, plain_kwargs
from .endpoint import parse
from .safeload import MSPROBE_API_DATA, ApiData

_PyPickler: Any = pickle._Pickler  # the pure-Python pickler: its save_global can name msprobe's ApiData


class _Pickler(_PyPickler):  # type: ignore[misc]
    def save_global(self, obj: Any, name: str | None = None) -> None:
        if obj is ApiData:
            module, qualname = MSPROBE_API_DATA
            if self.proto >= 4:
                self.save(module)
                self.save(qualname)
                self.write(pickle.STACK_GLOBAL)
            else:  # torch.save's protocol 2
                self.write(pickle.GLOBAL + f"{module}\n{qualname}\n".encode())
            self.memoize(obj)
            return
        super().save_global(obj, name)


class _PickleModule:
    Pickler = _Pickler
    Unpickler = pickle.Unpickler


def encode(call: ApiData) -> bytes:
    """A TCP body: torch.save(ApiData) with the class named as msprobe's, as its client sends."""
    buffer = io.BytesIO()
    torch.save(call, buffer, pickle_module=_PickleModule)
    return buffer.getvalue()


def encode_nfs(call: ApiData | str) -> bytes:
    """An nfs_path file: a plain pickle of the ApiData (or the marker strings), as msprobe's client writes."""
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=4).dump(call)
    return buffer.getvalue()


def _snapshot(value: Any) -> Any:
    return map_structure(lambda v: v.detach().cpu() if isinstance(v, torch.Tensor) else v, value)


@dataclass(frozen=True)
class SendOptions:
    """`send()`'s keywords: the rank (else $RANK), the first step's number, how many calls may wait for their
    acknowledgement, CRC32 on each frame, the TLS folder, whether backward is sent, and how long to wait."""

    rank: int | None = None
    step: int = 0
    window: int = 20
    check_sum: bool = True
    tls_path: str | None = None
    backward: bool = True
    timeout: float = 600.0


class Sender:
    """The context manager `send()` returns; `step()` starts the next training step's numbering."""

    def __init__(self, address: str, options: SendOptions) -> None:
        self.endpoint = parse(address, options.tls_path)
        self.rank = int(os.environ.get("RANK", "0")) if options.rank is None else options.rank
        self.current_step, self.window, self.check_sum = options.step, max(1, options.window), options.check_sum
        self.timeout = options.timeout
        self.capture = Capture(self.record, backward=options.backward)
        self.counters: defaultdict[str, int] = defaultdict(int)
        self.sent = 0
        self._sequence = 0
        self._pending: dict[int, bytes] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._sock: socket.socket | None = None
        self._stopped = False
        self._wlock = threading.Lock()
        self.error: str | None = None  # the last call that could not be sent, or unacknowledged calls

    # ---------------------------------------------------------------- context
    def __enter__(self) -> Sender:
        if self.endpoint.kind == "nfs":
            assert self.endpoint.path is not None
            self.endpoint.path.mkdir(parents=True, exist_ok=True)
            self._write_file(f"start_{int(time.time())}", encode_nfs("start"))
        else:
            self._connect()
        self.capture.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.capture.__exit__(*exc)
        if self.endpoint.kind == "nfs":
            self._write_file(f"end_{int(time.time())}", encode_nfs("end"))
        else:
            self._finish()

    def step(self) -> None:
        self.current_step += 1
        self.counters.clear()

    # ---------------------------------------------------------------- calls
    def record(self, api: str, args: Any, kwargs: Any, out: Any) -> None:
        index = self.counters[api]
        self.counters[api] += 1
        kwargs = plain_kwargs(kwargs)  # the defaults it drops cannot be pickled by name either
        call = ApiData(f"{api}.{index}", tuple(_snapshot(list(args))), _snapshot(kwargs), _snapshot(out),
                       self.current_step, self.rank)
        try:
            if self.endpoint.kind == "nfs":  # msprobe names the file <call>.pt: step 1 overwrote step 0's
                self._write_file(f"rank{self.rank}.step{self.current_step}.{self._sequence:09d}.{call.name}.pt",
                                 encode_nfs(call))
                self._sequence += 1
            else:
                self._send(encode(call))
        except (pickle.PicklingError, RuntimeError, TypeError, AttributeError) as exc:
            self.error = f"{call.name} not sent: {exc}"
            return
        self.sent += 1

    # ---------------------------------------------------------------- transports
    def _write_file(self, name: str, data: bytes) -> None:
        assert self.endpoint.path is not None
        tmp = self.endpoint.path / f".{name}.{os.getpid()}.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, self.endpoint.path / name)  # the receiver never sees half a file

    def _connect(self) -> None:
        sock = socket.create_connection((self.endpoint.host, self.endpoint.port), timeout=self.timeout)
        if self.endpoint.kind == "tls":
            folder = Path(self.endpoint.path or ".")
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            ctx.minimum_version = ssl.TLSVersion.TLSv1_2
            ctx.load_cert_chain(folder / "client.crt", folder / "client.key",
                                password=lambda: os.environ.get("MSPROBE_TLS_PASSPHRASE", ""))
            ctx.load_verify_locations(cafile=folder / "ca.crt")
            ctx.check_hostname = False  # msprobe's certificates name no host; the chain is verified
            sock = ctx.wrap_socket(sock)
        sock.settimeout(None)
        self._sock = sock
        threading.Thread(target=self._acks, name="msprobe-online-acks", daemon=True).start()

    def _send(self, body: bytes) -> None:
        with self._cond:
            deadline = time.monotonic() + self.timeout
            while len(self._pending) >= self.window and not self._closed:
                if not self._cond.wait(timeout=max(0.0, deadline - time.monotonic())):
                    raise RuntimeError(f"no acknowledgement from {self.endpoint} for {self.timeout:.0f} s")
            if self._closed:
                raise RuntimeError(f"the connection to {self.endpoint} is closed")
            sequence = self._sequence
            self._sequence += 1
            self._pending[sequence] = body
        self._write(body, sequence)

    def _write(self, body: bytes, sequence: int) -> None:
        assert self._sock is not None
        head = protocol.HEADER.pack(len(body), sequence, self.rank, self.current_step)
        crc = protocol.crc_text(body) if self.check_sum else b""
        with self._wlock:
            self._sock.sendall(head + crc)
            self._sock.sendall(body)

    def _acks(self) -> None:
        assert self._sock is not None
        buffer = b""
        while True:
            try:
                chunk = self._sock.recv(4096)
            except OSError:
                chunk = b""
            if not chunk:
                with self._cond:
                    self._closed = True
                    self._cond.notify_all()
                return
            buffer += chunk
            while len(buffer) >= protocol.ACK.size:
                word, sequence, _, _ = protocol.parse_ack(buffer[:protocol.ACK.size])
                buffer = buffer[protocol.ACK.size:]
                self._ack(word, sequence)

    def _ack(self, word: bytes, sequence: int) -> None:
        with self._cond:
            if word == protocol.OK:
                self._pending.pop(sequence, None)
            elif word == protocol.ERROR and sequence in self._pending:
                body = self._pending[sequence]
                threading.Thread(target=self._write, args=(body, sequence), daemon=True).start()
            elif word in (protocol.OVER, protocol.KILL):
                self._closed = word == protocol.KILL or self._closed
                self._stopped = True
            self._cond.notify_all()

    def _finish(self) -> None:
        with self._cond:
            deadline = time.monotonic() + self.timeout
            while self._pending and not self._closed:
                if not self._cond.wait(timeout=max(0.0, deadline - time.monotonic())):
                    break
            self._stopped = False
            unacked = len(self._pending)
        if not self._closed:
            self._write(protocol.STOP, self._sequence)
            with self._cond:
                self._cond.wait_for(lambda: self._stopped or self._closed, timeout=60)
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
        if unacked:
            self.error = f"{unacked} call(s) were not acknowledged by {self.endpoint}"
