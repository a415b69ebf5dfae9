"""Outputs an API leaves undefined for a call (api_specs undefined_outputs) are not compared: native_batch_norm's
saved statistics in eval mode, which a CPU returns empty and CUDA with the channels' shape."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.helpers import records

LEAN = ("-p", "no:cacheprovider", "--msprobe-mode", "replay")


def batch_norm_dump(root: Path, training: bool, statistics: list[torch.Tensor] | None) -> Path:
    """A tensor dump of one fp32 native_batch_norm; its saved statistics replaced by `statistics` where given,
    as another device returns them."""
    gen = torch.Generator().manual_seed(0)
    x, weight, bias = torch.randn(8, 4, 16, generator=gen), torch.rand(4, generator=gen) + 0.5, torch.randn(4)
    mean, var = torch.zeros(4), torch.ones(4)
    outputs = list(torch.native_batch_norm(x, weight, bias, mean.clone(), var.clone(), training, 0.1, 1e-5))
    if statistics is not None:
        outputs[1:] = statistics
    folder = root / "dump_tensor_data"
    folder.mkdir(parents=True)

    def leaf(t: torch.Tensor, name: str) -> dict[str, object]:
        torch.save(t.clone(), folder / name)
        filled = t.numel() > 0
        return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": list(t.shape), "requires_grad": False,
                "Max": float(t.max()) if filled else None, "Min": float(t.min()) if filled else None,
                "Mean": float(t.mean()) if filled else None, "Norm": float(t.norm()), "data_name": name}

    stem = "Torch.native_batch_norm.0.forward"
    args = [leaf(t, f"{stem}.input.{i}.pt") for i, t in enumerate((x, weight, bias, mean, var))]
    args += [{"type": "bool", "value": training}, {"type": "float", "value": 0.1}, {"type": "float", "value": 1e-5}]
    entry = {"input_args": args, "input_kwargs": {},
             "output": [leaf(t, f"{stem}.output.{i}.pt") for i, t in enumerate(outputs)]}
    path = root / "dump.json"
    path.write_text(json.dumps({"task": "tensor", "level": "L1", "framework": "pytorch", "dump_data_dir": None,
                                "data": {stem: entry}}))
    return path


def test_eval_modes_saved_statistics_are_not_compared(pytester: pytest.Pytester) -> None:
    """CUDA's [C]-shaped statistics against the CPU's empty ones: the output is compared and passes, the two
    statistics are SKIP rows that say why."""
    dump = batch_norm_dump(pytester.path / "d", False, [torch.randn(4), torch.rand(4)])
    pytester.runpytest(str(dump), *LEAN).assert_outcomes(passed=1)
    (record,) = records(pytester)
    rows = {row["name"].rsplit(".", 1)[-1]: row for row in record["outputs"]}
    assert rows["0"]["status"] == "pass" and rows["1"]["status"] == rows["2"]["status"] == "SKIP"
    assert rows["1"]["message"].startswith("undefined: save_mean and save_invstd are not defined in eval mode")
    assert rows["2"]["shape"] == [4]


def test_training_modes_statistics_are_compared(pytester: pytest.Pytester) -> None:
    """In training they are the batch's mean and inverse deviation: wrong ones fail."""
    right = batch_norm_dump(pytester.path / "right", True, None)
    pytester.runpytest(str(right), *LEAN).assert_outcomes(passed=1)
    wrong = batch_norm_dump(pytester.path / "wrong", True, [torch.randn(4), torch.rand(4)])
    pytester.runpytest(str(wrong), *LEAN, "--msprobe-out", "wrong").assert_outcomes(failed=1)
    (record,) = records(pytester, "wrong")
    assert [row["status"] for row in record["outputs"]][1:] == ["error", "error"]
