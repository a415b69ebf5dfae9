"""-k and -m applied while a dump is collected select exactly the items pytest itself would."""
from __future__ import annotations

import pytest

from tests.helpers import EXAMPLES, copy_dump

BF16_EXAMPLE = EXAMPLES / "mlp_bf16_statistics" / "step0" / "rank0"
# A conftest that modifies items after collection: the plugin must then leave -k/-m to pytest alone. Another
# installed plugin that modifies items (pytest-benchmark) does the same, so the runs here leave it out.
NO_OTHERS = ("-p", "no:benchmark")
MODIFIER = "def pytest_collection_modifyitems(items):\n    pass\n"
EXPRESSIONS = [
    ("-k", "linear"), ("-k", "linear and forward"), ("-k", "not backward"), ("-k", "LINEAR and 1"),
    ("-k", "bf16"), ("-k", "dump.json"), ("-k", "nested and linear"), ("-k", "msprobe and not gelu"),
    ("-k", "bfloat16 or float32"), ("-k", "Functional.linear.1"),
    ("-m", "Functional and backward"), ("-m", "bfloat16"), ("-m", "not forward"), ("-m", "msprobe and Tensor"),
]


def ids(result: pytest.RunResult) -> list[str]:
    return [line for line in result.outlines if "::" in line]


@pytest.mark.parametrize("option, expression", EXPRESSIONS)
def test_early_selection_equals_pytests(pytester: pytest.Pytester, option: str, expression: str) -> None:
    dump = copy_dump(pytester, BF16_EXAMPLE, "nested/bf16")
    early = pytester.runpytest("--collect-only", "-q", str(dump), option, expression,
                               "-o", "msprobe_early_selection_entries=0", *NO_OTHERS)
    pytester.makeconftest(MODIFIER)
    late = pytester.runpytest("--collect-only", "-q", str(dump), option, expression,
                              "-o", "msprobe_early_selection_entries=0", *NO_OTHERS)
    assert ids(early) == ids(late)
    assert "deselected" not in early.stdout.str() or not ids(early)  # made only what is kept
    assert "deselected" in late.stdout.str() or len(ids(late)) == 18  # all of them


def test_small_dumps_report_deselected_items(pytester: pytest.Pytester) -> None:
    dump = copy_dump(pytester, BF16_EXAMPLE, "bf16")
    pytester.runpytest("--collect-only", "-q", str(dump), "-k", "linear").stdout.fnmatch_lines(
        ["*4/18 tests collected (14 deselected)*"])


def test_a_conftest_marker_still_selects(pytester: pytest.Pytester) -> None:
    dump = copy_dump(pytester, BF16_EXAMPLE, "bf16")
    pytester.makeconftest("""
        import pytest
        def pytest_collection_modifyitems(items):
            for item in items:
                if "gelu" in item.name:
                    item.add_marker(pytest.mark.slow)
    """)
    result = pytester.runpytest("--collect-only", "-q", str(dump), "-m", "slow", "-p", "no:randomly",
                                "-o", "msprobe_early_selection_entries=0")
    assert len(ids(result)) == 2 and all("gelu" in i for i in ids(result))


def test_small_dumps_keep_pytests_deselected_count(pytester: pytest.Pytester) -> None:
    dump = copy_dump(pytester, BF16_EXAMPLE, "bf16")
    result = pytester.runpytest("--collect-only", "-q", str(dump), "-k", "linear")
    result.stdout.fnmatch_lines(["*deselected*"])
