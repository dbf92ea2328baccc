"""``manifest JOB_ID...``: the host side of ``gpuq pull`` (docs/results.md).

stdlib only, Python >= 3.8.  One round trip builds the manifest of every named job.

The roster is explicit: the controller names the jobs it believes succeeded.  A named job is
manifested only when the exit record of its current attempt (the attempt of its claimed spec,
else the newest attempt directory) has wrapper code 0; anything else yields an error entry for
that job, never a manifest.  A manifest covers, relative to ``jobs/<job_id>/`` as POSIX paths:

  result/**                  every regular file (leftover ``*.tmp`` writes are not results)
  ckpt/best.pt               the best checkpoint (required)
  attempts/<n>/job.log       the attempt's log (evidence; when present)
  attempts/<n>/exit.json     the attempt's exit record (evidence; required)
  attempts/<n>/outputs.json  the attempt's end record (gpuq_outputs.py; when the attempt has one)

The files besides the evidence are gpuq_outputs.selection's, the list the wrapper hashed into the end
record as the attempt ended: the controller holds that record and refuses what differs from it.  An
end record that says why it lists nothing (a match that cannot travel, too many files) refuses the job.

It fails closed, per job (error entry, no manifest written): a bad or duplicate job id, a
component name outside ``[A-Za-z0-9._-]``, any symlink or non-regular file on the way, no exit
record or a non-zero one, missing ``result/metrics.jsonl`` or ``ckpt/best.pt``, a best.pt whose
sha256 differs from the one the wrapper recorded after loading it, or no files at all.

``jobs/<job_id>/MANIFEST.json`` is rebuilt on every call (files sorted by path; only
``created_at`` changes when nothing else did) and written atomically (tmp + fsync + rename).
The controller binds its verification to the sha256 printed here, i.e. to the manifest bytes it
fetched, so a rebuild between two pulls is harmless.

Prints one JSON object: {job_id: {"manifest": path, "sha256": hex of the manifest bytes,
"attempt": n, "files": count, "bytes": total} | {"error": "why"}}.  Exit status: 0 when at least
one manifest was built, 1 when none was (every entry is an error: an empty result set is a
failure, docs/results.md), 64 for a malformed roster (bad or duplicate job id): nothing is written.
"""

# ruff: noqa: UP031  (%-formatting on purpose, as in the other agent modules)
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
from typing import Any

from gpuq_records import gpuq_outputs
from gpuq_records import gpuq_own
from gpuq_base import gpuq_protocol as P
from gpuq_base.gpuq_files import Layout, atomic_write, read_json, utc
from gpuq_records.gpuq_summary import job_spec
from gpuq_base.gpuq_jobspec import JOB_ID_RE, RunSection, read_spec
from gpuq_records.gpuq_observe import safe_globs
from gpuq_records.gpuq_outputs import CHUNK, Hasher, Refused, no_link, open_regular


def _attempt_number(lay: Layout, job_id: str) -> int:
    spec = read_spec(lay.p(P.CLAIMED_DIR, job_id + ".json"))
    if spec is not None:
        return spec.attempt
    try:
        numbers = [int(n) for n in os.listdir(lay.job(job_id, P.ATTEMPTS_DIR)) if n.isdigit()]
    except OSError:
        numbers = []
    if not numbers:
        raise Refused("no attempt of this job ran on this host")
    return max(numbers)


def build(lay: Layout, job_id: str) -> dict[str, Any]:
    """Hash the job's files and write its MANIFEST.json; returns the document (Refused on failure)."""
    jdir = lay.job(job_id)
    no_link(lay.p(P.JOBS_DIR), P.JOBS_DIR + "/")
    no_link(jdir, "the job directory")
    if not os.path.isdir(jdir):
        raise Refused("no job directory on this host")
    n = _attempt_number(lay, job_id)
    adir = lay.attempt(job_id, n)
    for path, what in ((lay.job(job_id, P.ATTEMPTS_DIR), P.ATTEMPTS_DIR + "/"), (adir, "attempt %d" % n)):
        no_link(path, what)
    exit_doc = read_json(os.path.join(adir, P.EXIT_FILE))
    if not isinstance(exit_doc, dict):
        raise Refused("attempt %d has no exit record (still running, or lost)" % n)
    stopped = os.path.exists(lay.job(job_id, P.CANCEL_FILE))  # stopped by gpuq (early stopping): partial results
    if exit_doc.get("wrapper_code") != P.EXIT_OK and not stopped:
        raise Refused("attempt %d exited %r, not 0: its log and exit record are evidence, not results"
                      % (n, exit_doc.get("wrapper_code")))
    spec = job_spec(lay.root, job_id)
    ended = gpuq_outputs.check(lay, job_id, n)  # Refused when the attempt's end record says why not
    hasher = Hasher()
    files = gpuq_outputs.selection(lay, job_id, spec, hasher)
    if spec is None or spec.run is None:
        _payload_checks(files, exit_doc)
    prefix = "%s/%d/" % (P.ATTEMPTS_DIR, n)
    log = os.path.join(adir, P.JOB_LOG)
    no_link(log, prefix + P.JOB_LOG)
    if os.path.exists(log):
        files.append(hasher.entry(log, prefix + P.JOB_LOG))
    files.append(hasher.entry(os.path.join(adir, P.EXIT_FILE), prefix + P.EXIT_FILE))
    if ended is not None:  # the record itself: the controller holds its sha256 since the attempt ended
        files.append(hasher.entry(os.path.join(adir, P.OUTPUTS_FILE), ended))
    files.sort(key=lambda f: f["path"])
    queue_id = spec.queue_id if spec is not None else None
    return {"schema": P.MANIFEST_SCHEMA, "job_id": job_id, "queue_id": queue_id, "attempt": n,
            "created_at": utc(), "files": files, "total_files": len(files),
            "total_bytes": sum(f["bytes"] for f in files)}


def _payload_checks(files: list[dict[str, Any]], exit_doc: dict[str, Any]) -> None:
    """gpuq's own payload: result/metrics.jsonl and the verified ckpt/best.pt must be among its files."""
    if not any(f["path"] == "%s/%s" % (P.RESULT_DIR, P.METRICS_FILE) for f in files):
        raise Refused("%s/%s is missing" % (P.RESULT_DIR, P.METRICS_FILE))
    best_entry = next((f for f in files if f["path"] == "%s/%s" % (P.CKPT_DIR, P.BEST_CKPT)), None)
    if best_entry is None:
        raise Refused("the best checkpoint %s/%s is missing" % (P.CKPT_DIR, P.BEST_CKPT))
    recorded = exit_doc.get("best_sha256")
    if recorded and recorded != best_entry["sha256"]:
        raise Refused("%s/%s changed after the wrapper verified it (sha256 %s, exit record says %s)"
                      % (P.CKPT_DIR, P.BEST_CKPT, best_entry["sha256"][:12], str(recorded)[:12]))


def cmd_manifest(root: str, job_ids: list[str]) -> int:
    seen = set()
    for job_id in job_ids:
        if not JOB_ID_RE.match(job_id):
            print("gpuq manifest: bad job id %r" % job_id, file=sys.stderr)
            return P.AGENT_EXIT_USAGE
        if job_id in seen:
            print("gpuq manifest: job %s is named twice in the roster" % job_id, file=sys.stderr)
            return P.AGENT_EXIT_USAGE
        seen.add(job_id)
    lay = Layout(root)
    out: dict[str, Any] = {}
    for job_id in job_ids:
        try:
            doc = build(lay, job_id)
        except Refused as e:
            out[job_id] = {"error": str(e)}
            continue
        text = json.dumps(doc, sort_keys=True, indent=1) + "\n"
        path = lay.job(job_id, P.JOB_MANIFEST_FILE)
        try:
            atomic_write(path, text)
        except OSError as e:
            out[job_id] = {"error": "cannot write %s: %s" % (path, e.strerror or e)}
            continue
        out[job_id] = {"manifest": path, "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
                       "attempt": doc["attempt"], "files": doc["total_files"], "bytes": doc["total_bytes"]}
    sys.stdout.write(json.dumps(out, sort_keys=True) + "\n")
    sys.stdout.flush()
    return 0 if any("manifest" in v for v in out.values()) else 1


SHIP_SNAPSHOT = ".ship.pt"  # ckpt/.ship.pt: a hard link the controller copies (never a rolling name)


def cmd_snapshot(root: str, job_id: str) -> int:
    """``snapshot JOB_ID``: pin the checkpoint LATEST names right now by hard-linking it to
    ``ckpt/.ship.pt`` and print the pointer.  The payload may rotate its rolling file away a moment
    later; the link keeps those bytes for the controller's copy, which removes it when done."""
    if not re.match(r"^[A-Za-z0-9._-]+$", job_id) or job_id.startswith("."):
        print("gpuq snapshot: bad job id %r" % (job_id,), file=sys.stderr)
        return P.AGENT_EXIT_USAGE
    spec = job_spec(root, job_id)
    run = spec.run if spec is not None else None
    if run is not None and safe_globs(run.checkpoint):
        return _snapshot_run(Layout(root), job_id, run)
    ckpt = Layout(root).job(job_id, P.CKPT_DIR)
    for _ in range(5):  # LATEST may move between reading it and linking its file: read it again
        pointer = read_json(os.path.join(ckpt, P.LATEST_POINTER))
        if not isinstance(pointer, dict) or not isinstance(pointer.get("file"), str):
            print("gpuq snapshot: no checkpoint pointer under %s" % ckpt, file=sys.stderr)
            return 1
        name = pointer["file"]
        if "/" in name or name.startswith("."):
            print("gpuq snapshot: the pointer names an unsafe file %r" % (name,), file=sys.stderr)
            return 1
        tmp = os.path.join(ckpt, SHIP_SNAPSHOT + ".link")
        try:
            if os.path.lexists(tmp):
                os.unlink(tmp)
            os.link(os.path.join(ckpt, name), tmp)
        except FileNotFoundError:
            continue
        os.replace(tmp, os.path.join(ckpt, SHIP_SNAPSHOT))
        pointer["snapshot"] = P.CKPT_DIR + "/" + SHIP_SNAPSHOT
        print(json.dumps(pointer, sort_keys=True))
        return 0
    print("gpuq snapshot: the checkpoint kept moving under %s" % ckpt, file=sys.stderr)
    return 1


def _copy_stable(src: str, dst: str, rel: str) -> dict[str, Any]:
    """Copy ``src`` (a regular file, never a link) to ``dst`` and hash the copy.  Refused when the
    source changed while it was read (inode, size or mtime moved)."""
    fd, before = open_regular(src, rel)
    try:
        h = hashlib.sha256()
        size = 0
        with os.fdopen(fd, "rb", closefd=False) as f, open(dst, "wb") as out:
            for chunk in iter(lambda: f.read(CHUNK), b""):
                h.update(chunk)
                out.write(chunk)
                size += len(chunk)
            out.flush()
            os.fsync(out.fileno())
        after = os.lstat(src)
    finally:
        os.close(fd)
    if (after.st_ino, after.st_size, after.st_mtime_ns) != (before.st_ino, before.st_size, before.st_mtime_ns) \
            or size != before.st_size:
        raise Refused("%s changed while it was copied" % rel)
    return {"path": rel, "bytes": size, "sha256": h.hexdigest(), "mtime": before.st_mtime}


def _snapshot_run(lay: Layout, job_id: str, run: RunSection) -> int:
    """A project's own checkpoint (spec ``run.checkpoint`` globs, gpuq_own): COPY the job's newest own
    checkpoint under run/ to ckpt/.ship.pt and print {"file": "run/<rel>", "sha256", "bytes", "mtime",
    "step": null, "snapshot"}.  A copy, not a hard link: a trainer that saves with ``torch.save(state,
    "snapshot.pt")`` rewrites the same inode in place, and a link would change under the controller's
    transfer.  A complete checkpoint directory (settled for gpuq_own.SETTLE_S) is copied file by file to
    ckpt/.ship.d/ and printed with ``"dir": true``, its ``files`` [{"path", "bytes", "sha256"}] and as
    ``sha256`` their tree hash (gpuq_own.tree_sha256).  What changes while it is copied is copied again
    (up to 5 times)."""
    run_dir = lay.job(job_id, P.RUN_DIR)
    ckpt = lay.job(job_id, P.CKPT_DIR)
    tmp = os.path.join(ckpt, SHIP_SNAPSHOT + ".copy")
    for _ in range(5):
        newest = gpuq_own.newest_checkpoint(run_dir, run.checkpoint, settle_s=gpuq_own.SETTLE_S)
        if newest is None:
            print("gpuq snapshot: nothing of the job's own under %s matches the checkpoint globs %r"
                  % (run_dir, list(run.checkpoint)), file=sys.stderr)
            return 1
        rel = newest.rel
        try:
            os.makedirs(ckpt, exist_ok=True)
            if newest.kind == "dir":
                doc = _copy_dir(newest, os.path.join(ckpt, SHIP_DIR))
            else:
                entry = _copy_stable(newest.real, tmp, rel)
                os.replace(tmp, os.path.join(ckpt, SHIP_SNAPSHOT))
                doc = {"sha256": entry["sha256"], "bytes": entry["bytes"], "mtime": entry["mtime"],
                       "snapshot": P.CKPT_DIR + "/" + SHIP_SNAPSHOT}
        except (FileNotFoundError, Refused):
            continue
        doc.update(file=P.RUN_DIR + "/" + rel, step=None)
        print(json.dumps(doc, sort_keys=True))
        return 0
    try:
        os.unlink(tmp)
    except OSError:
        pass
    print("gpuq snapshot: the checkpoint kept changing under %s; the next tick tries again" % run_dir,
          file=sys.stderr)
    return 1


SHIP_DIR = ".ship.d"  # ckpt/.ship.d/: the private copy of a checkpoint directory


def _copy_dir(found: Any, target: str) -> dict[str, Any]:
    """Copy a complete checkpoint directory file by file to ``target`` (replaced whole); Refused when
    it changed meanwhile (a file rewritten, added or removed, or it no longer counts as complete)."""
    staging = target + ".copy"
    for path in (staging, target):
        if os.path.lexists(path):
            shutil.rmtree(path)
    before = gpuq_own.dir_files(found.real)
    entries = []
    for sub, full in before:
        why = gpuq_own.path_problem(sub)
        if why is not None:
            raise Refused("%r in %s: %s" % (sub[:120], found.rel, why))
        dst = os.path.join(staging, *sub.split("/"))
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        entry = _copy_stable(full, dst, sub)
        entries.append({"path": sub, "bytes": entry["bytes"], "sha256": entry["sha256"]})
    if gpuq_own.dir_files(found.real) != before or gpuq_own.dir_problem(found.real) is not None:
        shutil.rmtree(staging)
        raise Refused("%s changed while it was copied" % found.rel)
    os.replace(staging, target)
    return {"dir": True, "files": entries, "sha256": gpuq_own.tree_sha256(entries),
            "bytes": sum(e["bytes"] for e in entries), "mtime": found.mtime,
            "snapshot": P.CKPT_DIR + "/" + SHIP_DIR}
