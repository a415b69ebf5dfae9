"""--msprobe-html: one self-contained page; sorted and filtered by its own JS in a real headless Chromium."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import pytest

from pytest_msprobe.records.record import Record
from tests.helpers import make_dump
from tests.triage_helpers import PLANTED, gelu_bf16, relu_fp16

LEAN = ("-p", "no:cacheprovider")
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync")


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("no chromium/chrome on PATH (Debian: apt-get install -y chromium chromium-driver): "
                "the page's JS and SVG are not rendered in a browser here")


def run_chromium(*args: str) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory(prefix="msprobe-chromium-") as profile:
        return subprocess.run([chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
                              capture_output=True, text=True, timeout=120)


class Rows(HTMLParser):
    """Rows of the API table in document order: {column: the text the row shows, `<column>_title`: the cell's
    tooltip, `<column>_folded`: what a folded cell opens to, row_status, hidden}."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[dict[str, str]] = []
        self.body: dict[str, str] = {}
        self.table: dict[str, str] = {}
        self.col: str | None = None
        self.part: str | None = None  # the key the text goes to

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "body":
            self.body = a
        elif tag == "table" and a.get("id") == "apis":
            self.table = a
        elif tag == "tr" and "data-order" in a:
            self.rows.append({"row_status": a["data-status"], "hidden": "display: none" in a.get("style", "")})
        elif tag == "td" and self.rows:
            self.col = self.part = a.get("data-col")
            if self.col and "title" in a:
                self.rows[-1][f"{self.col}_title"] = a["title"]
        elif tag == "summary" and self.col:
            self.part = self.col
        elif tag == "details" and self.col:
            self.part = f"{self.col}_folded"

    def handle_data(self, data: str) -> None:
        if self.part and self.rows:
            self.rows[-1][self.part] = self.rows[-1].get(self.part, "") + data

    def handle_endtag(self, tag: str) -> None:
        if tag == "td":
            self.col = self.part = None
        elif tag == "summary" and self.col:
            self.part = f"{self.col}_folded"


def parse(html_text: str) -> Rows:
    parser = Rows()
    parser.feed(html_text)
    return parser


def make_report(pytester: pytest.Pytester) -> Path:
    pytester.makeconftest(PLANTED)
    dump = make_dump(pytester, {**gelu_bf16(), **relu_fp16()})
    result = pytester.runpytest(str(dump), "--msprobe-standard", "strict", "--msprobe-fuzz", "30",
                                "--msprobe-html", "out/report.html", *LEAN)
    result.assert_outcomes(failed=4, passed=1)  # gelu fwd+bwd, gelu[fuzz], relu[fuzz]; relu passes
    result.stdout.fnmatch_lines(["*html report: *out/report.html*"])
    return pytester.path / "out" / "report.html"


def test_the_page_is_self_contained_and_plots_each_failure(pytester: pytest.Pytester) -> None:
    page = make_report(pytester).read_text(encoding="utf-8")
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page) and "<link" not in page
    assert "<script src" not in page and "@import" not in page
    rows = parse(page).rows
    assert [(r["item"], r["status"]) for r in rows] == [
        ("Functional.gelu.0.forward", "error"), ("Functional.gelu.0.backward", "error"),
        ("Functional.relu.0.forward", "pass"), ("Functional.gelu.0.forward [fuzz]", "error"),
        ("Functional.relu.0.forward [fuzz]", "error")]
    # the device dtypes of each item's outputs; one dump: no dump column, the header names it
    assert [r["dtype"] for r in rows] == ["bfloat16", "bfloat16", "float16", "bfloat16", "float16"]
    assert 'data-col="dump"' not in page and " · dump d/dump.json</p>" in page
    # a long message folds: the row shows the start of its first line, cut at a word; it opens to all of it
    shown, folded = rows[0]["message"], rows[0]["message_folded"]
    assert shown.endswith("…") and len(shown) <= 100 and folded.startswith(shown[:-1]) and len(folded) > 2 * len(shown)
    assert page.count('<svg class="plot heatmap"') == 4 and page.count('<section class="failure"') == 4
    assert "2.998046875 (one ULP below the recorded Max)" in page  # the fuzz failure's shrunk example
    # what judged it: strict and its kind of op, not the algorithm msprobe's own standards would have used
    assert rows[0]["algorithm"] == "strict elementwise" and float(rows[0]["strict_max_err"]) > 4
    assert "device cpu (--msprobe-device auto)" in page  # the device the items ran on, not "auto"
    summary = re.findall(r'<tr data-api="([^"]+)">(.*?)</tr>', page)  # by API, failing first
    assert [api for api, _ in summary] == ["Functional.gelu", "Functional.relu"]
    assert [re.findall(r'class="num[^"]*">(\d*)<', cells) for _, cells in summary] == [
        ["2", "2", "", "", ""], ["1", "", "", "1", ""]]  # items, error, Warning, pass, SKIP
    bars = re.findall(r'<svg class="plot bars".*?</svg>', page)
    assert len(bars) == 8 and all(b.count('axis-label"') == 2 for b in bars)  # both axes labelled
    assert "error, ULP of the device dtype" in bars[0] and "flat index, in 48 slices" in bars[1]


def test_chromium_loads_sorts_filters_and_renders_the_plots(pytester: pytest.Pytester) -> None:
    chromium()
    report = make_report(pytester)
    url = report.as_uri() + "#sort=max_abs_err&dir=desc&status=error"
    dom = run_chromium("--dump-dom", "--virtual-time-budget=3000", url)
    assert dom.returncode == 0 and "<tbody>" in dom.stdout, dom.stderr[-2000:]
    parsed = parse(dom.stdout)
    assert parsed.table.get("data-sorted") == "max_abs_err:desc"  # the page's JS ran
    shown = [r for r in parsed.rows if not r["hidden"]]
    assert {r["row_status"] for r in shown} == {"error"} and len(shown) == 4
    errors = [float(r["max_abs_err"]) for r in shown if r.get("max_abs_err")]
    assert errors == sorted(errors, reverse=True) and len(errors) >= 3
    assert [r for r in parsed.rows if r["hidden"]][0]["row_status"] == "pass"
    assert int(parsed.body.get("data-plots-rendered", "0")) == 12  # 4 failures x 3 SVG plots with a size
    shot = pytester.path / "report.png"
    screenshot = run_chromium(f"--screenshot={shot}", "--window-size=1300,1800", report.as_uri())
    assert screenshot.returncode == 0 and shot.stat().st_size > 20_000, screenshot.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # every row is one line high: a failing row, its long message folded, is as tall as a passing one
    probe = ("<script>var h={};Array.prototype.forEach.call(document.querySelectorAll('#apis tbody tr'),function(r){"
             "var s=r.getAttribute('data-status');h[s]=(h[s]||[]).concat([r.getBoundingClientRect().height]);});"
             "document.body.setAttribute('data-heights',JSON.stringify(h));</script></body>")
    (pytester.path / "probe.html").write_text(report.read_text("utf-8").replace("</body>", probe), encoding="utf-8")
    dom = run_chromium("--dump-dom", "--window-size=1300,1800", "--virtual-time-budget=2000",
                       (pytester.path / "probe.html").as_uri())
    heights = json.loads(parse(dom.stdout).body.get("data-heights", "{}"))
    assert len(heights.get("error", [])) == 4 and len(heights.get("pass", [])) == 1, heights
    assert max(heights["error"]) <= 1.5 * heights["pass"][0], heights


def test_pytest_html_gets_the_same_plots(pytester: pytest.Pytester) -> None:
    import pytest_html  # noqa: F401  (the test extra installs it: this test must run, not skip)

    pytester.makeconftest(PLANTED)
    dump = make_dump(pytester, gelu_bf16())
    result = pytester.runpytest_subprocess(str(dump), "--msprobe-standard", "strict", "--html", "ph.html",
                                           "--self-contained-html", *LEAN)
    result.assert_outcomes(failed=2)
    page = (pytester.path / "ph.html").read_text(encoding="utf-8")  # pytest-html 4 keeps extras in a JSON blob
    assert page.count("plot heatmap") == 2 and page.count("histogram of errors") == 2


def test_plots_draw_stricts_gross_limit_of_the_ops_kind() -> None:
    """The dashed line and the red bars follow `strict: gross` of api_specs (a reduction's own), not a constant."""
    import torch

    from pytest_msprobe.specs.loader import load_specs
    from pytest_msprobe.triage.error_summary import gross_limit, summarize
    from pytest_msprobe.triage.html import output_plots

    specs = load_specs()
    rules = specs["thresholds"]["strict"]
    assert gross_limit(specs, "gelu", "torch.bfloat16") == rules["gross"]
    assert gross_limit(specs, "softmax", "torch.bfloat16") == rules["reduction"]["gross"]
    bench = torch.linspace(1.0, 1.9, 64, dtype=torch.float64)  # one bf16 ULP is 2**-7 in [1, 2)
    device = bench.to(torch.bfloat16)
    device[3] += 5 * 2 ** -7  # 5 ULP: beyond a limit of 4, within one of 6
    for limit, red_bins in ((4.0, True), (6.0, False)):
        (summary,) = summarize([bench], [device], ["out"], lambda dtype, limit=limit: limit)
        assert summary["gross"] == limit and summary["max_ulp"] > 4.5
        page = output_plots(summary)
        assert f"dashed: {limit:g} ULP" in page
        # the histogram's (4, 8] ULP bin may hold errors beyond either limit: red; the largest error per slice
        # of the flat index is red only beyond the limit
        bar = re.search(r'fill="(#[0-9a-f]+)"><title>≤8: ', page)
        assert bar is not None and bar.group(1) == "#d9534f"
        slices = re.findall(r'fill="(#[0-9a-f]+)"><title>\d+: ([\d.e+-]+)</title>', page)
        assert any(colour == "#d9534f" for colour, v in slices) == red_bins


# ------------------------------------------------------------------------------ messages in English, folded

CJK = re.compile(r"[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]")
SETTINGS = {"standard": "msprobe", "check_options": {"run_seed": 1, "device": "cpu", "specs_file": None}}


def _record(message: str, **extra: object) -> Record:
    out = {"name": "Torch.mul.0.forward.output.0", "status": "pass", "message": "", "verdict": "error",
           "algorithm": "absolute_threshold", "verdict_message": message, "metrics": {"cosine": 1.0, "max_abs_err": 0.5},
           "worst": None, "device_dtype": "torch.int32", "bench_dtype": "torch.int32", "shape": [2]}
    return Record.from_dict({"api": "Torch.mul.0", "direction": "forward", "seed": 0, "status": "error",
                             "standard": "msprobe", "order": 0, "nodeid": "d/dump.json::Torch.mul.0.forward",
                             "dump": "d/dump.json", "outputs": [out], "message": "", **extra})


def _page(path: Path, records: list[Record]) -> str:
    from types import SimpleNamespace

    from pytest_msprobe.triage.html import write_html

    settings = SimpleNamespace(standard=SETTINGS["standard"], check_options=SimpleNamespace(**SETTINGS["check_options"]))
    return write_html(path, records, [], settings).read_text("utf-8")


def test_messages_are_english_and_a_long_message_folds(tmp_path: Path) -> None:
    from pytest_msprobe.triage.html import CSS
    from pytest_msprobe.verdict.verdicts import ENGLISH

    message = "ERROR: inf/nan错误率超过阈值ERROR: 绝对误差错误率超过阈值"  # as msprobe concatenates them
    summary = [{"name": "Torch.mul.0.forward.output.0", "dtype": "torch.int32", "shape": [2], "numel": 2,
                "kind": "exact", "mismatches": 1}]
    page = _page(tmp_path / "r.html", [_record(message, error_summary=summary)])
    assert not CJK.search(page), CJK.findall(page)[:10]
    row = parse(page).rows[0]
    english = "ERROR: inf/nan error ratio above the threshold; ERROR: absolute error ratio above the threshold"
    assert row["message"] == row["message_folded"] == english  # folded: may not fit the cell; not cut
    assert row["dtype"] == "int32"
    assert "Torch.mul.0.forward.output.0: ERROR: inf/nan error ratio above the threshold; ERROR: absolute" in page
    assert all(not CJK.search(en) for en in ENGLISH.values())
    # over 100 characters, the row shows the start of the first line, cut at a word; it opens to all
    lines = "device raised: " + "word " * 40 + "end\nTraceback line two"
    short = "Relative error is below 0.001"  # fits the narrowest cell: as it is
    rows = parse(_page(tmp_path / "r2.html", [_record(english + " " + english), _record(lines), _record(short),
                                              _record("a\nb")])).rows
    assert rows[0]["message"] == english + "…" and rows[0]["message_folded"] == english + " " + english
    assert rows[1]["message"].startswith("device raised: word") and rows[1]["message"].endswith("word…")
    assert len(rows[1]["message"]) <= 100 and rows[1]["message_folded"] == lines
    assert rows[2]["message"] == rows[2]["message_title"] == short and "message_folded" not in rows[2]
    assert rows[3]["message"] == "a" and rows[3]["message_folded"] == "a\nb"
    # closed, the row keeps to one line (the table's nowrap, cut with an ellipsis); open, the text wraps
    rules: dict[str, str] = {}
    for sels, body in re.findall(r"([^{}]+)\{([^}]*)\}", CSS.replace("\n", "")):
        for sel in sels.split(","):
            rules[" ".join(sel.split())] = rules.get(" ".join(sel.split()), "") + ";" + body
    assert "white-space:nowrap" in rules["table.api td"] and "white-space" not in rules["table.api td.msg"]
    assert "text-overflow:ellipsis" in rules["table.api td.msg"] and "text-overflow:ellipsis" in rules[
        "table.api td.msg summary"]
    assert {"white-space:pre-line", "overflow-wrap:anywhere"} <= set(rules["table.api td.msg details[open]"].split(";"))
    assert "white-space:pre-wrap" in rules["pre"]


def test_in_english_keeps_unknown_text_and_order() -> None:
    from pytest_msprobe.verdict.verdicts import in_english

    assert in_english("Relative error is less than 0.001") == "Relative error is less than 0.001"
    assert in_english("ERROR: 绝对误差错误率超过阈值ERROR: inf/nan错误率超过阈值") == (
        "ERROR: absolute error ratio above the threshold; ERROR: inf/nan error ratio above the threshold")


def test_chromium_folds_a_long_message_to_one_line_and_opens_it_inside_the_window(tmp_path: Path) -> None:
    chromium()
    long = ("The shape of bench torch.Size([4096, 4096]) and npu torch.Size([4096, 4095]) not equal; "
            "Functional.scaled_dot_product_attention.0.forward.output.0.but_also_a_very_long_unbroken_name_" * 3)
    page = _page(tmp_path / "r.html", [_record(long[:290]), _record("", status="pass")])
    probe = ("<script>(function(){var rows=document.querySelectorAll('#apis tbody tr'),c=rows[0].querySelector("
             "'td.msg'),line=rows[1].getBoundingClientRect().height,fits=function(){return document.documentElement."
             "scrollWidth<=window.innerWidth;},shut=[fits(),rows[0].getBoundingClientRect().height<=1.5*line];"
             "c.querySelector('summary').click();var opened=[fits(),c.getBoundingClientRect().height>"
             "3*parseFloat(getComputedStyle(c).lineHeight)];"
             "document.body.setAttribute('data-probe',shut.concat(opened).join(','));})();</script></body>")
    (tmp_path / "probe.html").write_text(page.replace("</body>", probe), encoding="utf-8")
    dom = run_chromium("--dump-dom", "--window-size=1300,800", "--virtual-time-budget=2000",
                       (tmp_path / "probe.html").as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    # closed: no horizontal overflow, one line as the passing row; opened: still inside the window, several lines
    assert parse(dom.stdout).body.get("data-probe") == "true,true,true,true"


# ------------------------------------------------------------------------------ which dump, which dtype


def test_rows_of_the_same_call_in_two_dumps_read_apart(pytester: pytest.Pytester) -> None:
    """The dump column names each row's dump past the folders the dumps share (as the CSV sets are named); the
    dtype column, the device dtypes of its outputs. The records come from two xdist workers."""
    pytester.makeconftest(PLANTED)
    dumps = [make_dump(pytester, gelu_bf16(), name="step0/rank0"),
             make_dump(pytester, {**gelu_bf16(), **relu_fp16()}, name="step0/rank1")]
    result = pytester.runpytest(*map(str, dumps), "--msprobe-standard", "strict", "-n", "2",
                                "--msprobe-html", "report.html", *LEAN)
    result.assert_outcomes(failed=4, passed=1)
    page = (pytester.path / "report.html").read_text(encoding="utf-8")
    rows = parse(page).rows
    assert [(r["dump"], r["item"], r["dtype"]) for r in rows] == [
        ("rank0", "Functional.gelu.0.forward", "bfloat16"), ("rank0", "Functional.gelu.0.backward", "bfloat16"),
        ("rank1", "Functional.gelu.0.forward", "bfloat16"), ("rank1", "Functional.gelu.0.backward", "bfloat16"),
        ("rank1", "Functional.relu.0.forward", "float16")]
    assert [r["dump_title"] for r in rows] == ["step0/rank0/dump.json"] * 2 + ["step0/rank1/dump.json"] * 3
    assert '<th data-col="dump">dump</th>' in page and " · dump " not in page


def test_chromium_sorts_and_filters_by_dump_and_dtype(tmp_path: Path) -> None:
    chromium()
    records = [_record("", status="pass", api=f"Torch.mul.{i}", order=i, dump=f"run/step{s}/rank{r}/dump.json",
                       nodeid=f"run/step{s}/rank{r}/dump.json::Torch.mul.{i}.forward")
               for i, (s, r) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)])]
    records[2].outputs[0].device_dtype = "torch.bfloat16"
    (tmp_path / "r.html").write_text(_page(tmp_path / "r.html", records), encoding="utf-8")
    seen = {}
    for view in ("sort=dump&dir=desc", "sort=dump&dir=desc&q=rank1", "sort=dtype&dir=asc"):
        dom = run_chromium("--dump-dom", "--virtual-time-budget=2000", (tmp_path / "r.html").as_uri() + "#" + view)
        assert dom.returncode == 0, dom.stderr[-2000:]
        seen[view] = [(r["dump"], r["dtype"]) for r in parse(dom.stdout).rows if not r["hidden"]]
    assert seen["sort=dump&dir=desc"] == [("step1/rank1", "int32"), ("step1/rank0", "bfloat16"),
                                          ("step0/rank1", "int32"), ("step0/rank0", "int32")]
    assert seen["sort=dump&dir=desc&q=rank1"] == [("step1/rank1", "int32"), ("step0/rank1", "int32")]
    assert seen["sort=dtype&dir=asc"][0] == ("step1/rank0", "bfloat16")
