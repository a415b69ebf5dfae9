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


def conv_tensor_dump(root: Path, location: str, hf32: bool) -> Path:
    """A PyTorch tensor dump of one fp32 conv2d, its output computed in full fp32 (a CPU or GPU) or from
    HF32-rounded inputs (Ascend's cube), every tensor saved as if from `location`."""
    from pytest_msprobe.runs.execution import HF32_BITS, round_mantissa

    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(2, 8, 10, 10, generator=gen), torch.randn(16, 8, 3, 3, generator=gen) * 0.2
    read = (lambda t: round_mantissa(t, HF32_BITS)) if hf32 else (lambda t: t)
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


@pytest.mark.parametrize("location, hf32", [("cpu", False), ("cuda:0", False), ("npu:0", True)])
def test_replay_reads_what_recorded_the_dump_from_its_tensors(pytester: pytest.Pytester, location: str,
                                                               hf32: bool) -> None:
    """Replay rounds fp32 convolution inputs to HF32 only for a dump an Ascend NPU recorded: a CPU- or
    GPU-recorded fp32 conv2d passes, told by its .pt files' device; msprobe_recorded_on overrides."""
    dump = conv_tensor_dump(pytester.path / "d", location, hf32)
    result = pytester.runpytest(str(dump), "--msprobe-mode", "replay", *LEAN)
    result.assert_outcomes(passed=1)
    (record,) = records(pytester)
    device = location.split(":")[0]
    noted = [n for n in record["notes"] if n.startswith("recorded on")]
    assert noted == ([] if hf32 else [f"recorded on {device} (the device of its saved tensors): fp32 inputs not "
                                     "rounded to HF32, which only Ascend's convolutions read"])
    wrong = "cpu" if hf32 else "npu"  # the other assumption fails: thousands of ULPs at HF32's resolution
    told = pytester.runpytest(str(dump), "--msprobe-mode", "replay", "-o", f"msprobe_recorded_on={wrong}",
                              "--msprobe-out", "told", *LEAN)
    told.assert_outcomes(failed=1)
    told.stdout.fnmatch_lines(["*gross error*", f"rerun: *-o msprobe_recorded_on={wrong}*"])


def test_the_recorded_device_has_an_ini_key(pytester: pytest.Pytester) -> None:
    dump = conv_tensor_dump(pytester.path / "d", "cpu", False)
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
