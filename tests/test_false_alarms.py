"""Correct kernels that strict must pass: flush-to-zero found by fuzzing, the bundled examples, dumps
recorded off an NPU."""
from __future__ import annotations

import importlib.util
import io
import json
import re
import shutil
import struct
import zipfile
from pathlib import Path

import pytest
import torch

from pytest_msprobe.runs.precision import HF32_BITS, TF32_BITS
from tests.helpers import EXAMPLES, records, tensor

LEAN = ("-p", "no:cacheprovider")


def test_fuzzing_the_bf16_linear_passes_flush_to_zero(pytester: pytest.Pytester) -> None:
    """torch's CPU bf16 matmul flushes a subnormal result to zero (0.0 where the bench is 1.47e-39), as
    NPUs and GPUs do: the fuzz example that found it passes."""
    pytest.importorskip("hypothesis")
    shutil.copytree(EXAMPLES / "llama_tiny_bf16_statistics", pytester.path / "llama")
    result = pytester.runpytest("llama", "--msprobe-fuzz", "10", "-k", "Functional.linear and forward", *LEAN)
    result.assert_outcomes(passed=18, deselected=455)
    result.stdout.fnmatch_lines(["*fuzz: 9 API(s), 10 examples each, 0 failing*"])


def _save(tensor: torch.Tensor, path: Path, location: str) -> None:
    """torch.save of `tensor` as if it had been saved from `location` ("npu:0", "cuda:0"): the storage's
    location tag in the pickle, which is what msprobe's .pt files keep of the device."""
    buffer = io.BytesIO()
    torch.save(tensor.clone().contiguous(), buffer)
    source = zipfile.ZipFile(io.BytesIO(buffer.getvalue()))
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as target:
        for info in source.infolist():
            data = source.read(info.filename)
            if info.filename.endswith("data.pkl") and location != "cpu":
                tag = location.encode()
                data = data.replace(b"X\x03\x00\x00\x00cpu", b"X" + struct.pack("<I", len(tag)) + tag)
            target.writestr(info, data)


def conv_tensor_dump(root: Path, location: str, bits: int | None) -> Path:
    """A PyTorch tensor dump of one fp32 conv2d, its output computed in full fp32 (a CPU, or a GPU with TF32
    off) or from inputs rounded to `bits` mantissa bits (Ascend's HF32 cube, cuDNN's TF32), every tensor saved as
    if from `location`."""
    from pytest_msprobe.runs.precision import round_mantissa

    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(2, 8, 10, 10, generator=gen), torch.randn(16, 8, 3, 3, generator=gen) * 0.2
    read = (lambda t: t) if bits is None else (lambda t: round_mantissa(t, bits))
    y = torch.nn.functional.conv2d(read(x), read(w))
    folder = root / "dump_tensor_data"
    folder.mkdir(parents=True)
    entry: dict[str, object] = {"input_kwargs": {}}
    for key, tensors in (("input_args", [x, w]), ("output", [y])):
        leaves = []
        for i, t in enumerate(tensors):
            name = f"Functional.conv2d.0.forward.{key.split('_')[0]}.{i}.pt"
            _save(t, folder / name, location)
            leaves.append(tensor("torch.float32", list(t.shape), float(t.max()), float(t.min()), data_name=name))
        entry[key] = leaves
    path = root / "dump.json"
    path.write_text(json.dumps({"task": "tensor", "level": "L1", "framework": "pytorch", "dump_data_dir": None,
                                "data": {"Functional.conv2d.0.forward": entry}}))
    return path


NOT_HF32 = "recorded on {} (the device of its saved tensors): fp32 inputs not rounded to HF32, which only " \
           "Ascend's convolutions read"
TF32 = "TF32: cuda reads 10 mantissa bits of this API's fp32 inputs (torch's setting), so they are rounded to " \
       "TF32 as the kernel reads them"


@pytest.mark.parametrize("location, bits, notes, wrong", [
    ("cpu", None, [NOT_HF32.format("cpu")], "npu"),
    ("cuda:0", TF32_BITS, [NOT_HF32.format("cuda"), TF32], "cpu"),  # cuDNN's default: TF32 convolutions
    ("npu:0", HF32_BITS, [], "cpu"),
])
def test_replay_reads_what_recorded_the_dump_from_its_tensors(pytester: pytest.Pytester, location: str,
                                                               bits: int | None, notes: list[str],
                                                               wrong: str) -> None:
    """Replay's bench reads fp32 convolution inputs as the recording device's kernel did: HF32 for a dump an
    Ascend NPU recorded, TF32 for a GPU's (cuDNN's default), full fp32 for a CPU's; told by its .pt files'
    device, and msprobe_recorded_on overrides."""
    dump = conv_tensor_dump(pytester.path / "d", location, bits)
    result = pytester.runpytest(str(dump), "--msprobe-mode", "replay", *LEAN)
    result.assert_outcomes(passed=1)
    (record,) = records(pytester)
    assert [n for n in record["notes"] if n.startswith(("recorded on", "TF32"))] == notes
    # the other assumption fails: thousands of ULPs at HF32's or TF32's resolution
    told = pytester.runpytest(str(dump), "--msprobe-mode", "replay", "-o", f"msprobe_recorded_on={wrong}",
                              "--msprobe-out", "told", *LEAN)
    told.assert_outcomes(failed=1)
    told.stdout.fnmatch_lines(["*gross error*", f"rerun: *-o msprobe_recorded_on={wrong}*"])


def test_a_gpu_dump_with_tf32_off_is_replayed_with_tf32_off(pytester: pytest.Pytester) -> None:
    """A job that turned TF32 off says so as it did, in torch's settings (here a conftest.py): its full-fp32
    convolution then passes, and fails under cuDNN's default."""
    if not hasattr(torch.backends.cudnn, "conv"):
        pytest.skip(f"torch {torch.__version__} has no per-backend fp32_precision settings")
    dump = conv_tensor_dump(pytester.path / "d", "cuda:0", None)
    pytester.runpytest(str(dump), "--msprobe-mode", "replay", *LEAN).assert_outcomes(failed=1)
    (pytester.path / "d" / "conftest.py").write_text(
        "import torch\n\n_saved = []\n\n\n"
        "def pytest_sessionstart(session):\n"
        "    _saved.append(torch.backends.cudnn.conv.fp32_precision)\n"
        "    torch.backends.cudnn.conv.fp32_precision = 'ieee'\n\n\n"
        "def pytest_sessionfinish(session):\n"
        "    torch.backends.cudnn.conv.fp32_precision = _saved.pop()\n")
    result = pytester.runpytest(str(dump), "--msprobe-mode", "replay", "--msprobe-out", "off", *LEAN)
    result.assert_outcomes(passed=1)
    assert not [n for n in records(pytester, "off")[0]["notes"] if n.startswith("TF32")]


def test_the_recorded_device_has_an_ini_key(pytester: pytest.Pytester) -> None:
    dump = conv_tensor_dump(pytester.path / "d", "cpu", None)
    pytester.makeini("[pytest]\nmsprobe_recorded_on = npu\n")
    pytester.runpytest(str(dump), "--msprobe-mode", "replay", *LEAN).assert_outcomes(failed=1)
    pytester.makeini("[pytest]\nmsprobe_recorded_on = tpu\n")
    bad = pytester.runpytest(str(dump), "--msprobe-mode", "replay", *LEAN)
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*ini msprobe_recorded_on: 'tpu' is not one of auto, npu, cuda, cpu*"])


def sdpa_tensor_dump(root: Path) -> Path:
    """A PyTorch tensor dump of a causal bf16 scaled_dot_product_attention, forward and backward, recorded by
    torch's own CPU kernel (as a Llama step's dump)."""
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 4, 16, 16, generator=gen).bfloat16().requires_grad_() for _ in range(3))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    grad = (torch.randn(1, 4, 16, 16, generator=gen) * 3e-3).bfloat16()
    out.backward(grad)
    folder = root / "dump_tensor_data"
    folder.mkdir(parents=True)

    def leaves(prefix: str, tensors: list[torch.Tensor], requires_grad: bool) -> list[dict[str, object]]:
        found = []
        for i, t in enumerate(t.detach() for t in tensors):
            name = f"Functional.scaled_dot_product_attention.0.{prefix}.{i}.pt"
            torch.save(t.clone(), folder / name)
            found.append(tensor("torch.bfloat16", list(t.shape), float(t.max()), float(t.min()), data_name=name,
                                requires_grad=requires_grad))
        return found

    data = {"Functional.scaled_dot_product_attention.0.forward": {
                "input_args": leaves("forward.input", [q, k, v], True),
                "input_kwargs": {"is_causal": {"type": "bool", "value": True}},
                "output": leaves("forward.output", [out], True)},
            "Functional.scaled_dot_product_attention.0.backward": {
                "input": leaves("backward.input", [grad], False),
                "output": leaves("backward.output", [q.grad, k.grad, v.grad], False)}}
    path = root / "dump.json"
    path.write_text(json.dumps({"task": "tensor", "level": "L1", "framework": "pytorch", "dump_data_dir": None,
                                "data": data}))
    return path


def test_replayed_bf16_attention_gradients_are_judged_against_torchs_kernel(pytester: pytest.Pytester) -> None:
    """Replaying torch's own bf16 attention backward failed ('mean error 5.64 > limit 0.1') because
    its sampled torch run, whose autograd node is not the attention's, was dropped ('reference gradients
    not used: list index out of range'): the gradients were held to correct rounding near zero."""
    dump = sdpa_tensor_dump(pytester.path / "d")
    result = pytester.runpytest(str(dump), "--msprobe-mode", "replay", *LEAN)
    result.assert_outcomes(passed=2)
    backward = next(r for r in records(pytester) if r["direction"] == "backward")
    assert backward["reference"] == "torch's kernel on cpu, device dtype, on sampled heads"
    assert not [n for n in backward["notes"] if "not used" in n], backward["notes"]
    assert [o["verdict"] for o in backward["outputs"]] == ["pass"] * 3
    assert all(o["reference"]["ref_mean_err"] > 0 for o in backward["outputs"])  # the torch run's own errors


def test_the_bundled_examples_end_as_the_readme_says(pytester: pytest.Pytester) -> None:
    """`pytest examples/` (README: its outcome, and the two MindSpore silu items that strict flags as an
    approximation), then with the shipped baseline: those two as xfails and exit status 0."""
    for module in ("mindspore", "torch_npu"):
        if importlib.util.find_spec(module) is not None:
            pytest.skip(f"the README's counts are those of a machine without MindSpore and torch_npu ({module} is "
                        "installed here)")
    root = EXAMPLES.parent  # the README, or the docs/ pages its sections move to
    readme = "\n".join(p.read_text(encoding="utf-8") for p in [root / "README.md", *sorted(root.glob("docs/**/*.md"))])
    promised = re.search(r"`pytest examples/` then checks every bundled dump\. .*? ends with\s+`([^`]+)`",
                         readme, re.S)
    assert promised, "the README says what `pytest examples/` ends with"
    shutil.copytree(EXAMPLES, pytester.path / "examples")
    plain = pytester.runpytest_subprocess("examples", "-n", "2", *LEAN)
    assert plain.ret == pytest.ExitCode.TESTS_FAILED
    summary = plain.outlines[-1]
    assert re.sub(r" in [\d.]+s.*", "", summary.strip("= ")) == promised.group(1), summary
    # the node ids; pytest adds " - <message>" where the line has room, and always when $CI is set
    assert sorted(line.split(" - ")[0] for line in plain.outlines if line.startswith("FAILED")) == [
        f"FAILED examples/mint_mlp_fp32_tensor/step0/rank0/dump.json::MintFunctional.silu.0.{d}" for d in
        ("backward", "forward")]
    based = pytester.runpytest_subprocess("examples/mint_mlp_fp32_tensor", "--msprobe-baseline",
                                          "examples/baseline.yaml", *LEAN)
    based.assert_outcomes(passed=18, xfailed=2)
    assert "2 xfailed" in readme and based.ret == pytest.ExitCode.OK


def test_the_false_alarm_benchmark_fuzzes_correct_kernels(tmp_path: Path) -> None:
    """python -m evals planted_bugs --fuzz: a [fuzz] item per forward call, armed like the planted runs; a
    correct variant passes, a bug armed the same way is reported with its failure."""
    from evals.planted.registry import BY_NAME
    from evals.planted_bugs import fuzz

    data = {"Functional.linear.0.forward": {
        "input_args": [tensor("torch.bfloat16", [16, 256], 3.0, -3.0), tensor("torch.bfloat16", [64, 256], 1.0, -1.0)],
        "input_kwargs": {}, "output": [tensor("torch.bfloat16", [16, 64])]}}
    (tmp_path / "d").mkdir()
    dump = tmp_path / "d" / "dump.json"
    dump.write_text(json.dumps({"task": "statistics", "level": "L1", "framework": "pytorch", "data": data}))
    assert fuzz(dump, BY_NAME["splitk-matmul"], "torch.bfloat16", 3, 0) == {"Functional.linear.0.forward[fuzz]": None}
    found = fuzz(dump, BY_NAME["lowacc-matmul"], "torch.bfloat16", 10, 0)
    assert list(found) == ["Functional.linear.0.forward[fuzz]"]
    assert "hypothesis found a failing input" in (found["Functional.linear.0.forward[fuzz]"] or "")
