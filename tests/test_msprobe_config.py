"""Migrating from msprobe: --msprobe-config config.json (white/black lists, error_data_path), API names checked as
msprobe checks them (also in ini msprobe_specs), and msprobe's NPU runtime settings as ini keys."""
from __future__ import annotations

import importlib
import json
import sys
import types
from pathlib import Path

import pytest
import torch

from pytest_msprobe.runs import npu_runtime
from pytest_msprobe.session.msprobe_config import ConfigError, read
from pytest_msprobe.specs.loader import load_specs
from tests.helpers import api_records, make_dump, tensor

LEAN = ("-p", "no:cacheprovider")


def unary(dtype: str = "torch.float32") -> dict:
    return {"input_args": [tensor(dtype, [4, 8])], "input_kwargs": {}, "output": [tensor(dtype, [4, 8])]}


DATA = {"Functional.relu.0.forward": unary(), "Functional.gelu.0.forward": unary(), "Torch.exp.0.forward": unary(),
        "Torch.exp.1.forward": unary()}


def config_json(folder: Path, section: str = "run_ut", **body: object) -> Path:
    path = folder / "config.json"
    path.write_text(json.dumps({"task": section, "dump_path": "./dump", "level": "L1", section: body}))
    return path


@pytest.mark.parametrize("section", ["run_ut", "acc_check"])  # msprobe 8.x, 26.x
def test_white_and_black_lists_select_items_as_msprobe_does(pytester: pytest.Pytester, section: str) -> None:
    dump = make_dump(pytester, DATA)
    config_json(pytester.path, section, white_list=["exp", "relu"], black_list=["relu"])
    result = pytester.runpytest(str(dump), "--msprobe-config", "config.json", *LEAN)
    result.assert_outcomes(passed=2, deselected=2)  # black wins over white; gelu is not in the white list
    assert sorted(api_records(pytester)) == ["Torch.exp.0.forward", "Torch.exp.1.forward"]
    result.stdout.fnmatch_lines([f"msprobe: --msprobe-config *config.json ({section}): white_list 2; black_list 1",
                                 "msprobe: 2 item(s) deselected by the white_list/black_list of *config.json"])


def test_the_lists_also_drop_the_fuzz_items_of_excluded_apis(pytester: pytest.Pytester) -> None:
    """An API the lists exclude is not fuzzed either (its [fuzz] item used to run)."""
    dump = make_dump(pytester, DATA)
    config_json(pytester.path, white_list=["exp"])
    result = pytester.runpytest(str(dump), "--msprobe-config", "config.json", "--msprobe-fuzz", "2", "-v", *LEAN)
    result.assert_outcomes(passed=4, deselected=4)  # exp.0, exp.1 and their [fuzz] items
    assert "relu.0.forward[fuzz]" not in result.stdout.str() and "gelu.0.forward[fuzz]" not in result.stdout.str()
    result.stdout.fnmatch_lines(["*Torch.exp.0.forward[[]fuzz[]] PASSED*"])


@pytest.mark.parametrize("body, message", [
    ({"white_list": ["relu", "gleu"]}, "run_ut.white_list: unknown API name(s) gleu (did you mean glu or gelu or lu?)"),
    ({"black_list": "relu"}, "run_ut.black_list must be a list of API names"),
    ({"error_data_path": "./nowhere"}, "run_ut.error_data_path: * is not an existing folder"),
])
def test_what_msprobe_refuses_is_a_usage_error(pytester: pytest.Pytester, body: dict, message: str) -> None:
    dump = make_dump(pytester, DATA)
    config_json(pytester.path, **body)
    result = pytester.runpytest(str(dump), "--msprobe-config", "config.json", *LEAN)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--msprobe-config: *config.json: {message}*"])


def test_a_file_without_the_section_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"task": "statistics", "statistics": {"scope": []}}))
    with pytest.raises(ConfigError, match="no acc_check or run_ut section .task 'statistics'."):
        read(path, tmp_path, load_specs())
    path.write_text("{")
    with pytest.raises(ConfigError, match="not valid JSON"):
        read(path, tmp_path, load_specs())
    path.write_text(json.dumps({"task": "run_ut", "run_ut": {"is_online": False, "host": "x", "white_list": []}}))
    assert read(path, tmp_path, load_specs()).ignored == ("is_online", "host")


def test_error_data_path_is_where_save_error_data_without_a_folder_writes(pytester: pytest.Pytester) -> None:
    from tests.triage_helpers import PLANTED, gelu_bf16

    pytester.makeconftest(PLANTED)
    dump = make_dump(pytester, gelu_bf16())
    (pytester.path / "errors").mkdir()
    config_json(pytester.path, "acc_check", error_data_path="errors")
    result = pytester.runpytest(str(dump), "--msprobe-standard", "strict", "--msprobe-config", "config.json",
                                "--msprobe-save-error-data", *LEAN)
    result.assert_outcomes(failed=2)
    saved = json.loads((pytester.path / "errors" / "ut_error_data" / "dump.json").read_text())
    assert list(saved["data"]) == ["Functional.gelu.0.forward", "Functional.gelu.0.backward"]
    # the folder is an option value: a dump.json right after it would be swallowed, so it is refused
    result = pytester.runpytest("--msprobe-save-error-data", str(dump), *LEAN)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--msprobe-save-error-data takes a folder, got the file *dump.json*"])


def test_a_misspelt_name_in_a_specs_skip_is_rejected(pytester: pytest.Pytester) -> None:
    dump = make_dump(pytester, DATA)
    pytester.makefile(".yaml", specs="apis:\n  gelu_new: {skip: 'flaky on our NPU'}\n")
    result = pytester.runpytest(str(dump), "-o", "msprobe_specs=specs.yaml", *LEAN)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*ini msprobe_specs: *specs.yaml: apis: unknown API name(s) gelu_new (did you mean "
                                 "gelu or *?): not in torch.nn.functional*"])
    pytester.makefile(".yaml", specs="apis:\n  gelu: {skip: 'flaky on our NPU'}\n")
    result = pytester.runpytest(str(dump), "-o", "msprobe_specs=specs.yaml", *LEAN)
    result.assert_outcomes(passed=3, skipped=1)
    result.stdout.fnmatch_lines(["  skipped by msprobe_specs (1: Functional.gelu): as that file says"])


# ------------------------------------------------------------------------------------------------ NPU runtime


def test_npu_settings_without_an_npu_say_so_and_change_nothing(pytester: pytest.Pytester) -> None:
    dump = make_dump(pytester, {"Functional.relu.0.forward": unary()})
    result = pytester.runpytest(str(dump), "-o", "msprobe_jit_compile=on", *LEAN)
    result.assert_outcomes(passed=1)  # auto picks the CPU here; nothing crashes on the missing torch_npu
    result.stdout.fnmatch_lines(["msprobe: NPU runtime jit_compile=on, allow_internal_format=on not applied: "
                                 "torch_npu cannot be imported here (*); the settings only matter for items running "
                                 "on an NPU"])
    result = pytester.runpytest(str(dump), "--msprobe-device", "npu", "-o", "msprobe_allow_internal_format=off", "-rs",
                                *LEAN)
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*--msprobe-device npu: torch_npu cannot be imported*"])


def test_npu_settings_use_torch_npus_documented_switches(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, object]] = []
    fake = types.ModuleType("torch_npu")
    fake.npu = types.SimpleNamespace(set_compile_mode=lambda **kw: calls.append(("set_compile_mode", kw)))  # type: ignore
    config = types.SimpleNamespace(allow_internal_format=None)
    monkeypatch.setitem(sys.modules, "torch_npu", fake)
    monkeypatch.setattr(torch, "npu", types.SimpleNamespace(config=config), raising=False)
    # the module the code imports (sys.modules), not the package attribute, which an in-process pytester
    # run of an earlier test can leave pointing to another copy: the real check would see the fake
    npu_import = importlib.import_module("pytest_msprobe.npu_import")
    real_npu_import_error = npu_import.npu_import_error
    monkeypatch.setattr(npu_import, "npu_import_error", lambda: None)
    npu_runtime.apply.cache_clear()
    try:
        runtime = npu_runtime.NpuRuntime(jit_compile=False, allow_internal_format=False)
        assert npu_runtime.apply(runtime) is None
        assert calls == [("set_compile_mode", {"jit_compile": False})] and config.allow_internal_format is False
        assert npu_runtime.apply(runtime) is None and len(calls) == 1  # once per process
        del fake.npu.set_compile_mode  # an older torch_npu
        assert "torch_npu refused jit_compile=on" in npu_runtime.apply(npu_runtime.NpuRuntime(True, None))
    finally:
        npu_runtime.apply.cache_clear()
        # the real import check may have run against the fake module (a module that imported it by name
        # calls it): its cached "importable" would send every later item of this process to an npu device
        real_npu_import_error.cache_clear()
