"""TF32: a device that reads 10 mantissa bits of fp32 inputs (CUDA's cuDNN convolutions by default, its matrix
products when allowed) gets those inputs rounded to TF32 on both sides, as Ascend's HF32 convolutions do."""
from __future__ import annotations

import json
import math

import pytest
import torch

from pytest_msprobe.runs.backends import Backend, CpuBackend, CudaBackend
from pytest_msprobe.runs.execution import Device
from pytest_msprobe.runs.precision import input_rounding, round_mantissa
from pytest_msprobe.specs.loader import load_specs
from tests.helpers import tensor

SPECS = load_specs()


def test_tf32_keeps_ten_mantissa_bits_rounding_half_away_from_zero() -> None:
    x = torch.tensor([1 + 2**-11, 1 + 2**-12, -(1 + 2**-11), 1 + 2**-10 + 2**-11, math.inf, -math.inf])
    assert round_mantissa(x, 10).tolist() == [1 + 2**-10, 1.0, -(1 + 2**-10), 1 + 2**-9, math.inf, -math.inf]
    assert math.isnan(round_mantissa(torch.tensor([math.nan]), 10).item())
    y = torch.randn(1000)
    tf32 = round_mantissa(y, 10)
    assert torch.equal(round_mantissa(tf32, 10), tf32)  # a TF32 value is read exactly
    assert ((tf32.view(torch.int32) & 0x1FFF) == 0).all()


class _Reads(Backend):
    kind = "cuda"

    def __init__(self, families: set[str]) -> None:
        self.families = families

    def reads_tf32(self, family: str) -> bool:
        return family in self.families


def test_input_rounding_follows_the_backend_and_the_api_lists() -> None:
    def rounding(api: str, families: set[str], hf32: bool = False) -> str | None:
        return input_rounding(api, hf32, Device("cuda", 0, _Reads(families)), SPECS)

    assert rounding("conv2d", {"conv"}, hf32=True) == "TF32"
    assert rounding("conv3d", {"conv"}) == "TF32"
    assert rounding("conv2d", set(), hf32=True) == "HF32"  # msprobe's Ascend rule, on every device
    assert rounding("linear", {"conv"}) is None
    assert rounding("linear", {"matmul"}) == "TF32"
    assert rounding("softmax", {"conv", "matmul"}) is None
    assert input_rounding("conv2d", True, Device("cpu", None, CpuBackend()), SPECS) == "HF32"


def test_cuda_backend_reads_torchs_fp32_precision_settings() -> None:
    """Read without a GPU: the settings are torch's, the kernels are not run."""
    if not hasattr(torch.backends.cudnn, "conv") or not hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        pytest.skip(f"torch {torch.__version__} has no per-backend fp32_precision settings")
    conv, matmul = torch.backends.cudnn.conv, torch.backends.cuda.matmul
    saved = conv.fp32_precision, matmul.fp32_precision  # module-like objects: set and restored by hand
    cuda = CudaBackend()
    try:
        conv.fp32_precision, matmul.fp32_precision = "tf32", "ieee"
        assert cuda.reads_tf32("conv") and not cuda.reads_tf32("matmul")
        conv.fp32_precision, matmul.fp32_precision = "ieee", "tf32"
        assert not cuda.reads_tf32("conv") and cuda.reads_tf32("matmul")
    finally:
        conv.fp32_precision, matmul.fp32_precision = saved
    assert not CpuBackend().reads_tf32("conv")


TENSOR_CORE_BACKEND = '''
import os

import torch

from pytest_msprobe.backends import CpuBackend


def _tf32_read(t):
    """What a tensor core reads of an fp32 input: its top 10 mantissa bits (truncated)."""
    if not isinstance(t, torch.Tensor) or t.dtype != torch.float32:
        return t
    kept = (t.detach().view(torch.int32) & ~0x1FFF).view(torch.float32)
    return t + (kept - t.detach())  # the same gradient path


class TensorCore(CpuBackend):
    """A CPU stand-in for a GPU whose convolutions and matrix products read TF32."""
    name = "tensorcore"

    def reads_tf32(self, family):
        return os.environ.get("SAYS_TF32") == "1"

    def run(self, api, fn, args, kwargs):
        return fn(*[_tf32_read(a) for a in args], **{k: _tf32_read(v) for k, v in kwargs.items()})


def pytest_msprobe_device(config, name):
    return TensorCore() if name == "tensorcore" else None


def pytest_msprobe_device_names(config):
    return ["tensorcore"]
'''


def test_a_tf32_device_passes_when_its_backend_says_so(pytester: pytest.Pytester,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """fp32 conv2d (K = 576) and linear (K = 1024) on a device that reads TF32: without the rounding both
    forward items fail (10 bits read against an fp32 bench: false alarms); with it every item passes."""
    data = {
        "Functional.conv2d.0.forward": {
            "input_args": [tensor("torch.float32", [2, 64, 12, 12], requires_grad=True),
                           tensor("torch.float32", [32, 64, 3, 3], mx=0.1, mn=-0.1, requires_grad=True)],
            "input_kwargs": {}, "output": [tensor("torch.float32", [2, 32, 10, 10])]},
        "Functional.conv2d.0.backward": {"input": [tensor("torch.float32", [2, 32, 10, 10])], "output": []},
        "Functional.linear.0.forward": {
            "input_args": [tensor("torch.float32", [64, 1024], requires_grad=True),
                           tensor("torch.float32", [256, 1024], mx=0.05, mn=-0.05, requires_grad=True)],
            "input_kwargs": {}, "output": [tensor("torch.float32", [64, 256])]},
        "Functional.linear.0.backward": {"input": [tensor("torch.float32", [64, 256])], "output": []},
    }
    dump = pytester.path / "dump.json"
    dump.write_text(json.dumps({"task": "statistics", "level": "L1", "framework": "pytorch", "data": data}))
    pytester.makeconftest(TENSOR_CORE_BACKEND)
    monkeypatch.setenv("SAYS_TF32", "0")
    result = pytester.runpytest_subprocess(str(dump), "--msprobe-device", "tensorcore", "-k", "forward")
    result.assert_outcomes(failed=2)
    monkeypatch.setenv("SAYS_TF32", "1")
    result = pytester.runpytest_subprocess(str(dump), "--msprobe-device", "tensorcore", "--msprobe-out", "out")
    result.assert_outcomes(passed=4)
    (records,) = (pytester.path / "out").glob("msprobe_records_*.jsonl")
    notes = [json.loads(line)["notes"] for line in records.read_text().splitlines() if line.strip()]
    assert len(notes) == 4 and all(any(n.startswith("TF32: cpu reads 10 mantissa bits") for n in rec) for rec in notes)
