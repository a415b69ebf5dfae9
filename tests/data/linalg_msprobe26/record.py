"""Records dump.json of this folder with msprobe 26.2's own dumper (pip install mindstudio-probe==26.2.0
torch==2.13.0): torch.linalg calls, which msprobe names Torch.<name>, beside older torch namesakes.

Run from this folder: python record.py  (writes ./dump.json; the msprobe output tree is removed).
"""
import json
import shutil
import tempfile
from pathlib import Path

import torch
from msprobe.pytorch import PrecisionDebugger

HERE = Path(__file__).resolve().parent
out = Path(tempfile.mkdtemp(prefix="msprobe-linalg-"))
config = out / "config.json"
config.write_text(json.dumps({"task": "statistics", "dump_path": str(out / "dump"), "rank": [], "step": [],
                              "level": "L1", "statistics": {"scope": [], "list": [], "data_mode": ["all"],
                                                            "summary_mode": "statistics"}}))
debugger = PrecisionDebugger(config_path=str(config))
torch.manual_seed(0)
a = torch.randn(4, 4) + 4 * torch.eye(4)
spd = a @ a.T + torch.eye(4)
tall, rhs, vec = torch.randn(6, 4), torch.randn(4, 2), torch.randn(4)
x = torch.randn(4, 4, requires_grad=True)

debugger.start()
# no torch.<name>: only torch.linalg has them
torch.linalg.inv(a)
torch.linalg.vector_norm(a, ord=2, dim=1)
torch.linalg.matrix_norm(a)
torch.linalg.pinv(tall)
torch.linalg.svdvals(a)
torch.linalg.multi_dot([a, a, rhs])
torch.linalg.vecdot(a, a)
torch.linalg.lu_factor(a)
torch.linalg.cholesky_ex(spd, check_errors=True)  # random inputs from statistics are not positive-definite
torch.linalg.inv(x).sum().backward()
# older namesakes with another signature
torch.linalg.svd(tall)  # full_matrices: U is 6x6; torch.svd(tall) would give 6x4
torch.svd(tall, some=True)
torch.linalg.lstsq(tall, torch.randn(6, 2))
torch.linalg.solve(a, rhs)
torch.linalg.matrix_rank(a, hermitian=False)
torch.linalg.vander(vec, N=3)
torch.vander(vec, 3, True)
torch.linalg.cond(a)
torch.linalg.norm(a, ord="fro")
debugger.stop()
debugger.step()

(dump,) = (out / "dump").rglob("dump.json")
doc = json.loads(dump.read_text())
(HERE / "dump.json").write_text(json.dumps(doc, indent=1) + "\n")
shutil.rmtree(out)
print(f"{len(doc['data'])} entries: " + ", ".join(doc["data"]))
