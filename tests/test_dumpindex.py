"""The dump index: entries read back from byte ranges equal json.load's, the cache, the work estimate."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pytest_msprobe.dump import index as dumpindex
from pytest_msprobe.dump import reader as dump_module
from pytest_msprobe.dump.reader import load_dump
from tests.helpers import SHARED_DUMPS, shared_dump_dirs, tensor


def fresh(path: Path) -> dump_module.Dump:
    dump_module._CACHE.clear()
    return load_dump(path)


@pytest.mark.skipif(not SHARED_DUMPS.is_dir(), reason="../shared/dumps is not beside this checkout")
@pytest.mark.parametrize("folder", shared_dump_dirs("pt") + shared_dump_dirs("ms"), ids=lambda p: p.name)
def test_every_entry_reads_back_as_json_load_parses_it(folder: Path) -> None:
    data = json.loads((folder / "dump.json").read_text())["data"]
    dump = fresh(folder / "dump.json")
    for name, entry in data.items():
        assert dump.entry(name) == entry


def test_multibyte_text_repeated_names_and_odd_spacing(write_dump) -> None:
    raw = ('{ "data" :{"Torch.add.0.forward" : {"input_args": [{"type": "str", "value": "héllo ✓"}]},\n'
           '"Torch.add.1.forward":{"input_args":[{"type":"torch.Tensor","dtype":"torch.float16","shape":[2],'
           '"Max":1,"Min":0}]},  "Torch.add.0.forward": {"input_args": [{"type": "str", "value": "ünïcode"}]}}'
           ',"task":"statistics" , "framework" : "pytorch"}\n')
    dump = fresh(write_dump({}, raw=raw))
    parsed = json.loads(raw)["data"]
    assert dump.entry_names() == list(parsed)  # a repeated key keeps its first place and its last value
    assert dump.entry("Torch.add.0.forward") == parsed["Torch.add.0.forward"]
    assert dump.entry("Torch.add.1.forward") == parsed["Torch.add.1.forward"]
    assert dump.dtypes("Torch.add.1.forward") == ["torch.float16"] and dump.task == "statistics"
    assert dump.entry("Torch.nope.0.forward") is None


def test_cached_index_is_reused_and_invalidated_by_a_change(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(dumpindex.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(dumpindex, "CACHE_MIN_BYTES", 0)
    path = tmp_path / "dump.json"
    entry = {"input_args": [tensor(shape=[4, 8])], "input_kwargs": {}, "output": []}
    path.write_text(json.dumps({"task": "statistics", "data": {"Torch.relu.0.forward": entry}}))
    first = fresh(path)
    (cached,) = (tmp_path / "cache").glob("*.idx")
    scans = []
    monkeypatch.setattr(dumpindex, "scan", lambda raw: scans.append(1) or dumpindex.Index.from_bytes(b""))
    again = fresh(path)  # loaded from the cache: no scan
    assert not scans and again.entry("Torch.relu.0.forward") == first.entry("Torch.relu.0.forward")
    monkeypatch.undo()
    monkeypatch.setenv(dumpindex.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(dumpindex, "CACHE_MIN_BYTES", 0)
    path.write_text(json.dumps({"task": "statistics", "data": {"Torch.relu.1.forward": entry}}))
    os.utime(path, ns=(1, 1))
    changed = fresh(path)
    assert changed.entry_names() == ["Torch.relu.1.forward"]
    assert [p.name for p in (tmp_path / "cache").glob("*.idx")] != [cached.name]  # the stale index is gone
    assert len(list((tmp_path / "cache").glob("*.idx"))) == 1


def test_a_damaged_cache_file_is_ignored(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(dumpindex.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(dumpindex, "CACHE_MIN_BYTES", 0)
    path = tmp_path / "dump.json"
    path.write_text(json.dumps({"data": {"Torch.relu.0.forward": {"input_args": []}}}))
    fresh(path)
    for cached in (tmp_path / "cache").glob("*.idx"):
        cached.write_bytes(b"not marshal")
    assert fresh(path).entry_names() == ["Torch.relu.0.forward"]


def test_work_estimate_counts_matmul_multiply_adds() -> None:
    x, w = tensor(shape=[512, 1024]), tensor(shape=[4096, 1024])
    linear = dumpindex.work("linear", {"input_args": [x, w]})
    assert linear == 512 * 1024 + 4096 * 1024 + 512 * 1024 * 4096 * dumpindex.FLOP_WEIGHT
    add = dumpindex.work("add", {"input_args": [x, x]})
    assert add == 2 * 512 * 1024
    conv = dumpindex.work("conv2d", {"input_args": [tensor(shape=[8, 64, 56, 56]), tensor(shape=[128, 64, 3, 3])],
                                     "output": [tensor(shape=[8, 128, 56, 56])]})
    assert conv > 8 * 128 * 56 * 56 * 64 * 9 * dumpindex.FLOP_WEIGHT


def test_few_descriptors_stay_open_however_many_dumps(tmp_path: Path) -> None:
    dumps = []
    for k in range(dump_module._OPEN_FILES + 5):
        path = tmp_path / f"d{k}" / "dump.json"
        path.parent.mkdir()
        path.write_text(json.dumps({"data": {f"Torch.relu.{k}.forward": {"input_args": [k]}}}))
        dumps.append(load_dump(path))
    for _ in range(2):
        for k, dump in enumerate(dumps):
            dump._recent.clear()
            assert dump.entry(f"Torch.relu.{k}.forward") == {"input_args": [k]}
            assert sum(d._fd is not None for d in dumps) <= dump_module._OPEN_FILES


@pytest.mark.skipif(not SHARED_DUMPS.is_dir(), reason="../shared/dumps is not beside this checkout")
def test_columns_computed_later_equal_those_of_the_scan() -> None:
    raw = (SHARED_DUMPS / "msprobe26_pt_statistics_llama_bf16" / "dump.json").read_bytes()
    inline = dumpindex.scan(raw, dumpindex.COLUMNS)
    later = dumpindex.scan(raw)
    assert later.work is None and later.dtypes is None
    assert later.fill(dumpindex.COLUMNS, lambda k: raw[later.offsets[2 * k]:later.offsets[2 * k + 1]])
    assert later.work == inline.work and later.dtypes == inline.dtypes
    assert any(w > 0 for w in inline.work) and "torch.bfloat16" in ",".join(inline.dtypes)
    assert not later.fill(dumpindex.COLUMNS, lambda k: b"")  # nothing missing: nothing read


def test_the_largest_call_counts_its_forward_and_backward_tensors(write_dump) -> None:
    """The default memory budget's measure: a call's recorded inputs, outputs and gradients, by their dtypes
    (MindSpore's spelling too), the largest call of the dump; a scalar and a null count nothing."""
    path = write_dump({
        "Functional.linear.0.forward": {"input_args": [tensor("torch.bfloat16", [8, 16]), tensor("torch.bfloat16", [4, 16])],
                                        "input_kwargs": {"bias": None}, "output": [tensor("torch.bfloat16", [8, 4])]},
        "Functional.linear.0.backward": {"input": [tensor("torch.bfloat16", [8, 4])],
                                         "output": [tensor("torch.bfloat16", [8, 16]), None]},
        "Tensor.mul.0.forward": {"input_args": [tensor("Float32", [90]), {"type": "float", "value": 2.0}],
                                 "input_kwargs": {}, "output": [tensor("Float32", [90])]},  # 720 bytes
    })
    assert dumpindex.tensor_bytes({"a": [tensor("torch.float64", [3, 5])], "b": None}) == 120
    assert fresh(path).largest_call() == 2 * (8 * 16 + 4 * 16 + 8 * 4 + 8 * 4 + 8 * 16)  # 768 bytes, with its backward
