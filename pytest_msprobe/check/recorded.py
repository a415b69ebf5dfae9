"""Where a replayed item's device result comes from: the outputs and gradients the dump saved (`Recorded`, replay
mode), or MindSpore running the recorded call again (`MindSporeRun`, runs/mindspore.py). Each source is what
its device source (replay.RecordedOutputs, replay.MindSporeRerun) supplies to replay.py's stages; the rest (inputs, bench, third run, comparison) is shared.

Apart from replay.py (the stages) and gradients.py (matching recorded gradients to the bench's): reading
saved values from dump_tensor_data/ is its own concern, with its own failure (a tensor the dump did not save).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import torch

from ..dump.reader import Dump
from ..inputs.build import TENSOR_TYPES, BuildContext, build, parse_dtype
from ..inputs.build import leaf_shape as _shape
from ..inputs.build import load_saved as _load_saved
from ..records.record import Record
from ..runs import mindspore
from ..runs.execution import NotCheckable
from . import calls


@dataclass(frozen=True)
class Unsaved:
    """A recorded tensor the dump has no file for: reported as a SKIP row, never compared."""

    where: str
    shape: tuple[int, ...]


class Recorded:
    """Replay: the device result is what the dump saved (`output`, and for backward items `backward.output`)."""

    runs_here = False

    def describe(self, record: Record, bench_label: str) -> None:
        record.device, record.impl = "recorded", f"outputs saved in the dump (bench {bench_label})"

    def outputs(self, case: Any, pairs_b: list[Any]) -> list[Any]:
        """The recorded forward outputs, as the bench's are selected."""
        started = time.perf_counter()
        leaves_d = calls.selected(recorded(case.forward.get("output"), case.dump, case.max_bytes, "output"),
                                  case.bare, case.specs)
        case.record.timings["recorded_s"] = time.perf_counter() - started
        return leaves_d

    def gradients(self, case: Any) -> list[Any]:
        """The recorded gradients (backward.output), in the dump's order."""
        return recorded(case.backward_entry.get("output"), case.dump, case.max_bytes, "backward.output")


class MindSporeRun:
    """MindSpore dumps re-run: the recorded call runs again in MindSpore, its backward with mindspore.vjp."""

    runs_here = True

    def __init__(self, call: mindspore.MsCall) -> None:
        self.call = call
        self.grads: dict[int, torch.Tensor] = {}

    def describe(self, record: Record, bench_label: str) -> None:
        record.device, record.impl = f"mindspore:{self.call.target}", f"{self.call.label} (bench {bench_label})"

    def outputs(self, case: Any, pairs_b: list[Any]) -> list[Any]:
        """MindSpore's forward outputs (and, for a backward item, its gradients, kept for `gradients`)."""
        grad_positions = sorted(pos for pos, _ in case.bench_side.grad_leaves) if case.want_grad else []
        leaves_d, self.grads = calls.timed(case.record.timings, "device_s", "device", lambda: mindspore.run(
            self.call, case.recorded.args, case.recorded.kwargs, seed=case.record.seed, grad_positions=grad_positions,
            cotangents=dict(pairs_b)), None)
        return calls.selected(leaves_d, case.bare, case.specs)



def _is_tensor(leaf: Any) -> bool:
    return isinstance(leaf, dict) and leaf.get("type") in TENSOR_TYPES


def require_saved(full: str, encoded: Any, where: str) -> None:
    """Replay needs the real inputs: a non-empty tensor the dump did not save cannot be invented."""
    def walk(value: Any, at: str) -> None:
        if isinstance(value, list):
            for i, v in enumerate(value):
                walk(v, f"{at}.{i}")
        elif _is_tensor(value):
            shape = value.get("shape")
            empty = isinstance(shape, list) and 0 in shape
            if not (value.get("data_name") or value.get("datapath")) and not empty:
                raise NotCheckable(f"{full} {at}: the dump saved no tensor for it; replay needs every input "
                                   "from dump_tensor_data/")
        elif isinstance(value, dict) and "type" not in value:
            for k, v in value.items():
                walk(v, f"{at}.{k}")

    walk(encoded, where)


def recorded(encoded: Any, dump: Dump, max_bytes: int, where: str) -> list[Any]:
    """The recorded values, flattened like execution.output_leaves (None kept): saved tensors, scalars."""
    out: list[Any] = []
    _recorded_into(encoded, BuildContext(dump, torch.Generator(), True, max_bytes), where, out)
    return out


def _recorded_into(value: Any, ctx: BuildContext, at: str, out: list[Any]) -> None:
    # module-level recursion: a nested recursive function would keep `out`'s tensors in a reference cycle
    if isinstance(value, list):
        for i, v in enumerate(value):
            _recorded_into(v, ctx, f"{at}.{i}", out)
    elif value is None:
        out.append(None)
    elif _is_tensor(value):
        out.append(_saved_tensor(value, ctx, at))
    elif isinstance(value, dict) and value and "type" not in value and "class_type" not in value:
        for k, v in value.items():  # namedtuple / structseq outputs
            _recorded_into(v, ctx, f"{at}.{k}", out)
    else:
        out.append(build(value, ctx, at))


def _saved_tensor(leaf: dict[str, Any], ctx: BuildContext, where: str) -> Any:
    dtype, shape = parse_dtype(leaf.get("dtype")), _shape(leaf, where)
    loaded = _load_saved(leaf, ctx, where, dtype, shape)
    if loaded is not None:
        return loaded
    if math.prod(shape) == 0:
        return torch.empty(shape, dtype=dtype)
    return Unsaved(where, tuple(shape))
