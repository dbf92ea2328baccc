"""The report's detail per cell: each seed's own values and wall time, what the cell runs differently
from the baseline (docs/report.md, "Seeds" and "What differs"), and the parts that joined a sweep later.

The config a job ran with is read as it was submitted: the file beside the queue (or in the project) when
its sha256 is still the job's ``config_sha256``, else the sweep's cached bundle
(``$GPUQ_HOME/bundles/<sha>.tar``, ``workdir/<config>``); when neither holds those bytes the line says so.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from orchestrator.core import protocol
from orchestrator.core.states import JobState
from orchestrator.report.differs import Setup, differences
from orchestrator.report.model import CellRow, SeedRow

if TYPE_CHECKING:  # the ORM's models only as types: the report reads through ledger/reader.py too
    from orchestrator.ledger import Attempt, Job, Ledger, Sweep
    from orchestrator.ledger.reader import LedgerReader

MAX_CONFIG_BYTES = 1 << 20  # a config larger than this is not read for its keys


class _Scored(Protocol):
    @property
    def value(self) -> float: ...
    @property
    def step(self) -> int | None: ...


def seed_rows(members: Sequence[Job], values: Mapping[str, Mapping[str, _Scored]],
              attempts: Mapping[str, Sequence[Attempt]], now: float) -> list[SeedRow]:
    """Every job of a cell with its own final and best value, steps, attempts and wall time."""
    rows = []
    for job in members:
        got = values.get(job.id, {})
        final, best = got.get("final"), got.get("best")
        runs = attempts.get(job.id, [])
        rows.append(SeedRow(job=job.id, name=job.name, seed=job.seed, state=job.state,
                            final=final.value if final else None, best=best.value if best else None,
                            steps=final.step if final else None, attempts=len(runs),
                            wall_s=sum(_seconds(a, now) for a in runs)))
    return rows


def _seconds(att: Attempt, now: float) -> float:
    """Seconds an attempt ran: from its start to its end (``now`` while it runs); 0 before it started."""
    if att.started_at is None:
        return 0.0
    return max(0.0, (att.ended_at if att.ended_at is not None else now) - att.started_at)


def mean_wall(rows: Sequence[SeedRow]) -> float | None:
    """The mean wall time of the seeds that finished with a value; None when none did."""
    done = [r.wall_s for r in rows if r.state == JobState.SUCCEEDED.value and r.final is not None]
    return sum(done) / len(done) if done else None


def _matching(data: bytes | None, sha: str) -> str | None:
    return data.decode("utf-8", "replace") if data is not None and hashlib.sha256(data).hexdigest() == sha else None


def _file_bytes(path: Path) -> bytes | None:
    with contextlib.suppress(OSError):
        if path.is_file() and path.stat().st_size <= MAX_CONFIG_BYTES:
            return path.read_bytes()
    return None


def _bundled_bytes(tar: Path, member: str) -> bytes | None:
    with contextlib.suppress(OSError, tarfile.TarError, KeyError), tarfile.open(tar) as bundle:
        info = bundle.getmember(member)
        handle = bundle.extractfile(info) if info.size <= MAX_CONFIG_BYTES else None
        return handle.read() if handle is not None else None
    return None


def _submitted_text(sweep: Sweep, job: Job, bundles: Path) -> str | None:
    """The config's text with the bytes the job was submitted with, or None when they are not at hand."""
    if not job.config or not job.config_sha256:
        return None
    for root in (Path(sweep.queue_path).parent, Path(sweep.workdir)):
        found = _matching(_file_bytes(root / job.config), job.config_sha256)
        if found is not None:
            return found
    if not sweep.bundle_sha:
        return None
    return _matching(_bundled_bytes(bundles / f"{sweep.bundle_sha}.tar", f"{protocol.BUNDLE_WORKDIR}/{job.config}"),
                     job.config_sha256)


def _args(job: Job) -> list[str]:
    try:
        found = json.loads(job.args or "[]")
    except ValueError:
        return []
    return [str(a) for a in found] if isinstance(found, list) else []


def setup_of(job: Job, text: str | None) -> Setup:
    return Setup(config=job.config, config_sha256=job.config_sha256, config_text=text, task=job.task,
                 epochs=job.epochs, gpus=job.gpus, nodes=job.nodes, args=tuple(_args(job)))


def fill_differs(out: Sequence[CellRow], cells: Mapping[str, Sequence[Job]], sweeps: Sequence[Sweep],
                 base: str | None, bundles: Path) -> None:
    """Each non-baseline cell's ``differs``: against the baseline's first job, by its own first job."""
    if base is None or not cells.get(base):
        return
    by_id = {s.id: s for s in sweeps}
    texts: dict[tuple[str, str, str], str | None] = {}  # cells share configs: each read once

    def setup(job: Job) -> Setup:
        key = (job.sweep_id, job.config, job.config_sha256)
        if key not in texts:
            texts[key] = _submitted_text(by_id[job.sweep_id], job, bundles)
        return setup_of(job, texts[key])

    theirs = setup(cells[base][0])
    for row in out:
        members = cells[row.cell]
        if not row.is_baseline and members:
            row.differs = differences(setup(members[0]), theirs)


def joined_notes(ledger: Ledger | LedgerReader, sweeps: Sequence[Sweep], jobs: Sequence[Job],
                 cell_of: Mapping[str, str]) -> list[str]:
    """One note per part that joined a sweep later (``submit --into``): when, from which queue, and its cells,
    compared with the same baseline as the rest."""
    out = []
    for sweep in sweeps:
        for part in ledger.parts_of(sweep.id)[1:]:
            names = dict.fromkeys(cell_of[j.id] for j in jobs if j.sweep_id == sweep.id and j.part == part.number)
            out.append(f"sweep {sweep.id} {part.line}: cells {', '.join(names) or 'none'}")
    return out
