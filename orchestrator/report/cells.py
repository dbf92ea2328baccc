"""Cells: the jobs of one ablation setting that differ only by seed.

A job's name is its line's name (``Job.cell``) followed by one ``-<part>`` per grid group and
``-seed<k>`` for ``seeds=N`` (docs/queue.md).  A part that names a seed (``seed3``, ``random_seed3``
from ``--seed {1,2,3}``) is dropped; what is left is the cell.  Lines that differ only by their
``seed=`` field (``baseline_s1 ... seed=1``, ``baseline_s2 ... seed=2``) are one cell too: same config
bytes, task, epochs, GPUs, nodes and trainer arguments; it is named by the names' common stem.
Cells of the same name in several sweeps are merged.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol, TypeVar

_SEED_PART = re.compile(r"^[A-Za-z0-9_.]*seed\d+$", re.IGNORECASE)
_STEM_TRIM = re.compile(r"(?:[-_.]*(?:seed|s))?[-_.]*$", re.IGNORECASE)


class JobLike(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def cell(self) -> str: ...
    @property
    def seed(self) -> int | None: ...
    @property
    def config_sha256(self) -> str: ...
    @property
    def task(self) -> str: ...
    @property
    def epochs(self) -> int: ...
    @property
    def gpus(self) -> int: ...
    @property
    def nodes(self) -> int: ...
    @property
    def args(self) -> str: ...


J = TypeVar("J", bound=JobLike)


def cell_name(name: str, line_name: str) -> str:
    """The job's name without its seed parts.  Only the parts after the line's own name are looked at
    (a line called ``seed1`` stays ``seed1``); a job of a ledger before v6 (no line name) keeps its name."""
    if not line_name or not name.lower().startswith(line_name.lower()) or name == line_name:
        return name
    rest = name[len(line_name):]
    if not rest.startswith("-"):
        return name
    kept = [part for part in rest[1:].split("-") if not _SEED_PART.match(part)]
    # a part like "lr1e-3" contains a dash: rejoin what the split cut, dropping only whole seed parts
    return "-".join([name[:len(line_name)], *kept]) if kept else name[:len(line_name)]


def _stem(names: Sequence[str]) -> str:
    first = min(names)
    last = max(names)
    i = 0
    while i < min(len(first), len(last)) and first[i].lower() == last[i].lower():
        i += 1
    stem = _STEM_TRIM.sub("", first[:i])
    return stem or first


def group(jobs: Sequence[J]) -> dict[str, list[J]]:
    """Cell name -> its jobs, cells in the order of their first job."""
    by_name: dict[str, list[J]] = {}
    for job in jobs:
        by_name.setdefault(cell_name(job.name, job.cell), []).append(job)
    # lines that differ only by seed=: single-job cells with a seed and the same everything else
    fingerprints: dict[tuple[object, ...], list[str]] = {}
    for name, members in by_name.items():
        if len(members) == 1 and members[0].seed is not None:
            j = members[0]
            key = (j.config_sha256, j.task, j.epochs, j.gpus, j.nodes, j.args)
            fingerprints.setdefault(key, []).append(name)
    rename: dict[str, str] = {}
    for names in fingerprints.values():
        if len(names) > 1:
            stem = _stem(names)
            for name in names:
                rename[name] = stem
    cells: dict[str, list[J]] = {}
    for name, members in by_name.items():
        cells.setdefault(rename.get(name, name), []).extend(members)
    return cells
