"""Online pre-check figures over loopback (docs/how-to/online.md), side by side with mindstudio-probe 8.1.2's
own receiver (its twisted TCPServer, which runs on CPU even though its run_ut side needs a GPU):

* receive: MB/s and calls/s of tensor payload a receiver takes (frames sent by a raw-socket process that reads
  the acks; the receiving side drains its queue without checking);
* client: the training step's time with msprobe 8.1.2's client sending to our session, to msprobe's receiver,
  and without msprobe (the Llama-style step of tests/data/online/msprobe81_client.py);
* session: peak RSS of the session (queue 50) over that step, and every call accounted for with two ranks.

    MSPROBE81_PYTHON=/path/to/venv-msprobe81/bin/python python benchmarks/bench_online.py [--quick]

Without MSPROBE81_PYTHON only our receiver's figures are measured.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
CLIENT = ROOT / "tests" / "data" / "online" / "msprobe81_client.py"

from tests.online_helpers import free_port, wait_for_port  # noqa: E402  (the tests' own port helpers)

SENDER = r'''
import os, socket, sys, threading, time, zlib, struct
port, size, count = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
body = os.urandom(size)
crc = b"%08x" % zlib.crc32(body)
sock = socket.create_connection(("127.0.0.1", port))
acked = threading.Semaphore(0)
def acks():
    buf = b""
    while True:
        chunk = sock.recv(1 << 16)
        if not chunk:
            return
        buf += chunk
        while len(buf) >= 29:
            if buf[:5] == b"OK___":
                acked.release()
            buf = buf[29:]
threading.Thread(target=acks, daemon=True).start()
start = time.perf_counter()
for seq in range(count):
    sock.sendall(struct.pack("!QQQQ", size, seq, 0, 0) + crc)
    sock.sendall(body)
for _ in range(count):
    acked.acquire()
elapsed = time.perf_counter() - start
print("ELAPSED", elapsed, flush=True)
stop = b"STOP_"
sock.sendall(struct.pack("!QQQQ", 5, count, 0, 0) + b"%08x" % zlib.crc32(stop) + stop)
time.sleep(0.5)
'''

MSPROBE_RECEIVER = r'''
import sys, time
from multiprocessing import Queue
from msprobe.pytorch.api_accuracy_checker.tensor_transport_layer.server import TCPServer
queue = Queue(maxsize=50)
server = TCPServer(int(sys.argv[1]), queue, check_sum=True, tls_path="")
server.start()
print("LISTENING", flush=True)
n = nbytes = 0
while True:
    item = queue.get()
    if item in (b"KILL_", b"STOP_"):
        break
    n += 1
    nbytes += len(item)
print("RECEIVED", n, nbytes, flush=True)
'''


def wait_port(port: int) -> None:
    if not wait_for_port(port):
        raise RuntimeError(f"nothing listens on {port}")


def receive_ours(size: int, count: int) -> tuple[float, float]:
    """(seconds, CPU seconds of this process) for `count` frames of `size` bytes into our Receiver."""
    from pytest_msprobe.online.receiver import Receiver

    receiver = Receiver("127.0.0.1", 0, queue_size=50, max_frame=size + 1)
    port = receiver.start()
    got = 0

    def drain() -> None:
        nonlocal got
        while got < count:
            receiver.calls.get()
            got += 1

    drainer = threading.Thread(target=drain, daemon=True)
    drainer.start()
    cpu0 = time.process_time()
    out = subprocess.run([sys.executable, "-c", SENDER, str(port), str(size), str(count)], capture_output=True,
                         text=True, timeout=600)
    cpu = time.process_time() - cpu0
    drainer.join(60)
    receiver.close()
    return float(out.stdout.split("ELAPSED")[1].split()[0]), cpu


def receive_msprobe(python: str, size: int, count: int) -> float:
    port = free_port()
    server = subprocess.Popen([python, "-c", MSPROBE_RECEIVER, str(port)], stdout=subprocess.PIPE, text=True,
                              stderr=subprocess.DEVNULL)
    assert server.stdout is not None
    server.stdout.readline()
    time.sleep(1)  # no probe connection: msprobe's receiver ends when any connection closes
    out = subprocess.run([sys.executable, "-c", SENDER, str(port), str(size), str(count)], capture_output=True,
                         text=True, timeout=900)
    server.wait(120)
    return float(out.stdout.split("ELAPSED")[1].split()[0])


def step_times(text: str) -> list[float]:
    match = re.search(r"STEP_SECONDS ([\d. ]+)", text)
    return [float(x) for x in match.group(1).split()] if match else []


def run_client(python: str, args: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    out = subprocess.run([python, str(CLIENT), *args], cwd=cwd, capture_output=True, text=True, timeout=1800,
                         env={**os.environ, **(env or {})})
    text = out.stdout + out.stderr
    if "CLIENT DONE" not in text:
        raise RuntimeError(text[-3000:])
    return text


def sent_calls(text: str) -> int:
    dumped = re.findall(r"tools is dumping api: (\S+), rank", text)
    unsaved = set(re.findall(r"\] (\S+) can not be saved, skip", text))
    return sum(1 for d in dumped if d not in unsaved)


def session(cwd: Path, port: int, clients: int = 1, extra: tuple[str, ...] = ()) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--msprobe-online",
                             f"tcp://127.0.0.1:{port}", "--msprobe-online-clients", str(clients),
                             "--msprobe-online-idle", "300", "--msprobe-out", "results", *extra],
                            cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen[str]) -> tuple[str, float]:
    """(output, peak RSS in MiB) of a session process."""
    assert proc.stdout is not None
    text = proc.stdout.read()
    _, _, usage = os.wait4(proc.pid, 0)
    proc.returncode = 0
    return text, usage.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--steps", type=int, default=3)
    opts = parser.parse_args()
    python = os.environ.get("MSPROBE81_PYTHON", "")
    size, count = 8 << 20, (32 if opts.quick else 128)
    print(f"receive: {count} frames of {size >> 20} MiB over loopback (CPU: {os.cpu_count()} cores)")
    for _ in range(1 if opts.quick else 3):
        seconds, cpu = receive_ours(size, count)
        print(f"  ours:    {size * count / seconds / 1e6:8.0f} MB/s  {count / seconds:7.1f} calls/s  "
              f"(receiving process CPU {cpu:.2f} s for {seconds:.2f} s)")
        if python:
            seconds = receive_msprobe(python, size, count)
            print(f"  msprobe: {size * count / seconds / 1e6:8.0f} MB/s  {count / seconds:7.1f} calls/s")
    small = 64 << 10
    seconds, _ = receive_ours(small, 2000)
    print(f"  ours, 2000 frames of 64 KiB: {2000 / seconds:.0f} calls/s")
    if python:
        print(f"  msprobe, 2000 frames of 64 KiB: {2000 / receive_msprobe(python, small, 2000):.0f} calls/s")
    if not python:
        print("MSPROBE81_PYTHON not set: no client figures")
        return

    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        args = ["--model", "llama", "--steps", str(opts.steps)]
        off = step_times(run_client(python, [*args, "--mode", "off"], cwd))
        port = free_port()
        proc = session(cwd, port)
        wait_port(port)
        text = run_client(python, [*args, "--mode", "tcp", "--port", str(port)], cwd)
        ours = step_times(text)
        out, rss = finish(proc)
        summary = [ln for ln in out.splitlines() if "received" in ln]
        print(f"client step (Llama-style, {opts.steps} steps, {sent_calls(text)} calls sent): "
              f"without msprobe {statistics.median(off):.3f} s, to our session {statistics.median(ours):.3f} s")
        print(f"  session: {summary[0] if summary else out[-2000:]}; peak RSS {rss:.0f} MiB (queue 50)")
        port = free_port()
        server = subprocess.Popen([python, "-c", MSPROBE_RECEIVER, str(port)], stdout=subprocess.PIPE, text=True,
                                  stderr=subprocess.DEVNULL)
        assert server.stdout is not None
        server.stdout.readline()
        time.sleep(1)
        theirs = step_times(run_client(python, [*args, "--mode", "tcp", "--port", str(port)], cwd))
        server.wait(120)
        print(f"  to msprobe 8.1.2's receiver {statistics.median(theirs):.3f} s")

        # two ranks at once (gloo on CPU), each streaming its own step to one session
        port = free_port()
        proc = session(cwd, port, clients=2)
        wait_port(port)
        init = f"file://{cwd / 'gloo_init'}"
        ranks = [subprocess.Popen([python, str(CLIENT), "--model", "llama", "--steps", "1", "--mode", "tcp",
                                   "--port", str(port), "--world", "2", "--rank", str(r), "--init", init], cwd=cwd,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
        texts = [p.communicate(timeout=1800)[0] for p in ranks]
        sent = [sent_calls(t) for t in texts]
        dropped = [t.count("send_queue put send_data timeout") for t in texts]  # the client's own 60 s drops
        out, rss = finish(proc)
        print(f"two ranks: sent {sent[0]} + {sent[1]} calls (the client itself dropped {dropped[0]} + {dropped[1]} "
              f"after 60 s waits); session peak RSS {rss:.0f} MiB")
        for line in out.splitlines():
            if line.startswith("msprobe online:") or line.startswith(("FAILED", "=")) and "passed" in line:
                print("  " + line)


if __name__ == "__main__":
    main()
