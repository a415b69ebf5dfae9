"""The receiving end of msprobe's shared-storage transport (`nfs_path`): one pickle file per call.

msprobe's client writes `start_<unix time>` when it starts, `<call name>.pt` (a plain pickle of its ApiData)
per call and `end_<unix time>` when it stops, into the shared folder; the receiver takes each file and
deletes it. Here a poller thread moves files into the same bounded queue as the TCP receiver (a full queue
leaves the files on disk), refuses files over the size limit unread, and waits for a file whose pickle is
not complete yet (its last byte is not the STOP opcode) until it stops growing. The session ends when `end`
markers of `clients` writers have arrived and no call file is left. Torch-free.
"""
from __future__ import annotations

import queue
import threading
import time
from pathlib import Path
from typing import Any, Callable

from .receiver import Call, Stats

_POLL_S = 0.02
_SETTLE_S = 2.0  # an incomplete file that has not changed for this long is taken as it is (and refused)


class NfsReceiver:
    def __init__(self, folder: Path, *, queue_size: int = 50, max_frame: int, clients: int = 1,
                 ranks: tuple[int, ...] | None = None, log: Callable[[str], None] | None = None) -> None:
        self.folder = folder
        self.calls: queue.Queue[Call] = queue.Queue(maxsize=max(1, queue_size))
        self.max_frame = max_frame
        self.clients = max(1, len(ranks) if ranks else clients)  # one end marker per writer
        self.finished = threading.Event()
        self.stats = Stats()
        self._log = log
        self._closing = False
        self._sequence = 0
        self._ends = 0

    def start(self) -> int:
        self.folder.mkdir(parents=True, exist_ok=True)
        threading.Thread(target=self._poll, name="msprobe-online-nfs", daemon=True).start()
        return 0

    def close(self) -> None:
        self._closing = True

    def log(self, line: str) -> None:
        self.stats.lines.append(line)
        if self._log is not None:
            self._log(line)

    # what the session tells and asks (receiver.Receiver's): files carry no connection, the clients are the
    # writers of end markers
    def accept(self, call: Call) -> None:
        pass

    def is_client(self, call: Call) -> bool:
        return True

    def unstopped(self) -> list[Any]:
        return []

    def client_lines(self) -> list[str]:
        return []

    def waiting_for(self) -> str:
        return f"{self.clients - self._ends} more end marker(s) in {self.folder}"

    def _poll(self) -> None:
        while not self._closing and not self.finished.is_set():
            try:
                busy = self._scan()
            except OSError as exc:
                self.log(f"msprobe online: nfs_path {self.folder}: {exc.strerror or exc}")
                busy = False
            if not busy:
                time.sleep(_POLL_S)

    def _scan(self) -> bool:
        for marker in sorted(self.folder.glob("start*")):
            _remove(marker)
            self.stats.connections += 1
        files = sorted(self.folder.glob("*.pt"), key=_mtime)
        taken = False
        for path in files:
            if self._closing:
                return taken
            taken |= self._take(path)
        if not files:
            ends = sorted(self.folder.glob("end*"))
            for marker in ends:
                _remove(marker)
                self._ends += 1
            if self._ends >= self.clients:
                self.finished.set()
        return taken

    def _take(self, path: Path) -> bool:
        try:
            stat = path.stat()
        except OSError:
            return False
        if stat.st_size > self.max_frame:
            self.stats.refused_frames += 1
            self.log(f"msprobe online: {path.name}: {stat.st_size} bytes refused unread: the limit is "
                     f"{self.max_frame} bytes (--msprobe-online-max-frame)")
            _remove(path)
            return True
        try:
            data = path.read_bytes()
        except OSError:
            return False
        if not data.endswith(b".") and time.time() - stat.st_mtime < _SETTLE_S:
            return False  # still being written
        _remove(path)
        call = Call(None, None, self._sequence, data, f"nfs:{path.name}", nfs=True)
        self._sequence += 1
        while not self._closing:
            try:
                self.calls.put(call, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass
