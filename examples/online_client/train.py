"""A training job under mindstudio-probe 8.1.2's online client: each API call of the steps in the config's
"step" list goes to a pytest session (`pytest --msprobe-online ...`), which checks it as it arrives.

One process:      python train.py config_tcp.json
Several ranks:    torchrun --nproc-per-node 2 train.py config_tcp.json   (gloo on CPU; one client per rank)
TLS:              sh make_certs.sh && python train.py config_tls.json

Runs on CPU; on an Ascend host the same script runs on the NPU (`import torch_npu`, model.to("npu")). It needs
msprobe 8.1.2's online packages: pip install "torch==2.13.0" "mindstudio-probe==8.1.2" twisted "pyOpenSSL==24.2.1"
"cryptography<44" "service_identity==24.1.0" "numpy<2"
"""
from __future__ import annotations

import json
import os
import sys

import torch

if len(sys.argv) != 2:
    sys.exit("usage: python train.py CONFIG.json")
json_path = sys.argv[1]
with open(json_path) as fh:
    steps = max(json.load(fh)["step"]) + 1  # the config's "step" list: 0 .. steps-1 are sent

# msprobe 8.1.2's TLS client asks "Enter your password: " for client.key on the terminal (pwinput), even for a
# key without a passphrase, and without a terminal fails with termios.error. Answer it from the environment
# (empty for an unencrypted key) before msprobe starts its client:
import pwinput  # noqa: E402 - installed with mindstudio-probe

pwinput.pwinput = lambda prompt="", mask="*": os.environ.get("MSPROBE_CLIENT_KEY_PASSPHRASE", "")

# msprobe 8.1.2's TCP client stalls for good now and then (a race on its one shared twisted FileSender); a
# FileSender per transfer avoids it (sender_fix.py, beside this script):
from sender_fix import one_file_sender_per_transfer  # noqa: E402

one_file_sender_per_transfer()

world = int(os.environ.get("WORLD_SIZE", "1"))
if world > 1:  # started by torchrun: each rank is its own client, with its own connection
    import torch.distributed as dist

    dist.init_process_group("gloo")

from msprobe.pytorch import PrecisionDebugger  # noqa: E402 - after the process group: it reads the rank

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 8))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
inputs, target = torch.randn(4, 16), torch.randn(4, 8)

debugger = PrecisionDebugger(config_path=json_path)
# msprobe 8.1.2's client sends its STOP_ when start() runs for a step past the last one of "step": one start()
# more than the steps checked, or the session waits for this client (and says so after 30 s)
for step in range(steps + 1):
    debugger.start(model)
    if step < steps:
        loss = torch.nn.functional.mse_loss(model(inputs), target)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    debugger.stop()
    debugger.step()
print(f"rank {os.environ.get('RANK', '0')}: done", flush=True)
