"""Host retries (docs/checkpoints.md, "Who retries what"): the agent starts attempt n+1 of a job itself
when attempt n died of a signal gpuq did not send, or its wrapper's whole group vanished, while the
job's spec says it has retries left; the controller adopts that attempt at its next look.

Who starts attempt n+1 is decided once, on the host, in ``attempts/<n>/next.json``: the agent writes
``{"by": "host", "attempt": n+1, ...}`` before it writes attempt n+1's spec into its own inbox; the
controller writes ``{"by": "controller"}`` (agent verb ``decide-retry``) before it settles attempt n
itself, and the ``kill`` verb writes it before gpuq kills an attempt (a stall); the agent's own stall
kill writes ``{"by": "host", "class": "stalled"|"deadlock_at_start"}`` before it kills (gpuq_stall.py).
Both sides take the root's ``retry.lock`` and write the file only when it is absent, so whichever comes
first decides and the other side follows: never two attempts n+1, never none.

The agent's rule is conservative; everything else is the controller's:

- the spec's ``retry`` says retries are left (``left`` >= 1) and names the class (``on``);
- no cancel was requested; the wrapper received no signal (a stop, a preemption, gpuq's own kill);
- the attempt was training when it ended, and either its group vanished (``vanished``: kill -9 of the
  wrapper's group, the OOM killer) or the trainer, or under torchrun one of its ranks, died of one of
  the spec's ``signals`` (``killed``);
- its log shows nothing that makes the crash a verdict on the code or the host (a traceback's exception
  of its own, CUDA OOM, a NaN, a full disk or /dev/shm, a checkpoint of another config);
- the attempt before did not die the same way at the same step (a recurring host OOM);
- the host did not log a fatal Xid (48, 79) since the attempt began and has the room the spec's
  ``min_free_gb`` asks: where the controller would move the job, the agent leaves it to the controller.

Attempt n+1's spec is attempt n's with ``attempt`` n+1, ``started_by`` "host", one retry less (and no
``deadlock_at_start`` retry: a failure came before) and a new ``created_at``; it goes through the same
claim, launch, exit record and heartbeat as any other.

stdlib only, Python >= 3.8.
"""

# ruff: noqa: UP031  (%-formatting on purpose, as in the other agent modules)
from __future__ import annotations

import calendar
import contextlib
import fcntl
import json
import os
import re
import signal
import sys
import time
from typing import Any, Iterator

from gpuq_base import gpuq_protocol as P
from gpuq_base.gpuq_files import Layout, atomic_write_json, read_json, utc
from gpuq_base.gpuq_jobspec import JobSpec, parse_spec

BY_HOST = "host"
BY_CONTROLLER = "controller"
STOP_SIGNALS = (int(signal.SIGTERM), int(signal.SIGINT))
# the log scan's signatures a signal death may carry and still be a kill from outside (torchrun's own
# traceback and ChildFailedError, the shell's "Killed", a collective failing after a rank's death)
KILL_SIGNATURES = frozenset({"traceback", "child_failed", "killed", "rank_killed", "nccl", "segfault"})
TORCHRUN_CAUSES = ("rank_failed", "rank_killed", "rank_terminated")  # the scan's words for torchrun's root cause
MAX_CHAIN = 20  # attempts the status probe reports back to the controller's (a bound, never reached)
RANK_SIGNAL = re.compile(r"Signal (\d+) \(SIG\w+\) received by PID|exitcode: -(\d+)\) local_rank")
ROOT_CAUSE_EXCEPTION = re.compile(r"^root cause: rank \d+: ")
RANK_PREFIX = re.compile(r"^\[(?:rank|default)\d+\]:\s?")
EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception)\b")
LAUNCHER_EXCEPTION = re.compile(r"^(?:[\w.]+\.)?(ChildFailedError|SignalException)\b")  # torchrun's own


@contextlib.contextmanager
def retry_lock(lay: Layout) -> Iterator[None]:
    """The root's retry.lock: the agent's retry and the controller's decision never interleave."""
    fd = os.open(lay.p(P.RETRY_LOCK), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing drops the flock


def decided(lay: Layout, job_id: str, n: int) -> dict[str, Any] | None:
    """attempts/<n>/next.json: who starts attempt n+1 ({"by": "host"|"controller", ...}), else None."""
    got = read_json(lay.attempt(job_id, n, P.NEXT_FILE))
    return got if isinstance(got, dict) else None


def forgo(lay: Layout, job_id: str, n: int, why: str) -> dict[str, Any]:
    """The controller settles what follows attempt ``n`` (unless the host decided first): the decision
    recorded in next.json, as it stands after this call."""
    with retry_lock(lay):
        return _forgo_locked(lay, job_id, n, why)


def _forgo_locked(lay: Layout, job_id: str, n: int, why: str) -> dict[str, Any]:
    got = decided(lay, job_id, n)
    if got is not None:
        if got.get("by") == BY_HOST:  # what the controller records of attempt n: its end, as the host saw it
            ex = read_json(lay.attempt(job_id, n, P.EXIT_FILE))
            got["exit"] = ex if isinstance(ex, dict) else None
        return got
    rec = {"by": BY_CONTROLLER, "attempt": None, "why": why, "time": utc()}
    if os.path.isdir(lay.attempt(job_id, n)):  # an attempt this host never saw needs no record
        atomic_write_json(lay.attempt(job_id, n, P.NEXT_FILE), rec)
    return rec


def death_signal(ex: dict[str, Any]) -> int | None:
    """The signal the trainer died of (a negative trainer code, else wrapper code 128+N), else None."""
    tc, wc = ex.get("trainer_code"), ex.get("wrapper_code")
    if isinstance(tc, int) and -64 <= tc < 0:
        return -tc
    if isinstance(wc, int) and P.EXIT_SIGNAL_BASE < wc <= P.EXIT_SIGNAL_BASE + 64:
        return wc - P.EXIT_SIGNAL_BASE
    return None


def rank_signal(hits: list[dict[str, Any]]) -> int | None:
    """Under torchrun: the signal its report says a rank died of (the first such line), else None."""
    for hit in hits:
        if hit.get("signature") == "rank_killed":
            m = RANK_SIGNAL.search(str(hit.get("line", "")))
            if m:
                return int(m.group(1) or m.group(2))
    return None


def log_verdict(lay: Layout, job_id: str, n: int) -> tuple[list[dict[str, Any]], str]:
    """(the log's crash hits, "" or why they make the death a verdict, not a kill from outside).  Under
    torchrun the first failure decides (its root cause is the scan's first hit): a rank killed by a signal
    makes torchrun terminate the others, whose errors then follow from that death."""
    from gpuq_watch.gpuq_scan import scan_log  # serve only: the probe never pays for it here
    scan = scan_log(lay.attempt(job_id, n, P.JOB_LOG), 0)
    hits = [h for h in scan.get("hits") or [] if isinstance(h, dict)]
    names = {str(h.get("signature")) for h in hits}
    causes = [h.get("signature") for h in hits if h.get("signature") in TORCHRUN_CAUSES]
    rank_killed = bool(causes) and causes[0] == "rank_killed" and "rank_failed" not in names
    own = sorted(names - KILL_SIGNATURES - ({"rank_terminated"} if rank_killed else set()))
    if own:
        return hits, "its log shows %s" % ", ".join(own)
    last = next((str(line) for line in reversed(scan.get("traceback") or []) if str(line).strip()), "")
    text = RANK_PREFIX.sub("", ROOT_CAUSE_EXCEPTION.sub("", last.strip()))
    if not rank_killed and EXCEPTION.match(text) and not LAUNCHER_EXCEPTION.match(text):
        return hits, "its log ends with an exception of its own (%s)" % text[:120]
    return hits, ""


def fatal_xid_since(started: Any) -> str:
    """A fatal Xid (48, 79) the kernel logged since ``started`` (the attempt's ISO start), else ""."""
    from gpuq_watch import gpuq_kernel
    try:
        began = calendar.timegm(time.strptime(str(started)[:19], "%Y-%m-%dT%H:%M:%S"))
        with open("/proc/uptime") as f:
            up = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return ""
    since = "%.6f" % max(0.0, up - (time.time() - began))
    for xid in gpuq_kernel.kernel_section(since).get("xids") or []:
        if xid.get("code") in P.FATAL_XIDS:
            return "the kernel logged Xid %s" % xid.get("code")
    return ""


def short_of_disk(lay: Layout, spec: JobSpec) -> str:
    want = spec.min_free_gb
    try:
        st = os.statvfs(lay.root)
    except OSError:
        return ""
    free = st.f_bavail * st.f_frsize / 1e9
    return "%.1f GB free, the job wants %g" % (free, want) if free < want else ""


def judge(lay: Layout, job_id: str, spec: JobSpec, n: int) -> tuple[str, str]:
    """(class, why) when the host retries attempt ``n`` itself; ("", why not) otherwise."""
    policy = spec.retry
    if policy is None or policy.left < 1:
        return "", "no retries left to the host"
    if os.path.exists(lay.job(job_id, P.CANCEL_FILE)):
        return "", "cancel requested"
    ex = read_json(lay.attempt(job_id, n, P.EXIT_FILE))
    if not isinstance(ex, dict) or ex.get("wrapper_code") in (None, P.EXIT_OK):
        return "", "no failure"
    if ex.get("wrapper_signal") is not None:
        return "", "the wrapper was signalled (a stop, not a crash)"
    if ex.get("phase") != "train":
        return "", "it ended in phase %s" % ex.get("phase")
    hits, verdict = log_verdict(lay, job_id, n)
    sig = death_signal(ex)
    signals = [s for s in policy.signals if s not in STOP_SIGNALS]
    ranked = rank_signal(hits)
    if ex.get("vanished") and ex.get("signal") not in STOP_SIGNALS:  # a group stopped by SIGTERM: a stop
        klass, what = "vanished", "its wrapper's group vanished (%s)" % ex.get("message", "")
    elif sig is not None and sig in signals:
        klass, what = "killed", "the trainer died of signal %d" % sig
    elif sig is None and "rank_failed" not in {h.get("signature") for h in hits} and ranked is not None \
            and ranked in signals:
        klass, what = "killed", "a rank died of signal %d" % ranked
    else:
        return "", "not a signal death from outside"
    if klass not in policy.on:
        return "", "%s is not retried by the host" % klass
    why_not = verdict or _same_death_before(lay, job_id, n, ex) or short_of_disk(lay, spec) \
        or fatal_xid_since(ex.get("started_at"))
    return ("", why_not) if why_not else (klass, what)


def _same_death_before(lay: Layout, job_id: str, n: int, ex: dict[str, Any]) -> str:
    before = read_json(lay.attempt(job_id, n - 1, P.EXIT_FILE)) if n > 1 else None
    if not isinstance(before, dict) or not (before.get("vanished") or death_signal(before) is not None):
        return ""
    step = ex.get("last_step")
    if step is not None and step == before.get("last_step"):
        return "attempt %d died the same way at the same step %s" % (n - 1, step)
    return ""


def retry_after(lay: Layout, job_id: str, spec: JobSpec, n: int) -> dict[str, Any] | None:
    """Attempt ``n`` has ended: when the host retries it, write who decided (next.json) and attempt n+1's
    spec into the inbox, under retry.lock; returns the decision, else None (the controller's)."""
    if decided(lay, job_id, n) is not None:
        return None  # gpuq killed it, or the controller has settled it already
    klass, why = judge(lay, job_id, spec, n)
    if not klass:
        return None
    from gpuq_records import gpuq_inbox
    nxt = spec.host_retry_document(time.time(), BY_HOST)
    with retry_lock(lay):
        if decided(lay, job_id, n) is not None or os.path.exists(lay.job(job_id, P.CANCEL_FILE)):
            return None  # the controller decided first, or the job was cancelled meanwhile
        if gpuq_inbox.verdict_for(lay.root, parse_spec(nxt)) is not None:
            return None  # attempt n+1 exists already, or another attempt still lives here
        rec = {"by": BY_HOST, "attempt": n + 1, "class": klass, "why": why, "time": utc()}
        atomic_write_json(lay.attempt(job_id, n, P.NEXT_FILE), rec)  # the decision before the spec
        gpuq_inbox.write_spec(lay.root, job_id, nxt)
    return rec


def chain(lay: Layout, job_id: str, known: int, current: int) -> list[dict[str, Any]]:
    """For the status probe: each attempt k (``known`` <= k < ``current``) the host retried itself, with
    its exit record, oldest first; stops at the first attempt the host did not retry."""
    out: list[dict[str, Any]] = []
    for k in range(max(1, known), min(current, known + MAX_CHAIN)):
        rec = decided(lay, job_id, k)
        if rec is None or rec.get("by") != BY_HOST or rec.get("attempt") != k + 1:
            break
        ex = read_json(lay.attempt(job_id, k, P.EXIT_FILE))
        out.append({"attempt": k, "exit": ex if isinstance(ex, dict) else None, "class": rec.get("class"),
                    "why": rec.get("why"), "time": rec.get("time"), "stacks": rec.get("stacks")})
    return out


def cmd_decide_retry(lay: Layout, items: list[str]) -> int:
    """``decide-retry JOB_ID:ATTEMPT...``: the controller settles these ended attempts unless the host
    already retried them.  Prints {job_id: next.json as it stands} ({"by": "host", "attempt": n+1, ...,
    "exit": attempt n's exit.json} or {"by": "controller", ...})."""
    from gpuq_base.gpuq_jobspec import JOB_ID_RE  # the rule every spec's job id passed
    parsed: list[tuple[str, int]] = []
    for item in items:
        job_id, _, n = item.rpartition(":")
        if not JOB_ID_RE.match(job_id) or not n.isdigit() or int(n) < 1:
            print("gpuq decide-retry: bad JOB_ID:ATTEMPT %r" % item, file=sys.stderr)
            return P.AGENT_EXIT_USAGE
        parsed.append((job_id, int(n)))
    out: dict[str, Any] = {}
    with retry_lock(lay):
        for job_id, attempt in parsed:
            out[job_id] = _forgo_locked(lay, job_id, attempt, "the controller settles attempt %d" % attempt)
    print(json.dumps(out, sort_keys=True))
    return 0
