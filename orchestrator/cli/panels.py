"""The live view's drawing (``gpuq status`` in a terminal): pure functions of data and ``now`` that
return rich renderables (unit-tested by rendering into a fixed-size Console): ``bar``,
``sparkline``, ``LossHistory``, ``hosts_panel``, ``jobs_panel`` (with the shown sweeps' budget lines),
``alerts_panel``, ``footer`` and ``screen``.  The terminal, keys and the ticking thread are
``orchestrator/cli/dashboard.py``.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rich.console import Console, Group, RenderableType
from rich.layout import Layout
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from orchestrator.cli.glyphs import BAR_W, SPARK_W, bar, level_style
from orchestrator.cli.render import SEVERITY_STYLE
from orchestrator.views import (
    HEALTH_STYLE,
    AlertView,
    HostView,
    JobView,
    alert_views,
    host_views,
    job_views,
    sweep_views,
)
from orchestrator.views.text import clock, duration, one_line, printable

if TYPE_CHECKING:
    from orchestrator.api import Snapshot

NARROW_BAR_W = 4  # cells of a bar on a narrow terminal
ALERT_ROWS = 6  # at most this many alerts on screen (the newest)
BUDGET_ROWS = 3  # at most this many sweeps' budget lines above the jobs


class LossHistory:
    """Per job, the losses seen at distinct (attempt, step) points, oldest first (in memory only:
    the sparkline of a dashboard started a minute ago covers that minute)."""

    def __init__(self, limit: int = 4 * SPARK_W) -> None:
        self.limit = limit
        self._points: dict[str, list[tuple[int, int, float]]] = {}

    def add(self, snap: Snapshot) -> None:
        for job_id, att in snap.attempts.items():
            if att.step is None or att.loss is None or not math.isfinite(att.loss):
                continue
            points = self._points.setdefault(job_id, [])
            if points and points[-1][:2] == (att.number, att.step):
                continue
            points.append((att.number, att.step, att.loss))
            del points[:-self.limit]
        for job_id in set(self._points) - set(snap.attempts):
            del self._points[job_id]

    def losses(self, job_id: str) -> list[float]:
        return [loss for _, _, loss in self._points.get(job_id, [])]


@dataclass
class View:
    """Everything one frame shows: the latest snapshot and what the live loop knows about ticks."""

    snapshot: Snapshot
    history: LossHistory = field(default_factory=LossHistory)
    offset: int = 0  # first job row shown
    interval_s: float = 5.0
    updated_at: float | None = None  # when the newest probing tick ended (None: not yet)
    ticking: bool = False
    error: str = ""  # why the latest tick failed ("" when it did not)
    show_cells: bool = False  # key c: the per-cell view instead of the jobs table


def _gib(mib: object) -> str:
    return f"{mib / 1024:.1f}" if isinstance(mib, int | float) else "?"


HOST_COLUMNS = ("host", "state", "probed", "slots", "disk", "inodes", "mem", "gpu", "util", "vram", "temp", "job")
# what a narrow terminal gives up first: the minor columns, then the bars narrow, then disk and utilisation,
# the job on each GPU (the jobs panel says where each job runs), the memory
HOST_DROPS: tuple[tuple[str, int], ...] = (("inodes", BAR_W), ("temp", BAR_W), ("probed", BAR_W), ("mem", BAR_W),
                                           ("", NARROW_BAR_W), ("disk", NARROW_BAR_W), ("util", NARROW_BAR_W),
                                           ("job", NARROW_BAR_W), ("vram", NARROW_BAR_W))


def hosts_panel(snap: Snapshot, now: float, stale_after_s: float | None = None, title: str = "hosts",
                width: int = 160) -> Panel:
    """One row per host (state and flags, probe age, slots, disk, inodes, memory), one more per GPU
    (utilisation and memory bars, temperature, the job on it), then one line per host that needs a
    word: why it is unreachable, unhealthy or held.  A host whose last good probe is older than
    ``stale_after_s`` is marked stale: an old reading is never shown as a fresh one.  On a terminal
    narrower than the table the minor columns go first (HOST_DROPS), never the host's name."""
    if not snap.hosts:
        return Panel(Text("no hosts yet: `gpuq submit` uses this machine; `gpuq hosts add` adds SSH hosts",
                          style="dim"), title="hosts", title_align="left", border_style="blue")
    dropped: set[str] = set()
    for name, bar_w in (("", BAR_W), *HOST_DROPS):
        dropped.add(name)
        table = _hosts_table(snap, now, stale_after_s, [c for c in HOST_COLUMNS if c not in dropped], bar_w)
        if Console(width=10_000, file=io.StringIO()).measure(table).maximum <= width - 4:
            break
    table.expand = True
    notes: list[Text] = []
    for host in host_views(snap):
        text, style = host.state
        said = [(text, style)] if style != "green" and text != "not probed" else []
        if said or host.flags:
            note = Text.assemble((f"{printable(host.row.name)}: ", "bold"))
            for i, (flag, flag_style) in enumerate(said + host.flags):
                note.append(" · " if i else "")
                note.append(flag, style=flag_style)
            note.no_wrap, note.overflow = True, "ellipsis"
            notes.append(note)
    return Panel(Group(table, *notes), title=title, title_align="left", border_style="blue")


def _hosts_table(snap: Snapshot, now: float, stale_after_s: float | None, columns: list[str], bar_w: int) -> Table:
    table = Table(box=None, padding=(0, 1), pad_edge=False, expand=False, header_style="bold dim")
    for name in columns:
        table.add_column(name, no_wrap=True, overflow="ellipsis", max_width=26 if name == "gpu" else None,
                         min_width=min(len(name), 4) if name in ("host", "state") else None,
                         ratio=1 if name == "job" else None)
    names = {j.id: printable(j.name) for j in snap.jobs}
    for host in host_views(snap):
        host_cells = _host_cells(host, now, stale_after_s, bar_w)
        blank: list[RenderableType] = [""] * len(host_cells)
        devices: list[list[RenderableType]] = _device_rows(host, names, bar_w) or [["", "", "", "", ""]]
        for i, device in enumerate(devices):
            cells = dict(zip(HOST_COLUMNS, [*(host_cells if i == 0 else blank), *device], strict=True))
            table.add_row(*(cells[c] for c in columns))
    return table


def _host_cells(host: HostView, now: float, stale_after_s: float | None, bar_w: int) -> list[RenderableType]:
    row, probe = host.row, host.probe
    if probe is not None and probe.ok:
        state = Text("ok", style="green")
    elif probe is not None and probe.reachable:
        protocol_error = probe.error.startswith("protocol error")
        state = Text("protocol error" if protocol_error else "no agent answer", style="bold red" if protocol_error
                     else "yellow")
    elif probe is None and not row.unreachable_since:
        state = Text("not probed", style="dim")
    else:
        state = Text("unreachable", style="bold red")
    if row.health in ("fail", "warn"):
        state.append(" UNHEALTHY" if row.health == "fail" else " health warn", style=HEALTH_STYLE[row.health])
    if row.held:
        state.append(" HELD", style="bold yellow")
    age = None if row.last_probe_at is None else now - row.last_probe_at
    probed = Text(duration(age), style="dim" if age is None else "")
    if age is not None and stale_after_s is not None and age > stale_after_s:
        probed = Text(f"{duration(age)} stale", style="bold red")
    inodes, mem_pct = host.inodes_pct, host.mem_pct
    return [
        Text(printable(row.name), style="bold"), state, probed,
        Text(f"{host.slots} free") if host.has_slots else "-",
        _pct_bar(host.disk_pct, 90, 95, bar_w=bar_w),
        Text(f"{inodes:.0f}%", style=level_style(inodes, 90, 95)) if inodes is not None else "-",
        Text(f"{mem_pct:.0f}%", style=level_style(mem_pct, 90, 95)) if mem_pct is not None else "-",
    ]


def _device_rows(host: HostView, names: dict[str, str], bar_w: int) -> list[list[RenderableType]]:
    """Per GPU: index and model, utilisation, memory, temperature, the job on it; on a CPU host one
    row per running job with the CPU slots it holds."""
    rows: list[list[RenderableType]] = []
    for gpu in host.gpus:
        used, total = gpu.mem_used_mib, gpu.mem_total_mib
        vram = 100 * used / total if used is not None and total else None
        temp = gpu.temp_c
        job_id = gpu.job_id
        rows.append([
            Text(f"{'None' if gpu.index is None else gpu.index} {gpu.model}".strip()),  # a Text is never markup
            _pct_bar(gpu.util_pct, 101, 101, "cyan", bar_w=bar_w),
            Text.assemble(bar(None if vram is None else vram / 100, bar_w, level_style(vram, 90, 97)),
                          f" {_gib(used)}/{_gib(total)}G"),
            Text(f"{temp:.0f}°C", style=level_style(temp, 80, 88)) if temp is not None else "-",
            Text(names.get(job_id, job_id[:8])) if job_id else Text("idle", style="dim"),
        ])
    if host.answered and not host.gpus:
        for job_id, ids in host.cpu_jobs:
            rows.append([f"cpu {','.join(map(str, ids))}", "", "", "", Text(names.get(job_id, job_id[:8]))])
        if not host.cpu_jobs:
            rows.append(["cpu", "", "", "", Text("idle", style="dim")])
    return rows


def _pct_bar(pct: float | None, warn: float, bad: float, style: str | None = None, bar_w: int = BAR_W) -> Text:
    if pct is None:
        return Text("-", style="dim")
    return Text.assemble(bar(pct / 100, bar_w, style or level_style(pct, warn, bad)), f" {pct:3.0f}%")


def jobs_capacity(height: int) -> int:
    """Job rows that fit in a jobs panel ``height`` lines tall (borders and the header take 4)."""
    return max(1, height - 4)


def jobs_panel(views: Sequence[JobView], history: LossHistory, *, offset: int, rows: int,
               budgets: Sequence[str] = (), width: int = 160) -> Panel:
    """The jobs table, rows ``offset``..``offset + rows`` of ``views``, under the budget line of each shown
    sweep that has a cap (``budgets``, one line each), for a terminal ``width`` columns wide.

    Columns are as wide as what they hold (not stretched to the terminal) and drop by priority when
    the row does not fit (``cli/jobstable.py``): a job's name is never cut while its id is shown."""
    from orchestrator.cli.jobstable import jobs_table

    shown = views[offset:offset + rows]
    body: RenderableType = jobs_table(shown, history.losses, max(1, width - 4))  # the panel's borders and padding
    title = f"jobs {offset + 1}-{offset + len(shown)} of {len(views)}" if len(views) > rows else "jobs"
    if budgets:
        lines = [Text(line, style="bold red" if line.endswith("dispatch stopped") else "yellow", no_wrap=True,
                      overflow="ellipsis") for line in budgets]
        body = Group(*lines, body)
    return Panel(body, title=title, title_align="left", border_style="blue",
                 subtitle="↑↓ PgUp PgDn scroll" if len(views) > rows else None, subtitle_align="right")


def alerts_panel(alerts: Sequence[AlertView], rows: int = ALERT_ROWS) -> Panel:
    """The newest findings: time, severity, rule, subject, what was seen and what to do."""
    if not alerts:
        return Panel(Text("no alerts", style="dim"), title="alerts", title_align="left", border_style="blue")
    table = Table.grid(padding=(0, 1), expand=True)
    for kw in ({"no_wrap": True}, {"no_wrap": True}, {"no_wrap": True}, {"no_wrap": True},
               {"ratio": 3, "no_wrap": True}, {"ratio": 2, "no_wrap": True}):
        table.add_column(overflow="ellipsis", **kw)
    for alert in alerts[:rows]:
        table.add_row(clock(alert.time), Text(alert.severity.upper(), style=SEVERITY_STYLE.get(alert.severity, "")),
                      Text(alert.rule, style="bold"), Text(alert.subject), Text(one_line(alert.message)),
                      Text(f"→ {one_line(alert.action)}" if alert.action else "", style="italic"))
    more = f" (newest {rows} of {len(alerts)})" if len(alerts) > rows else ""
    worst = next((a.severity for a in alerts if a.severity == "escalate"), "")
    return Panel(table, title=f"alerts{more}", title_align="left", border_style="red" if worst else "yellow")


KEY_HINTS = ("q quit  ↑↓ scroll  r refresh  c cells/jobs", "q quit  r refresh  c cells", "q quit")


def footer(view: View, now: float, width: int = 160) -> Table:
    """One line: when the view was updated, and the keys in the room the left side leaves (the longest
    hint that fits beside it, "q quit" at the least; the left side is cut, never overlapped)."""
    when = "not probed yet" if view.updated_at is None else f"updated {duration(now - view.updated_at)} ago"
    left = Text.assemble(("gpuq status", "bold"), f" · {when} · every {view.interval_s:g}s")
    if view.ticking:
        left.append(" · probing…", style="cyan")
    if view.error:
        left.append(f" · last tick failed: {one_line(view.error)}", style="red")
    hint = next((h for h in KEY_HINTS if left.cell_len + 2 + len(h) <= width), KEY_HINTS[-1])
    grid = Table.grid(expand=True)
    grid.add_column(no_wrap=True, overflow="ellipsis", ratio=1)
    grid.add_column(no_wrap=True, justify="right", width=len(hint) + 2)
    grid.add_row(left, Text(hint, style="dim"))
    return grid


def height_of(renderable: RenderableType, width: int) -> int:
    """Lines ``renderable`` takes at ``width`` columns."""
    console = Console(width=width, file=io.StringIO(), highlight=False)
    return len(console.render_lines(renderable, console.options, pad=False))


def screen(view: View, now: float, width: int, height: int) -> tuple[Layout, int]:
    """The whole frame for a ``width`` x ``height`` terminal, and the job rows it has room for."""
    snap = view.snapshot
    stale_after_s = 3 * view.interval_s  # "three ticks" (docs/health.md)
    hosts = hosts_panel(snap, now, stale_after_s, width=width)
    hosts_h = height_of(hosts, width)
    room = max(5, (height - 1) // 3)
    if hosts_h > room:  # never cut silently
        hosts = hosts_panel(snap, now, stale_after_s, title=f"hosts ({hosts_h - room} lines cut: a taller "
                            "terminal, or `gpuq status --once`, shows them)", width=width)
        hosts_h = room
    alerts = alert_views(snap)
    alerts_h = 2 + max(1, min(len(alerts), ALERT_ROWS))
    jobs_h = max(5, height - 1 - hosts_h - alerts_h)
    shown = {job.sweep_id for job in snap.jobs}
    budgets = [v.budget_line for v in sweep_views(snap) if v.budget_line and v.id in shown][:BUDGET_ROWS]
    rows = max(1, jobs_capacity(jobs_h) - (0 if view.show_cells else len(budgets)))
    if view.show_cells:
        from orchestrator.cli.cellpanel import cells_panel

        total = len(snap.cells.cells) if snap.cells is not None else 0
        offset = max(0, min(view.offset, total - rows))
        middle = cells_panel(snap.cells, snap.cells_error, offset=offset, rows=rows)
    else:
        views = job_views(snap, now)
        offset = max(0, min(view.offset, len(views) - rows))
        middle = jobs_panel(views, view.history, offset=offset, rows=rows, budgets=budgets, width=width)
    layout = Layout()
    layout.split_column(
        Layout(hosts, name="hosts", size=hosts_h),
        Layout(middle, name="jobs", size=jobs_h),
        Layout(alerts_panel(alerts), name="alerts", size=alerts_h),
        Layout(footer(view, now, width), name="footer", size=1),
    )
    return layout, rows


def scroll(offset: int, key: str, *, rows: int, total: int) -> int:
    """The first job row shown after ``key``."""
    step = {"up": -1, "down": 1, "pgup": -rows, "pgdn": rows, "home": -total, "end": total}.get(key, 0)
    return max(0, min(offset + step, total - rows))


# --- the live loop ----------------------------------------------------------------------------------
