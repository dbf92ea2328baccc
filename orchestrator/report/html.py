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

from orchestrator.report import summary, tables
from orchestrator.report.figures import Curves, write_figures
from orchestrator.report.model import CellRow, Report

PAGE = "report.html"
_NUM = ' class="num"'
TIME_COLUMN = "time/seed"  # the mean wall time of the cell's finished seeds
_CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'"
_STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px; color: #1b1b1b; background: #fff; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 28px; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 13px; }
th, td { padding: 4px 6px; border-bottom: 1px solid #e4e4e4; white-space: nowrap; }
div.wide { max-width: 100%; overflow-x: auto; } p.headline { font-size: 16px; font-weight: 600; }
a.flags { color: #b3261e; } ul.differs { margin: 0 0 8px; }
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
  if (table) {
    table.setAttribute('data-box', box(table));
    var heights = [];
    table.querySelectorAll('tr').forEach(function (tr) {
      heights.push(Math.round(tr.getBoundingClientRect().height));
    });
    table.setAttribute('data-row-heights', heights.join(','));
  }
  document.body.setAttribute('data-width', String(document.documentElement.scrollWidth));
  document.body.setAttribute('data-figures-loaded', String(ok));
  document.body.setAttribute('data-height', String(document.documentElement.scrollHeight));
});
"""
_VERDICT_CLASS = {"better": "better", "worse": "worse", "within noise": "noise", "n too small": "small",
                  "cannot compute": "small", "no data": "small", "no baseline": "small"}


def _ci_mark(report: Report, cell: CellRow, text: str) -> str:
    """The CI's text, marked when it goes past [0, 1] for a metric that lives there (the note says why)."""
    past = summary.bounded(report.metric) and ((cell.ci_high is not None and cell.ci_high > 1)
                                       or (cell.ci_low is not None and cell.ci_low < 0))
    return f'{escape(text)} <span title="past [0, 1]: see the note">†</span>' if past else escape(text)


def _flag_key(flag: str) -> str:
    return flag.split(":", 1)[0]


def _td(report: Report, k: int, column: str, value: str) -> str:
    cell = report.cells[k]
    if column == "verdict":
        return f'<td class="{_VERDICT_CLASS.get(value, "")}">{escape(value)}</td>'
    if column == "flags":
        if not cell.flags:
            return "<td></td>"
        keys = list(dict.fromkeys(_flag_key(f) for f in cell.flags))  # in order, once each
        more = f" +{len(keys) - 1}" if len(keys) > 1 else ""
        return (f'<td class="flag"><a class="flags" href="#flags-{k}" '
                f'title="{escape("; ".join(keys))}">{escape(keys[0])}{more}</a></td>')
    if column == "95% CI":
        return f'<td{_NUM}>{_ci_mark(report, cell, value)}</td>'
    return f'<td{"" if column == "cell" else _NUM}>{escape(value)}</td>'


def _wide(table_id: str, head: str, rows: list[str]) -> str:
    """A table that never wraps its cells: past the window's width it scrolls in its own box, not the page."""
    return (f'<div class="wide"><table id="{table_id}"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table></div>')


def _table(report: Report) -> str:
    """The cells, one line each (no cell wraps: the flags are named here and said in full below)."""
    at = tables.COLUMNS.index("steps") + 1
    columns = [*tables.COLUMNS[:at], TIME_COLUMN, *tables.COLUMNS[at:]]
    head = "".join(f"<th>{escape(c)}</th>" for c in columns)
    rows = []
    for k, cell in enumerate(report.cells):  # anchors by position: two names never share one
        values = tables.cells(cell)
        values.insert(at, summary.duration(cell.wall_s))
        tds = "".join(_td(report, k, c, v) for c, v in zip(columns, values, strict=True))
        rows.append(f'<tr class="{"baseline" if cell.is_baseline else ""}">{tds}</tr>')
    table = _wide("cells", head, rows)
    flagged = "".join(f'<li id="flags-{k}"><b>{escape(c.cell)}</b>: {"; ".join(escape(f) for f in c.flags)}</li>'
                      for k, c in enumerate(report.cells) if c.flags)
    return table + (f'<ul class="flag">{flagged}</ul>' if flagged else "")


def _seeds(report: Report) -> str:
    """Every seed of every cell: its own final and best value, steps, attempts and wall time."""
    head = "".join(f"<th>{c}</th>" for c in ("cell", "job", "id", "seed", "state", f"final {escape(report.metric)}",
                                             "best", "steps", "attempts", "wall time"))
    rows = []
    for cell in report.cells:
        for seed in cell.seeds:
            values = (seed.name, seed.job, "" if seed.seed is None else str(seed.seed), seed.state,
                      tables.num(seed.final), tables.num(seed.best), "" if seed.steps is None else str(seed.steps),
                      str(seed.attempts), summary.duration(seed.wall_s))
            tds = "".join(f'<td{_NUM if i >= 4 else ""}>{escape(v)}</td>' for i, v in enumerate(values))
            rows.append(f"<tr><td>{escape(cell.cell)}</td>{tds}</tr>")
    return _wide("seeds", head, rows)


def _differs(report: Report) -> str:
    if report.baseline is None:
        return "<p>No baseline: nothing to compare the cells' settings with.</p>"
    parts = []
    for cell in report.cells:
        if cell.is_baseline:
            continue
        lines = "".join(f"<li>{escape(line)}</li>" for line in cell.differs) or \
            "<li>nothing but the name (same config bytes, task, epochs, GPUs and arguments)</li>"
        parts.append(f'<li class="differs"><b>{escape(cell.cell)}</b>'
                     f'<ul class="differs">{lines}</ul></li>')
    return f"<ul>{''.join(parts)}</ul>" if parts else "<p>The baseline is the only cell.</p>"


def _figures(report: Report, curves: Curves, out: Path) -> str:
    figures = write_figures(report, curves, out)
    if not figures:
        return "<p>No learning curves were recorded for these jobs (their hosts sent none).</p>"
    parts = []
    for name, path, axis in figures:
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        off = (f" {', '.join(axis.off_scale)} runs off the axis (an outlier: the axis fits the other cells; the "
               f"arrow gives its last value).") if axis.off_scale else ""
        parts.append(f'<figure><img class="curve" alt="{escape(name)} against step" data-curve="{escape(name)}" '
                     f'data-ylim="{axis.low:.6g},{axis.high:.6g}" data-yscale="{escape(axis.scale)}" '
                     f'data-yticks="{escape("|".join(axis.ticks))}" '
                     f'data-off-scale="{escape(",".join(axis.off_scale))}" '
                     f'src="data:image/png;base64,{data}"><figcaption>{escape(name)}: one line per cell (mean over '
                     f'its seeds), the band spans the lowest to the highest seed; the baseline is black and dashed.'
                     f'{escape(off)} Also saved as {escape(path.name)}.</figcaption></figure>')
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


def _cells_title(report: Report) -> str:
    return f"Cells against {report.baseline}" if report.baseline else "Cells (no baseline)"


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
<p class="headline" id="headline">{escape(report.headline)}</p>
<p>{escape(tables.heading(report))}. GPU-hours {report.gpu_hours:.2f}{_cpu(report)}, cost {escape(cost)}.</p>
<ul>{notes}</ul>
<h2>{escape(_cells_title(report))}</h2>
{_table(report)}
<p class="small">mean, std and 95% CI of each seed's final {escape(report.metric)}; the delta's CI and p-value
are Welch's t-test against the baseline (docs/report.md in gpuq explains the verdicts and flags); time/seed is the
mean wall time of a finished seed's attempts.</p>
<h2>Learning curves</h2>
{_figures(report, curves, out)}
<h2>What differs from the baseline</h2>
{_differs(report)}
<h2>Seeds</h2>
{_seeds(report)}
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
