"""The checks of a user's project at submit, beyond one queue line: config paths under ``[run] project``, the
``[run]`` globs at their gpuq.toml position, the ``[data]`` names the templates use, what leaves this machine,
and seeds a trainer cannot tell apart.  Pure over the parsed queue and ``[run]``; each problem is one line
naming the file and line (docs/your-project.md)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path

from orchestrator.core.agent_modules import argv_module
from orchestrator.core.errors import UsageError
from orchestrator.core.specs import JobSpec, ParsedQueue
from orchestrator.queue import datasets
from orchestrator.queue.runconfig import RunConfig, check_jobs, project_root, repository_root


def under_project(parsed: ParsedQueue, run: RunConfig, toml_path: Path, queue: str,
                   gpuq_home: Path) -> ParsedQueue:
    """Config paths relative to the project root (``[run] project``), and the [run] checks of every job."""
    root = project_root(run, toml_path.parent, gpuq_home=gpuq_home)
    errors = check_jobs(run, parsed.jobs, toml_path, queue) + glob_errors(run, toml_path)
    jobs = []
    for job in parsed.jobs:
        if job.config:
            rel = os.path.relpath(os.path.join(os.path.realpath(parsed.workdir), job.config), root)
            if rel.startswith(".."):
                errors.append(f"{queue}:{job.line}: config {job.config} is outside the project root {root} "
                              f"([run] project in {toml_path})")
            job = job.model_copy(update={"config": Path(rel).as_posix()})
        jobs.append(job)
    if errors:
        raise UsageError("\n".join([*errors, "nothing was submitted"]))
    return parsed.model_copy(update={"jobs": tuple(jobs), "workdir": str(root)})

def glob_errors(run: RunConfig, toml_path: Path) -> list[str]:
    """``outputs``/``checkpoint`` globs are relative to the job's run directory: an absolute one or one
    with a ``..`` part would match nothing there (the host drops it), so it is refused here, at its
    line and column of gpuq.toml."""
    errors = []
    text = ""
    for key in ("outputs", "checkpoint"):
        for pattern in getattr(run, key):
            parts = pattern.replace("\\", "/").split("/")
            if not (pattern.startswith(("/", "\\", "~")) or ".." in parts):
                continue
            if not text:
                try:
                    text = toml_path.read_text(encoding="utf-8", errors="replace")
                except OSError:
                    text = " "
            why = "is absolute" if pattern.startswith(("/", "\\", "~")) else "leaves the run directory (..)"
            errors.append(f"{toml_path}:{_position(text, key, pattern)}: [run] {key}: {pattern!r} {why}; "
                          "globs are relative to the job's run directory (e.g. \"outputs/**\")")
    return errors

def _position(text: str, key: str, needle: str) -> str:
    """``line:column`` of ``needle`` after ``key =`` in the [run] table (of the key when not found)."""
    section = re.search(r"^\s*\[run\]\s*$", text, re.M)
    match = re.compile(rf"^\s*{re.escape(key)}\s*=", re.M).search(text, section.end() if section else 0)
    if match is None:
        return "1:1"
    found = text.find(needle, match.end())
    offset = found if found >= 0 else match.start() + len(match.group()) - len(match.group().lstrip())
    return f"{text.count(chr(10), 0, offset) + 1}:{offset - (text.rfind(chr(10), 0, offset) + 1) + 1}"

def data_manifests(run: RunConfig | None, toml_path: Path, home: Path,
                   rules: Callable[[Path], datasets.TreeRules]) -> list[datasets.Manifest]:
    """The gpuq.toml's ``[data]`` entries, each hashed (datasets.py; [] without a table); every
    ``{data.NAME}`` the templates use must be declared there."""
    manifests = datasets.load_data(toml_path, repository_root(toml_path.parent), home, rules)
    names = {m.name for m in manifests}
    if manifests and run is None:
        raise UsageError(f"{toml_path}: [data] needs a [run] table (an empty one runs gpuq's own payload); "
                         "nothing was submitted")
    for used in sorted(run.uses() if run is not None else set()):
        if used.startswith("data.") and used[5:] not in names:
            raise UsageError(f"{toml_path}: [run] uses {{{used}}} but [data] has no {used[5:]!r}"
                             f" (declared: {', '.join(sorted(names)) or 'none'}); nothing was submitted")
    return manifests

def what_leaves(run: RunConfig | None, workdir: Path, queue: Path, toml_path: Path) -> list[str]:
    """Lines naming what a submit sends beyond the queue's directory: the forwarded variables' names and a
    bundled root that is not the queue's directory (docs/security.md)."""
    lines = []
    if run is not None and run.forward_env:
        lines.append(f"forwarding these environment variables to the hosts ([run] forward_env in {toml_path}): "
                     + ", ".join(run.forward_env))
    if workdir.resolve() != queue.parent.resolve():
        lines.append(f"bundling the project root {workdir.resolve()} ([run] project in {toml_path}), not the "
                     f"queue's directory {queue.parent.resolve()}")
    return lines

def seed_warnings(jobs: Sequence[JobSpec], run: RunConfig | None, queue: str) -> list[str]:
    """One warning per group of jobs that differ only by their seed while neither the trainer's command
    nor the line's own arguments use ``{seed}``: their argv is the same, so only a trainer that reads
    GPUQ_SEED makes them differ."""
    if run is not None and "seed" in run.uses():
        return []
    groups: dict[tuple[object, ...], list[JobSpec]] = {}
    module = argv_module()
    for job in jobs:
        if job.seed is not None and "seed" not in module.uses(list(job.args)):  # a line's own {seed} counts
            key = (job.config, job.config_sha256, job.task, job.epochs, job.gpus, job.nodes, job.args)
            groups.setdefault(key, []).append(job)
    out = []
    for group in groups.values():
        if len({j.seed for j in group}) < 2:
            continue
        names = ", ".join(j.name for j in group[:3]) + (f" and {len(group) - 3} more" if len(group) > 3 else "")
        out.append(f"{queue}:{group[0].line}: jobs {names} differ only by their seed, but the command does not use "
                   "{seed}: they run the same argv, so the trainer must read GPUQ_SEED (else every seed is the same "
                   "run and the report flags them as identical)")
    return out
