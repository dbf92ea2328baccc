"""The live view's jobs table at any terminal width: columns drop by priority, as htop, nvitop and squeue do.

Every column is as wide as what it holds.  When the row does not fit, the least needed column goes
first (cost, attempt, heartbeat, trend), then the 12-character id shrinks to 8 and goes, then the
ETA; only then is a name cut (to ``NAME_KEEP_W`` first), then the progress bar narrows, the loss and
``host:gpu`` go, the bar leaves only its percentage, and last the name is cut to what is left.  A
job's name is never cut while its id is shown.  With jobs of more than one sweep on screen
(``gpuq status --all``) a ``sweep`` column names each job's sweep, kept as long as the state is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rich import box
from rich.table import Table
from rich.text import Text

from orchestrator.cli.glyphs import bar, sparkline
from orchestrator.cli.render import STATE_STYLE
from orchestrator.views.text import duration, money, printable

if TYPE_CHECKING:
    from orchestrator.views import JobView

SEP_W = 3  # between two columns of a SIMPLE_HEAD table: padding, the invisible rule, padding
PROGRESS_W = 14  # cells of a job's progress bar when there is room
NARROW_BAR_W = 6  # ... when there is not
NAME_MAX_W = 48  # a job name wider than this is cut with an ellipsis, however wide the terminal
NAME_KEEP_W = 24  # a name is cut below its width only after the id, ETA and the minor columns are gone
NAME_MIN_W = 8
SHORT_ID_W = 8
HEARTBEAT_OLD_S = 300  # a heartbeat older than this is drawn red (the patrol's "stalled" rule decides)


@dataclass
class Column:
    key: str
    cells: list[Text]
    justify: str = "left"
    cap: int = 0  # cut to this width (0: as wide as its widest cell)

    @property
    def width(self) -> int:
        widest = max([len(self.key), *(cell.cell_len for cell in self.cells)])
        return min(widest, self.cap) if self.cap else widest


@dataclass
class Plan:
    """What the table shows at one width: the columns kept, the bar width, the name's cap."""

    columns: dict[str, Column]
    bar_w: int = PROGRESS_W
    order: list[str] = field(default_factory=list)

    def width(self) -> int:
        shown = [self.columns[k] for k in self.order if k in self.columns]
        return sum(c.width for c in shown) + SEP_W * max(0, len(shown) - 1)


def _drop(key: str) -> Callable[[Plan], None]:
    def drop(plan: Plan) -> None:
        plan.columns.pop(key, None)
    return drop


def _cap(key: str, width: int) -> Callable[[Plan], None]:
    def cap(plan: Plan) -> None:
        if key in plan.columns:
            plan.columns[key].cap = width
    return cap


def _bar(width: int) -> Callable[[Plan], None]:
    def narrow(plan: Plan) -> None:
        plan.bar_w = width
    return narrow


# the order in which a row gives up width when it does not fit (the first step first)
STEPS: tuple[Callable[[Plan], None], ...] = (
    _drop("cost"), _drop("try"), _drop("hb"), _drop("trend"), _cap("job", SHORT_ID_W), _drop("job"),
    _drop("eta"), _cap("name", NAME_KEEP_W), _bar(NARROW_BAR_W), _drop("loss"), _drop("host:gpu"), _bar(0),
)
ORDER = ["job", "name", "sweep", "state", "host:gpu", "progress", "eta", "loss", "trend", "hb", "try", "cost"]
RIGHT = {"eta", "loss", "hb", "try", "cost"}


def progress_cell(view: JobView, bar_w: int) -> Text:
    job, att = view.job, view.attempt
    return Text.assemble(
        bar(view.fraction, bar_w, "green" if job.state == "SUCCEEDED" else "cyan") if bar_w else "",
        (" " if bar_w else "") + (f"{view.fraction:4.0%}" if view.fraction is not None else "    "),
        (f" ep {att.epoch}" + (f"/{view.epochs}" if view.epochs else "")
         if att is not None and att.epoch is not None else "", "dim"),
        (f" {view.note}" if view.note else "", "dim"),  # no heartbeat: elapsed and the last log line
    )


Losses = Callable[[str], list[float]]  # a job id's losses seen so far, oldest first (LossHistory.losses)


def _columns(views: Sequence[JobView], losses: Losses, bar_w: int, sweeps: bool) -> dict[str, Column]:
    def column(key: str, cell: Callable[[JobView], Text | str]) -> Column:
        return Column(key, [c if isinstance(c, Text) else Text(c) for c in map(cell, views)],
                      justify="right" if key in RIGHT else "left")

    def old(v: JobView) -> bool:
        return v.heartbeat_age_s is not None and v.heartbeat_age_s > HEARTBEAT_OLD_S

    columns = [
        column("job", lambda v: v.job.id),
        column("name", lambda v: printable(v.job.name)),
        column("state", lambda v: Text(v.job.state, style=STATE_STYLE.get(v.job.state, ""))),
        column("host:gpu", lambda v: printable(v.where)),
        column("progress", lambda v: progress_cell(v, bar_w)),
        column("eta", lambda v: duration(v.eta_s)),
        column("loss", lambda v: f"{v.attempt.loss:.4g}" if v.attempt is not None and v.attempt.loss is not None
               else "-"),
        column("trend", lambda v: Text(sparkline(losses(v.job.id)), style="magenta")),
        column("hb", lambda v: Text(duration(v.heartbeat_age_s), style="bold red" if old(v) else "")),
        column("try", lambda v: str(v.job.attempt_count or "-")),
        column("cost", lambda v: money(v.cost)),
    ]
    if sweeps:
        columns.append(column("sweep", lambda v: v.job.sweep_id))
    found = {c.key: c for c in columns}
    found["name"].cap = NAME_MAX_W
    return found


def plan(views: Sequence[JobView], losses: Losses, width: int) -> Plan:
    """The columns (with their cells) that fit in ``width`` terminal cells, by the priority of STEPS."""
    sweeps = len({v.job.sweep_id for v in views}) > 1
    chosen = Plan(_columns(views, losses, PROGRESS_W, sweeps), order=ORDER)
    for step in STEPS:
        if chosen.width() <= width:
            break
        bar_w = chosen.bar_w
        step(chosen)
        if chosen.bar_w != bar_w:
            chosen.columns["progress"] = Column("progress", [progress_cell(v, chosen.bar_w) for v in views])
    if chosen.width() > width:  # the name takes what is left (never less than NAME_MIN_W)
        name = chosen.columns["name"]
        name.cap = max(NAME_MIN_W, name.width - (chosen.width() - width))
    if chosen.width() > width:  # still too narrow: the progress goes too, the state stays
        chosen.columns.pop("progress", None)
    return chosen


def jobs_table(views: Sequence[JobView], losses: Losses, width: int) -> Table | Text:
    """The jobs table for ``width`` cells inside the panel: ``plan`` decides which columns it has."""
    if not views:
        return Text("no jobs to show: `gpuq submit QUEUE`, or `gpuq status --all` for finished sweeps",
                    style="dim", no_wrap=True, overflow="ellipsis")
    chosen = plan(views, losses, width)
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, expand=False, header_style="bold dim")
    keys = [k for k in chosen.order if k in chosen.columns]
    for key in keys:
        # a shortened id is a prefix (still a job reference: `gpuq logs 1a2b3c4d`), never an ellipsis
        table.add_column(key, no_wrap=True, overflow="crop" if key == "job" else "ellipsis",
                         justify="right" if key in RIGHT else "left",
                         width=chosen.columns[key].width)
    for i in range(len(views)):
        table.add_row(*(chosen.columns[k].cells[i] for k in keys))
    return table
