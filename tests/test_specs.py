"""api_specs/ loading and user overrides (ini msprobe_specs)."""
from __future__ import annotations

from pathlib import Path

import pytest

from api_specs import SPEC_DIR
from pytest_msprobe.specs.loader import SpecError, load_specs, thresholds_for


def user(tmp_path: Path, text: str) -> str:
    path = tmp_path / "my_specs.yaml"
    path.write_text(text)
    return str(path)


def test_shipped_specs_hold_every_section() -> None:
    specs = load_specs()
    for key in ("thresholds", "categories", "unsupported_types", "precision", "backward", "apis"):
        assert key in specs
    assert specs["thresholds"]["strict"]["gross"] > 0


def test_the_specs_are_read_once_however_the_call_names_them(tmp_path: Path) -> None:
    """The checks' warm-up asks for load_specs(), every item for load_specs(user_file=None): one read
    (0.1 s of YAML) per process, not one per spelling."""
    assert load_specs() is load_specs(user_file=None) is load_specs(str(SPEC_DIR), None)
    mine = user(tmp_path, "max_tensor_bytes: 1024\n")
    assert load_specs(user_file=mine) is load_specs(str(SPEC_DIR), mine) is not load_specs()


def test_user_overrides_merge_and_per_api_settings(tmp_path: Path) -> None:
    specs = load_specs(user_file=user(tmp_path, """
thresholds:
  strict: {gross: 8.0, torch.bfloat16: {gross: 16.0}}
apis:
  bmm: {algorithm: ulp_compare, grad_index: 0, thresholds: {rtol: {torch.float16: 0.01}}}
  npu_rotary_mul: {skip: "vendor bug 123, fixed in CANN 9"}
"""))
    assert specs["thresholds"]["strict"]["gross"] == 8.0
    assert specs["thresholds"]["strict"]["gross"] != load_specs()["thresholds"]["strict"]["gross"]
    assert thresholds_for(specs, "bmm")["rtol"]["torch.float16"] == 0.01
    assert thresholds_for(specs, "other")["rtol"]["torch.float16"] == load_specs()["thresholds"]["rtol"]["torch.float16"]
    assert specs["apis"]["npu_rotary_mul"]["skip"].startswith("vendor bug")


def test_user_file_may_choose_an_fp64_attention_bench(tmp_path: Path) -> None:
    text = "precision: {raise_map_by_api: {npu_fusion_attention: {torch.bfloat16: torch.float64}}}"
    table = load_specs(user_file=user(tmp_path, text))["precision"]["raise_map_by_api"]["npu_fusion_attention"]
    assert table == {"torch.float16": "torch.float64", "torch.bfloat16": "torch.float64",
                     "torch.float32": "torch.float64"}


@pytest.mark.parametrize("text, message", [
    ("thresholds: {strict: {grosss: 3}}", "thresholds.strict: unknown key 'grosss'"),
    ("thresholds: {strict: {gross: big}}", "thresholds.strict.gross: expected a number"),
    ("thresholds: {rtol: {torch.float16: 1e-3}}", "read as a string"),
    ("nonsense: 1", "unknown key 'nonsense'"),
    ("apis: {mm: {algorithm: magic}}", "apis.mm.algorithm: 'magic' is not one of"),
    ("apis: {mm: {colour: red}}", "apis.mm: unknown key 'colour'"),
    ("apis: {mm: {thresholds: {nope: 1}}}", "apis.mm.thresholds: unknown key 'nope'"),
    ("precision: {raise_map_by_api: {npu_fusion_attention: {torch.bfloat16: torch.float99}}}",
     "precision.raise_map_by_api.npu_fusion_attention: 'torch.float99' is not one of"),
    ("precision: {mixed_raise_to: torch.int8}", "precision.mixed_raise_to: 'torch.int8' is not one of"),
    ("apis: {gleu: {skip: flaky}, relu: {skip: ok}}", "apis: unknown API name(s) gleu (did you mean glu or gelu or lu?): "
                                                      "not in torch.nn.functional"),
    ("apis: {Functional.gelu: {skip: x}}", "unknown API name(s) Functional.gelu"),  # bare names, as msprobe's
    ("[1, 2]", "top level must be a mapping"),
    ("thresholds: {strict: [", "not valid YAML"),
])
def test_bad_user_file_names_file_key_and_problem(tmp_path: Path, text: str, message: str) -> None:
    path = user(tmp_path, text)
    with pytest.raises(SpecError, match="my_specs.yaml") as info:
        load_specs(user_file=path)
    assert message in str(info.value)


def test_api_names_of_every_kind_are_known(tmp_path: Path) -> None:
    names = ["gelu", "__add__", "inv", "linalg.vector_norm", "npu_fusion_attention", "fast_gelu", "npu_my_vendor_op",
             "dense", "softmax_ext", "histc", "my_registered_op"]
    import bench_functions

    bench_functions.register("my_registered_op")(lambda x: x)  # a user's own bench function is an API too
    try:
        specs = load_specs(user_file=user(tmp_path, "apis:\n" + "".join(f"  {n}: {{skip: x}}\n" for n in names)))
    finally:
        bench_functions._REGISTRY.pop("my_registered_op")
    assert set(names) <= set(specs["apis"])


def test_bad_specs_file_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makefile(".yaml", my_specs="thresholds: {strict: {grosss: 3}}")
    result = pytester.runpytest("-o", "msprobe_specs=my_specs.yaml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*ini msprobe_specs:*my_specs.yaml: thresholds.strict: unknown key 'grosss'*"])
