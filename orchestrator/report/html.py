"""The HTML page of ``gpuq report --format html -o DIR``: one self-contained file (figures inlined as
data: URIs, inline style, nothing fetched) with the table and verdicts, the curves, each sweep's
queue, bundle and hosts, the failures with their class and last log lines, and the cost.

Everything a host or a queue wrote (job names, messages, log lines) is HTML-escaped, and the page's
Content-Security-Policy allows no network access and no script but its own inline one, which marks
each figure as loaded and records where the table and figures were laid out (``data-box``), so a
headless browser can check what it rendered.
"""

from __future__ import annotations

import base64
import time
from html import escape
from pathlib import Path

from orchestrator.report import tables
from orchestrator.report.figures import Curves, write_figures
from orchestrator.report.model import Report

PAGE = "report.html"
_CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'"
_STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px; color: #1b1b1b; background: #fff; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 28px; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; } th, td { padding: 4px 8px; border-bottom: 1px solid #e4e4e4; }
th { background: #f3f3f3; text-align: left; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.baseline td { font-weight: 600; background: #f7f7f7; }
.better { color: #17692f; font-weight: 600; } .worse { color: #b3261e; font-weight: 600; }
.noise { color: #8a6100; } .small { color: #777; } .flag { color: #b3261e; font-size: 12px; }
pre { background: #f6f6f6; padding: 8px; overflow-x: auto; font-size: 12px; }
figure { margin: 12px 0; } figcaption { color: #555; font-size: 12px; }
"""
_SCRIPT = """
window.addEventListener('load', function () {
  function box(el) {
    var r = el.getBoundingClientRect();
    return [r.left + window.scrollX, r.top + window.scrollY, r.width, r.height].map(Math.round).join(',');
  }
  var imgs = document.querySelectorAll('img.curve'), ok = 0;
  imgs.forEach(function (img) {
    var good = img.complete && img.naturalWidth > 0;
    img.setAttribute('data-loaded', good ? 'yes' : 'no');
    img.setAttribute('data-box', box(img));
    if (good) { ok += 1; }
  });
  var table = document.getElementById('cells');
  if (table) { table.setAttribute('data-box', box(table)); }
  document.body.setAttribute('data-figures-loaded', String(ok));
  document.body.setAttribute('data-height', String(document.documentElement.scrollHeight));
});
"""
_VERDICT_CLASS = {"better": "better", "worse": "worse", "within noise": "noise", "n too small": "small",
                  "cannot compute": "small", "no data": "small", "no baseline": "small"}


def _table(report: Report) -> str:
    head = "".join(f"<th>{escape(c)}</th>" for c in tables.COLUMNS)
    rows = []
    for cell in report.cells:
        values = tables.cells(cell)
        tds = []
        for i, (column, value) in enumerate(zip(tables.COLUMNS, values, strict=True)):
            if column == "verdict":
                tds.append(f'<td class="{_VERDICT_CLASS.get(value, "")}">{escape(value)}</td>')
            elif column == "flags":
                tds.append(f'<td class="flag">{escape(value)}</td>')
            else:
                tds.append(f'<td class="{"num" if i else ""}">{escape(value)}</td>')
        rows.append(f'<tr class="{"baseline" if cell.is_baseline else ""}">{"".join(tds)}</tr>')
    return f'<table id="cells"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def _figures(report: Report, curves: Curves, out: Path) -> str:
    figures = write_figures(report, curves, out)
    if not figures:
        return "<p>No learning curves were recorded for these jobs (their hosts sent none).</p>"
    parts = []
    for name, path in figures:
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        parts.append(f'<figure><img class="curve" alt="{escape(name)} against step" '
                     f'src="data:image/png;base64,{data}"><figcaption>{escape(name)}: one line per cell (mean over '
                     f'its seeds), the band spans the lowest to the highest seed; the baseline is black and dashed. '
                     f'Also saved as {escape(path.name)}.</figcaption></figure>')
    return "".join(parts)


def _failures(report: Report) -> str:
    if not report.failures:
        return "<p>No job failed.</p>"
    parts = []
    for f in report.failures:
        klass = f" (class {escape(f.failure_class)})" if f.failure_class else ""
        tail = f"<pre>{escape(chr(10).join(f.log_tail))}</pre>" if f.log_tail else ""
        parts.append(f"<h3>{escape(f.name)} <small>{escape(f.job)}, {escape(f.state)}{klass}</small></h3>"
                     f"<p>{escape(f.message)}</p>{tail}")
    return "".join(parts)


def _sweeps(report: Report) -> str:
    parts = []
    for s in report.sweeps:
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(s.created_at))
        parts.append(f"<h3>sweep {escape(s.id)}</h3><p>queue {escape(s.queue)}, submitted {when}; bundle "
                     f"<code>{escape(s.bundle_sha[:12] or 'none')}</code>; hosts {escape(', '.join(s.hosts) or 'none')}"
                     f"; git {_git(s.git_commit, s.git_dirty)}</p><pre>{escape(s.queue_text)}</pre>")
    return "".join(parts)


def _git(commit: str | None, dirty: bool | None) -> str:
    if not commit:
        return "unknown"
    state = " (dirty: unknown)" if dirty is None else " (uncommitted changes)" if dirty else " (clean)"
    return f"<code>{escape(commit[:12])}</code>{escape(state)}"


def _machines(report: Report) -> str:
    """What each cell's seeds ran with: one line per distinct machine and software."""
    items = "".join(f"<li><b>{escape(c.cell)}</b>: {'; '.join(escape(x) for x in c.ran_with) or 'unknown'}</li>"
                    for c in report.cells)
    return f"<ul>{items}</ul>"


def _cpu(report: Report) -> str:
    return f", CPU-hours {report.cpu_hours:.2f}" if report.cpu_hours else ""


def write_report(report: Report, curves: Curves, out: Path) -> Path:
    """Write ``out/report.html`` (and the figures beside it as PNG files); the page's path."""
    out.mkdir(parents=True, exist_ok=True)
    cost = tables.cost(report.cost_usd) or "not priced"
    notes = "".join(f"<li>{escape(n)}</li>" for n in report.notes)
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{_CSP}">
<title>gpuq report: {escape(", ".join(s.id for s in report.sweeps))}</title>
<style>{_STYLE}</style><script>{_SCRIPT}</script></head>
<body>
<h1>gpuq report</h1>
<p>{escape(tables.heading(report))}. GPU-hours {report.gpu_hours:.2f}{_cpu(report)}, cost {escape(cost)}.</p>
<ul>{notes}</ul>
<h2>Cells against the baseline</h2>
{_table(report)}
<p class="small">mean, std and 95% CI of each seed's final {escape(report.metric)}; the delta's CI and p-value
are Welch's t-test against the baseline (docs/report.md in gpuq explains the verdicts and flags).</p>
<h2>Learning curves</h2>
{_figures(report, curves, out)}
<h2>Machines</h2>
{_machines(report)}
<h2>Failures</h2>
{_failures(report)}
<h2>Sweeps</h2>
{_sweeps(report)}
</body></html>
"""
    path = out / PAGE
    path.write_text(page, encoding="utf-8")
    return path
