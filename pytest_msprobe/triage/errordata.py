"""`--msprobe-save-error-data DIR`: a failing item's tensors, saved as an msprobe dump (REFERENCE §1, §5.5).

Who writes what (nothing is written twice, nothing is appended concurrently):

* The process that ran the item (an xdist worker, or the only process) writes that item's own tensor
  files into `DIR[/<dump folder>]/dump_tensor_data/`. Every file name starts with the item's entry
  name, so no two items ever write the same file, and each file is written to a temporary name and
  renamed (a killed worker leaves no half-written file behind a name).
* The item's record carries the dump entries (plain JSON) and the file list; the controller writes
  the shared `dump.json`, `stack.json`, `construct.json` and `error_data_index.json` once, at the end
  of the session (:func:`write_dumps`).

Saved per failing item, with msprobe's file names (`{Type}.{api}.{n}.{direction}.{input|output}.{k}.pt`,
a contiguous CPU tensor via `torch.save`):

* forward item: the inputs exactly as both sides got them (after msprobe's dtype fixes and HF32
  rounding), the device outputs (the entry's `output`) and the bench outputs
  (`....forward.output.bench.{k}.pt`, listed in the index, not in dump.json);
* backward item: the forward inputs (as `....backward.forward_input.{k}.pt`, so they never collide
  with the forward item's files; the controller keeps one copy), the cotangents (`backward.input`),
  the device gradients (`backward.output`) and the bench gradients (`....backward.output.bench.{k}.pt`).

The folder is a `task: tensor` dump: `pytest DIR` with the run's options (the `replay:` command printed with it)
replays every saved call from these files and fails the same way, and msprobe's own tools read it.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from ..records.record import Record

INDEX_NAME = "error_data_index.json"
TENSOR_TYPES = ("torch.Tensor", "torch.nn.parameter.Parameter")


# ----------------------------------------------------------------------------- where (torch-free)


def _leaves(value: Any) -> list[Any]:
    """Leaves of a built argument/output, in the order the dump encodes them (torch imported lazily)."""
    from ..runs.execution import output_leaves

    return output_leaves(value)


def node_folder(node_path: str) -> PurePosixPath:
    """The folder of an item's node path: a dump file's folder; an online session's node path (`online/rank0/step1`,
    no file) itself, since each rank and step names its calls from 0 again."""
    path = PurePosixPath(node_path.replace("\\", "/"))
    return path.parent if path.suffix else path


def dump_key(dump_rel: str) -> str:
    """Sub-folder of DIR for items of one source dump (node_folder), made safe."""
    parts = [p for p in node_folder(dump_rel).parts if p not in ("", ".", "..", "/")]
    parts = [re.sub(r"[^A-Za-z0-9_.\-]", "_", p) for p in parts]
    return "/".join(parts) or "dump"


def target_dir(base: Path, key: str, flat: bool, fuzz: bool = False) -> Path:
    folder = base if flat else base / key
    return folder / "fuzz" if fuzz else folder


# ----------------------------------------------------------------------------- saving (worker, torch)


def _stats(t: Any) -> dict[str, Any]:
    import torch

    x = t.detach().cpu()
    if x.numel() == 0:
        return {"Max": None, "Min": None, "Mean": None, "Norm": None}
    if x.dtype == torch.bool:
        return {"Max": bool(x.any()), "Min": bool(x.all()), "Mean": None, "Norm": None}
    if x.is_complex():
        x = x.abs()
    x = x.double()
    return {"Max": x.max().item(), "Min": x.min().item(), "Mean": x.mean().item(), "Norm": x.norm().item()}


class _Writer:
    """Writes tensor files of one item into `folder/dump_tensor_data` and remembers their names."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.tensor_dir = folder / "dump_tensor_data"
        self.files: list[str] = []

    def leaf(self, t: Any, data_name: str, requires_grad: bool = False,
             type_name: str = "torch.Tensor") -> dict[str, Any]:
        enc: dict[str, Any] = {"type": type_name if type_name in TENSOR_TYPES else "torch.Tensor",
                               "dtype": str(t.dtype), "shape": list(t.shape), **_stats(t),
                               "requires_grad": bool(requires_grad)}
        if t.numel() == 0:
            return enc  # msprobe saves no file for an empty tensor; its statistics rebuild it
        self.store(t.detach().cpu().contiguous().clone(), data_name)
        self.files.append(data_name)
        enc["data_name"] = data_name
        return enc

    def store(self, t: Any, data_name: str) -> None:
        import torch

        self.tensor_dir.mkdir(parents=True, exist_ok=True)
        path = self.tensor_dir / data_name
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        torch.save(t, tmp)
        os.replace(tmp, path)


class _Memory(_Writer):
    """Keeps the tensors by data name instead of writing them (a repro script embeds them)."""

    def __init__(self) -> None:
        super().__init__(Path())
        self.tensors: dict[str, Any] = {}

    def store(self, t: Any, data_name: str) -> None:
        self.tensors[data_name] = t


def _enc_leaf_count(enc: Any) -> int:
    if isinstance(enc, list):
        return sum(_enc_leaf_count(e) for e in enc)
    if isinstance(enc, dict) and enc and "type" not in enc and "class_type" not in enc:
        return sum(_enc_leaf_count(e) for e in enc.values())
    return 1


def _pair(enc: Any, leaves: Iterator[Any], path: str, on_tensor: Any) -> Any:
    """Rebuild an encoding, replacing each tensor leaf by `on_tensor(tensor, original, path)`."""
    import torch

    if isinstance(enc, list):
        return [_pair(e, leaves, f"{path}.{i}", on_tensor) for i, e in enumerate(enc)]
    if isinstance(enc, dict) and enc and "type" not in enc and "class_type" not in enc:
        return {k: _pair(v, leaves, f"{path}.{k}", on_tensor) for k, v in enc.items()}
    value = next(leaves)
    if isinstance(value, torch.Tensor):
        return on_tensor(value, enc, path)
    return enc


def _encode(values: Any, enc: Any, path: str, on_tensor: Any) -> Any:
    """The recorded encoding with its tensors replaced; a fresh flat list if the structure changed."""
    leaves = _leaves(values)
    if enc is not None and _enc_leaf_count(enc) == len(leaves):
        return _pair(enc, iter(leaves), path, on_tensor)
    import torch

    if isinstance(values, torch.Tensor):
        return on_tensor(values, enc, path)
    return [on_tensor(v, None, f"{path}.{i}") if isinstance(v, torch.Tensor) else None for i, v in enumerate(leaves)]


def save_item(dump: Any, entry_name: str, captured: Mapping[str, Any], folder: Path,
              record: Record) -> dict[str, Any] | None:
    """Write one failing item's tensors; return what its record carries for the controller."""
    from ..dump.reader import parse_entry_name

    if "args" not in captured:
        return None  # failed before its inputs existed (nothing to save)
    writer = _Writer(folder)
    entries, index = _item_entries(dump, entry_name, captured, writer, outputs=True)
    return {"entries": entries, "files": writer.files, "index": index,
            "forward_from": parse_entry_name(entry_name).direction,
            "task": "overflow_check" if captured.get("mode") == "overflow_check" else "tensor",
            "framework": captured.get("framework") or "pytorch", "mode": captured.get("mode") or "rerun"}


def inputs_in_memory(dump: Any, entry_name: str,
                     captured: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(dump entries, tensors by data name) of one item's inputs as its check built them, and of a
    backward item's recorded gradients: saved error data without the outputs, kept in memory (what a
    repro script replays through `temporary_dump`). None when the check failed before its inputs existed."""
    if "args" not in captured:
        return None
    writer = _Memory()
    entries, _ = _item_entries(dump, entry_name, captured, writer, outputs=False)
    return entries, writer.tensors


def _item_entries(dump: Any, entry_name: str, captured: Mapping[str, Any], writer: _Writer,
                  outputs: bool) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """The item's dump entries with its tensors handed to `writer`, and the data names by group.

    `outputs`: also the device outputs (gradients) and the bench's; otherwise the recorded outputs stay
    as statistics only (the check reads nothing but their dtypes)."""
    from ..dump.reader import parse_entry_name

    name = parse_entry_name(entry_name)
    fwd_name, bwd_name = f"{name.full_name}.forward", f"{name.full_name}.backward"
    forward = dump.entry(fwd_name) if isinstance(dump.entry(fwd_name), dict) else {}
    requires_grad = captured.get("requires_grad") or set()
    index: dict[str, list[str]] = {}

    def saver(group: str, grad_flags: bool = False) -> Any:
        def on_tensor(t: Any, original: Any, path: str) -> dict[str, Any]:
            type_name = str(original.get("type")) if isinstance(original, dict) else "torch.Tensor"
            enc = writer.leaf(t, f"{path}.pt", grad_flags and id(t) in requires_grad, type_name)
            if "data_name" in enc:
                index.setdefault(group, []).append(enc["data_name"])
            return enc
        return on_tensor

    in_prefix = f"{fwd_name}.input" if name.direction == "forward" else f"{bwd_name}.forward_input"
    args_enc = forward.get("input_args") if isinstance(forward.get("input_args"), list) else None
    kwargs_enc: dict[str, Any] = forward["input_kwargs"] if isinstance(forward.get("input_kwargs"), dict) else {}
    args = _encode(captured["args"], args_enc, in_prefix, saver("inputs", True))
    kwargs = {k: _encode(v, kwargs_enc.get(k), f"{in_prefix}.{k}", saver("inputs", True))
              for k, v in captured["kwargs"].items()}
    fwd_entry: dict[str, Any] = {"input_args": args, "input_kwargs": kwargs,
                                 "output": _statistics_only(forward.get("output", []))}
    entries: dict[str, Any] = {fwd_name: fwd_entry}
    if outputs and name.direction == "forward" and "out_d" in captured:
        fwd_entry["output"] = _encode(captured["out_d"], forward.get("output"), f"{fwd_name}.output",
                                      saver("device_outputs"))
        index["bench_outputs"] = writer_bench(writer, captured["out_b"], f"{fwd_name}.output.bench")
    if name.direction == "backward":
        backward = dump.entry(bwd_name) if isinstance(dump.entry(bwd_name), dict) else {}
        cot = captured.get("cotangents") or []
        raw = backward.get("input")
        bwd_entry: dict[str, Any] = {"input": _encode(cot, raw if isinstance(raw, list) else None,
                                                      f"{bwd_name}.input", saver("cotangents")),
                                     "output": _statistics_only(backward.get("output", []))}
        positions = captured.get("positions")
        if outputs and "compared_device" in captured and positions is not None:
            slots = sum(1 for v in _leaves([captured["args"], captured["kwargs"]]) if _is_tensor(v))
            grads: list[Any] = [None] * max(slots, max(positions, default=-1) + 1)
            on_grad = saver("device_grads")
            for pos, g in zip(positions, captured["compared_device"]):
                grads[pos] = on_grad(g, None, f"{bwd_name}.output.{pos}") if _is_tensor(g) else None
            bwd_entry["output"] = grads
            index["bench_grads"] = writer_bench(writer, captured["compared_bench"], f"{bwd_name}.output.bench",
                                                positions)
        entries[bwd_name] = bwd_entry
    return entries, index


def _statistics_only(enc: Any) -> Any:
    """A recorded encoding without its tensor file names (they belong to the source dump's folder)."""
    if isinstance(enc, list):
        return [_statistics_only(e) for e in enc]
    if isinstance(enc, dict):
        return {k: _statistics_only(v) for k, v in enc.items() if k not in ("data_name", "datapath")}
    return enc


def _is_tensor(v: Any) -> bool:
    import torch

    return isinstance(v, torch.Tensor)


def writer_bench(writer: _Writer, values: Any, prefix: str, positions: list[int] | None = None) -> list[str]:
    names = []
    for i, v in enumerate(_leaves(values)):
        if _is_tensor(v) and v.numel():
            k = positions[i] if positions is not None and i < len(positions) else i
            names.append(writer.leaf(v, f"{prefix}.{k}.pt")["data_name"])
    return names


@contextlib.contextmanager
def temporary_dump(entries: Mapping[str, Any], tensors: Mapping[str, Any] | None = None,
                   files: Mapping[str, Path] | None = None, prefix: str = "msprobe_",
                   header: Mapping[str, Any] | None = None) -> Iterator[Any]:
    """`entries` as a dump in a temporary folder, for a check of one call on given inputs (fuzz examples,
    repro and `script` scripts): `tensors` (torch tensors, or the bytes of a tensor file) are written and
    `files` copied under their data names; `header` holds dump.json's own keys (task, framework) when they
    are not those of a PyTorch `task: tensor` dump. The folder is removed, and forgotten by the dump cache,
    when the block ends."""
    from ..dump.reader import forget_dumps, load_dump

    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        folder = Path(tmp)
        tensor_dir = folder / "dump_tensor_data"
        tensor_dir.mkdir()
        for data_name, t in (tensors or {}).items():
            target = tensor_dir / data_name
            target.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(t, bytes):
                target.write_bytes(t)
            else:
                import torch

                torch.save(t, target)
        for data_name, source in (files or {}).items():
            target = tensor_dir / data_name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
        doc = {"task": "tensor", "level": "L1", "framework": "pytorch", **(header or {}), "data": dict(entries)}
        # a statistics dump stays one (its calls re-run from statistics); a tensor dump reads the folder
        doc["dump_data_dir"] = str(tensor_dir) if doc["task"] != "statistics" else None
        (folder / "dump.json").write_text(json.dumps(doc, allow_nan=True), encoding="utf-8")
        try:
            yield load_dump(folder / "dump.json")
        finally:
            forget_dumps(folder)


# ----------------------------------------------------------------------------- the shared files (controller)


def write_dumps(base: Path, records: Iterable[Record]) -> list[Path]:
    """Write dump.json (+ stack.json, construct.json, the index) of every folder the records saved into."""
    folders: dict[str, dict[str, Any]] = {}
    for rec in records:
        saved = rec.error_data
        if not saved:
            continue
        folder = folders.setdefault(saved["dir"], {"data": {}, "source": {}, "index": {}, "drop": [],
                                                   "task": saved.get("task", "tensor"),
                                                   "framework": saved.get("framework", "pytorch")})
        for entry_name, entry in saved["entries"].items():
            previous = folder["source"].get(entry_name)
            # the forward entry of a failing forward item wins over the copy a backward item made
            if previous is None or (entry_name.endswith(".forward") and saved["forward_from"] == "forward"):
                if previous is not None:
                    folder["drop"].extend(_data_names(folder["data"][entry_name]))
                folder["data"][entry_name] = entry
                folder["source"][entry_name] = saved["forward_from"]
            else:
                folder["drop"].extend(_data_names(entry))
        folder["index"][rec.nodeid or f"{rec.api}.{rec.direction}"] = {
            "status": rec.status, "message": rec.message[:500],
            "standard": rec.standard, "seed": rec.seed, "mode": saved.get("mode", "rerun"),
            **saved["index"]}
    written = []
    for rel, folder in sorted(folders.items()):
        target = base / rel
        target.mkdir(parents=True, exist_ok=True)
        keep = {n for entry in folder["data"].values() for n in _data_names(entry)}
        for name in set(folder["drop"]) - keep:
            try:
                (target / "dump_tensor_data" / name).unlink()
            except OSError:
                pass
        ordered = dict(sorted(folder["data"].items(), key=lambda kv: _order_key(kv[0])))
        doc = {"task": folder["task"], "level": "L1", "framework": folder["framework"],
               "dump_data_dir": str((target / "dump_tensor_data").resolve()), "data": ordered}
        _write_json(target / "dump.json", doc)
        _write_json(target / "stack.json", {name: [] for name in ordered})
        _write_json(target / "construct.json", {})
        _write_json(target / INDEX_NAME, folder["index"])
        written.append(target / "dump.json")
    return written


def _order_key(name: str) -> tuple[str, int, int]:
    body, _, direction = name.rpartition(".")
    stem, _, index = body.rpartition(".")
    return (stem, int(index) if index.isdigit() else 0, 0 if direction == "forward" else 1)


def _data_names(entry: Any) -> list[str]:
    names = []
    if isinstance(entry, dict):
        if isinstance(entry.get("data_name"), str):
            names.append(entry["data_name"])
        for value in entry.values():
            if isinstance(value, (dict, list)):
                names += _data_names(value)
    elif isinstance(entry, list):
        for value in entry:
            names += _data_names(value)
    return names


def _write_json(path: Path, doc: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(doc, indent=1, allow_nan=True), encoding="utf-8")
    os.replace(tmp, path)
