"""Host stall kills (docs/health.md, "Stalls the host heals itself"): the agent notices a running attempt
that has stalled, by the same signs and limits the controller's patrol uses, and heals it at once, with
no gpuq command running: it decides under ``retry.lock`` that the host starts attempt n+1, saves where
each process waits (``stacks.txt``, gpuq_stacks.py), kills the attempt's group and, once the attempt has
ended, writes attempt n+1's spec (resumed as every retry is) into its own inbox.

The limits come in the spec's ``retry`` (``stall_after_s``, ``startup_grace_s``, ``start_stall_after_s``,
the controller's settings); without them the agent watches nothing.  The rule is the patrol's
(orchestrator/health/patrol.py ``job_findings``): the attempt's group lives, the freshest of its heartbeat, its
log, its checkpoint pointer, its checkpoint-glob matches and its metrics files is older than the limit
(``stall_after_s``; ``start_stall_after_s`` before its first step: a ``deadlock_at_start``), and a trainer
without a heartbeat is past ``startup_grace_s``.  It is checked cheaply: three stats at most every
CHECK_S seconds; the status probe's full view of the attempt (a capped walk of its run dir, its log's
tail, its metrics files) is read only when those three are all older than the smallest limit.

The host retries a stall only where gpuq would, with the same spec rules as a signal death (retries
left, the class in ``on``, no cancel, a disk with ``min_free_gb``, no fatal Xid since the attempt
began); a ``deadlock_at_start`` only when ``deadlock_left`` says the job may still have its one retry.
A stall whose log or metrics show a non-finite loss is the controller's (a divergence, never retried),
as is every stall the host will not retry: the agent leaves it running for the patrol, which kills and
settles it as it always has.  Whichever of the agent and gpuq's ``kill`` writes ``next.json`` first
decides; the other follows (gpuq_retry.py).

stdlib only, Python >= 3.8.
"""

# ruff: noqa: UP031  (%-formatting on purpose, as in the other agent modules)
from __future__ import annotations

import calendar
import os
import signal
import time
from typing import Any, Callable

from gpuq_base import gpuq_protocol as P
from gpuq_base.gpuq_files import Layout, atomic_write_json, mtime, read_json, utc
from gpuq_base.gpuq_jobspec import JobSpec, parse_spec
from gpuq_base.gpuq_procs import group_alive, signal_group
from gpuq_watch.gpuq_retry import BY_HOST, decided, fatal_xid_since, retry_lock, short_of_disk

STALLED = "stalled"
DEADLOCK_AT_START = "deadlock_at_start"
CLASSES = (STALLED, DEADLOCK_AT_START)
CHECK_S = 5.0  # the most often one attempt's files are looked at (less often than the smallest limit / 4)
MIN_CHECK_S = 0.5


def limits(spec: JobSpec) -> dict[str, float] | None:
    """The spec's stall limits ({"stall_after_s", "startup_grace_s", "start_stall_after_s"}), or None
    when the host may not retry a stall of this job (no retries left, not in ``on``)."""
    policy = spec.retry
    if policy is None or policy.left < 1 or not any(k in policy.on for k in CLASSES):
        return None
    return {"stall_after_s": policy.stall_after_s, "startup_grace_s": policy.startup_grace_s,
            "start_stall_after_s": policy.start_stall_after_s}


def check_every(th: dict[str, float]) -> float:
    return max(MIN_CHECK_S, min(CHECK_S, min(th["start_stall_after_s"], th["stall_after_s"]) / 4.0))


def stamp(value: Any) -> float | None:
    """An agent ISO-8601 UTC stamp (gpuq_files.utc) or epoch seconds, as epoch seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    try:
        text = str(value)
        whole = calendar.timegm(time.strptime(text[:19], "%Y-%m-%dT%H:%M:%S"))
        frac = float("0" + text[19:].rstrip("Z")) if text[19:20] == "." else 0.0
        return whole + frac
    except (TypeError, ValueError):
        return None


def surely_alive(lay: Layout, job_id: str, n: int, th: dict[str, float], now: float) -> bool:
    """True when three stats prove the attempt is not stalled: its heartbeat, log or checkpoint pointer
    is younger than the smallest limit, or it started too recently to be judged."""
    smallest = min(th["start_stall_after_s"], th["stall_after_s"])
    launched = stamp((read_json(lay.attempt(job_id, n, P.LAUNCH_FILE)) or {}).get("time"))
    since = None if launched is None else now - launched
    beat = mtime(lay.attempt(job_id, n, P.HEARTBEAT_FILE))
    if beat is None and since is not None and since < th["startup_grace_s"]:
        return True
    if since is not None and since <= min(smallest, th["startup_grace_s"]):
        return True
    ages = [now - m for m in (beat, mtime(lay.attempt(job_id, n, P.JOB_LOG)),
                              mtime(lay.job(job_id, P.CKPT_DIR, P.LATEST_POINTER))) if m is not None]
    return bool(ages) and min(ages) <= smallest


def first_step_reached(e: dict[str, Any], stepped: bool) -> bool:
    """The patrol's ``first_step_reached`` over a status entry (gpuq_status.job_entry)."""
    if stepped or isinstance(e.get("ckpt"), dict) or e.get("run_ckpt_mtime") is not None:
        return True
    hb = e.get("heartbeat")
    step = hb.get("step") if isinstance(hb, dict) else None
    if isinstance(step, int) and not isinstance(step, bool) and step > 0:
        return True
    prog = e.get("progress")
    if not isinstance(prog, dict):
        return False
    return any(isinstance(prog.get(k), (int, float)) and prog[k] > floor
               for k, floor in (("step", 0), ("pct", 0), ("epoch", 1))) or prog.get("source") == "metrics"


def _age(now: float, m: Any) -> float | None:
    return None if isinstance(m, bool) or not isinstance(m, (int, float)) else max(0.0, now - float(m))


def stall_of(e: dict[str, Any], now: float, th: dict[str, float], stepped: bool) -> tuple[str, str]:
    """(class, what the patrol would say of it) when the running attempt ``e`` (a status entry) has
    stalled by the patrol's rule; ("", "") otherwise."""
    if e.get("state") != "running":
        return "", ""
    launched = stamp(e.get("launched_at"))
    since = None if launched is None else now - launched
    beat_age = e.get("heartbeat_age_s")
    beat_age = None if isinstance(beat_age, bool) or not isinstance(beat_age, (int, float)) else float(beat_age)
    ck = e.get("ckpt")
    ck_age = _age(now, ck.get("mtime")) if isinstance(ck, dict) else None
    log_m = e.get("log_mtime")
    log_age = None if isinstance(log_m, bool) or not isinstance(log_m, (int, float)) else now - float(log_m)
    signals = [a for a in (beat_age, log_age, ck_age) if a is not None]
    signals += [a for a in (_age(now, e.get("run_ckpt_mtime")), _age(now, e.get("run_metrics_mtime")))
                if a is not None]
    freshest = min(signals) if signals else since
    started = first_step_reached(e, stepped)
    limit = th["stall_after_s"] if started else min(th["start_stall_after_s"], th["stall_after_s"])
    if beat_age is None and since is not None and since < th["startup_grace_s"]:
        return "", ""
    if freshest is None or freshest <= limit or (since is not None and since <= min(limit, th["startup_grace_s"])):
        return "", ""
    hb = "never" if beat_age is None else "%.0fs ago" % beat_age
    if not started:
        return DEADLOCK_AT_START, "stalled before its first step (%s): heartbeat %s, nothing written for %.0fs" % (
            DEADLOCK_AT_START, hb, freshest)
    beat = e.get("heartbeat")
    step = beat.get("step") if isinstance(beat, dict) else None
    if step is None and isinstance(e.get("progress"), dict):
        step = e["progress"].get("step")
    return STALLED, "stalled: heartbeat %s, nothing written for %.0fs (last step %s)" % (hb, freshest, step)


def nonfinite(lay: Layout, job_id: str, n: int, launched: Any) -> bool:
    """A non-finite loss in the attempt's metrics: the controller ends it as a divergence, never retried."""
    from gpuq_watch.gpuq_nonfinite import of_running_job
    from gpuq_watch.gpuq_scan import scan_metrics
    found = scan_metrics(lay.job(job_id, P.RESULT_DIR, "metrics.jsonl"), 0).get("nonfinite") or []
    return bool(found) or bool(of_running_job(lay, job_id, n, launched))


def why_not(lay: Layout, job_id: str, spec: JobSpec, n: int, klass: str, e: dict[str, Any]) -> str:
    """"" when the host retries this stall of attempt ``n`` itself; else why it leaves it to gpuq."""
    policy = spec.retry
    if policy is None or klass not in policy.on:
        return "%s is not retried by the host" % klass
    if klass == DEADLOCK_AT_START and policy.deadlock_left < 1:
        return "a stall before the first step is retried once at most, and not after another failure"
    if os.path.exists(lay.job(job_id, P.CANCEL_FILE)):
        return "cancel requested"
    if decided(lay, job_id, n) is not None:
        return "gpuq decided first"
    if nonfinite(lay, job_id, n, e.get("launched_at")):
        return "its metrics show a non-finite loss (gpuq ends it as a divergence)"
    return short_of_disk(lay, spec) or fatal_xid_since(e.get("launched_at"))


def judge(lay: Layout, job_id: str, spec: JobSpec, n: int, th: dict[str, float],
          now: float) -> tuple[str, str, str]:
    """(class, what, "") when attempt ``n`` stalled and the host retries it; (class, what, why not) when
    it stalled and is left to gpuq; ("", "", "") when it has not stalled."""
    from gpuq_verbs.gpuq_status import job_entry  # the probe's own view of the attempt: the patrol reads the same
    e = job_entry(lay, job_id, P.CLAIMED_DIR, now)
    if e.get("attempt") != n:
        return "", "", ""
    klass, what = stall_of(e, now, th, bool(spec.resume_from))
    if not klass:
        return "", "", ""
    return klass, what, why_not(lay, job_id, spec, n, klass, e)


def claim(lay: Layout, job_id: str, n: int, klass: str, what: str) -> dict[str, Any] | None:
    """Under retry.lock: the host starts attempt n+1 (next.json), unless gpuq decided first or the job is
    being cancelled; the decision, else None."""
    with retry_lock(lay):
        if decided(lay, job_id, n) is not None or os.path.exists(lay.job(job_id, P.CANCEL_FILE)):
            return None
        rec = {"by": BY_HOST, "attempt": n + 1, "class": klass, "why": what, "time": utc()}
        atomic_write_json(lay.attempt(job_id, n, P.NEXT_FILE), rec)
    return rec


def noted(lay: Layout, job_id: str, n: int, **fields: Any) -> None:
    """Add ``fields`` (the stacks' one line) to the host's decision in next.json."""
    with retry_lock(lay):
        rec = decided(lay, job_id, n)
        if rec is not None and rec.get("by") == BY_HOST:
            rec.update(fields)
            atomic_write_json(lay.attempt(job_id, n, P.NEXT_FILE), rec)


def follow(lay: Layout, job_id: str, spec: JobSpec, n: int) -> dict[str, Any] | None:
    """Attempt ``n`` has ended after the host decided to retry its stall: write attempt n+1's spec into
    the inbox (once).  A cancel that came meanwhile is honoured by the launch itself (cancelled before
    launch): the attempt the decision names always exists.  Returns the decision when written."""
    from gpuq_records import gpuq_inbox
    rec = decided(lay, job_id, n)
    if rec is None or rec.get("by") != BY_HOST or rec.get("class") not in CLASSES or rec.get("attempt") != n + 1:
        return None
    nxt = spec.host_retry_document(time.time(), BY_HOST)
    with retry_lock(lay):
        if gpuq_inbox.verdict_for(lay.root, parse_spec(nxt)) is not None:
            return None  # written already, or attempt n still lives
        gpuq_inbox.write_spec(lay.root, job_id, nxt)
    return rec


def heal(lay: Layout, job_id: str, n: int, spec: JobSpec, rec: Any, th: dict[str, float],
         log: Callable[[str], None]) -> tuple[bool, float | None]:
    """One look at the agent's running attempt ``n`` (its recorded group ``rec``): when it has stalled and
    the host retries it, decide (next.json), save its stacks and TERM its group.  Returns (whether the
    agent is done watching it, the monotonic SIGKILL deadline of the stall kill begun, else None)."""
    rec_n = decided(lay, job_id, n)
    mine = rec_n is not None and rec_n.get("by") == BY_HOST and rec_n.get("class") in CLASSES
    if not mine:  # (after a restart, a stall kill this agent decided on goes on without judging again)
        now = time.time()
        if surely_alive(lay, job_id, n, th, now):
            return False, None
        klass, what, why_not = judge(lay, job_id, spec, n, th, now)
        if not klass:
            return False, None
        if why_not:
            log("STALLED %s a%d: %s; left to gpuq: %s" % (job_id, n, what, why_not))
            return True, None
        if claim(lay, job_id, n, klass, what) is None:
            log("STALLED %s a%d: %s; gpuq decided first" % (job_id, n, what))
            return True, None
        log("STALLED %s a%d: %s; the host retries it" % (job_id, n, what))
    if not isinstance(rec, dict) or not group_alive(rec):
        return True, None
    from gpuq_verbs.gpuq_stacks import save_stacks
    try:
        summary = save_stacks(lay, job_id, n, rec)[1]
    except OSError as e:
        summary = "not saved: %s" % (e.strerror or e)
    noted(lay, job_id, n, stacks=summary)
    grace = spec.kill_grace_s
    log("STALL KILL %s a%d: stacks %s; TERM to group %d, KILL in %.0fs" % (job_id, n, summary, rec["pgid"], grace))
    signal_group(rec["pgid"], signal.SIGTERM)
    return True, time.monotonic() + grace
