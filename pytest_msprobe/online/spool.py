"""A received call as a one-call msprobe tensor dump, so the item that checks it is an ordinary replay item.

`write(call, folder)` writes `<folder>/dump.json` (task `tensor`, level L1, framework pytorch) with the one
entry `<name>.forward` (inputs, kwargs and the device's output as msprobe's dumper encodes them) and the
tensors under `<folder>/dump_tensor_data/`. The check then reads them as it reads any tensor dump, in replay
mode: the device result is the output the client sent. Folders of passing calls are deleted by the session;
those of failing ones stay, so `pytest <folder>/dump.json --msprobe-mode replay` checks the call again
offline and `--msprobe-repro` scripts point at real files.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from .safeload import ApiData

DIRECTION = "forward"


def entry_name(call: ApiData) -> str:
    return f"{call.name}.{DIRECTION}"


class _Writer:
    def __init__(self, folder: Path, prefix: str, save: bool = True, held: dict[str, Any] | None = None) -> None:
        self.save = save  # False: shapes and dtypes only (a call skipped before it is checked)
        self.held = held  # not None: each tensor named and kept here instead of saved (save_held writes them)
        self.tensors = folder / "dump_tensor_data"
        self.prefix = prefix
        self.count = 0
        self.nbytes = 0

    def encode(self, value: Any, where: str) -> Any:
        if value is None:
            return None
        if isinstance(value, torch.Tensor):
            return self._tensor(value, where)
        if isinstance(value, bool):
            return {"type": "bool", "value": value}
        if isinstance(value, int):
            return {"type": "int", "value": value}
        if isinstance(value, float):
            return {"type": "float", "value": value}
        if isinstance(value, str):
            return {"type": "str", "value": value}
        if isinstance(value, torch.dtype):
            return {"type": "torch.dtype", "value": str(value)}
        if isinstance(value, torch.device):
            return {"type": "torch.device", "value": str(value)}
        if isinstance(value, torch.Size):
            return {"type": "torch.Size", "value": list(value)}
        if isinstance(value, torch.memory_format):
            return {"type": "torch.memory_format", "format": str(value).rsplit(".", 1)[-1]}
        if isinstance(value, slice):
            return {"type": "slice", "value": [value.start, value.stop, value.step]}
        if value is Ellipsis:
            return {"type": "ellipsis", "value": "..."}
        if isinstance(value, (list, tuple)):
            return [self.encode(v, f"{where}.{i}") for i, v in enumerate(value)]
        if isinstance(value, dict):
            return {str(k): self.encode(v, f"{where}.{k}") for k, v in value.items()}
        return {"type": f"{type(value).__module__}.{type(value).__qualname__}"}  # the check skips naming it

    def _tensor(self, t: torch.Tensor, where: str) -> dict[str, Any]:
        meta = {"type": "torch.Tensor", "dtype": str(t.dtype), "shape": list(t.shape),
                "requires_grad": bool(t.requires_grad)}
        if not self.save:
            return meta
        name = f"{self.prefix}.{where}.pt"
        if t.untyped_storage().nbytes() > t.numel() * t.element_size():
            t = t.clone()  # a view of a larger storage: save only its own elements
        self.nbytes += t.numel() * t.element_size()
        if self.held is not None:
            self.held[name] = t.detach()
            return {**meta, "data_name": name}
        if not self.count:
            self.tensors.mkdir(parents=True, exist_ok=True)
        torch.save(t.detach(), self.tensors / name)
        self.count += 1
        return {**meta, "data_name": name}


def save_held(held: dict[str, Any], folder: Path) -> None:
    """Write the tensors `write(..., held=)` kept in memory as the one-call dump's files."""
    if held:
        (folder / "dump_tensor_data").mkdir(parents=True, exist_ok=True)
    for name, t in held.items():
        torch.save(t, folder / "dump_tensor_data" / name)


def entry(call: ApiData, folder: Path, tensors: bool = True,
          held: dict[str, Any] | None = None) -> tuple[dict[str, Any], int]:
    """The dump entry of a call (its tensors written under folder/dump_tensor_data, or put in `held` by their
    data_name) and the tensor bytes."""
    writer = _Writer(folder, call.name, tensors, held)
    result = call.result
    outputs = list(result) if isinstance(result, (tuple, list)) else [result]
    body = {"input_args": writer.encode(list(call.args), f"{DIRECTION}.input"),
            "input_kwargs": {str(k): writer.encode(v, f"{DIRECTION}.input.{k}") for k, v in call.kwargs.items()},
            "output": [writer.encode(v, f"{DIRECTION}.output.{i}") for i, v in enumerate(outputs)]}
    return body, writer.nbytes


def write(call: ApiData, folder: Path, tensors: bool = True, held: dict[str, Any] | None = None) -> tuple[Path, int]:
    """One-call tensor dump of `call` in `folder`; returns (dump.json, tensor bytes). Without `tensors`, only
    their shapes and dtypes (the dump of a call that is skipped); with `held`, the tensors go there by their
    data_name, not to files (the in-process check hands them to its worker in memory)."""
    folder.mkdir(parents=True, exist_ok=True)
    body, nbytes = entry(call, folder, tensors, held)
    doc = {"task": "tensor", "level": "L1", "framework": "pytorch", "dump_data_dir": str(folder / "dump_tensor_data"),
           "online": {"rank": call.rank, "step": call.step}, "data": {entry_name(call): body}}
    path = folder / "dump.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path, nbytes
