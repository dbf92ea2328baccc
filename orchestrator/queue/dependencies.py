"""``after=``: which expanded jobs wait for which, resolved over the whole queue file (pure; docs/queue.md).

A name in ``after=`` is a job's name (``train-seed0``) or a cell's (``train``: every job of that line),
compared case-insensitively; a job's name wins over a cell's.  A job waits for every job its names resolve
to.  ``{checkpoint.NAME}`` in a line's arguments needs ``NAME`` in that line's ``after=`` and resolving to
exactly one job (whose checkpoint it is).  Unknown names, a line naming itself and cycles are errors at
submit, each one line naming the queue line (``QueueIssue``).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from orchestrator.core.errors import QueueIssue
from orchestrator.core.specs import DependencyEdge, job_id_for
from orchestrator.queue.queuegrid import CHECKPOINT_PREFIX, Cell
from orchestrator.queue.queueline import Draft

_ENV_UNSAFE_RE = re.compile(r"[^A-Za-z0-9]")


@dataclass(frozen=True)
class AfterName:
    """One name of a line's ``after=`` and its 1-based column."""

    text: str
    column: int


@dataclass(frozen=True)
class Member:
    """One expanded job: its name, its line's cell name and its line number."""

    name: str
    cell: str
    line: int


@dataclass(frozen=True)
class LineAfter:
    """What one queue line says about waiting: its ``after=`` names, and the ``{checkpoint.NAME}`` placeholders
    of its arguments (name without the prefix, column)."""

    line: int
    cell: str
    names: tuple[AfterName, ...]
    checkpoints: tuple[AfterName, ...] = ()


def env_name(via: str) -> str:
    """``GPUQ_CHECKPOINT_<VIA>``: the name upper-cased, every character outside [A-Za-z0-9] as ``_``."""
    return "GPUQ_CHECKPOINT_" + _ENV_UNSAFE_RE.sub("_", via).upper()


def edges_of(drafts: Sequence[Draft], jobs: Sequence[tuple[Draft, str, Cell]],
             issues: list[QueueIssue]) -> list[DependencyEdge]:
    """The ``after=`` edges between a queue file's expanded jobs (``jobs``: each with its line's draft and its
    name); every problem goes to ``issues``."""
    lines = []
    for draft in drafts:
        marks = tuple(AfterName(ph.name[len(CHECKPOINT_PREFIX):], ph.column) for word in draft.words
                      for ph in word.placeholders if ph.name.startswith(CHECKPOINT_PREFIX))
        if (draft.after or marks) and draft.name is not None:
            lines.append(LineAfter(draft.number, draft.name, tuple(AfterName(t.text, t.column) for t in draft.after),
                                   marks))
    if not lines:
        return []
    edges, found = resolve(lines, [Member(name, draft.name or name, draft.number) for draft, name, _ in jobs])
    issues.extend(found)
    return edges


def resolve(lines: Sequence[LineAfter], jobs: Sequence[Member]) -> tuple[list[DependencyEdge], list[QueueIssue]]:
    """The edges between expanded jobs that ``lines`` ask for, and every problem (unknown name, a line that
    names itself, a cycle, a ``{checkpoint.NAME}`` that names no single dependency)."""
    by_job = {j.name.casefold(): j.name for j in jobs}
    of_cell: dict[str, list[Member]] = {}
    for j in jobs:
        of_cell.setdefault(j.cell.casefold(), []).append(j)
    by_cell = {cell: [j.name for j in members] for cell, members in of_cell.items()}
    edges: list[DependencyEdge] = []
    issues: list[QueueIssue] = []
    for line in lines:
        mine = of_cell.get(line.cell.casefold(), [])
        targets: dict[str, list[str]] = {}
        for name in line.names:
            key = name.text.casefold()
            if key in targets:
                continue  # after=t,T: the same name twice
            found = [by_job[key]] if key in by_job else by_cell.get(key, [])
            if not found:
                issues.append(QueueIssue(line.line, name.column, f'after={name.text}: no job or cell of this queue '
                                                                 f'is named "{name.text}"'))
                continue
            if any(f.casefold() in {j.name.casefold() for j in mine} for f in found):
                issues.append(QueueIssue(line.line, name.column, f"after={name.text}: a line cannot wait for "
                                                                 "its own jobs"))
                continue
            targets[key] = found
            edges += [DependencyEdge(job=j.name, needs=f, via=name.text) for j in mine for f in found]
        issues += _checkpoint_issues(line, targets)
    first: dict[tuple[str, str], DependencyEdge] = {}
    for edge in edges:
        first.setdefault((edge.job, edge.needs), edge)  # one edge a pair: the first name that asked for it
    edges = list(first.values())
    cycle = find_cycle(_needs(edges))
    if cycle:
        at = next(j for j in jobs if j.name == cycle[0])
        issues.append(QueueIssue(at.line, None, "after= makes a cycle: " + " -> ".join([*cycle, cycle[0]])
                                 + "; no job of it could ever start"))
    issues += _env_collisions(lines)
    return edges, issues


def _checkpoint_issues(line: LineAfter, targets: Mapping[str, list[str]]) -> list[QueueIssue]:
    out = []
    for ph in line.checkpoints:
        found = targets.get(ph.text.casefold())
        if found is None:
            out.append(QueueIssue(line.line, ph.column, f"{{checkpoint.{ph.text}}} needs after={ph.text} on the line "
                                                        "(the job whose checkpoint it hands over)"))
        elif len(found) != 1:
            listed = ", ".join(found[:3]) + (", ..." if len(found) > 3 else "")
            out.append(QueueIssue(line.line, ph.column, f"{{checkpoint.{ph.text}}}: after={ph.text} names "
                                                        f"{len(found)} jobs ({listed}); name one job "
                                                        f"(after={found[0]})"))
    return out


def _env_collisions(lines: Sequence[LineAfter]) -> list[QueueIssue]:
    out = []
    for line in lines:
        seen: dict[str, str] = {}
        for name in line.names:
            var = env_name(name.text)
            if var in seen and seen[var].casefold() != name.text.casefold():
                out.append(QueueIssue(line.line, name.column, f"after={seen[var]} and after={name.text} both hand "
                                                              f"their checkpoint over as {var}; rename one"))
            seen.setdefault(var, name.text)
    return out


def needs_by_id(edges: Sequence[DependencyEdge], sweep_id: str) -> dict[str, list[str]]:
    """{job id: the ids of the jobs it waits for} of sweep ``sweep_id``'s ``edges``."""
    out: dict[str, list[str]] = {}
    for edge in edges:
        out.setdefault(job_id_for(sweep_id, edge.job), []).append(job_id_for(sweep_id, edge.needs))
    return out


def _needs(edges: Sequence[DependencyEdge]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for edge in edges:
        out.setdefault(edge.job, []).append(edge.needs)
    return out


def find_cycle(needs: Mapping[str, Sequence[str]]) -> list[str]:
    """One cycle of the graph ``needs`` (node -> the nodes it waits for) as its nodes in order, or []."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    for start in sorted(needs):
        if state.get(start):
            continue
        path: list[str] = []
        stack: list[tuple[str, int]] = [(start, 0)]
        while stack:
            node, index = stack.pop()
            if index == 0:
                state[node] = 1
                path.append(node)
            after = list(needs.get(node, ()))
            if index < len(after):
                stack.append((node, index + 1))
                nxt = after[index]
                if state.get(nxt) == 1:
                    return path[path.index(nxt):]
                if not state.get(nxt):
                    stack.append((nxt, 0))
                continue
            state[node] = 2
            path.pop()
    return []


def folded_keys(keys: Mapping[str, str], edges: Sequence[DependencyEdge]) -> dict[str, str]:
    """The result cache's content keys ({job name: key}) with each waiting job's key folded with the keys of
    what it waits for, transitively: an evaluation whose training changed is not the evaluation that ran."""
    needs = _needs(edges)
    out: dict[str, str] = {}
    for name in _dependencies_first(needs, list(keys)):
        below = sorted(out.get(dep, keys.get(dep, "")) for dep in needs.get(name, ()))
        out[name] = hashlib.sha256("/".join([keys.get(name, ""), *below]).encode()).hexdigest() if below \
            else keys.get(name, "")
    return {name: out[name] for name in keys}


def _dependencies_first(needs: Mapping[str, Sequence[str]], nodes: Sequence[str]) -> list[str]:
    """``nodes`` (and what they wait for) ordered so that each comes after what it waits for (no recursion)."""
    order: list[str] = []
    placed: set[str] = set()
    entered: set[str] = set()
    for root in nodes:
        stack = [(root, False)]
        while stack:
            node, expanded = stack.pop()
            if node in placed or (node in entered and not expanded):
                continue
            if expanded:
                placed.add(node)
                order.append(node)
                continue
            entered.add(node)
            stack.append((node, True))
            stack.extend((dep, False) for dep in needs.get(node, ()) if dep not in entered)
    return order
