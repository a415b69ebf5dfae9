"""Online pre-check figures over loopback (docs/how-to/online.md), side by side with mindstudio-probe 8.1.2's
own receiver (its twisted TCPServer, which runs on CPU even though its run_ut side needs a GPU):

* receive: MB/s and calls/s of tensor payload a receiver takes (frames sent by a raw-socket process that reads
  the acks; the receiving side drains its queue without checking), ours and msprobe's run after one another,
  --runs times; the median, and MB/s per second of the receiving process's CPU (one core's worth);
* client: the training step's time with msprobe 8.1.2's client sending to our session, to msprobe's receiver,
  and without msprobe, interleaved (the MLP and the Llama-style step of tests/data/online/msprobe81_client.py);
* session: peak RSS of the session (queue 50) over that step, and two ranks at once: what each client wrote
  (counted in the client, --trace) against the session's per-rank received = checked + skipped + refused.

    MSPROBE81_PYTHON=/path/to/venv-msprobe81/bin/python python -m benchmarks bench_online [--quick] [--runs 5]

Without MSPROBE81_PYTHON only our receiver's figures are measured.

`--workers 1 2` measures parallel checking instead (no msprobe needed): our sender streams `--calls` bf16
`linear` calls whose CPU bench is the bottleneck (`--shape`), and a session with `-o msprobe_online_workers=N`
checks them; after 8 untimed warm-up calls and a 20 s pause (torch's imports, the first checks' compiles),
it prints calls/s checked from the first timed call sent to the session's end, and the peak RSS of
the session with its workers (summed over the processes, sampled every 0.1 s), for each N in turn,
`--repeat` times interleaved.
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

from benchmarks.machine import cpu_model  # the CPU model and native bf16, as every benchmark prints it
from tests.online_helpers import free_port, wait_for_port  # the tests' own port helpers

ROOT = Path(__file__).resolve().parent.parent
CLIENT = ROOT / "tests" / "data" / "online" / "msprobe81_client.py"

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
    from pytest_msprobe.online.receiver import Admission, Receiver

    receiver = Receiver("127.0.0.1", 0, Admission(queue_size=50, max_frame=size + 1))
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


def run_client(python: str, args: list[str], cwd: Path) -> str:
    out = subprocess.run([python, str(CLIENT), *args], cwd=cwd, capture_output=True, text=True, timeout=1800)
    text = out.stdout + out.stderr
    if "CLIENT DONE" not in text:
        raise RuntimeError(text[-3000:])
    return text


def wire_calls(text: str) -> int:
    """Calls the client wrote to its connection (--trace), each sequence number once (resends reuse it)."""
    return len(set(re.findall(r"WIRE SEND CALL (\d+) ", text)))


def session(cwd: Path, port: int, clients: int = 1, extra: tuple[str, ...] = ()) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--msprobe-online",
                             f"tcp://127.0.0.1:{port}", "-o", f"msprobe_online_clients={clients}",
                             "-o", "msprobe_online_idle=300", "--msprobe-out", "results", *extra],
                            cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen[str]) -> tuple[str, float]:
    """(output, peak RSS in MiB) of a session process."""
    assert proc.stdout is not None
    text = proc.stdout.read()
    _, _, usage = os.wait4(proc.pid, 0)
    proc.returncode = 0
    return text, usage.ru_maxrss / 1024


LINEAR_CLIENT = r'''
import sys, time, torch
import pytest_msprobe.online as online
calls, rows, width = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.manual_seed(0)
x = torch.randn(rows, width).bfloat16()
w = (torch.randn(width, width) / width ** 0.5).bfloat16()
with online.send(sys.argv[1], backward=False) as sender:
    for _ in range(int(sys.argv[5])):  # warm-up: the session's and its workers' torch imports and first checks
        torch.nn.functional.linear(x, w)
    time.sleep(float(sys.argv[6]))
    print("FIRST", time.time(), flush=True)
    for _ in range(calls):
        torch.nn.functional.linear(x, w)
print("SENT", sender.sent, "ERROR", sender.error, flush=True)
'''


WARM_CALLS, WARM_S = 8, 20.0  # not timed: sent, then 20 s for the session to import torch and check them


def memory_mib(pid: int) -> tuple[float, float]:
    """(RSS, PSS) of a process in MiB; PSS shares the pages processes share (torch's libraries) among them."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            fields = {ln.split(":")[0]: int(ln.split()[1]) for ln in fh if ln.split(":")[0] in ("Rss", "Pss")}
        return fields.get("Rss", 0) / 1024, fields.get("Pss", 0) / 1024
    except (OSError, ValueError, IndexError):
        return 0.0, 0.0


def tree_memory(pid: int) -> tuple[float, float, float]:
    """(summed RSS, summed PSS, largest RSS) in MiB of pid and its children."""
    pids = [pid]
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as fh:
                pids += [int(c) for c in fh.read().split()]
    except OSError:
        pass
    each = [memory_mib(p) for p in pids]
    return sum(r for r, _ in each), sum(p for _, p in each), max(r for r, _ in each)


def check_workers(workers: int, calls: int, shape: tuple[int, int], cwd: Path) -> tuple[float, list[float], str]:
    """(calls/s checked, peak [summed RSS, summed PSS, largest RSS] in MiB, the summary line) of one session."""
    port = free_port()
    proc = session(cwd, port, extra=("-o", f"msprobe_online_workers={workers}"))
    peak = [0.0, 0.0, 0.0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[:] = [max(a, b) for a, b in zip(peak, tree_memory(proc.pid))]
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    wait_port(port)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    client = subprocess.run([sys.executable, "-c", LINEAR_CLIENT, f"tcp://127.0.0.1:{port}", str(calls),
                             str(shape[0]), str(shape[1]), str(WARM_CALLS), str(WARM_S)], capture_output=True, text=True, env=env, timeout=1800)
    first = float(client.stdout.split("FIRST")[1].split()[0])
    assert proc.stdout is not None
    out = proc.stdout.read()
    proc.wait()
    end = time.time()
    done.set()
    sampler.join()
    summary = next((ln for ln in out.splitlines() if "received" in ln), out[-2000:])
    if f"checked {calls + WARM_CALLS}" not in summary:
        raise RuntimeError(client.stdout + client.stderr + out[-3000:])
    return calls / (end - first), peak, summary


def workers_bench(opts: argparse.Namespace) -> None:
    rows, width = opts.shape
    print(f"parallel checking: {opts.calls} bf16 linear calls ({rows}x{width} @ {width}x{width}), "
          f"{os.cpu_count()} CPU cores, load average before {os.getloadavg()[0]:.1f}")
    results: dict[int, list[tuple[float, list[float]]]] = {n: [] for n in opts.workers}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(opts.repeat):
            for n in opts.workers:  # interleaved: the machine's load drifts
                rate, peak, summary = check_workers(n, opts.calls, (rows, width), Path(tmp))
                results[n].append((rate, peak))
                print(f"  workers {n}: {rate:6.2f} calls/s  peak RSS {peak[0]:5.0f} MiB summed, PSS {peak[1]:5.0f} "
                      f"MiB summed, largest process {peak[2]:.0f} MiB  [{summary.strip()}]", flush=True)
    for n, runs in results.items():
        rates = [r[0] for r in runs]
        print(f"workers {n}: median {statistics.median(rates):.2f} calls/s (min {min(rates):.2f}, max "
              f"{max(rates):.2f}); peak RSS {max(r[1][0] for r in runs):.0f} MiB summed, PSS "
              f"{max(r[1][1] for r in runs):.0f} MiB summed, largest process {max(r[1][2] for r in runs):.0f} MiB")


def receive(python: str, runs: int, quick: bool) -> None:
    size, count = 8 << 20, (32 if quick else 64)
    ours, cores, theirs = [], [], []
    for _ in range(runs):  # interleaved, so that the shared machine's load falls on both alike
        seconds, cpu = receive_ours(size, count)
        ours.append(size * count / seconds / 1e6)
        cores.append(size * count / cpu / 1e6)
        if python:
            theirs.append(size * count / receive_msprobe(python, size, count) / 1e6)
    print(f"receive: {count} frames of {size >> 20} MiB over loopback, {runs} runs ({cpu_model()}, {os.cpu_count()} cores)")
    print(f"  ours:    median {statistics.median(ours):6.0f} MB/s (runs {' '.join(f'{x:.0f}' for x in ours)}); "
          f"{statistics.median(cores):.0f} MB/s per second of the receiving process's CPU")
    if theirs:
        print(f"  msprobe: median {statistics.median(theirs):6.0f} MB/s (runs {' '.join(f'{x:.0f}' for x in theirs)})")
    small, n = 64 << 10, 2000
    ours_small, theirs_small = [], []
    for _ in range(max(3, runs // 2)):
        ours_small.append(n / receive_ours(small, n)[0])
        if python:
            theirs_small.append(n / receive_msprobe(python, small, n))
    print(f"  {n} frames of 64 KiB: ours median {statistics.median(ours_small):.0f} calls/s "
          f"(runs {' '.join(f'{x:.0f}' for x in ours_small)})" +
          (f", msprobe median {statistics.median(theirs_small):.0f} calls/s "
           f"(runs {' '.join(f'{x:.0f}' for x in theirs_small)})" if theirs_small else ""))


def msprobe_receiver(python: str) -> tuple[subprocess.Popen[str], int]:
    port = free_port()
    server = subprocess.Popen([python, "-c", MSPROBE_RECEIVER, str(port)], stdout=subprocess.PIPE, text=True,
                              stderr=subprocess.DEVNULL)
    assert server.stdout is not None
    server.stdout.readline()
    time.sleep(1)
    return server, port


def client_steps(python: str, cwd: Path, model: str, steps: int, rounds: int) -> None:
    """The training step's median time without msprobe, streaming to our session and to msprobe's receiver,
    interleaved `rounds` times."""
    args = ["--model", model, "--steps", str(steps)]
    times: dict[str, list[float]] = {"without msprobe": [], "to our session": [], "to msprobe 8.1.2's receiver": []}
    summary, rss, sent = "", 0.0, 0
    for _ in range(rounds):
        times["without msprobe"] += step_times(run_client(python, [*args, "--mode", "off"], cwd))
        port = free_port()
        proc = session(cwd, port)
        wait_port(port)
        text = run_client(python, [*args, "--mode", "tcp", "--port", str(port), "--trace"], cwd)
        times["to our session"] += step_times(text)
        sent = wire_calls(text)
        out, rss = finish(proc)
        summary = next((ln for ln in out.splitlines() if "received" in ln), out[-2000:])
        server, port = msprobe_receiver(python)
        times["to msprobe 8.1.2's receiver"] += step_times(run_client(python, [*args, "--mode", "tcp", "--port",
                                                                               str(port)], cwd))
        server.wait(120)
    print(f"client step ({model}, {steps} step(s) x {rounds} rounds, {sent} calls per run): " +
          ", ".join(f"{k} {statistics.median(v):.3f} s" for k, v in times.items() if v))
    print(f"  our session: {summary}; peak RSS {rss:.0f} MiB (queue 50)")


def two_ranks(python: str, cwd: Path, layers: int) -> None:
    """Two ranks at once (gloo on CPU), each streaming its own Llama-style step to one session."""
    port = free_port()
    proc = session(cwd, port, clients=2)
    wait_port(port)
    init = f"file://{cwd / f'gloo_init_{port}'}"
    # each client's output to a file: a pipe that is not read while the other client is waited for fills up
    # (64 KiB, about 700 calls of msprobe's log), and the client then blocks in its logging, silently
    logs = [cwd / f"client_rank{r}_{port}.log" for r in (0, 1)]
    ranks = []
    for r, log in enumerate(logs):
        with log.open("w") as sink:
            ranks.append(subprocess.Popen([python, str(CLIENT), "--model", "llama", "--layers", str(layers), "--steps",
                                           "1", "--mode", "tcp", "--port", str(port), "--world", "2", "--rank", str(r),
                                           "--init", init, "--trace"], cwd=cwd, stdout=sink, stderr=subprocess.STDOUT))
    for p in ranks:
        p.wait(timeout=1800)
    texts = [log.read_text() for log in logs]
    out, rss = finish(proc)
    received = {int(r): int(n) for r, n in re.findall(r"msprobe online: rank(\d+): received (\d+) =", out)}
    for r, text in enumerate(texts):
        print(f"two ranks ({layers} layers): rank {r} wrote {wire_calls(text)} calls, the session received "
              f"{received.get(r)}; the client's own drops after 60 s waits: "
              f"{text.count('send_queue put send_data timeout')}")
    for r, text in enumerate(texts):  # a client that went quiet: its state and stacks, as --trace printed them
        stall = text[text.find("WIRE STALL"):] if "WIRE STALL" in text else ""
        if stall:
            print(f"  rank {r}: " + "\n    ".join(ln for ln in stall.splitlines()[:60] if not ln.startswith("WIRE ")
                                                  or ln.startswith("WIRE STALL")))
    print(f"  session peak RSS {rss:.0f} MiB")
    for line in out.splitlines():
        if line.startswith("msprobe online:") or line.startswith(("FAILED", "=")) and "passed" in line:
            print("  " + line)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--runs", type=int, default=5, help="interleaved runs of each receive figure (median)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the client-step comparison")
    parser.add_argument("--only", choices=["receive", "client", "ranks"], default=None)
    parser.add_argument("--workers", type=int, nargs="*", default=None,
                        help="measure parallel checking with these msprobe_online_workers values instead")
    parser.add_argument("--calls", type=int, default=60)
    parser.add_argument("--shape", type=int, nargs=2, default=(256, 2048), metavar=("ROWS", "WIDTH"))
    parser.add_argument("--repeat", type=int, default=3)
    opts = parser.parse_args()
    if opts.workers:
        workers_bench(opts)
        return
    python = os.environ.get("MSPROBE81_PYTHON", "")
    if opts.only in (None, "receive"):
        receive(python, opts.runs, opts.quick)
    if not python:
        print("MSPROBE81_PYTHON not set: no client figures")
        return
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        if opts.only in (None, "client"):
            client_steps(python, cwd, "mlp", opts.steps, opts.rounds)
            if not opts.quick:
                client_steps(python, cwd, "llama", 1, 1)
        if opts.only in (None, "ranks"):
            two_ranks(python, cwd, 1 if opts.quick else 2)


if __name__ == "__main__":
    main()
