"""`--msprobe-html FILE`: one self-contained HTML page (inline CSS, JS and SVG; nothing from the network).

* The worker that ran a failing item reduces each compared float output to a bounded error summary
  (error_summary.py); raw tensors never leave the worker, the summary rides on the record.
* The controller renders the page once at the end (:func:`write_html`): a table of every item
  (dump, status, dtype, algorithm, key metrics, a message folded to one line; click a header to sort, type
  to filter, or put it in the URL: `report.html#sort=max_abs_err&dir=desc&q=gelu&status=error`) and, for
  each failing API and fuzz failure, the plots. The same plots go into pytest-html's report through its
  extras when it runs.
"""
from __future__ import annotations

import html
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Callable

from ..records.record import Record
from ..reports.summary import shorten
from ..verdict.verdicts import in_english
from .html_summary import devices_used, dump_names, judged_by, summary_table

CHAR_WIDTH = 6.2  # px per character of an 11px sans-serif caption, with room (Chromium: 4.7-5.1 on such text)
MESSAGE_CHARS = 1000  # the table's message cell, unfolded (the failure sections below hold all of it)
FOLD_CHARS = 30  # a longer message (the cell is at least 16em wide), or one of several lines, folds
SUMMARY_CHARS = 100  # behind at most this much of its first line
HIST_AXES = ("error, ULP of the device dtype", "elements (log2)")
SLICE_AXIS = "flat index, in {n} slices of equal length, first to last"


# ----------------------------------------------------------------------------- SVG (torch-free)


def _heat(value: int, top: int) -> str:
    if value <= 0:
        return "#f7f7f7"
    t = math.log1p(value) / math.log1p(max(top, 1))
    r, g, b = 255, int(235 - 200 * t), int(200 - 190 * t)
    return f"rgb({r},{max(g, 0)},{max(b, 0)})"


def svg_heatmap(s: Mapping[str, Any]) -> str:
    """Error (ULPs of the device dtype) against the bench magnitude: where in the value range it goes wrong."""
    counts, xl, yl = s["counts"], s["x_labels"], s["y_labels"]
    cw, ch, left = 34, 13, 52
    width = max(left + cw * len(xl) + 10, 420)
    title = _caption(f'error (ULP) vs |bench| — {s["name"]}', width, 14)
    legend = (f"|bench| (decade; 0 = zero) → count per cell; dashed: {s['gross']:g} ULP, strict's gross-error limit "
              f"of {s['gross']:g} scale units where an element's scale is one ULP (it is at least one ULP)")
    top = 8 + 14 * title.count("<text")
    bottom = 22 + 14 * len(_lines(legend, width))
    height = top + ch * len(yl) + bottom
    peak = max((max(col) for col in counts), default=0)
    parts = [f'<svg class="plot heatmap" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'role="img" aria-label="error vs magnitude">', title]
    for xi, col in enumerate(counts):
        for yi, value in enumerate(col):
            x, y = left + xi * cw, top + (len(yl) - 1 - yi) * ch
            parts.append(f'<rect x="{x}" y="{y}" width="{cw - 1}" height="{ch - 1}" fill="{_heat(value, peak)}">'
                         f'<title>|bench| {html.escape(xl[xi])}, error {html.escape(yl[yi])} ULP: {value}'
                         '</title></rect>')
    for yi, label in enumerate(yl):
        if yi % 2 == 0 or yi == len(yl) - 1:
            y = top + (len(yl) - 1 - yi) * ch + 10
            parts.append(f'<text x="{left - 4}" y="{y}" class="yl">{html.escape(label)}</text>')
    for xi, label in enumerate(xl):
        xt = left + xi * cw + cw / 2
        parts.append(f'<text x="{xt}" y="{top + len(yl) * ch + 12}" class="xl">{html.escape(label)}</text>')
    # strict's gross-error limit, on the log2 scale of the rows (row 2 + k holds errors in (2^(k-1), 2^k])
    log_limit = min(max(math.log2(s["gross"]), -1.0), 21.0)
    k = math.ceil(log_limit)
    gross_y = top + (len(yl) - k - 2) * ch - (log_limit - k + 1) * ch
    parts.append(f'<line x1="{left}" x2="{left + cw * len(xl)}" y1="{gross_y:.1f}" y2="{gross_y:.1f}" class="limit"/>')
    parts.append(_caption(legend, width, top + len(yl) * ch + 30))
    parts.append("</svg>")
    return "".join(parts)


def _lines(text: str, width: float) -> list[str]:
    """`text` wrapped to the captions' width in an SVG `width` pixels wide (long names broken too)."""
    import textwrap

    return textwrap.wrap(text, max(20, int((width - 12) / CHAR_WIDTH)), break_on_hyphens=False) or [""]


def _caption(text: str, width: float, y: float) -> str:
    """SVG text lines of a caption from `y` down, wrapped so that none runs past the plot's right edge."""
    return "".join(f'<text x="6" y="{y + 14 * i}" class="t">{html.escape(line)}</text>'
                   for i, line in enumerate(_lines(text, width)))


def svg_bars(values: Sequence[float], title: str, labels: Sequence[str] | None = None, log2: bool = True,
             red: Sequence[bool] | None = None, axes: tuple[str, str] = ("", "")) -> str:
    """Bars (log2(1 + value) high); `red` marks the bars beyond strict's gross-error limit; `axes`: the x and y
    axes' labels."""
    width, left, bottom = 420, 40, 44
    caption = _caption(title, width, 14)
    top = 6 + 14 * (caption.count("<text") + 1)  # a line for the y axis' label, above the bars
    height = top + 130
    n = max(len(values), 1)
    bw = (width - left - 10) / n
    scaled = [math.log2(1 + v) if log2 and math.isfinite(v) else (v if math.isfinite(v) else None) for v in values]
    peak = max([v for v in scaled if v is not None] + [1e-12])
    parts = [f'<svg class="plot bars" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img">',
             caption,
             f'<line x1="{left}" x2="{width - 10}" y1="{height - bottom}" y2="{height - bottom}" class="axis"/>']
    for i, v in enumerate(scaled):
        h = (height - top - bottom) if v is None else (height - top - bottom) * v / peak
        colour = "#b00" if v is None else "#d9534f" if red is not None and red[i] else "#5b8fd9"
        label = labels[i] if labels else str(i)
        parts.append(f'<rect x="{left + i * bw:.1f}" y="{height - bottom - h:.1f}" width="{max(bw - 1, 1):.1f}" '
                     f'height="{max(h, 0.5):.1f}" fill="{colour}"><title>{html.escape(label)}: {values[i]:.6g}'
                     f'</title></rect>')
    if labels:
        for i in range(0, n, max(1, n // 8)):
            parts.append(f'<text x="{left + i * bw + bw / 2:.1f}" y="{height - bottom + 12}" class="xl">'
                         f'{html.escape(labels[i])}</text>')
    x_label, y_label = axes
    parts.append(f'<text x="{(left + width - 10) / 2:.0f}" y="{height - 6}" class="xl axis-label">'
                 f'{html.escape(x_label)}</text>')
    parts.append(f'<text x="6" y="{top - 4}" class="axis-label">↑ {html.escape(y_label)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def output_plots(s: Mapping[str, Any], strict_max: float | None = None) -> str:
    """The plots of one output's summary; `strict_max`: strict's largest error there, in scale units."""
    if s.get("kind") != "float":
        return (f'<p>{html.escape(s["name"])} ({html.escape(s["dtype"])}): {s.get("mismatches")} of {s["numel"]} '
                f'elements differ (compared exactly)</p>')
    hist = [sum(col[yi] for col in s["counts"]) for yi in range(len(s["y_labels"]))]
    # the bins that hold errors beyond strict's gross-error limit (bin yi: errors up to 2^(yi-2) ULP)
    beyond = [yi >= 1 and 2.0 ** (yi - 2) > s["gross"] for yi in range(len(hist))]
    over = [v > s["gross"] for v in s["position_max_ulp"]]
    rows = "".join(f"<tr><td>{w['index']}</td><td>{w['bench']:.8g}</td><td>{w['device']:.8g}</td>"
                   f"<td>{w['ulp']:.4g}</td></tr>" for w in s["worst"])
    slices = (SLICE_AXIS.format(n=len(s["position_max_ulp"])), "max ULP (log2)")
    nonfinite = f", {int(s['nonfinite_mismatch'])} NaN/inf mismatches" if s["nonfinite_mismatch"] else ""
    if isinstance(strict_max, (int, float)):
        nonfinite += f"; strict: max {strict_max:.4g} scale units"
    return (f'<div class="output"><h4>{html.escape(s["name"])} <small>{html.escape(s["dtype"])} {s["shape"]}: '
            f'{s["exact"]} of {s["numel"]} exact, max {s["max_ulp"]:.4g} ULP, mean {s["mean_ulp"]:.4g} ULP'
            f'{nonfinite}</small></h4>'
            f'<div class="plots">{svg_heatmap(s)}'
            f'{svg_bars(hist, "histogram of errors (ULP), elements per bin", s["y_labels"], red=beyond, axes=HIST_AXES)}'
            f'{svg_bars(s["position_max_ulp"], "largest error (ULP) per slice of the flat index", red=over, axes=slices)}'
            '</div>'
            f'<table class="worst"><tr><th>worst index</th><th>bench</th><th>device</th><th>ULP</th></tr>{rows}'
            f'</table></div>')


def plots_html(record: Record) -> str:
    strict = {o.name: (o.reference or {}).get("max_err") for o in record.outputs if record.standard == "strict"}
    return "".join(output_plots(s, strict.get(s["name"])) for s in record.error_summary or ())


# ----------------------------------------------------------------------------- the page (controller)

CSS = """
body{font:13px/1.4 system-ui,sans-serif;margin:16px;color:#222}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:24px 0 6px} h3{font-size:14px;margin:18px 0 4px}
h4{font-size:13px;margin:10px 0 4px} small{color:#555;font-weight:normal}
table.api{border-collapse:collapse;width:100%} table.api th,table.api td{border-bottom:1px solid #ddd;padding:3px 6px;
text-align:left;white-space:nowrap} table.api th{cursor:pointer;background:#f0f0f0;position:sticky;top:0;vertical-align:bottom}
table.api th[data-col="strict_max_err"]{white-space:normal;min-width:8.5em}
table.api th.sorted-asc:after{content:" ▲"} table.api th.sorted-desc:after{content:" ▼"}
table.api td.msg{width:100%;max-width:0;min-width:16em;overflow:hidden;text-overflow:ellipsis;color:#444}
table.api td.msg summary{overflow:hidden;text-overflow:ellipsis;cursor:pointer}
table.api td.msg details[open]{white-space:pre-line;overflow-wrap:anywhere}
table.api td.msg details[open] summary{float:left;margin-right:4px} table.api td.msg details[open] summary span{display:none}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.s-error{color:#b00;font-weight:bold} .s-pass{color:#070} .s-Warning{color:#a60} .s-SKIP{color:#777}
.controls{margin:8px 0} .controls input{width:280px}
.plots{display:flex;flex-wrap:wrap;gap:12px;align-items:flex-start}
svg.plot text{font:10px sans-serif} svg.plot text.t{font-size:11px} svg.plot text.yl{text-anchor:end}
svg.plot text.xl{text-anchor:middle} svg.plot .limit{stroke:#000;stroke-dasharray:4 3} svg.plot .axis{stroke:#999}
table.summary{border-collapse:collapse;margin-bottom:8px} table.summary td,table.summary th{border-bottom:1px solid #ddd;
padding:2px 8px;text-align:left} table.summary th{background:#f0f0f0} svg.plot text.axis-label{fill:#444}
table.worst{border-collapse:collapse;margin-top:4px} table.worst td,table.worst th{border:1px solid #ddd;padding:1px 5px}
section.failure{border-top:2px solid #b00;margin-top:18px}
pre{background:#f6f6f6;padding:6px;overflow:auto;white-space:pre-wrap;overflow-wrap:anywhere}
"""

JS = r"""
(function(){
  var table=document.getElementById('apis'), body=table.tBodies[0];
  var q=document.getElementById('q'), st=document.getElementById('status');
  var state={sort:null,dir:'asc',q:'',status:''};
  function params(){var h=location.hash.replace(/^#/,''),o={};
    h.split('&').forEach(function(kv){if(!kv)return;var i=kv.indexOf('=');
      o[decodeURIComponent(i<0?kv:kv.slice(0,i))]=decodeURIComponent(i<0?'':kv.slice(i+1));});return o;}
  function value(tr,col){var td=tr.querySelector('td[data-col="'+col+'"]');if(!td)return '';
    var v=td.getAttribute('data-v');if(v===null)v=td.textContent;var f=parseFloat(v);
    return (v!==''&&!isNaN(f)&&isFinite(v))?f:v.toLowerCase();}
  function apply(){
    var rows=Array.prototype.slice.call(body.rows);
    if(state.sort){var s=state.sort,m=state.dir==='desc'?-1:1;
      rows.sort(function(a,b){var x=value(a,s),y=value(b,s);
        if(typeof x!==typeof y){if(x==='')return 1;if(y==='')return -1;x=String(x);y=String(y);}
        return (x<y?-1:x>y?1:0)*m||(+a.getAttribute('data-order'))-(+b.getAttribute('data-order'));});
      rows.forEach(function(r){body.appendChild(r);});}
    var needle=state.q.toLowerCase(),shown=0;
    rows.forEach(function(r){var ok=(!needle||r.textContent.toLowerCase().indexOf(needle)>=0)&&
      (!state.status||r.getAttribute('data-status')===state.status);r.style.display=ok?'':'none';if(ok)shown++;});
    Array.prototype.forEach.call(table.tHead.rows[0].cells,function(th){th.className=
      th.getAttribute('data-col')===state.sort?'sorted-'+state.dir:'';});
    document.getElementById('shown').textContent=shown;
    table.setAttribute('data-sorted',(state.sort||'')+':'+state.dir);
    var h=[];['sort','dir','q','status'].forEach(function(k){if(state[k]&&!(k==='dir'&&!state.sort))
      h.push(k+'='+encodeURIComponent(state[k]));});
    if(history.replaceState)history.replaceState(null,'',h.length?'#'+h.join('&'):location.pathname);}
  function load(){var p=params();state.sort=p.sort||null;state.dir=p.dir==='desc'?'desc':'asc';
    state.q=p.q||'';state.status=p.status||'';q.value=state.q;st.value=state.status;apply();}
  table.tHead.addEventListener('click',function(e){var th=e.target.closest('th');if(!th)return;
    var c=th.getAttribute('data-col');state.dir=(state.sort===c&&state.dir==='asc')?'desc':'asc';state.sort=c;apply();});
  q.addEventListener('input',function(){state.q=q.value;apply();});
  st.addEventListener('change',function(){state.status=st.value;apply();});
  window.addEventListener('hashchange',load);
  load();
  var drawn=0;Array.prototype.forEach.call(document.querySelectorAll('svg.plot'),function(s){
    var b=s.getBBox();if(b.width>0&&b.height>0)drawn++;});
  document.body.setAttribute('data-plots-rendered',String(drawn));
})();
"""

COLUMNS = (("order", "#"), ("dump", "dump"), ("item", "API call"), ("status", "status"), ("dtype", "dtype"),
           ("standard", "standard"),
           ("algorithm", "algorithm"), ("cosine", "min cosine"), ("max_abs_err", "max abs err"),
           ("max_rel_err", "max rel err"), ("strict_max_err", "strict max err (scale units)"), ("device", "device"),
           ("message", "message"))


def _num(value: Any) -> str:
    if value is None:
        return "-"  # as the terminal's failure table: msprobe left the metric empty
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _row_values(rec: Record, kind: Callable[[str], str] = lambda api: "") -> dict[str, Any]:
    outputs = rec.outputs
    metrics = [o.metrics for o in outputs]
    cos = [m["cosine"] for m in metrics if isinstance(m.get("cosine"), (int, float))]
    abs_err = [m["max_abs_err"] for m in metrics if isinstance(m.get("max_abs_err"), (int, float))]
    rel = [m["max_rel_err"] for m in metrics if isinstance(m.get("max_rel_err"), (int, float))]
    units: list[Any] = [(o.reference or {}).get("max_err") for o in outputs if rec.standard == "strict"]
    units = [u for u in units if isinstance(u, (int, float))]
    dtypes = dict.fromkeys(str(o.device_dtype).removeprefix("torch.") for o in outputs if o.device_dtype)
    message = rec.message or "; ".join(
        in_english(str(o.verdict_message or o.message or "")) for o in outputs
        if (o.verdict or o.status) not in ("pass", None)) or ""
    return {"item": f"{rec.api}.{rec.direction}", "status": rec.status,
            "dtype": ",".join(dtypes), "standard": rec.standard or "",
            "algorithm": judged_by(rec, kind(str(rec.api or ""))),
            "cosine": min(cos) if cos else None, "max_abs_err": max(abs_err) if abs_err else None,
            "max_rel_err": max(rel) if rel else None, "strict_max_err": max(units) if units else None,
            "device": rec.device or "",
            "message": message.strip()}


def _message_cell(message: str) -> str:
    """The message in one line of the row: one that may not fit (or of several lines) folds behind its first
    line, cut at a word if long and by the cell's width, and opens to all of it."""
    text = shorten(message, MESSAGE_CHARS)
    first, _, rest = text.partition("\n")
    if not rest and len(first) <= FOLD_CHARS:
        title = f' title="{html.escape(first)}"' if first else ""
        return f'<td data-col="message" class="msg"{title}>{html.escape(first)}</td>'
    return (f'<td data-col="message" class="msg"><details><summary><span>{html.escape(shorten(first, SUMMARY_CHARS))}'
            f'</span></summary>{html.escape(text)}</details></td>')


def _entries(records: Sequence[Record], fuzz: Sequence[Mapping[str, Any]]
             ) -> list[tuple[Record, Mapping[str, Any] | None]]:
    """The table's rows in order: (record, None) per item, then (its record, fuzz result) per fuzz item; a fuzz
    item that found no failure has no record: an empty one stands in (its row's cells are the fuzz result's)."""
    return [(rec, None) for rec in records] + [(f.get("record") or Record("", "", 0), f) for f in fuzz]


def _dump_of(rec: Record, fz: Mapping[str, Any] | None) -> str:
    """The dump file of a row: the record's, else the one its node id names."""
    nodeid = str(rec.nodeid or (fz or {}).get("nodeid") or "")
    return str(rec.dump or (fz or {}).get("dump") or nodeid.partition("::")[0])


def _columns(dumps: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """The table's columns: the `dump` column only when the rows come from several dumps (the page's header
    names a single one)."""
    return COLUMNS if len(set(dumps)) > 1 else tuple(c for c in COLUMNS if c[0] != "dump")


def _cell(col: str, v: Any, title: str = "", link: str | None = None) -> str:
    if col == "message":
        return _message_cell(str(v))
    text = _num(v) if not isinstance(v, str) else v
    attr = f' data-v="{html.escape(repr(float(v)) if isinstance(v, float) else str(v))}"' \
        if isinstance(v, (int, float)) and not isinstance(v, bool) else ""
    css = f"s-{text}" if col == "status" else "num" if attr else ""
    attr += f' title="{html.escape(title)}"' if title else ""
    text_html = f'<a href="#{link}">{html.escape(text)}</a>' if link else html.escape(text)
    return f'<td data-col="{col}" class="{css}"{attr}>{text_html}</td>'


def _table_rows(records: Sequence[Record], fuzz: Sequence[Mapping[str, Any]],
                kind: Callable[[str], str] = lambda api: "") -> tuple[tuple[tuple[str, str], ...], list[str]]:
    """The table's columns and rows."""
    rows = []
    entries = _entries(records, fuzz)
    dumps = [_dump_of(rec, fz) for rec, fz in entries]
    names, columns = dump_names(dumps), _columns(dumps)
    for order, (rec, fz) in enumerate(entries):
        values = _row_values(rec, kind)
        values.update(order=order + 1, dump=names[dumps[order]])
        if fz is not None:
            values.update(item=f"{fz.get('api')} [fuzz]", status=fz.get("status", ""),
                          message=str(fz.get("shrunk") or "").strip()
                          or f"{fz.get('examples', 0)} examples passed (seed {fz.get('seed')})")
        anchor = f"f{order}" if (values["status"] == "error" and (rec.error_summary or fz)) else None
        cells = "".join(_cell(col, values.get(col), title=dumps[order] if col == "dump" else "",
                              link=anchor if col == "item" else None) for col, _ in columns)
        rows.append(f'<tr data-order="{order}" data-status="{html.escape(values["status"])}" '
                    f'title="{html.escape(rec.nodeid or "")}">{cells}</tr>')
    return columns, rows


def _failure_sections(records: Sequence[Record], fuzz: Sequence[Mapping[str, Any]]) -> list[str]:
    sections = []
    for order, (rec, fz) in enumerate(_entries(records, fuzz)):
        status = fz.get("status") if fz is not None else rec.status
        if status != "error" or not (rec.error_summary or fz):
            continue
        title = f"{rec.api}.{rec.direction}" + (" [fuzz]" if fz is not None else "")
        lines = [f'<section class="failure" id="f{order}"><h3>{html.escape(title)} '
                 f'<small>{html.escape(rec.nodeid or "")}</small></h3>']
        if fz is not None:
            lines.append(f"<p>hypothesis seed {fz.get('seed')}, {fz.get('examples')} examples; shrunk example:</p>"
                         f"<pre>{html.escape(str(fz.get('shrunk') or ''))}</pre>")
        message = rec.message
        verdicts = [f"{o.name}: {in_english(str(o.verdict_message or o.message))}"
                    for o in rec.outputs if (o.verdict or o.status) == "error"]
        if message or verdicts:
            lines.append(f"<pre>{html.escape(chr(10).join(([message] if message else []) + verdicts))}</pre>")
        rerun = fz.get("rerun") if fz is not None else rec.rerun
        for label, prefix, value in (("repro script", "python ", rec.repro), ("rerun", "", rerun)):
            if value:
                lines.append(f"<p>{label}: <code>{html.escape(prefix + str(value))}</code></p>")
        lines.append(plots_html(rec) or "<p>(no float output to plot)</p>")
        lines.append("</section>")
        sections.append("".join(lines))
    return sections


def _op_kinds(specs_file: str | None) -> Callable[[str], str]:
    """`Functional.softmax.1` -> its kind of op in strict's error model (reduction, ...)."""
    from ..dump.reader import parse_entry_name
    from ..specs.loader import error_kind, load_specs

    specs = load_specs(user_file=specs_file)

    def kind(api: str) -> str:
        try:
            return error_kind(parse_entry_name(f"{api}.forward").api_name, specs)
        except ValueError:  # a name msprobe never writes: no kind to give
            return ""
    return kind


def write_html(path: Path, records: Iterable[Record], fuzz: Iterable[Mapping[str, Any]], settings: Any) -> Path:
    """The page of the items' records and the fuzz results (plain dicts; a failing one holds its example's
    `Record` under `record`), written to a temporary name and renamed (no half-written page)."""
    records = sorted(records, key=lambda r: (str(r.dump or ""), r.order or 0, r.direction))
    fuzz = sorted(fuzz, key=lambda f: str(f.get("nodeid")))
    counts: dict[str, int] = {}
    for rec in records:
        counts[rec.status] = counts.get(rec.status, 0) + 1
    for f in fuzz:
        counts[f"fuzz {f.get('status')}"] = counts.get(f"fuzz {f.get('status')}", 0) + 1
    opts = settings.check_options
    head = " · ".join(f"{k}: {v}" for k, v in counts.items())
    options = "".join(f'<option value="{s}">{s}</option>' for s in ("", "error", "Warning", "pass", "SKIP"))
    columns, rows = _table_rows(records, fuzz, _op_kinds(opts.specs_file))
    dump = {_dump_of(rec, fz) for rec, fz in _entries(records, fuzz)}
    one_dump = f" · dump {html.escape(dump.pop())}" if len(columns) < len(COLUMNS) and dump - {""} else ""
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>pytest-msprobe report</title>
<meta name="generator" content="pytest-msprobe"><style>{CSS}</style></head>
<body>
<h1>pytest-msprobe report</h1>
<p>{html.escape(time.strftime('%Y-%m-%d %H:%M:%S'))} · standard <b>{html.escape(str(settings.standard))}</b> ·
seed {opts.run_seed} · device {html.escape(devices_used(records, opts.device))} · {html.escape(head)}{one_dump}</p>
{summary_table(records)}
<h2>Items</h2>
<div class="controls">filter <input id="q" type="search" placeholder="text in any column">
status <select id="status">{options}</select> · <span id="shown">{len(rows)}</span> shown ·
click a column header to sort (also <code>#sort=col&amp;dir=desc&amp;q=text&amp;status=error</code>)</div>
<table class="api" id="apis"><thead><tr>{"".join(f'<th data-col="{c}">{html.escape(t)}</th>' for c, t in columns)}</tr></thead>
<tbody>
{chr(10).join(rows)}
</tbody></table>
<h2>Where the errors are</h2>
<p>Per failing output: the error in ULPs of the device dtype (|device − bench| over one ULP of the bench rounded to
the device dtype; 0 = the correctly rounded value) against the magnitude of the bench value, its histogram, and the
largest error per slice of the flat index. Hover a cell for its count. strict's figures (the table's column, each
output's header) are in scale units: the error over the element's scale, one ULP raised to what a correct kernel may
lose there, so never above the plain ULPs.</p>
{chr(10).join(_failure_sections(records, fuzz)) or "<p>No failing API with a float output.</p>"}
<script>{JS}</script>
</body></html>
"""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(path)
    return path
