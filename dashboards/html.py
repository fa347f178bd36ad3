"""A Report as one self-contained HTML page (Vega, Vega-Lite and Vega-Embed inlined) and, optionally, PNGs.

The page loads nothing: the JavaScript comes from vl-convert's bundle, the specs sit in the page as
JSON, and the specs carry no `$schema` URL. Files are written to a temporary name and renamed into
place, so an error leaves no half-written page behind.
"""
from __future__ import annotations

import datetime
import html
import json
import math
import os
import re
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import altair as alt
import pyarrow as pa
import vl_convert

from itertrace import __version__ as version
from itertrace.dashboards.blocks import ChartBlock, NoteBlock, Report, TableBlock
from itertrace.errors import UserError, no_folder_for
from itertrace.targets import Kind, replaceable, write_failure

# Applied to every chart of the page and every PNG: the chart functions leave configuration to the caller.
CONFIG = {
    "view": {"continuousWidth": 300, "continuousHeight": 200},
    "font": "Helvetica, Arial, sans-serif",
    "title": {"fontSize": 14, "subtitleFontSize": 11, "subtitleColor": "#555555", "anchor": "start", "offset": 8},
    "axis": {"labelFontSize": 11, "titleFontSize": 12, "titleFontWeight": "normal", "labelColor": "#333333"},
    "legend": {"labelFontSize": 11, "titleFontSize": 12, "titleFontWeight": "normal", "labelLimit": 320},
    "header": {"labelFontSize": 12},
}

_STYLE = """
body { font-family: Helvetica, Arial, sans-serif; color: #222; margin: 0 auto; padding: 0 24px 48px;
       max-width: 1120px; line-height: 1.45; }
h1 { font-size: 24px; margin: 28px 0 4px; }
h2 { font-size: 19px; margin: 40px 0 6px; padding-top: 12px; border-top: 1px solid #ddd; }
h3 { font-size: 14px; margin: 18px 0 4px; color: #333; }
p.meta { color: #666; font-size: 13px; margin: 0 0 12px; }
p.intro { max-width: 820px; font-size: 14px; color: #333; }
p.note { background: #f4f4f4; border-left: 4px solid #999; padding: 8px 12px; font-size: 13px; }
p.simulated { background: #fff4d6; border-left: 4px solid #e0a800; padding: 8px 12px; font-weight: bold; }
p.mapping { background: #e8f1fb; border-left: 4px solid #4c78a8; padding: 8px 12px; font-size: 13px; }
p.mapping code { white-space: nowrap; }  /* a --param line stays whole */
nav ol { columns: 3; font-size: 13px; padding-left: 20px; }
table { border-collapse: collapse; font-size: 12px; margin: 4px 0 6px; }
th, td { padding: 3px 9px; border-bottom: 1px solid #e4e4e4; text-align: left; white-space: nowrap; }
th { background: #f2f2f2; font-weight: 600; }
/* long text (kernel names, causes, --param lines) wraps inside its cell instead of widening the page */
td:not(.num) { white-space: normal; overflow-wrap: anywhere; max-width: 440px; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
td[title] { text-decoration: underline dotted #999; cursor: help; }  /* hover for the full name */
code { font-family: Menlo, Consolas, monospace; font-size: 12px; background: rgba(0, 0, 0, 0.05); padding: 0 2px; }
tbody tr:nth-child(even) { background: #fafafa; }
div.scroll { overflow-x: auto; }
p.caption, figcaption { font-size: 12px; color: #555; max-width: 820px; margin: 2px 0 10px; }
figure { margin: 16px 0 24px; }
div.chart { min-height: 60px; overflow-x: auto; }
div.chart.failed { color: #b00020; font-size: 13px; }
"""

# Renders each chart, marks it rendered or failed (with the reason on the page), and the body when all are done.
_EMBED = """
(function () {
  var jobs = [];
  document.querySelectorAll("div.chart[data-spec]").forEach(function (el) {
    var spec = JSON.parse(document.getElementById(el.dataset.spec).textContent);
    jobs.push(vegaEmbed(el, spec, {mode: "vega-lite", renderer: "svg",
                                   actions: {export: true, source: false, compiled: false, editor: false}})
      .then(function () { el.dataset.rendered = "yes"; })
      .catch(function (err) {
        el.dataset.rendered = "failed"; el.className += " failed";
        el.textContent = "This chart failed to render: " + err; console.error(err);
      }));
  });
  Promise.all(jobs).then(function () { document.body.dataset.charts = "done"; });
})();
"""


@dataclass(frozen=True)
class Written:
    """What write_report wrote."""

    html: Path
    bytes: int
    charts: int
    tables: int
    pngs: tuple[Path, ...]


def vl_version() -> str | None:
    """The Vega-Lite version of Altair's specs, as vl-convert names it; None for vl-convert's latest."""
    major_minor = ".".join(alt.SCHEMA_VERSION.lstrip("v").split(".")[:2])
    return major_minor if major_minor in vl_convert.get_vegalite_versions() else None


@cache
def javascript_bundle() -> str:
    """Vega, Vega-Lite and Vega-Embed as one script that defines window.vegaEmbed (made once per process)."""
    return vl_convert.javascript_bundle(vl_version=vl_version())


def chart_spec(chart: alt.TopLevelMixin) -> dict:
    """The chart's Vega-Lite spec with the page's configuration and without its `$schema` URL."""
    spec = chart.to_dict()
    spec.pop("$schema", None)
    spec["config"] = {**spec.get("config", {}), **CONFIG}
    return spec


def format_cell(column: str, value: object) -> tuple[str, bool]:
    """A cell's text and whether it is a number: ns in ms, shares in percent, counts with separators."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–", False
    if isinstance(value, bool):
        return ("yes" if value else "no"), False
    if isinstance(value, (int, float)):
        if column.endswith("_ns"):
            ms = value / 1e6
            if 0 < abs(ms) < 0.001:
                return f"{ms:.1g}", True
            return (f"{ms:,.1f}" if abs(ms) >= 100 else f"{ms:.2f}" if abs(ms) >= 1 else f"{ms:.3f}"), True
        if "share" in column:
            return f"{100 * value:.1f}%", True
        if column.endswith(("_id", "_tid", "_pid", "iteration", "seed")) or column in ("rank", "position"):
            return str(value), True
        if isinstance(value, float):
            return (f"{value:,.0f}" if value.is_integer() else f"{value:,.3g}"), True
        return f"{value:,}", True
    if isinstance(value, list):
        return ", ".join(str(v) for v in value), False
    return str(value), False


def with_code(text: str) -> str:
    """`text` as HTML, its `backticked` parts as code."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))


def column_title(column: str) -> str:
    """A column name for people: `gap_p50_ns` becomes `gap p50 (ms)`."""
    return (column[:-3] + " (ms)" if column.endswith("_ns") else column).replace("_", " ")


def table_html(table: pa.Table, hover: dict[str, str] | None = None) -> str:
    """A table; columns with no value in any row are left out. `hover` maps a shown column to the column holding
    each cell's full text (a kernel's full name), shown on hover and not as a column of its own."""
    hover = hover or {}
    full = {c: table.column(h).to_pylist() for c, h in hover.items()}
    table = table.drop_columns(list(set(hover.values())))
    empty = [c for c in table.column_names if table.num_rows and table.column(c).null_count == table.num_rows]
    table = table.drop_columns(empty)
    head = "".join(f"<th>{html.escape(column_title(c))}</th>" for c in table.column_names)
    rows = []
    for i, row in enumerate(table.to_pylist()):
        cells = []
        for c in table.column_names:
            if isinstance(row[c], dict) and set(row[c]) == {"text", "href"}:  # a link: {text, href}
                cells.append(f'<td><a href="{html.escape(row[c]["href"])}">{html.escape(row[c]["text"])}</a></td>')
                continue
            text, numeric = format_cell(c, row[c])
            title = full[c][i] if c in full and full[c][i] not in (None, row[c]) else None
            attrs = (' class="num"' if numeric else "") + (f' title="{html.escape(title)}"' if title else "")
            cells.append(f"<td{attrs}>{html.escape(text)}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    if not rows:
        rows.append(f'<tr><td colspan="{len(table.column_names)}">no rows</td></tr>')
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table></div>'


def render_html(report: Report, specs: list[dict] | None = None) -> str:
    """The whole page; `specs` are the charts' specs in order (made here when not given)."""
    charts = report.charts()
    specs = specs if specs is not None else [chart_spec(c.chart) for c in charts]
    spec_of = {id(block): i for i, block in enumerate(charts)}
    esc = html.escape
    made = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           f"<title>{esc(report.title)}</title><style>{_STYLE}</style></head><body>",
           f"<h1>{esc(report.title)}</h1>",
           f'<p class="meta">Made by itertrace {esc(version)} on {made}. This page is self-contained: its charts '
           "render without a network. Hover over a chart for iterations, requests and times.</p>"]
    if report.simulated:
        out.append(f'<p class="simulated">Simulated: {esc(", ".join(report.simulated))} ran on the cost-model runner; '
                   "their times come from a model, not a machine.</p>")
    for line in report.mappings:
        out.append(f'<p class="mapping">{with_code(line)}</p>')
    out.append(f'<nav><ol><li><a href="#runs">{esc(report.meta_title)}</a></li>' + "".join(
        f'<li><a href="#{s.id}">{esc(s.title)}</a></li>' for s in report.sections) + "</ol></nav>")
    out.append(f'<section id="runs"><h2>{esc(report.meta_title)}</h2>' + table_html(report.meta) + "</section>")
    for section in report.sections:
        out.append(f'<section id="{section.id}"><h2>{esc(section.title)}</h2>')
        if section.intro:
            out.append(f'<p class="intro">{with_code(section.intro)}</p>')
        for block in section.blocks:
            if isinstance(block, NoteBlock):
                out.append(f'<p class="note">{with_code(block.text)}</p>')
            elif isinstance(block, TableBlock):
                out.append(f"<h3>{esc(block.title)}</h3>" + table_html(block.table, block.hover))
                if block.caption:
                    out.append(f'<p class="caption">{esc(block.caption)}</p>')
            elif isinstance(block, ChartBlock):
                if block.heading:
                    out.append(f"<h3>{esc(block.heading)}</h3>")
                i = spec_of[id(block)]
                data = json.dumps(specs[i], separators=(",", ":")).replace("</", "<\\/")
                out.append(f'<figure><div class="chart" id="chart-{i}" data-spec="spec-{i}" '
                           f'data-name="{esc(block.name)}"></div>'
                           f'<script type="application/json" id="spec-{i}">{data}</script>'
                           f"<figcaption>{esc(block.caption)}</figcaption></figure>")
        out.append("</section>")
    out.append("<noscript><p class=\"note\">The charts need JavaScript (inlined in this page).</p></noscript>")
    out.append(f"<script>{javascript_bundle()}</script><script>{_EMBED}</script></body></html>")
    return "\n".join(out)


def write_report(report: Report, out: str | Path, *, png_dir: str | Path | None = None,
                 png_scale: float = 2.0) -> Written:
    """Write the page to `out` (temporary file, then rename) and, with `png_dir`, each chart as NN-name.png."""
    out = Path(out)
    if out.is_dir():
        raise UserError(f"{out}: is a folder; give the report's file name, e.g. -o {out / 'report.html'}")
    if why := no_folder_for(out):
        raise UserError(f"{out}: {why}")
    charts = report.charts()
    specs = [chart_spec(c.chart) for c in charts]
    page = render_html(report, specs).encode("utf-8")  # before any PNG: a page that fails leaves no PNG behind
    pngs: list[Path] = []
    if png_dir is not None:
        folder = Path(png_dir)
        if folder.exists() and not folder.is_dir():
            raise UserError(f"{folder}: not a folder (--png needs a folder for the PNG files)")
        folder.mkdir(parents=True, exist_ok=True)
        paths = [folder / f"{i:02d}-{block.name}.png" for i, block in enumerate(charts, start=1)]
        for path in paths:  # all checked before any is written
            replaceable(path, Kind.PNG, "--png")
        for path, spec in zip(paths, specs):
            _write_atomically(path, vl_convert.vegalite_to_png(spec, vl_version=vl_version(), scale=png_scale))
            pngs.append(path)
    _write_atomically(out, page)
    return Written(out, len(page), len(charts), len(report.tables()), tuple(pngs))


def _write_atomically(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_report_or_fail(report: Report, out: Path, png_dir: Path | None = None) -> Written:
    """write_report, with a failure to write said in one line naming `-o` (a UserError)."""
    try:
        return write_report(report, out, png_dir=png_dir)
    except OSError as exc:
        if why := write_failure(exc):
            raise UserError(f"-o {out}: cannot write {exc.filename or 'it'} ({why})") from None
        raise
