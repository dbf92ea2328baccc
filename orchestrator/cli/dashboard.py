"""``gpuq status`` in a terminal: a live view of hosts, jobs and alerts.

Pure views (unit-tested by rendering into a fixed-size Console): ``bar``, ``sparkline``,
``LossHistory``, ``parse_keys``, ``hosts_panel``, ``jobs_panel``, ``alerts_panel`` and ``screen``
take data and ``now`` and return rich renderables.  The live part (``run``) is a thin shell: a
worker thread ticks (probe every host, reconcile; seconds over SSH) every interval, while the main
thread owns the terminal (cbreak mode and the alternate screen, restored on every way out: ``q``,
Ctrl-C, SIGTERM/SIGHUP, an exception), reads keys and redraws, so the view never waits on a probe.

Keys: q quits; up/down or k/j scroll the jobs table one row, PgUp/PgDn (or space/b) a page,
Home/End (g/G) to the ends; r ticks now.
"""

from __future__ import annotations

import io
import math
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Console, Group, RenderableType
from rich.layout import Layout
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from orchestrator.cli.render import (
    HEALTH_STYLE,
    SEVERITY_STYLE,
    STATE_STYLE,
    AlertView,
    JobView,
    alert_views,
    clock,
    duration,
    host_flags,
    host_state,
    job_views,
    money,
    one_line,
    slot_jobs,
)

if TYPE_CHECKING:
    from orchestrator.api import Context, Snapshot
    from orchestrator.controller import Probe
    from orchestrator.ledger import Host as HostRow

SPARKS = "▁▂▃▄▅▆▇█"
FULL, EMPTY = "█", "░"
BAR_W = 10  # cells of a utilisation / memory / disk bar
PROGRESS_W = 14  # cells of a job's progress bar
SPARK_W = 16  # losses shown in a job's sparkline
ALERT_ROWS = 6  # at most this many alerts on screen (the newest)
REDRAW_S = 1.0  # redraw at least this often: ages ("updated 3s ago", heartbeat) keep moving
KEY_POLL_S = 0.2
HEARTBEAT_OLD_S = 300  # a heartbeat older than this is drawn red (the patrol's "stalled" rule decides)
JOIN_S = 0.5  # on quit, wait this long for a tick in flight (then leave it: see run())


# --- pure views -------------------------------------------------------------------------------------


def bar(fraction: float | None, width: int = BAR_W, style: str = "green") -> Text:
    """``█████░░░░░``: ``fraction`` (0..1) of ``width`` cells filled; dim dots when unknown."""
    if fraction is None or not math.isfinite(fraction):
        return Text("·" * width, style="dim")
    filled = round(min(1.0, max(0.0, fraction)) * width)
    return Text.assemble((FULL * filled, style), (EMPTY * (width - filled), "dim"))


def level_style(pct: float | None, warn: float, bad: float) -> str:
    if pct is None:
        return "dim"
    return "bold red" if pct >= bad else "yellow" if pct >= warn else "green"


def sparkline(values: Sequence[float], width: int = SPARK_W) -> str:
    """The last ``width`` values as block characters (log scale when all are positive: losses fall
    by orders of magnitude, and a linear scale would flatten everything after the first drop)."""
    vals = [v for v in values if math.isfinite(v)][-width:]
    if not vals:
        return ""
    if all(v > 0 for v in vals):
        vals = [math.log(v) for v in vals]
    lo, hi = min(vals), max(vals)
    if hi - lo <= 1e-12 * max(1.0, abs(hi)):
        return SPARKS[3] * len(vals)
    top = len(SPARKS) - 1
    return "".join(SPARKS[round((v - lo) / (hi - lo) * top)] for v in vals)


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


KEYS = {
    b"\x1b[A": "up", b"\x1bOA": "up", b"k": "up",
    b"\x1b[B": "down", b"\x1bOB": "down", b"j": "down",
    b"\x1b[5~": "pgup", b"b": "pgup", b"\x1b[6~": "pgdn", b" ": "pgdn",
    b"\x1b[H": "home", b"\x1bOH": "home", b"\x1b[1~": "home", b"\x1b[7~": "home", b"g": "home",
    b"\x1b[F": "end", b"\x1bOF": "end", b"\x1b[4~": "end", b"\x1b[8~": "end", b"G": "end",
    b"q": "quit", b"Q": "quit", b"r": "refresh",
}
_LONGEST_KEY = max(len(k) for k in KEYS)


def parse_keys(data: bytes) -> list[str]:
    """Key names in a chunk read from a cbreak terminal; unknown bytes (and escape sequences) are skipped."""
    keys, i = [], 0
    while i < len(data):
        for size in range(min(_LONGEST_KEY, len(data) - i), 0, -1):
            name = KEYS.get(data[i:i + size])
            if name is not None:
                keys.append(name)
                i += size
                break
        else:
            if data[i:i + 2] in (b"\x1b[", b"\x1bO"):  # an escape sequence we do not use: skip it whole
                i += 2
                while i < len(data) and not 0x40 <= data[i] <= 0x7E:
                    i += 1
            i += 1
    return keys


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


def _gib(mib: object) -> str:
    return f"{mib / 1024:.1f}" if isinstance(mib, int | float) else "?"


def _num(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def hosts_panel(snap: Snapshot, now: float, stale_after_s: float | None = None, title: str = "hosts") -> Panel:
    """One row per host (state and flags, probe age, slots, disk, inodes, memory), one more per GPU
    (utilisation and memory bars, temperature, the job on it), then one line per host that needs a
    word: why it is unreachable, unhealthy or held.  A host whose last good probe is older than
    ``stale_after_s`` is marked stale: an old reading is never shown as a fresh one."""
    if not snap.hosts:
        return Panel(Text("no hosts yet: `gpuq submit` uses this machine; `gpuq hosts add` adds SSH hosts",
                          style="dim"), title="hosts", title_align="left", border_style="blue")
    table = Table(box=None, padding=(0, 1), pad_edge=False, expand=True, header_style="bold dim")
    for name in ("host", "state", "probed", "slots", "disk", "inodes", "mem", "gpu", "util", "vram", "temp"):
        table.add_column(name, no_wrap=True, overflow="ellipsis", max_width=26 if name == "gpu" else None)
    table.add_column("job", no_wrap=True, overflow="ellipsis", ratio=1, min_width=12)
    names = {j.id: j.name for j in snap.jobs}
    notes: list[Text] = []
    for row in snap.hosts:
        probe = snap.probes.get(row.name)
        doc = probe.doc if probe is not None and probe.ok else {}
        host_cells = _host_cells(row, probe, doc, now, stale_after_s)
        blank: list[RenderableType] = [""] * len(host_cells)
        devices: list[list[RenderableType]] = _device_rows(doc, names) or [["", "", "", "", ""]]
        for i, device in enumerate(devices):
            table.add_row(*(host_cells if i == 0 else blank), *device)
        text, style = host_state(row, probe)
        said = [(text, style)] if style != "green" and text != "not probed" else []
        if said or host_flags(row):
            note = Text.assemble((f"{row.name}: ", "bold"))
            for i, (flag, flag_style) in enumerate(said + host_flags(row)):
                note.append(" · " if i else "")
                note.append(flag, style=flag_style)
            note.no_wrap, note.overflow = True, "ellipsis"
            notes.append(note)
    return Panel(Group(table, *notes), title=title, title_align="left", border_style="blue")


def _host_cells(row: HostRow, probe: Probe | None, doc: dict[str, Any], now: float,
                stale_after_s: float | None) -> list[RenderableType]:
    if probe is not None and probe.ok:
        state = Text("ok", style="green")
    elif probe is not None and probe.reachable:
        state = Text("no agent answer", style="yellow")
    elif probe is None and not row.unreachable_since:
        state = Text("not probed", style="dim")
    else:
        state = Text("unreachable", style="bold red")
    if row.health in ("fail", "warn"):
        state.append(" UNHEALTHY" if row.health == "fail" else " health warn", style=HEALTH_STYLE[row.health])
    if row.hold_reason:
        state.append(" HELD", style="bold yellow")
    age = None if row.last_probe_at is None else now - row.last_probe_at
    probed = Text(duration(age), style="dim" if age is None else "")
    if age is not None and stale_after_s is not None and age > stale_after_s:
        probed = Text(f"{duration(age)} stale", style="bold red")
    slots, disk, mem = doc.get("slots", {}), doc.get("disk", {}), doc.get("memory", {})
    inodes, mem_pct = _num(disk.get("inodes_used_pct")), _num(mem.get("used_pct"))
    return [
        Text(row.name, style="bold"), state, probed,
        f"{slots.get('free', '?')}/{slots.get('total', '?')} {slots.get('kind', '')} free" if slots else "-",
        _pct_bar(_num(disk.get("used_pct")), 90, 95),
        Text(f"{inodes:.0f}%", style=level_style(inodes, 90, 95)) if inodes is not None else "-",
        Text(f"{mem_pct:.0f}%", style=level_style(mem_pct, 90, 95)) if mem_pct is not None else "-",
    ]


def _device_rows(doc: dict[str, Any], names: dict[str, str]) -> list[list[RenderableType]]:
    """Per GPU: index and model, utilisation, memory, temperature, the job on it; on a CPU host one
    row per running job with the CPU slots it holds."""
    held = slot_jobs(doc)
    rows: list[list[RenderableType]] = []
    for gpu in doc.get("gpus", []):
        index = gpu.get("index")
        util, used, total = _num(gpu.get("util_pct")), _num(gpu.get("mem_used_mib")), _num(gpu.get("mem_total_mib"))
        vram = 100 * used / total if used is not None and total else None
        temp = _num(gpu.get("temp_c"))
        job_id = held.get(index) if isinstance(index, int) else None
        model = str(gpu.get("name") or "").removeprefix("NVIDIA ")
        rows.append([
            f"{index} {model}".strip(),
            _pct_bar(util, 101, 101, "cyan"),
            Text.assemble(bar(None if vram is None else vram / 100, BAR_W, level_style(vram, 90, 97)),
                          f" {_gib(used)}/{_gib(total)}G"),
            Text(f"{temp:.0f}°C", style=level_style(temp, 80, 88)) if temp is not None else "-",
            names.get(job_id, job_id[:8]) if job_id else Text("idle", style="dim"),
        ])
    if doc and not doc.get("gpus"):
        by_job: dict[str, list[int]] = {}
        for slot, job_id in sorted(held.items()):
            by_job.setdefault(job_id, []).append(slot)
        for job_id, ids in by_job.items():
            rows.append([f"cpu {','.join(map(str, ids))}", "", "", "", names.get(job_id, job_id[:8])])
        if not by_job:
            rows.append(["cpu", "", "", "", Text("idle", style="dim")])
    return rows


def _pct_bar(pct: float | None, warn: float, bad: float, style: str | None = None) -> Text:
    if pct is None:
        return Text("-", style="dim")
    return Text.assemble(bar(pct / 100, BAR_W, style or level_style(pct, warn, bad)), f" {pct:3.0f}%")


def jobs_capacity(height: int) -> int:
    """Job rows that fit in a jobs panel ``height`` lines tall (borders and the header take 4)."""
    return max(1, height - 4)


def jobs_panel(views: Sequence[JobView], history: LossHistory, *, offset: int, rows: int) -> Panel:
    """The jobs table, rows ``offset``..``offset + rows`` of ``views``."""
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, expand=True, header_style="bold dim")
    for name, kw in (("job", {"no_wrap": True}), ("name", {"ratio": 1}), ("state", {"no_wrap": True}),
                     ("host:gpu", {"no_wrap": True}), ("progress", {"no_wrap": True}),
                     ("eta", {"no_wrap": True, "justify": "right"}), ("loss", {"no_wrap": True, "justify": "right"}),
                     ("trend", {"no_wrap": True}), ("hb", {"no_wrap": True, "justify": "right"}),
                     ("try", {"no_wrap": True, "justify": "right"}), ("cost", {"no_wrap": True, "justify": "right"})):
        table.add_column(name, overflow="ellipsis", **kw)
    shown = views[offset:offset + rows]
    for view in shown:
        job, att = view.job, view.attempt
        progress = Text.assemble(
            bar(view.fraction, PROGRESS_W, "green" if job.state == "SUCCEEDED" else "cyan"),
            f" {view.fraction:4.0%}" if view.fraction is not None else "     ",
            (f" ep {att.epoch}/{job.epochs}" if att is not None and att.epoch is not None else "", "dim"),
            (f" {view.note}" if view.note else "", "dim"),  # no heartbeat: elapsed and the last log line
        )
        old = view.heartbeat_age_s is not None and view.heartbeat_age_s > HEARTBEAT_OLD_S
        table.add_row(
            job.id, job.name, Text(job.state, style=STATE_STYLE.get(job.state, "")), view.where, progress,
            duration(view.eta_s), f"{att.loss:.4g}" if att is not None and att.loss is not None else "-",
            Text(sparkline(history.losses(job.id)), style="magenta"),
            Text(duration(view.heartbeat_age_s), style="bold red" if old else ""),
            str(job.attempt_count or "-"), money(view.cost),
        )
    if not views:
        table.add_row("", Text("no jobs to show: `gpuq submit QUEUE`, or `gpuq status --all` for finished sweeps",
                               style="dim"), *[""] * 9)
    title = f"jobs {offset + 1}-{offset + len(shown)} of {len(views)}" if len(views) > rows else "jobs"
    return Panel(table, title=title, title_align="left", border_style="blue",
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
                      Text(alert.rule, style="bold"), alert.subject, one_line(alert.message),
                      Text(f"→ {one_line(alert.action)}" if alert.action else "", style="italic"))
    more = f" (newest {rows} of {len(alerts)})" if len(alerts) > rows else ""
    worst = next((a.severity for a in alerts if a.severity == "escalate"), "")
    return Panel(table, title=f"alerts{more}", title_align="left", border_style="red" if worst else "yellow")


def footer(view: View, now: float) -> Table:
    grid = Table.grid(expand=True)
    grid.add_column(no_wrap=True, overflow="ellipsis", ratio=1)
    grid.add_column(no_wrap=True, justify="right")
    when = "not probed yet" if view.updated_at is None else f"updated {duration(now - view.updated_at)} ago"
    left = Text.assemble(("gpuq status", "bold"), f" · {when} · every {view.interval_s:g}s")
    if view.ticking:
        left.append(" · probing…", style="cyan")
    if view.error:
        left.append(f" · last tick failed: {view.error}", style="red")
    grid.add_row(left, Text("q quit  ↑↓ scroll  r refresh", style="dim"))
    return grid


def height_of(renderable: RenderableType, width: int) -> int:
    """Lines ``renderable`` takes at ``width`` columns."""
    console = Console(width=width, file=io.StringIO(), highlight=False)
    return len(console.render_lines(renderable, console.options, pad=False))


def screen(view: View, now: float, width: int, height: int) -> tuple[Layout, int]:
    """The whole frame for a ``width`` x ``height`` terminal, and the job rows it has room for."""
    snap = view.snapshot
    stale_after_s = 3 * view.interval_s  # "three ticks" (DOMAIN.md 6.5)
    hosts = hosts_panel(snap, now, stale_after_s)
    hosts_h = height_of(hosts, width)
    room = max(5, (height - 1) // 3)
    if hosts_h > room:  # never cut silently
        hosts = hosts_panel(snap, now, stale_after_s, title=f"hosts ({hosts_h - room} lines cut: a taller "
                            "terminal, or `gpuq status --once`, shows them)")
        hosts_h = room
    alerts = alert_views(snap)
    alerts_h = 2 + max(1, min(len(alerts), ALERT_ROWS))
    jobs_h = max(5, height - 1 - hosts_h - alerts_h)
    rows = jobs_capacity(jobs_h)
    views = job_views(snap, now)
    offset = max(0, min(view.offset, len(views) - rows))
    layout = Layout()
    layout.split_column(
        Layout(hosts, name="hosts", size=hosts_h),
        Layout(jobs_panel(views, view.history, offset=offset, rows=rows), name="jobs", size=jobs_h),
        Layout(alerts_panel(alerts), name="alerts", size=alerts_h),
        Layout(footer(view, now), name="footer", size=1),
    )
    return layout, rows


def scroll(offset: int, key: str, *, rows: int, total: int) -> int:
    """The first job row shown after ``key``."""
    step = {"up": -1, "down": 1, "pgup": -rows, "pgdn": rows, "home": -total, "end": total}.get(key, 0)
    return max(0, min(offset + step, total - rows))


# --- the live loop ----------------------------------------------------------------------------------


def interactive() -> bool:
    """A live view needs a terminal on both ends: one to draw on, one to read keys from."""
    return sys.stdout.isatty() and sys.stdin.isatty() and not Console().is_dumb_terminal


class Ticker:
    """Runs ``fetch`` (one probing tick) in a daemon thread, every ``interval_s`` after the last ended.

    A GpuqError is the tick's problem (a busy ledger, a host that refused): kept for the footer,
    the previous snapshot stays.  Any other exception is a bug: kept for the main thread to raise."""

    def __init__(self, fetch: Callable[[], Snapshot], interval_s: float) -> None:
        self._fetch, self.interval_s = fetch, interval_s
        self._lock = threading.Lock()
        self._wake, self._stop = threading.Event(), threading.Event()
        self.seq = 0  # ticks finished
        self.snapshot: Snapshot | None = None
        self.updated_at: float | None = None
        self.error = ""
        self.ticking = False
        self.fatal: BaseException | None = None
        self.thread = threading.Thread(target=self._loop, name="gpuq-status-tick", daemon=True)

    def _loop(self) -> None:
        from orchestrator.errors import GpuqError

        while not self._stop.is_set():
            with self._lock:
                self.ticking = True
            try:
                snap, error = self._fetch(), ""
            except GpuqError as exc:
                snap, error = None, str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            except BaseException as exc:
                with self._lock:
                    self.fatal, self.ticking = exc, False
                return
            with self._lock:
                self.seq += 1
                self.ticking, self.error = False, error
                if snap is not None:
                    self.snapshot, self.updated_at = snap, time.time()
            self._wake.wait(self.interval_s)
            self._wake.clear()

    def state(self) -> tuple[int, Snapshot | None, float | None, bool, str]:
        with self._lock:
            return self.seq, self.snapshot, self.updated_at, self.ticking, self.error

    def tick_now(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()


class _Leave(BaseException):
    """SIGTERM or SIGHUP: leave like Ctrl-C does (a BaseException, so no ``except Exception`` eats it)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _leave(signum: int, frame: FrameType | None) -> None:
    raise _Leave(128 + signum)


@contextmanager
def cbreak(fd: int) -> Iterator[None]:
    """Keys arrive one by one, unechoed; the saved terminal mode comes back on every way out,
    SIGTERM and SIGHUP included (they raise inside the loop instead of killing us mid-frame)."""
    import termios
    import tty

    def resumed(signum: int, frame: FrameType | None) -> None:
        # back from Ctrl-Z: the shell put the terminal in its own mode meanwhile (the next frame,
        # at most REDRAW_S away, repaints the whole screen)
        tty.setcbreak(fd, termios.TCSANOW)

    saved = termios.tcgetattr(fd)
    handlers: dict[signal.Signals, Any] = {}
    try:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            handlers[sig] = signal.signal(sig, _leave)
        handlers[signal.SIGCONT] = signal.signal(signal.SIGCONT, resumed)
        tty.setcbreak(fd, termios.TCSANOW)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def read_keys(fd: int, timeout: float) -> list[str]:
    ready, _, _ = select.select([fd], [], [], timeout)
    if not ready:
        return []
    data = os.read(fd, 64)
    return parse_keys(data) if data else ["quit"]  # end of input: nobody is left to press q


def run(ctx: Context, *, sweep: str | None, all_jobs: bool, interval_s: float) -> int:
    """The live dashboard until q, Ctrl-C (exit 0) or SIGTERM/SIGHUP (128 + signal)."""
    from rich.live import Live

    from orchestrator import api

    # the ledger's view first (instant, no probe; a bad --sweep fails here, before the screen changes)
    view = View(api.status(ctx, sweep=sweep, all_jobs=all_jobs, probe=False), interval_s=interval_s)
    # unreachable hosts back off (DOMAIN.md 6.5): a live view must not hammer a dead sshd every few seconds
    ticker = Ticker(lambda: api.status(ctx, sweep=sweep, all_jobs=all_jobs, honour_backoff=True), interval_s)
    console = Console(highlight=False)
    fd = sys.stdin.fileno()
    code = 0
    ticker.thread.start()
    try:
        with cbreak(fd), Live(console=console, screen=True, auto_refresh=False, redirect_stdout=False,
                              redirect_stderr=False) as live:
            _loop(live, console, fd, ticker, view)
    except KeyboardInterrupt:
        code = 0
    except _Leave as exc:
        code = exc.code
    finally:
        ticker.stop()
    ticker.thread.join(JOIN_S)
    if ticker.thread.is_alive():
        # A probe is still in flight (an SSH round trip may take status_timeout_s).  The view is gone
        # and the user asked to leave: do not wait.  Cutting a tick is as safe as Ctrl-C on
        # `gpuq status --once` (every ledger change is one transaction); exiting now also keeps the
        # interpreter's shutdown from racing the worker's open connections.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _loop(live: Any, console: Console, fd: int, ticker: Ticker, view: View) -> None:
    seen, drawn_at, size, rows = -1, 0.0, None, 1
    view.history.add(view.snapshot)
    while True:
        if ticker.fatal is not None:
            raise ticker.fatal
        seq, snap, updated_at, ticking, error = ticker.state()
        dirty = seq != seen or ticking != view.ticking or console.size != size
        if seq != seen and snap is not None and snap is not view.snapshot:
            view.snapshot = snap
            view.history.add(snap)
        seen, size = seq, console.size
        view.updated_at, view.ticking, view.error = updated_at, ticking, error
        if dirty or time.monotonic() - drawn_at >= REDRAW_S:
            frame, rows = screen(view, time.time(), *console.size)
            live.update(frame, refresh=True)
            drawn_at = time.monotonic()
        for key in read_keys(fd, KEY_POLL_S):
            if key == "quit":
                return
            if key == "refresh":
                ticker.tick_now()
                continue
            total = len(view.snapshot.jobs)
            view.offset = scroll(max(0, min(view.offset, total - rows)), key, rows=rows, total=total)
            drawn_at = 0.0
