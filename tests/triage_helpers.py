"""Planted bugs and checks shared by the red-to-fix tests (saved error data, repro scripts, fuzzing, HTML)."""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.helpers import DEVICE_MODE, device_side_conftest, tensor

# Device-side bugs, armed only inside the device call (as a real device's kernels differ; the bench and
# strict's torch run use torch's own kernels), each in the dtype the device runs:
#  * gelu (bf16): element 5 scaled by 1.5 -- forward and gradient (the backward runs the armed graph);
#  * torch.matmul (fp16): every element 1% too large;
#  * relu (fp16): doubled for inputs in (2.995, 3.0), just below a recorded Max of 3: random inputs from
#    statistics (Min at index 0, Max at the end, uniform between) almost never land there.
BUGS = """
import torch
import torch.nn.functional as F


def gelu(orig, x, *a, **k):
    y = orig(x, *a, **k)
    if y.dtype != torch.bfloat16:
        return y
    scale = torch.ones_like(y)
    scale.view(-1)[5] = 1.5
    return y * scale


def relu(orig, x, *a, **k):
    y = orig(x, *a, **k)
    if x.dtype != torch.float16:
        return y
    return torch.where((x > 2.995) & (x < 3.0), y * 2, y)


def matmul(orig, a, b, *x, **k):
    y = orig(a, b, *x, **k)
    return y * 1.01 if y.dtype == torch.float16 else y


IMPLS = {F.gelu: gelu, F.relu: relu, torch.matmul: matmul}
"""

# A conftest arming the bugs around the device call of every item.
PLANTED = device_side_conftest(BUGS)

# For repro scripts, which run outside pytest: the "buggy vendor library" of the environment, a device
# plugin installed under the entry point `cpu` (it replaces the built-in cpu device) whose backend arms
# the bugs inside its boundary, i.e. around exactly the device call.
VENDOR = BUGS + DEVICE_MODE + """
import contextlib

from pytest_msprobe.backends import CpuBackend


class PlantedCpu(CpuBackend):
    def boundary(self, api, phase):
        return DeviceSide() if phase == "forward" else contextlib.nullcontext()
"""


def gelu_bf16(shape: list[int] | None = None) -> dict[str, Any]:
    shape = shape or [16, 16]
    return {
        "Functional.gelu.0.forward": {
            "input_args": [tensor("torch.bfloat16", shape, 3.0, -3.0, requires_grad=True)], "input_kwargs": {},
            "output": [tensor("torch.bfloat16", shape, requires_grad=True)]},
        "Functional.gelu.0.backward": {"input": [tensor("torch.bfloat16", shape, 0.5, -0.5)],
                                       "output": [tensor("torch.bfloat16", shape)]},
    }


def relu_fp16() -> dict[str, Any]:
    return {"Functional.relu.0.forward": {"input_args": [tensor("torch.float16", [4, 4], 3.0, -3.0)],
                                          "input_kwargs": {}, "output": [tensor("torch.float16", [4, 4])]}}


def matmul_fp16() -> dict[str, Any]:
    return {"Torch.matmul.0.forward": {
        "input_args": [tensor("torch.float16", [256, 512], 1.0, -1.0), tensor("torch.float16", [512, 256], 1.0, -1.0)],
        "input_kwargs": {}, "output": [tensor("torch.float16", [256, 256], 8.0, -8.0)]}}


def site_dir(root: Path, planted: bool = True) -> Path:
    """A folder for PYTHONPATH: with `planted`, the buggy device plugin; without, nothing (torch's kernels)."""
    folder = root / ("site_planted" if planted else "site_plain")
    folder.mkdir(exist_ok=True)
    if planted:
        (folder / "planted_vendor.py").write_text(VENDOR)
        info = folder / "planted_vendor-1.0.dist-info"
        info.mkdir(exist_ok=True)
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: planted-vendor\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text("[pytest_msprobe.devices]\ncpu = planted_vendor:PlantedCpu\n")
    return folder


def run_script(script: Path, site: Path, *args: str) -> tuple[int, dict[str, Any] | str]:
    """Run a repro script the way a user would, outside pytest, with `site` as the environment."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS")}
    env["PYTHONPATH"] = str(site)
    proc = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, env=env,
                          cwd=script.parent, timeout=300)
    if "--json" in args:
        assert proc.stdout.strip(), proc.stderr
        return proc.returncode, _numbers(json.loads(proc.stdout.strip().splitlines()[-1], parse_constant=_not_json))
    return proc.returncode, proc.stdout + proc.stderr


def _not_json(name: str) -> None:
    raise ValueError(f"--json printed {name}, which is not JSON")


def _numbers(value: Any) -> Any:
    """The script's JSON writes non-finite numbers as "nan", "inf", "-inf": back to floats for comparing."""
    if isinstance(value, str) and value in ("nan", "inf", "-inf"):
        return float(value)
    if isinstance(value, dict):
        return {k: _numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_numbers(v) for v in value]
    return value


def close(a: Any, b: Any, rel: float = 1e-12) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b or abs(a - b) <= rel * max(abs(a), abs(b))
    return a == b


METRICS = ("cosine", "max_abs_err", "dual_hundredth", "dual_thousandth", "dual_ten_thousandth", "binary_error_rate")


def assert_same_numbers(result: dict[str, Any], record: dict[str, Any]) -> int:
    """The repro's numbers equal the item's (to 1e-12 relative); returns how many numbers were compared."""
    assert result["status"] == record["status"], (result["status"], record["status"])
    assert result["same_as_item"], result["differences"]
    expected = {o["name"]: o for o in record["outputs"]}
    assert [r["name"] for r in result["outputs"]] == list(expected)
    compared = 0
    for row in result["outputs"]:
        exp = expected[row["name"]]
        for key in METRICS:
            mine, theirs = row["metrics"].get(key), exp["metrics"].get(key)
            assert close(mine, theirs), (row["name"], key, mine, theirs)
            compared += theirs is not None
        if exp.get("worst"):
            assert row["worst"]["index"] == exp["worst"]["index"]
            for key in ("device", "bench", "abs_err", "rel_err"):
                assert close(row["worst"][key], exp["worst"][key]), (key, row["worst"], exp["worst"])
                compared += 1
        # the standard's own numbers: strict's statistics (errors, the torch run's, bias), a reference's metrics
        assert sorted(row.get("reference") or {}) == sorted(exp.get("reference") or {})
        for key, theirs in (exp.get("reference") or {}).items():
            assert close(row["reference"][key], theirs), (key, row["reference"][key], theirs)
            compared += 1
        assert (row["verdict"] or row["status"]) == (exp["verdict"] or exp["status"])
        assert row["status"] == exp["status"]
    return compared


def replay_line(text: str, err: Path, dumps: int = 1) -> str:
    """The summary line a run that saved error data into `err` prints: its replay command is `pytest err` with the
    options of the run's `rerun:` lines (one set for every item), which decide the device side and the verdict."""
    options = {re.sub(r"^rerun: pytest \S+", "", line) for line in text.splitlines() if line.startswith("rerun: pytest ")}
    assert len(options) == 1, options
    return f"error data: {dumps} dump(s) in {err} (replay: pytest {err}{options.pop()})"
