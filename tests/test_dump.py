"""dump.json parsing across msprobe versions and broken files."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pytest_msprobe.dump.reader import DumpError, load_dump, parse_entry_name, resolve_tensor_path
from tests.helpers import SHARED_DUMPS, shared_dump_dirs, tensor


@pytest.mark.parametrize(
    "name, expected",
    [
        ("Functional.linear.0.forward", ("Functional", "linear", "0", "forward")),
        ("Torch.linalg.vector_norm.12.backward", ("Torch", "linalg.vector_norm", "12", "backward")),
        ("NPU.atb.npu_ring_mla.0.forward", ("NPU", "atb.npu_ring_mla", "0", "forward")),
        ("Aten.add.Tensor.0.forward", ("Aten", "add.Tensor", "0", "forward")),
        ("Tensor.__getitem__.5.forward", ("Tensor", "__getitem__", "5", "forward")),
    ],
)
def test_entry_names(name: str, expected: tuple[str, ...]) -> None:
    parsed = parse_entry_name(name)
    assert (parsed.api_type, parsed.api_name, parsed.index, parsed.direction) == expected
    assert f"{parsed.full_name}.{parsed.direction}" == name


@pytest.mark.parametrize("name", ["Functional.linear.forward", "Functional.linear.0", "a.b.c.d.e.f.forward",
                                  "Functional.linear.x.forward", "Functional.lin ear.0.forward"])
def test_bad_entry_names(name: str) -> None:
    with pytest.raises(ValueError, match="entry name"):
        parse_entry_name(name)


@pytest.mark.skipif(not SHARED_DUMPS.is_dir(), reason="../shared/dumps is not beside this checkout")
@pytest.mark.parametrize("folder", shared_dump_dirs("pt") + shared_dump_dirs("ms"), ids=lambda p: p.name)
def test_shared_dumps_parse(folder: Path) -> None:
    dump = load_dump(folder / "dump.json")
    raw = json.loads((folder / "dump.json").read_text())["data"]
    assert dump.entry_names() == list(raw)
    assert dump.framework == ("mindspore" if "_ms_" in folder.name else "pytorch")
    assert dump.is_real_data == ("tensor" in folder.name)


def test_nan_infinity_tokens_and_legacy_header(write_dump) -> None:
    raw = ('{"task": "statistics", "level": "L1", "dump_data_dir": null, "data": {"Torch.exp.0.forward": '
           '{"input_args": [{"type": "torch.Tensor", "dtype": "torch.float16", "shape": [3], "Max": Infinity, '
           '"Min": -Infinity, "Mean": NaN, "Norm": NaN, "requires_grad": false, "Max_except_inf_nan": 2.0, '
           '"Min_except_inf_nan": -2.0}], "input_kwargs": {}, "output": []}}}')
    dump = load_dump(write_dump({}, raw=raw))
    leaf = dump.entry("Torch.exp.0.forward")["input_args"][0]
    assert leaf["Max"] == float("inf") and leaf["Min"] == float("-inf")
    assert dump.framework == "pytorch"  # 1.0.x dumps have no framework key: inferred from dtype strings


def test_framework_inferred_for_mindspore(write_dump) -> None:
    data = {"Mint.add.0.forward": {"input_args": [{"type": "mindspore.Tensor", "dtype": "Float32", "shape": [2]}],
                                   "input_kwargs": {}, "output": []}}
    assert load_dump(write_dump(data, framework=None)).framework == "mindspore"


def test_module_entries_are_left_out(write_dump) -> None:
    data = {"Module.layer1.Linear.forward.0": {}, "Functional.relu.0.forward": {"input_args": []},
            "Module.layer1.Linear.parameters_grad": {}}
    dump = load_dump(write_dump(data, level="mix"))
    assert dump.entry_names() == ["Functional.relu.0.forward"]
    assert dump.ignored_modules == 2


@pytest.mark.parametrize(
    "raw, message",
    [
        ('{"task": "statistics", "data": {"Functional.relu.0.forward": {"input_args": [', "truncated"),
        ('{"task": "statistics"}', "no 'data' key"),
        ('[1, 2]', "top level is a list"),
        ('{"data": [1]}', "'data' is a list"),
        ('', "the file is empty \\(0 bytes\\)"),
        ('\n  \n', "the file is empty \\(4 bytes\\)"),
        ('{', "not valid JSON .*truncated"),
    ],
)
def test_broken_files_name_the_problem(write_dump, raw: str, message: str) -> None:
    path = write_dump({}, raw=raw)
    with pytest.raises(DumpError, match=message) as info:
        load_dump(path)
    assert str(path) in str(info.value)


def test_missing_file() -> None:
    with pytest.raises(DumpError, match="cannot read"):
        load_dump("/nonexistent/dump.json")


def test_tensor_paths_cannot_escape(write_dump, tmp_path: Path) -> None:
    dump = load_dump(write_dump({}, task="tensor"))
    (dump.tensor_dir).mkdir()
    (dump.tensor_dir / "ok.pt").write_bytes(b"")
    assert resolve_tensor_path(dump, {"data_name": "ok.pt"}) == (dump.tensor_dir / "ok.pt").resolve()
    assert resolve_tensor_path(dump, {"data_name": None}) is None
    for bad in ("../dump.json", "/etc/passwd", "a/../../x.pt"):
        with pytest.raises(ValueError, match="outside"):
            resolve_tensor_path(dump, {"data_name": bad})
    secret = tmp_path / "secret.pt"
    secret.write_bytes(b"")
    os.symlink(secret, dump.tensor_dir / "link.pt")
    with pytest.raises(ValueError, match="outside"):
        resolve_tensor_path(dump, {"data_name": "link.pt"})
    # legacy absolute datapath from the dump host: only the file name is used, locally
    assert resolve_tensor_path(dump, {"datapath": "/old/host/ok.pt"}) == (dump.tensor_dir / "ok.pt").resolve()


def test_parse_once_per_process(write_dump) -> None:
    path = write_dump({"Functional.relu.0.forward": {"input_args": [tensor()]}})
    assert load_dump(path) is load_dump(path)
