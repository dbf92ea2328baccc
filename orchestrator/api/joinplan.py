"""Which lines of a queue are new to a sweep they join (``submit --into``; docs/queue.md, "Growing a sweep").

Pure: the queue's expanded jobs and the sweep's jobs in, the jobs to add and one line per queue line out.

* A job whose name the sweep has, with the same identity (``spec_hash``: config bytes, task, epochs, GPUs, nodes,
  seed, arguments), is already in the sweep: not a new job.  The rest of its line (more seeds: ``seeds=2`` ->
  ``seeds=4``) joins as new jobs of the same cell.
* A changed line (a job of that name, or a cell of that name, with another identity) is a new cell: its jobs are
  renamed ``<cell>.p<part>...`` so the sweep keeps both, side by side in one report; the same changed line
  submitted again is that cell (more seeds of it join it), never another.
* The baseline cell (the report's: named ``baseline``) may gain seeds but never change: a changed baseline line
  is refused, with its line named.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from orchestrator.core.specs import JobSpec, spec_hash_for
from orchestrator.ledger import Job
from orchestrator.report.cells import cell_name

BASELINE = "baseline"  # the cell the report compares against by default (api/report.py)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
Fingerprint = tuple[str, str, str, int, int, int, str]


@dataclass
class JoinPlan:
    """What joins: ``new`` (renamed where their line changed), one note per queue line that is not simply new, and
    the errors that refuse the whole queue (each names its line)."""

    new: list[JobSpec] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    already: int = 0  # jobs of the queue the sweep already has


def _print(spec: JobSpec) -> Fingerprint:
    """What a cell's jobs share (all but name and seed)."""
    return (spec.config, spec.config_sha256, spec.task, spec.epochs or 0, spec.gpus, spec.nodes,
            json.dumps(list(spec.args)))


def _job_print(job: Job) -> Fingerprint:
    return (job.config, job.config_sha256, job.task, job.epochs, job.gpus, job.nodes, job.args or "[]")


def _what_differs(new: Fingerprint, old: Fingerprint) -> str:
    names = ("config", "config bytes", "task", "epochs", "gpus", "nodes", "arguments")
    said = []
    for name, a, b in zip(names, old, new, strict=True):
        if a != b:
            said.append(name if name in ("config bytes", "arguments") else f"{name} {b or 'none'} (was {a or 'none'})")
    return ", ".join(said) or "seed"


def classify(queue: str, specs: Sequence[JobSpec], existing: Sequence[Job], sweep_id: str, part: int) -> JoinPlan:
    """The plan of joining ``specs`` (one queue's expanded jobs) to sweep ``sweep_id`` (its jobs: ``existing``)
    as its part ``part``."""
    by_name = {job.name.casefold(): job for job in existing}
    cells: dict[str, list[Job]] = {}
    for job in existing:
        cells.setdefault(cell_name(job.name, job.cell).casefold(), []).append(job)
    lines: dict[int, list[JobSpec]] = {}
    for spec in specs:
        lines.setdefault(spec.line, []).append(spec)
    plan = JoinPlan()
    taken = set(by_name)
    for number, line in lines.items():
        line_name = line[0].cell or line[0].name
        shown = line_name
        changed = _changed(line, by_name, cells)
        if changed and any(cell_name(s.name, s.cell).casefold() == BASELINE for s in line):
            plan.errors.append(f"{queue}:{number}: the baseline differs from sweep {sweep_id}'s ({changed}); "
                               "a grown sweep keeps its baseline: restore the line, or submit without --into "
                               "for a new sweep")
            continue
        if changed:
            earlier = _earlier(line, line_name, by_name, cells)  # the cell a part before made of this very line
            if earlier is None:
                _new_cell(plan, f"{queue}:{number}", line, f"{line_name}.p{part}", taken, f"{sweep_id}'s ({changed})")
                continue
            line, shown = earlier, f"{line_name} (as {earlier[0].cell})"
        have = [s for s in line if s.name.casefold() in by_name]
        fresh = [s for s in line if s.name.casefold() not in by_name]
        plan.new.extend(fresh)
        plan.already += len(have)
        if have:
            parts = sorted({by_name[s.name.casefold()].part for s in have})
            more = f"; {len(fresh)} more join" if fresh else ": not new"
            plan.notes.append(f"{queue}:{number}: {shown}: {_jobs(len(have))} already in sweep {sweep_id} "
                              f"(part {', '.join(map(str, parts))}){more}")
    return plan


def _new_cell(plan: JoinPlan, where: str, line: Sequence[JobSpec], cell: str, taken: set[str], what: str) -> None:
    """The changed line's jobs joined as the new cell ``cell``, or the error that says why they cannot be."""
    line_name = line[0].cell or line[0].name
    renamed = _renamed(line, cell)
    clash = [s.name for s in renamed if s.name.casefold() in taken or not _NAME.fullmatch(s.name)]
    if clash:
        plan.errors.append(f"{where}: {line_name} differs from sweep {what} and cannot be named {clash[0]}; give "
                           "the line a name= of its own")
        return
    taken |= {s.name.casefold() for s in renamed}
    plan.new.extend(renamed)
    plan.notes.append(f"{where}: {line_name} differs from sweep {what}: joins as a new cell, {cell}")


def _earlier(line: Sequence[JobSpec], line_name: str, by_name: dict[str, Job],
             cells: dict[str, list[Job]]) -> list[JobSpec] | None:
    """The line renamed as the cell ``<line>.p<k>`` an earlier join made of it (its jobs the same), or None."""
    made = re.compile(re.escape(line_name.casefold()) + r"\.p[0-9]+")
    for cell in sorted({job.cell for jobs in cells.values() for job in jobs if made.fullmatch(job.cell.casefold())}):
        renamed = _renamed(line, cell)
        if not _changed(renamed, by_name, cells):
            return renamed
    return None


def _jobs(n: int) -> str:
    return f"{n} job{'s' if n != 1 else ''}"


def _changed(line: Sequence[JobSpec], by_name: dict[str, Job], cells: dict[str, list[Job]]) -> str:
    """What makes the line another cell than the sweep's of its name ("" when it is the same cell, or new)."""
    for spec in line:
        twin = by_name.get(spec.name.casefold())
        if twin is not None and twin.spec_hash != spec_hash_for(spec):
            return _what_differs(_print(spec), _job_print(twin))
        members = cells.get(cell_name(spec.name, spec.cell).casefold(), [])
        if members and _job_print(members[0]) != _print(spec):
            return _what_differs(_print(spec), _job_print(members[0]))
    return ""


def _renamed(line: Sequence[JobSpec], cell: str) -> list[JobSpec]:
    """The line's jobs as cell ``cell``: each name's part after its line's name kept (``-seed1``, ``-lr0.1``)."""
    out = []
    for spec in line:
        own = spec.cell or spec.name
        out.append(spec.model_copy(update={"name": cell + spec.name[len(own):], "cell": cell}))
    return out
