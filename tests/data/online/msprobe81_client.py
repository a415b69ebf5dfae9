"""A training step under mindstudio-probe 8.1.2's NPU-side client, run on CPU in that version's own virtualenv
(tests/test_online_msprobe.py, benchmarks/bench_online.py). Not imported by the test-suite itself.

    python msprobe81_client.py --mode tcp --port 59208 [--bug] [--model llama] [--steps 1] [--unfixed [--stall-at N]]
    python msprobe81_client.py --mode tls --port 59208 --tls DIR      (client.key/.crt, ca.crt; key passphrase in
                                                                      $CLIENT_KEY_PASSPHRASE, msprobe asks for it)
    python msprobe81_client.py --mode nfs --nfs DIR
    python msprobe81_client.py --mode dump --dump DIR                 (the same step as an L1 tensor dump)
    python msprobe81_client.py --mode off                             (no msprobe: the step's own time)

--bug plants a wrong gelu (1 % too large) in the model before msprobe wraps torch.nn.functional, as a broken
device kernel would be. Prints "STEP_SECONDS <s>" for the timed steps.
"""
import argparse
import json
import os
import sys
import time

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--mode", choices=["tcp", "tls", "nfs", "dump", "off"], default="tcp")
parser.add_argument("--port", type=int, default=0)
parser.add_argument("--tls", default="")
parser.add_argument("--nfs", default="")
parser.add_argument("--dump", default="./dump_path")
parser.add_argument("--bug", action="store_true")
parser.add_argument("--model", choices=["mlp", "llama"], default="mlp")
parser.add_argument("--steps", type=int, default=1)
parser.add_argument("--hidden", type=int, default=64)
parser.add_argument("--rank", type=int, default=-1, help="with --world 2: this process's rank (gloo on CPU)")
parser.add_argument("--world", type=int, default=1)
parser.add_argument("--init", default="")
parser.add_argument("--layers", type=int, default=2)
parser.add_argument("--unfixed", action="store_true",
                    help="msprobe 8.1.2's TCP client as it ships, without examples/online_client/sender_fix.py: it "
                         "stalls for good now and then (docs/how-to/online.md)")
parser.add_argument("--stall-at", type=int, default=0, metavar="N",
                    help="with --unfixed: widen the race window of msprobe 8.1.2's shared FileSender at the end of "
                         "its Nth transfer (the reactor thread pauses between the Deferred's callback and "
                         "`deferred = None`, as when it is descheduled there), so that the client stalls there")
parser.add_argument("--trace", action="store_true", help="log each frame the client writes and each ack it reads")
parser.add_argument("--lose", type=int, default=-1, metavar="SEQUENCE",
                    help="with --trace: the first write of this frame goes nowhere, as when the client's sending thread "
                         "races its reactor thread (twisted's write buffer is swapped under it) and the frame is lost "
                         "before the wire; it stays in the client's table of unacknowledged calls")
args = parser.parse_args()

if args.bug:
    _gelu = torch.nn.functional.gelu

    def gelu(input, approximate="none"):  # noqa: A002 - torch's own parameter name
        return _gelu(input, approximate=approximate) * 1.01

    torch.nn.functional.gelu = gelu

if args.mode == "tls":
    import pwinput  # msprobe 8.1.2 asks for the key's passphrase on the terminal

    pwinput.pwinput = lambda *a, **k: os.environ.get("CLIENT_KEY_PASSPHRASE", "")

if args.world > 1:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=args.init, rank=args.rank, world_size=args.world)

from msprobe.pytorch import PrecisionDebugger  # noqa: E402 - after the planted bug, as a model's own code

if args.mode == "tcp" and not args.unfixed:
    # the example's FileSender per transfer, the workaround docs/how-to/online.md gives: with msprobe 8.1.2's one
    # shared FileSender its TCP client stalls for good now and then (a race in the client, reproduced by
    # test_the_tcp_client_stall_is_a_shared_file_sender_race), which would fail these tests at random
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "examples",
                                    "online_client"))
    from sender_fix import one_file_sender_per_transfer

    one_file_sender_per_transfer()

if args.stall_at:
    # twisted's FileSender.resumeProducing as it is, with a pause between the two lines the race falls between: the
    # sending thread, polling the Deferred every 10 ms, begins the next transfer in the gap, and its Deferred is lost
    from twisted.protocols.basic import FileSender

    _ends = [0]

    def resume_producing(self):
        chunk = self.file.read(self.CHUNK_SIZE) if self.file else b""
        if not chunk:
            self.file = None
            self.consumer.unregisterProducer()
            if self.deferred:
                self.deferred.callback(self.lastSent)
                _ends[0] += 1
                if _ends[0] == args.stall_at:
                    time.sleep(0.5)
                self.deferred = None
            return
        if self.transform:
            chunk = self.transform(chunk)
        self.consumer.write(chunk)
        self.lastSent = chunk[-1:]

    FileSender.resumeProducing = resume_producing

if args.trace:
    # What the client itself puts on the wire, counted on its side (not the receiver's): each frame handed to
    # its send function (WIRE SEND), the bytes its reactor gave the kernel (WIRE TOTAL), each ack it read (WIRE
    # ACK, assuming acks are not split across reads), and, when it sent nothing for 20 s, its state and stacks.
    import faulthandler
    import threading

    from msprobe.pytorch.api_accuracy_checker.tensor_transport_layer import client as _client
    from twisted.internet import tcp as _tcp

    _wire = {"queued": 0, "begun": 0, "written": 0, "last": time.monotonic()}
    _send, _received = _client.ClientProtocol.send_wrapped_data, _client.ClientProtocol.dataReceived
    _write_some, _tcp_init = _tcp.Connection.writeSomeData, _client.TCPClient.__init__

    def write_some(self, data):
        n = _write_some(self, data)
        if isinstance(n, int) and n > 0:
            _wire["written"] += n
        return n

    def send_wrapped_data(self, data, sequence_number=0, rank=0, step=0):
        kind = "STOP" if data == b"STOP_" else "CALL"
        _wire["queued"] += 32 + (8 if self.check_sum else 0) + len(data)
        _wire["last"] = time.monotonic()
        print(f"WIRE SEND {kind} {sequence_number} {rank} {step} {len(data)}", file=sys.stderr, flush=True)
        if sequence_number == args.lose and kind == "CALL":
            args.lose = -1
            _wire["queued"] -= 32 + (8 if self.check_sum else 0) + len(data)
            print(f"WIRE LOST {sequence_number}", file=sys.stderr, flush=True)
            return None
        done = _send(self, data, sequence_number=sequence_number, rank=rank, step=step)
        _wire["begun"] += 32 + (8 if self.check_sum else 0) + len(data)  # its transfer has begun
        print(f"WIRE BEGUN {kind} {sequence_number}", file=sys.stderr, flush=True)
        return done

    def data_received(self, data):
        for i in range(0, len(data) - 28, 29):
            print(f"WIRE ACK {data[i:i + 5].decode(errors='replace')} {int.from_bytes(data[i + 5:i + 13], 'big')}",
                  file=sys.stderr, flush=True)
        return _received(self, data)

    def tcp_init(self, *a, **k):
        _tcp_init(self, *a, **k)

        def watch():
            while time.monotonic() - _wire["last"] < 20:
                time.sleep(2)
            p = self.tcp_manager
            t, f = p.transport, p.file_sender
            unflushed = len(t.dataBuffer) - t.offset + t._tempDataLen  # in twisted's buffer, not yet in the kernel
            unread = len(f.file.getvalue()) - f.file.tell() if f.file is not None else 0  # in the FileSender's file
            print(f"WIRE STALL unacknowledged {sorted(self.resend_dict)} send_queue {self.send_queue.qsize()} "
                  f"{[d.sequence_number for d in list(self.send_queue.queue)]} "
                  f"ack_queue {p.ack_queue.qsize()} defer_called {getattr(p.defer, 'called', None)} "
                  f"queued {_wire['queued']} begun {_wire['begun']} written {_wire['written']} unflushed {unflushed} unread {unread}",
                  file=sys.stderr, flush=True)
            faulthandler.dump_traceback(file=sys.stderr)

        threading.Thread(target=watch, daemon=True).start()

    _tcp.Connection.writeSomeData = write_some
    _client.ClientProtocol.send_wrapped_data = send_wrapped_data
    _client.ClientProtocol.dataReceived = data_received
    _client.TCPClient.__init__ = tcp_init


class RMSNorm(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Block(torch.nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = RMSNorm(dim), RMSNorm(dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim, bias=False)
        self.out = torch.nn.Linear(dim, dim, bias=False)
        self.gate = torch.nn.Linear(dim, 2 * dim, bias=False)
        self.up = torch.nn.Linear(dim, 2 * dim, bias=False)
        self.down = torch.nn.Linear(2 * dim, dim, bias=False)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        q, k, v = (t.reshape(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        scores = torch.matmul(q, k.transpose(-1, -2)) / (d // self.heads) ** 0.5
        mask = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)
        attn = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
        x = x + self.out(torch.matmul(attn, v).transpose(1, 2).reshape(b, s, d))
        h = self.norm2(x)
        return x + self.down(torch.nn.functional.silu(self.gate(h)) * self.up(h))


class Llama(torch.nn.Module):
    def __init__(self, vocab=128, dim=64, layers=2, heads=4):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.blocks = torch.nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.head = torch.nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


torch.manual_seed(0)
if args.model == "llama":
    model = Llama(dim=args.hidden, layers=args.layers)
    tokens = torch.randint(0, 128, (2, 16))
    inputs, target = tokens[:, :-1], tokens[:, 1:]

    def loss_fn(out):
        return torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))
else:
    model = torch.nn.Sequential(torch.nn.Linear(16, args.hidden), torch.nn.GELU(), torch.nn.Linear(args.hidden, 8))
    inputs, target = torch.randn(4, 16), torch.randn(4, 8)

    def loss_fn(out):
        return torch.nn.functional.mse_loss(out, target)

optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

debugger = None
if args.mode != "off":
    online = args.mode in ("tcp", "tls", "nfs")
    tensor = {"scope": [], "list": [], "online_run_ut": online, "nfs_path": args.nfs if args.mode == "nfs" else "",
              "host": "127.0.0.1", "port": args.port, "tls_path": args.tls if args.mode == "tls" else ""}
    config = {"task": "tensor", "dump_path": args.dump, "rank": [], "step": list(range(args.steps)), "level": "L1",
              "tensor": tensor}
    config_path = f"client_config_{os.getpid()}.json"
    with open(config_path, "w") as fh:
        json.dump(config, fh)
    debugger = PrecisionDebugger(config_path=config_path)

step_seconds = []
for step in range(args.steps + 1):  # the extra start() sees step > max(step) and sends STOP_ (or the end marker)
    if debugger is not None:
        debugger.start(model)
    if step < args.steps:
        started = time.perf_counter()
        loss = loss_fn(model(inputs))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        step_seconds.append(time.perf_counter() - started)
    if debugger is not None:
        debugger.stop()
        debugger.step()
if args.trace:
    print(f"WIRE TOTAL queued {_wire['queued']} written {_wire['written']}", file=sys.stderr, flush=True)
print("STEP_SECONDS", " ".join(f"{s:.4f}" for s in step_seconds))
print("CLIENT DONE", flush=True)
sys.stdout.flush()
