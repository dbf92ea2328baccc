"""``gpuq status`` in a terminal: a live view of hosts, jobs and alerts.

The drawing is ``orchestrator/cli/panels.py`` (pure functions of data and ``now``); this module
is the live part: keys (``parse_keys``), the ticking thread and the terminal.  ``run`` is a thin shell: a
worker thread ticks (probe every host, reconcile; seconds over SSH) every interval, while the main
thread owns the terminal (cbreak mode and the alternate screen, restored on every way out: ``q``,
Ctrl-C, SIGTERM/SIGHUP, an exception), reads keys and redraws, so the view never waits on a probe.

Keys: q quits; up/down or k/j scroll the jobs table one row, PgUp/PgDn (or space/b) a page,
Home/End (g/G) to the ends; r ticks now; c switches the jobs table to the per-cell view (mean ± CI and
the delta to the baseline so far, docs/report.md) and back.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING, Any

from rich.console import Console

from orchestrator.cli.glyphs import bar, sparkline  # noqa: F401  (re-exported for the tests)
from orchestrator.cli.panels import (  # noqa: F401  (the drawing, re-exported for the live loop and tests)
    LossHistory,
    View,
    jobs_capacity,
    screen,
    scroll,
)

if TYPE_CHECKING:
    from orchestrator.api import Context, Snapshot
    from orchestrator.core.states import JobState

REDRAW_S = 1.0  # redraw at least this often: ages ("updated 3s ago", heartbeat) keep moving
KEY_POLL_S = 0.2
JOIN_S = 0.5  # on quit, wait this long for a tick in flight (then leave it: see run())

KEYS = {
    b"\x1b[A": "up", b"\x1bOA": "up", b"k": "up",
    b"\x1b[B": "down", b"\x1bOB": "down", b"j": "down",
    b"\x1b[5~": "pgup", b"b": "pgup", b"\x1b[6~": "pgdn", b" ": "pgdn",
    b"\x1b[H": "home", b"\x1bOH": "home", b"\x1b[1~": "home", b"\x1b[7~": "home", b"g": "home",
    b"\x1b[F": "end", b"\x1bOF": "end", b"\x1b[4~": "end", b"\x1b[8~": "end", b"G": "end",
    b"q": "quit", b"Q": "quit", b"r": "refresh", b"c": "cells",
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
        from orchestrator.core.errors import GpuqError

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


def run(ctx: Context, *, sweep: str | None, all_jobs: bool, interval_s: float, probe: bool = True,
        states: Sequence[JobState] = ()) -> int:
    """The live dashboard until q, Ctrl-C (exit 0) or SIGTERM/SIGHUP (128 + signal)."""
    from rich.live import Live

    from orchestrator import api
    from orchestrator.transfer import progress as transfer_progress

    transfer_progress.install(None)  # the live screen owns the terminal: no transfer bars beside it

    # the ledger's view first (instant, no probe; a bad --sweep fails here, before the screen changes)
    view = View(api.status(ctx, sweep=sweep, all_jobs=all_jobs, probe=False, states=states), interval_s=interval_s)
    # unreachable hosts back off (docs/health.md): a live view must not hammer a dead sshd every few seconds
    def fetch() -> Snapshot:
        snap = api.status(ctx, sweep=sweep, all_jobs=all_jobs, honour_backoff=True, probe=probe, states=states)
        if view.show_cells:
            with_cells(ctx, snap)
        return snap

    ticker = Ticker(fetch, interval_s)
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


def with_cells(ctx: Context, snap: Snapshot) -> None:
    """Attach the per-cell report of the snapshot's sweeps (the ledger only: the tick just collected)."""
    from orchestrator.api.report import build_report
    from orchestrator.core.errors import GpuqError

    sweeps = sorted({job.sweep_id for job in snap.jobs})
    if not sweeps:
        return
    try:
        snap.cells = build_report(ctx, sweeps, collect=False)
    except GpuqError as exc:
        snap.cells_error = str(exc).splitlines()[0]


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
            if key == "cells":
                view.show_cells, view.offset = not view.show_cells, 0
                if view.show_cells and view.snapshot.cells is None:
                    ticker.tick_now()  # the next tick builds the cells (from the ledger: no extra round trip)
                drawn_at = 0.0
                continue
            cells = view.snapshot.cells
            total = len(cells.cells) if view.show_cells and cells is not None else len(view.snapshot.jobs)
            view.offset = scroll(max(0, min(view.offset, total - rows)), key, rows=rows, total=total)
            drawn_at = 0.0
