"""The receiving end of msprobe's shared-storage transport (`nfs_path`): one pickle file per call.

msprobe's client writes `start_<unix time>` when it starts, `<call name>.pt` (a plain pickle of its ApiData)
per call and `end_<unix time>` when it stops, into the shared folder; the receiver takes each file and
deletes it. Here a poller thread moves files into the same bounded queue as the TCP receiver (a full queue
leaves the files on disk), refuses files over the size limit unread, and waits for a file whose pickle is
not complete yet (its last byte is not the STOP opcode) until it stops growing. The session ends when `end`
markers of `clients` writers have arrived and no call file is left. Torch-free.

A file (call or marker) is touched only once its size, mtime and ctime have stayed the same for _QUIET_S on
this host's clock: msprobe 8.1's client closes each file, checks that it exists and then sets its mode, and a
file deleted between those two steps makes the client's chmod raise and its error handler crash the client.
The steadiness is timed locally, so a shared filesystem whose server clock differs delays nothing.
"""
from __future__ import annotations

import queue
import threading
import time
from pathlib import Path
from typing import Any, Callable

from .receiver import ADMIT_ONE, Admission, Call, Stats

_POLL_S = 0.02
_QUIET_S = 0.2  # a file unchanged for this long is its writer's no more (its mode set too)
_SETTLE_S = 2.0  # an incomplete file that has not changed for this long is taken as it is (and refused)


class NfsReceiver:
    def __init__(self, folder: Path, admission: Admission = ADMIT_ONE, *,
                 log: Callable[[str], None] | None = None) -> None:
        self.folder = folder
        self.calls: queue.Queue[Call] = queue.Queue(maxsize=max(1, admission.queue_size))
        self.max_frame = admission.max_frame
        ranks = admission.ranks
        self.clients = max(1, len(ranks) if ranks else admission.clients)  # one end marker per writer
        self.finished = threading.Event()
        self.stats = Stats()
        self._log = log
        self._closing = False
        self._sequence = 0
        self._ends = 0
        self._seen: dict[Path, tuple[tuple[int, int, int], float]] = {}  # (size, mtime, ctime) and since when

    def start(self) -> int:
        self.folder.mkdir(parents=True, exist_ok=True)
        if self.folder.stat().st_mode & 0o022:  # files carry no sender: whoever can write here is a client
            self.log(f"msprobe online: nfs_path {self.folder} is writable by its group or by others: any of them "
                     f"can add calls or an end marker (ending the session early); chmod go-w it")
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

    def client_lines(self, idle: bool = False) -> list[str]:
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

    def _steady(self, path: Path) -> float:
        """Seconds (this host's monotonic clock) that `path`'s size, mtime and ctime have stayed as they are now;
        -1 when it is gone."""
        try:
            stat = path.stat()
        except OSError:
            self._seen.pop(path, None)
            return -1.0
        signature, now = (stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns), time.monotonic()
        seen = self._seen.get(path)
        if seen is None or seen[0] != signature:
            self._seen[path] = (signature, now)
            return 0.0
        return now - seen[1]

    def _remove(self, path: Path) -> None:
        self._seen.pop(path, None)
        _remove(path)

    def _scan(self) -> bool:
        for marker in sorted(self.folder.glob("start*")):
            if self._steady(marker) >= _QUIET_S:
                self._remove(marker)
                self.stats.connections += 1
        files = sorted(self.folder.glob("*.pt"), key=_written)
        taken = False
        ages = [(path, self._steady(path)) for path in files]  # every file's clock starts when first seen
        for path, age in ages:
            if self._closing:
                return taken
            if 0.0 <= age < _QUIET_S:
                break  # later files wait for it: read at its own instant, a later file's age can cross _QUIET_S
                # first, and it would be taken before an earlier one, out of the order they were written
            taken |= self._take(path)
        if not files:
            for marker in sorted(self.folder.glob("end*")):
                if self._steady(marker) >= _QUIET_S:
                    self._remove(marker)
                    self._ends += 1
            if self._ends >= self.clients:
                self.finished.set()
        return taken

    def _take(self, path: Path) -> bool:
        steady = self._steady(path)
        if steady < _QUIET_S:
            return False  # gone, or still its writer's
        size = self._seen[path][0][0]
        if size > self.max_frame:
            self.stats.refused_frames += 1
            self.log(f"msprobe online: {path.name}: {size} bytes refused unread: the limit is "
                     f"{self.max_frame} bytes (msprobe_online_max_frame)")
            self._remove(path)
            return True
        try:
            data = path.read_bytes()
        except OSError:
            return False
        if not data.endswith(b".") and steady < _SETTLE_S:
            return False  # still being written
        self._remove(path)
        call = Call(None, None, self._sequence, data, f"nfs:{path.name}", nfs=True)
        self._sequence += 1
        while not self._closing:
            try:
                self.calls.put(call, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False


def _written(path: Path) -> tuple[int, str]:
    """Files in the order they were written: mtime to the nanosecond, then name, for two files written within one
    tick of the file system's clock (a sender that numbers its files keeps its order; one that does not is still
    taken the same way each time)."""
    try:
        return path.stat().st_mtime_ns, path.name
    except OSError:
        return 0, path.name


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass
