"""The same quantity reads the same, with its unit, in every view: the terminal's failure table and
message, the details CSV, the JSON lines record and the HTML page (table, plot headers, SVG captions)."""
from __future__ import annotations

import csv
import html
import json
import re

import pytest

from pytest_msprobe.reports.summary import shorten
from tests.helpers import device_side_conftest, make_dump, tensor
from tests.test_html import chromium, parse, run_chromium
from tests.triage_helpers import gelu_bf16

LEAN = ("-p", "no:cacheprovider")
# an fp32 linear 1e-3 too large on the device; a bf16 gelu with one element 1.5 times too large
BUGS = device_side_conftest("""
import torch
import torch.nn.functional as F

def linear(orig, *a, **k):
    return orig(*a, **k) * (1 + 1e-3)

def gelu(orig, x, *a, **k):
    y = orig(x, *a, **k)
    scale = torch.ones_like(y)
    scale.view(-1)[5] = 1.5
    return y * scale

IMPLS = {F.linear: linear, F.gelu: gelu}
""")
LINEAR = {"Functional.linear.0.forward": {"input_args": [tensor(shape=[4, 16]), tensor(shape=[32, 16])],
                                          "input_kwargs": {}, "output": [tensor(shape=[4, 32])]}}


def _terminal_rows(text: str) -> dict[str, dict[str, str]]:
    """The failure tables' rows by item and output: {"Functional.gelu.0.forward output.0": {column: cell}}."""
    rows, header, item = {}, None, ""
    for line in text.splitlines():
        if re.match(r"^\S+\.(forward|backward): error  \(device=", line):
            item = line.split(":")[0]
        elif line.startswith("output    shape"):
            header = line.split()
        elif header and re.match(r"^(output|input)\.\d+  ", line):
            rows[f"{item} {line.split()[0]}"] = dict(zip(header, re.split(r"  +", line)))
        else:
            header = None if not line.startswith(("output.", "input.")) else header
    return rows


def test_every_view_shows_the_same_figure_with_its_unit(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(BUGS)
    data = {**LINEAR, "Functional.gelu.0.forward": gelu_bf16([16, 16])["Functional.gelu.0.forward"]}
    dump = make_dump(pytester, data)
    result = pytester.runpytest(str(dump), "--msprobe-html", "out/report.html", *LEAN)
    result.assert_outcomes(failed=2)
    text = result.stdout.str()
    terminal = _terminal_rows(text)
    records = {r["api"]: r for r in map(json.loads, next((pytester.path / "msprobe_results").glob(
        "msprobe_records_*.jsonl")).read_text().splitlines())}
    with next((pytester.path / "msprobe_results").glob("accuracy_checking_details_*.csv")).open(
            encoding="utf-8-sig") as f:
        details = {row["API Name"]: row for row in csv.DictReader(f)}
    page = (pytester.path / "out" / "report.html").read_text(encoding="utf-8")
    table = {row["item"]: row for row in parse(page).rows}
    for api in ("Functional.linear.0", "Functional.gelu.0"):
        out = records[api]["outputs"][0]
        name, metrics, strict = out["name"], out["metrics"], out["reference"]
        cell = terminal[f"{api}.forward output.0"]
        html_row = table[f"{api}.forward"]
        # msprobe's max relative error: empty where msprobe's Layer 1 left it out (the fp32 linear)
        rel = metrics["max_rel_err"]
        assert (rel is None) == (api == "Functional.linear.0")
        assert cell["max_rel_err"] == html_row["max_rel_err"] == ("-" if rel is None else f"{rel:.6g}")
        assert details[name]["相对误差最大值"].strip() == ("" if rel is None else f"{rel:.14f}")
        # strict's largest error, in scale units: the message, the JSON line, the HTML column and plot header
        assert f"(worst {strict['max_err']:.3g} scale units = " in out["verdict_message"]
        assert f"(worst {strict['max_err']:.3g} scale units = " in text
        assert float(html_row["strict_max_err"]) == pytest.approx(strict["max_err"], rel=1e-5)
        assert f"{name} <small>" in page and f"strict: max {strict['max_err']:.4g} scale units</small>" in page
        # the plain ULPs of the plot header and msprobe's ULP column (both from the rounded bench's ULP)
        plot_max = float(re.search(rf"{re.escape(name)} <small>[^<]*, max ([\d.e+]+) ULP", page).group(1))
        if details[name]["ULP误差最大值"].strip():
            assert plot_max == pytest.approx(float(details[name]["ULP误差最大值"]), rel=1e-3)
        assert plot_max >= strict["max_err"] * (1 - 1e-3)  # a scale is at least one ULP
    assert "strict max err (scale units)" in page and "strict max err (ULP)" not in page
    assert "dashed: 4 ULP, strict's gross-error limit of 4 scale units where an element's scale is one ULP" in \
        html.unescape(" ".join(re.findall(r'class="t">([^<]*)<', page)))


def test_a_cut_message_ends_in_an_ellipsis_at_a_word() -> None:
    text = "gross error: 127 of 128 elements exceed 4 scale units (worst 833 scale units)"
    assert shorten(text, 200) == text
    cut = shorten(text, 40)
    assert len(cut) <= 40 and cut.endswith("…") and text.startswith(cut[:-1]) and text[len(cut) - 1] == " "
    assert shorten("x" * 50, 20) == "x" * 19 + "…"  # no space to cut at: cut inside the word, still marked


def test_table_messages_and_svg_captions_are_never_cut_silently(pytester: pytest.Pytester) -> None:
    """A long message ends in an ellipsis in the table; every SVG caption (a long API name included) lies
    inside its plot in a real browser."""
    chromium()
    pytester.makeconftest(BUGS)
    dump = make_dump(pytester, LINEAR)
    pytester.runpytest(str(dump), "--msprobe-html", "out/report.html", *LEAN).assert_outcomes(failed=1)
    report = pytester.path / "out" / "report.html"
    page = report.read_text(encoding="utf-8")
    message = parse(page).rows[0]["message"]
    assert len(message) <= 300 and message.endswith("…") and " scale units" in message
    # the captions, and a caption naming a long output, must fit in the plots' width
    probe = ("<script>var bad=[];Array.prototype.forEach.call(document.querySelectorAll('svg.plot'),function(s){"
             "var w=s.width.baseVal.value,h=s.height.baseVal.value;Array.prototype.forEach.call("
             "s.querySelectorAll('text'),function(t){var b=t.getBBox();if(b.x<0||b.x+b.width>w+0.5||b.y<0||"
             "b.y+b.height>h+0.5)bad.push(t.textContent);});});"
             "document.body.setAttribute('data-clipped',JSON.stringify(bad));</script></body>")
    from pytest_msprobe.triage import html as triage_html
    summary = json.loads(json.dumps(json.loads(next((pytester.path / "msprobe_results").glob(
        "msprobe_records_*.jsonl")).read_text().splitlines()[0])["error_summary"][0]))
    summary["name"] = "Functional.scaled_dot_product_attention.0.backward.input.0.and_a_longer_name_without_spaces"
    extra = triage_html.output_plots(summary)
    (pytester.path / "probe.html").write_text(page.replace("</body>", extra + probe), encoding="utf-8")
    dom = run_chromium("--dump-dom", "--window-size=1300,1800", "--virtual-time-budget=2000",
                       (pytester.path / "probe.html").as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert parse(dom.stdout).body.get("data-clipped") == "[]"
