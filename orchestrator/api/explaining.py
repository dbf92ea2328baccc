"""A job's attempts, one by one: ``gpuq logs JOB --attempt N`` (its log), ``gpuq logs JOB --attempts``
(the list) and ``gpuq explain JOB`` (for each: its class, the evidence the ledger holds, the fix, the
saved stacks); docs/cli.md, docs/health.md.

Everything but the logs and the stacks comes from the ledger: the attempt rows, and the events of the
job and its attempts (the findings the patrol recorded, ``(class: X)`` in the "ended badly" one, and
the settling decision, ``X: requeued with resume``), each found by the event's fields (``failure_class``,
``attempt``), never by its words.  An attempt's log is read from the copy at home
when one was brought home verified (``gpuq pull``, or the evidence of a failed attempt fetched before
its rented host was ended: ``transfer/evidence.py``), else from its host's
``jobs/<job>/attempts/<n>/job.log``.  Host text is redacted here; the CLI strips control characters.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.context import Context, host_for
from orchestrator.core import protocol
from orchestrator.core.errors import GpuqError, HostError, UsageError
from orchestrator.core.states import JobState
from orchestrator.health import hints
from orchestrator.hosts.base import Host
from orchestrator.ledger import Attempt, Event, Job
from orchestrator.tick import stoplooks
from orchestrator.transfer import evidence

EVENTS = 2000  # a job's newest events read (a job retried ten times writes a few dozen)
STACKS_MAX_BYTES = 1 << 20  # the end of a stacks file shown (py-spy of a big process tree is long)
CHUNK = 1 << 20


@dataclass(frozen=True)
class Evidence:
    """A finding the patrol recorded about the attempt: its rule, severity, words and suggested action."""

    time: float
    rule: str
    severity: str
    message: str
    action: str = ""


@dataclass
class AttemptStory:
    """One attempt as the ledger tells it."""

    number: int
    host: str
    state: str
    created_at: float
    started_at: float | None
    ended_at: float | None
    exit_code: int | None
    message: str  # the attempt's own last word ("exit 1: trainer exited 1"; "" none)
    klass: str = ""  # its failure class ("" for none recorded: it succeeded, runs, or was cancelled)
    decision: str = ""  # what gpuq did about it ("transient: requeued with resume (retry 1 of 2)")
    evidence: list[Evidence] = field(default_factory=list)
    hint: str = ""
    log_home: str = ""  # its log's verified copy at home ("" none)
    stacks: str = ""  # where its saved stacks are ("" none found)
    stacks_text: str = ""  # their end, when asked for
    stacks_note: str = ""  # why the stacks could not be looked for

    @property
    def reason(self) -> str:
        """One line: why it ended as it did."""
        return self.message or self.decision or (self.evidence[-1].message if self.evidence else "")


def stories(ctx: Context, job: Job) -> list[AttemptStory]:
    """The job's attempts, oldest first, with what the ledger says of each (no host is contacted)."""
    attempts = ctx.ledger.attempts(job.id)
    if not attempts:
        return []
    out = [AttemptStory(a.number, a.host, a.state, a.created_at, a.started_at, a.ended_at, a.exit_code, a.message)
           for a in attempts]
    by_number = {s.number: s for s in out}
    for event in ctx.ledger.events(job.id, limit=EVENTS):
        story = by_number.get(_attempt_of(event, job, attempts) or 0)
        if story is None:
            continue
        if event.severity and event.rule:
            story.evidence.append(Evidence(event.time, event.rule, event.severity, event.message, event.action))
        if event.failure_class and event.kind == "job" and event.new and not event.rule:
            story.decision = event.message  # the settling decision (or the stall kill it followed)
        if event.failure_class:  # the decision's class, or an "ended badly" finding's
            story.klass = event.failure_class
    results = ctx.settings.home / "results"
    pulled = ctx.ledger.verified_pulls([job.id]).get(job.id)
    for story in out:
        story.hint = hints.hint(story.klass, job.id, story.number, story.host) if story.klass else ""
        home = home_log(results, job, story.number, Path(pulled.local_dir) if pulled else None)
        story.log_home = str(home) if home is not None else ""
    return _redacted(ctx, out)


def _redacted(ctx: Context, out: list[AttemptStory]) -> list[AttemptStory]:
    texts = ctx.ledger.redact([[s.message, s.decision, [[e.message, e.action] for e in s.evidence]] for s in out])
    for story, (message, decision, found) in zip(out, texts, strict=True):
        story.message, story.decision = message, decision
        story.evidence = [Evidence(e.time, e.rule, e.severity, m, a)
                          for e, (m, a) in zip(story.evidence, found, strict=True)]
    return out


def _attempt_of(event: Event, job: Job, attempts: Sequence[Attempt]) -> int | None:
    """The attempt an event of the job speaks of: its subject (``JOB/a2``), its ``attempt`` (a finding's,
    the ASSIGNED event's), else the newest attempt created by its time (None: before the first)."""
    if event.subject != job.id:
        tail = event.subject.removeprefix(f"{job.id}/a")
        return int(tail) if tail.isdigit() else None
    if event.attempt is not None:
        return event.attempt
    number = None
    for att in attempts:
        if att.created_at <= event.time:
            number = att.number
    return number


def stopped(ctx: Context, job: Job) -> str:
    """Why early stopping stopped the job, from its recorded look's fields ("stopped: worse than baseline at
    step N ...", docs/stopping.md); "" for a job that was not stopped."""
    if job.state != JobState.STOPPED.value:
        return ""
    look = stoplooks.decided_stop(ctx.ledger, job)
    return stoplooks.reason(look) if look is not None else "stopped early (its look is not in the ledger)"


def attempt_or_error(ctx: Context, job: Job, number: int) -> Attempt:
    """Attempt ``number`` of ``job``; a one-line UsageError (exit 2) when it has no such attempt."""
    att = ctx.ledger.attempt(job.id, number)
    if att is not None:
        return att
    if job.attempt_count == 0:
        raise UsageError(f"job {job.id} ({job.name}) has not started yet: it has no attempt {number}")
    raise UsageError(f"job {job.id} ({job.name}) has no attempt {number}: it has attempts 1 to {job.attempt_count} "
                     f"(`gpuq logs {job.id} --attempts` lists them)")


def home_log(results: Path, job: Job, number: int, pulled: Path | None) -> Path | None:
    """The verified copy at home of attempt ``number``'s log: the evidence of a failed attempt, or the
    pulled results of the job (``pulled``: their local dir); None when neither holds it."""
    if evidence.is_home(results, job, number):
        copy = evidence.local_dir(results, job, number) / protocol.JOB_LOG
        if copy.is_file():
            return copy
    if pulled is not None:
        copy = pulled / protocol.ATTEMPTS_DIR / str(number) / protocol.JOB_LOG
        if copy.is_file():
            return copy
    return None


def attempt_log(ctx: Context, job: Job, number: int) -> Iterator[str]:
    """Attempt ``number``'s log: the copy at home when one was brought home verified, else from its host."""
    att = attempt_or_error(ctx, job, number)
    pulled = ctx.ledger.verified_pulls([job.id]).get(job.id)
    home = home_log(ctx.settings.home / "results", job, number, Path(pulled.local_dir) if pulled else None)
    if home is not None:
        with open(home, encoding="utf-8", errors="replace") as fh:
            while chunk := fh.read(CHUNK):
                yield chunk
        return
    host = _host(ctx, att, "its log was not brought home")
    path = host.path(protocol.JOBS_DIR, job.id, protocol.ATTEMPTS_DIR, str(number), protocol.JOB_LOG)
    result = host.run(["cat", path], timeout=120)
    if result.exit_code != 0:
        raise GpuqError(f"attempt {number} of job {job.id} ({job.name}) has no log on {host.name}: it is "
                        f"{att.state}{' and had not started' if att.started_at is None else ''}")
    yield result.stdout


def _host(ctx: Context, att: Attempt, why: str) -> Host:
    row = ctx.ledger.host(att.host)
    if row is None:
        raise GpuqError(f"attempt {att.number} ran on host {att.host}, which is no longer registered, and {why}")
    return host_for(ctx, row)


def explain(ctx: Context, job: Job, *, stacks: bool = False) -> list[AttemptStory]:
    """``stories`` and, for each attempt, where its saved stacks are (``stacks.txt`` in its directory at
    home or on its host; one round trip per host) and, with ``stacks``, their end, redacted."""
    told = stories(ctx, job)
    results = ctx.settings.home / "results"
    on_hosts: dict[str, list[AttemptStory]] = {}
    for story in told:
        home = evidence.local_dir(results, job, story.number) / protocol.STACKS_FILE
        if home.is_file():
            story.stacks = str(home)
            if stacks:
                story.stacks_text = _tail(home)
        else:
            on_hosts.setdefault(story.host, []).append(story)
    for name, mine in on_hosts.items():
        row = ctx.ledger.host(name)
        if row is None:
            for story in mine:
                story.stacks_note = f"host {name} is no longer registered"
            continue
        try:
            _stacks_on(ctx, host_for(ctx, row), job, mine, stacks)
        except HostError as exc:
            for story in mine:
                story.stacks_note = f"not looked for: {' '.join(str(exc).split())[:200]}"
    if stacks:
        texts = ctx.ledger.redact([s.stacks_text for s in told])
        for story, text in zip(told, texts, strict=True):
            story.stacks_text = text
    return told


def _stacks_on(ctx: Context, host: Host, job: Job, mine: Sequence[AttemptStory], show: bool) -> None:
    paths = {host.path(protocol.JOBS_DIR, job.id, protocol.ATTEMPTS_DIR, str(s.number), protocol.STACKS_FILE): s
             for s in mine}
    listed = host.run(["ls", "-d", "--", *paths], timeout=60)  # the ones that exist; the others on stderr
    for line in listed.stdout.splitlines():
        story = paths.get(line.strip())
        if story is None:
            continue
        story.stacks = line.strip()
        if show:
            got = host.run(["tail", "-c", str(STACKS_MAX_BYTES), story.stacks], timeout=120)
            story.stacks_text = got.stdout if got.exit_code == 0 else ""


def _tail(path: Path) -> str:
    with open(path, "rb") as fh:
        fh.seek(0, 2)
        fh.seek(max(0, fh.tell() - STACKS_MAX_BYTES))
        return fh.read().decode("utf-8", "replace")


def waits_of(ctx: Context, job: Job) -> list[str]:
    """What the job waits (or waited) for (``after=``), one line per dependency with its state now, and for a
    job that ended without an attempt (a dependency ended otherwise, a cancel) the words it ended with."""
    lines = []
    edges = ctx.ledger.dependencies([job.id]).get(job.id, [])
    needed = {j.id: j for j in ctx.ledger.jobs_by_ids(e.needs_id for e in edges)}
    for edge in edges:
        dep = needed.get(edge.needs_id)
        what = f"{dep.name} ({dep.id}): {dep.state}" if dep is not None else f"{edge.needs_id}: not in the ledger"
        lines.append(f"after={edge.via}: waits for {what}")
    if job.attempt_count == 0 and JobState(job.state).terminal:
        ended = [e for e in ctx.ledger.events(subject=job.id, exact=True) if e.kind == "job" and e.new == job.state]
        if ended:
            lines.append(f"ended {job.state} without starting: {ended[-1].message}")
    return lines
