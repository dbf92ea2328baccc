"""Controller-facing agent commands: ``enqueue`` (write specs into the inbox) and ``collect``.

stdlib only, Python >= 3.8.  Both run as one SSH round trip each.

enqueue: reads a JSON list of job specs on stdin (or {"specs": [...], "secrets": {queue_id:
{NAME: value}}}, the values written to secrets/<queue_id>.json, 0600) and prints {job_id: verdict}.  A spec is
written (tmp + rename into inbox/) only if no copy of that job's attempt exists anywhere under
the root: checked inbox -> claimed -> attempts, in that order, because the agent only ever moves
a spec forward (inbox -> claimed -> attempts), so a spec cannot slip past the checks.  Verdicts:
"queued", "exists" (already delivered), "withdrawn" (the user withdrew it), "busy" (another
attempt of the job is still alive on this host: nothing written; the controller delivers it again
once that attempt has ended).  Idempotent.

collect: prints {job_id: {"attempt", "summary", "files": [{"path", "bytes", "sha256"}], "outputs", "ckpt"}}
for finished jobs: the summary, the attempt's end record as ``outputs`` (gpuq_outputs.carried: what the
wrapper hashed as the attempt ended) and, for an attempt without one (an older agent's), every result
file and the best checkpoint hashed now as ``files``.
"""

# ruff: noqa: UP031  (%-formatting on purpose, as in the other agent modules)
from __future__ import annotations

import json
import os
import sys
from typing import Any

from gpuq_base import gpuq_protocol as P
from gpuq_base import gpuq_secrets
from gpuq_base.gpuq_files import Layout, read_json, sha256_hex
from gpuq_base.gpuq_jobspec import JOB_ID_RE, JobSpec, SpecError, attempt_of, parse_spec
from gpuq_base.gpuq_procs import live_attempt
from gpuq_records import gpuq_outputs
from gpuq_records.gpuq_runmetrics import payload_curves
from gpuq_records.gpuq_summary import job_spec, project_summary

def write_spec(root: str, job_id: str, spec: dict[str, Any]) -> None:
    """Write a spec document (``JobSpec.document``, or a host retry's) into the inbox: tmp + rename."""
    inbox = os.path.join(root, P.INBOX_DIR)
    os.makedirs(inbox, exist_ok=True)
    tmp = os.path.join(inbox, ".%s.json.%d.tmp" % (job_id, os.getpid()))
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(spec, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, os.path.join(inbox, job_id + ".json"))


def verdict_for(root: str, spec: JobSpec) -> str | None:
    """None when the spec may be written; else why not.  A copy already there is compared by the
    attempt it names alone (``attempt_of``: a half-written or refused copy still holds its place)."""
    job_id, n = spec.job_id, spec.attempt
    if attempt_of(read_json(os.path.join(root, P.INBOX_DIR, job_id + ".json"))) >= n:
        return "exists"
    if attempt_of(read_json(os.path.join(root, P.CLAIMED_DIR, job_id + ".json"))) >= n:
        return "exists"
    if os.path.exists(os.path.join(root, P.JOBS_DIR, job_id, P.ATTEMPTS_DIR, str(n))):
        return "exists"
    if attempt_of(read_json(os.path.join(root, P.WITHDRAWN_DIR, job_id + ".json"))) >= n:
        return "withdrawn"
    if live_attempt(root, job_id, other_than=n) is not None:
        return "busy"  # another attempt of this job still runs here: never two at once
    return None


def _secrets_dir(root: str) -> str:
    sdir = os.path.join(root, P.SECRETS_DIR)
    os.makedirs(sdir, mode=0o700, exist_ok=True)
    os.chmod(sdir, 0o700)
    return sdir


def write_secrets(root: str, queue_id: str, values: dict[str, str]) -> None:
    """secrets/<queue_id>.json, mode 0600 in a 0700 dir, written atomically (never logged)."""
    sdir = _secrets_dir(root)
    tmp = os.path.join(sdir, ".%s.json.%d.tmp" % (queue_id, os.getpid()))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(values, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, os.path.join(sdir, queue_id + ".json"))


def cmd_enqueue(root: str, stdin: Any) -> int:
    try:
        specs = json.load(stdin)
    except ValueError as exc:
        print("gpuq enqueue: stdin is not JSON: %s" % exc, file=sys.stderr)
        return P.AGENT_EXIT_USAGE
    secrets: Any = {}
    if isinstance(specs, dict):  # {"specs": [...], "secrets": {queue_id: {NAME: value}}}
        secrets = specs.get("secrets") or {}
        specs = specs.get("specs")
        if not isinstance(secrets, dict) or not all(
                isinstance(q, str) and JOB_ID_RE.match(q) and isinstance(v, dict) for q, v in secrets.items()):
            print("gpuq enqueue: \"secrets\" must map queue ids to {NAME: value} objects", file=sys.stderr)
            return P.AGENT_EXIT_USAGE
    if not isinstance(specs, list):
        print("gpuq enqueue: expected a JSON list of job specs", file=sys.stderr)
        return P.AGENT_EXIT_USAGE
    parsed = []
    for index, doc in enumerate(specs):
        try:
            parsed.append(parse_spec(doc))
        except SpecError as e:  # one bad spec refuses the whole delivery: nothing is written
            job = doc.get("job_id") if isinstance(doc, dict) else None
            print("gpuq enqueue: malformed spec %d%s: %s" % (index, " (%r)" % job if job else "", e), file=sys.stderr)
            return P.AGENT_EXIT_USAGE
    if secrets:
        _secrets_dir(root)
    verdicts: dict[str, str] = {}
    with gpuq_secrets.locked(Layout(root)):  # no deletion between a sweep's secrets and its specs
        for queue_id, values in sorted(secrets.items()):
            write_secrets(root, queue_id, {str(k): str(v) for k, v in values.items()})
        for spec in parsed:
            why = verdict_for(root, spec)
            if why is None:
                write_spec(root, spec.job_id, spec.document)
                why = "queued"
            verdicts[spec.job_id] = why
    sys.stdout.write(json.dumps(verdicts, sort_keys=True) + "\n")
    sys.stdout.flush()
    return 0


def _files(root: str, job_id: str) -> list[dict[str, Any]]:
    job_dir = os.path.join(root, P.JOBS_DIR, job_id)
    found: list[dict[str, Any]] = []
    result_dir = os.path.join(job_dir, P.RESULT_DIR)
    for dirpath, dirnames, filenames in os.walk(result_dir):
        dirnames.sort()
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            if name.endswith(".tmp") or os.path.islink(full) or not os.path.isfile(full):
                continue
            found.append({"path": os.path.relpath(full, job_dir), "bytes": os.path.getsize(full),
                          "sha256": sha256_hex(full)})
    best = os.path.join(job_dir, P.CKPT_DIR, P.BEST_CKPT)
    if os.path.isfile(best) and not os.path.islink(best):
        found.append({"path": os.path.relpath(best, job_dir), "bytes": os.path.getsize(best),
                      "sha256": sha256_hex(best)})
    return found


def cmd_collect(root: str, job_ids: list[str]) -> int:
    out: dict[str, Any] = {}
    for job_id in job_ids:
        if not JOB_ID_RE.match(job_id):
            print("gpuq collect: bad job id %r" % job_id, file=sys.stderr)
            return P.AGENT_EXIT_USAGE
        out[job_id] = collect_one(root, job_id)
    hide = gpuq_secrets.held_values(Layout(root))
    for got in out.values():  # the summary is the project's own text; paths and hashes stay as they are
        if isinstance(got, dict) and got.get("summary") is not None:
            got["summary"] = gpuq_secrets.redact_doc(got["summary"], hide)
    sys.stdout.write(json.dumps(out, sort_keys=True) + "\n")
    return 0


def collect_one(root: str, job_id: str, write: bool = True) -> dict[str, Any]:
    """A finished job's summary, its attempt's end record (or, without one, its result files hashed now)
    and checkpoint pointer (``collect``, and
    ``status --results-for`` so that a tick stays one round trip when jobs finish).  For a project's
    own trainer (spec ``run.metrics``) the summary comes from its metrics; ``write`` = False (the
    read-only status probe) computes it without writing result/summary.json."""
    spec = job_spec(root, job_id)
    counted = project_summary(root, job_id, spec, write)
    summary = counted
    if summary is None or summary.get("final") is None:  # no value from [run] metrics: a summary.json of its own?
        summary = read_json(os.path.join(root, P.JOBS_DIR, job_id, P.RESULT_DIR, P.SUMMARY_FILE))
        if not isinstance(summary, dict):
            summary = counted  # what the metrics setting found (nothing): the controller warns about it
        elif "curves" not in summary:  # gpuq's payload: from metrics.jsonl
            summary["curves"] = payload_curves(os.path.join(root, P.JOBS_DIR, job_id), str(summary.get("metric")
                                                                                           or "val_acc"))
    attempt = spec.attempt if spec is not None else 0
    ended = gpuq_outputs.carried(Layout(root), job_id, attempt) if attempt > 0 else None
    got = {
        "attempt": attempt,
        "summary": summary if isinstance(summary, dict) else None,
        "files": _files(root, job_id) if ended is None else [],
        "ckpt": read_json(os.path.join(root, P.JOBS_DIR, job_id, P.CKPT_DIR, P.LATEST_POINTER)),
    }
    if ended is not None:
        got["outputs"] = ended
    return got


def partial_one(root: str, job_id: str) -> dict[str, Any]:
    """A running job's learning curves so far (``status --curves-for``), computed as ``collect`` would
    (a project's ``[run] metrics``, else the payload's result/metrics.jsonl), never written."""
    spec = job_spec(root, job_id)
    summary = project_summary(root, job_id, spec, False)
    curves = summary.get("curves") if isinstance(summary, dict) else None
    if not curves:
        metric = (spec.run.metric if spec is not None and spec.run is not None else "") or "val_acc"
        curves = payload_curves(os.path.join(root, P.JOBS_DIR, job_id), metric)
    return {"attempt": spec.attempt if spec is not None else 0, "curves": curves or {}}
