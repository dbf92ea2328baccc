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
import stat
import sys
from typing import Any

import gpuq_own
import gpuq_protocol as P
from gpuq_files import Layout, atomic_write, read_json, spec_attempt, utc
from gpuq_inbox import JOB_ID_RE, job_spec, project_summary
from gpuq_observe import safe_globs, spec_run

CHUNK = 1 << 20


class Refused(Exception):
    """This job cannot be manifested; the message says why."""


def _safe(name: str, where: str) -> None:
    why = gpuq_own.name_problem(name)
    if why is not None:
        raise Refused("unsafe name %r in %s: %s" % (name[:120], where, why))


def _no_link(path: str, what: str) -> None:
    if os.path.islink(path):
        raise Refused("%s is a symlink: %s" % (what, path))


def _hash_regular(path: str, rel: str) -> dict[str, Any]:
    """Size and sha256 of one regular file, from the same open file (never follows a link)."""
    # O_NONBLOCK: a FIFO must be refused, not wait forever for a writer (no effect on regular files)
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        raise Refused("cannot read %s: %s" % (rel, e.strerror or e)) from e
    h = hashlib.sha256()
    size = 0
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise Refused("%s is not a regular file" % rel)
        with os.fdopen(fd, "rb", closefd=False) as f:
            for chunk in iter(lambda: f.read(CHUNK), b""):
                h.update(chunk)
                size += len(chunk)
    finally:
        os.close(fd)
    return {"path": rel, "bytes": size, "sha256": h.hexdigest()}


def _result_files(jdir: str) -> list[dict[str, Any]]:
    rdir = os.path.join(jdir, P.RESULT_DIR)
    _no_link(rdir, P.RESULT_DIR + "/")
    if not os.path.isdir(rdir):
        raise Refused("no %s/ directory: the job left no results" % P.RESULT_DIR)
    found: list[dict[str, Any]] = []
    for dirpath, dirnames, filenames in os.walk(rdir):
        rel_dir = os.path.relpath(dirpath, jdir).replace(os.sep, "/")
        for name in sorted(dirnames):
            _safe(name, rel_dir + "/")
            _no_link(os.path.join(dirpath, name), "%s/%s" % (rel_dir, name))
        dirnames.sort()
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            _no_link(full, "%s/%s" % (rel_dir, name))
            if name.endswith(".tmp"):
                continue  # an interrupted atomic write, never a result
            _safe(name, rel_dir + "/")
            found.append(_hash_regular(full, "%s/%s" % (rel_dir, name)))
    return found


def _attempt_number(lay: Layout, job_id: str) -> int:
    spec = read_json(lay.p(P.CLAIMED_DIR, job_id + ".json"))
    if isinstance(spec, dict):
        return spec_attempt(spec)
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
    _no_link(lay.p(P.JOBS_DIR), P.JOBS_DIR + "/")
    _no_link(jdir, "the job directory")
    if not os.path.isdir(jdir):
        raise Refused("no job directory on this host")
    n = _attempt_number(lay, job_id)
    adir = lay.attempt(job_id, n)
    for path, what in ((lay.job(job_id, P.ATTEMPTS_DIR), P.ATTEMPTS_DIR + "/"), (adir, "attempt %d" % n)):
        _no_link(path, what)
    exit_doc = read_json(os.path.join(adir, P.EXIT_FILE))
    if not isinstance(exit_doc, dict):
        raise Refused("attempt %d has no exit record (still running, or lost)" % n)
    if exit_doc.get("wrapper_code") != P.EXIT_OK:
        raise Refused("attempt %d exited %r, not 0: its log and exit record are evidence, not results"
                      % (n, exit_doc.get("wrapper_code")))
    spec = job_spec(lay.root, job_id)
    run = spec_run(spec)
    if run is not None:
        files = _run_files(lay, job_id, spec, run)
    else:
        files = _payload_files(lay, job_id, jdir, exit_doc)
    prefix = "%s/%d/" % (P.ATTEMPTS_DIR, n)
    log = os.path.join(adir, P.JOB_LOG)
    _no_link(log, prefix + P.JOB_LOG)
    if os.path.exists(log):
        files.append(_hash_regular(log, prefix + P.JOB_LOG))
    files.append(_hash_regular(os.path.join(adir, P.EXIT_FILE), prefix + P.EXIT_FILE))
    files.sort(key=lambda f: f["path"])
    queue_id = spec.get("queue_id") if isinstance(spec, dict) else None
    return {"schema": P.MANIFEST_SCHEMA, "job_id": job_id, "queue_id": queue_id, "attempt": n,
            "created_at": utc(), "files": files, "total_files": len(files),
            "total_bytes": sum(f["bytes"] for f in files)}


def _run_files(lay: Layout, job_id: str, spec: dict[str, Any], run: dict[str, Any]) -> list[dict[str, Any]]:
    """A project's own trainer (spec "run"): result/** when any (its summary, written now from its
    metrics), everything of the job's own that an ``outputs`` or ``checkpoint`` glob matches under run/
    (gpuq_own: real files, links to its own files as those files, every file of a matched directory),
    the metrics file, and ckpt/best.pt only when present.  Links into the project are not the job's;
    ``*.tmp`` files are interrupted writes.  Anything else the globs match that cannot travel (an unsafe
    name, a link out of the run dir, a FIFO) refuses the whole manifest, naming it: a pull never leaves
    a file behind in silence."""
    jdir = lay.job(job_id)
    project_summary(lay.root, job_id, spec, write=True)
    files: list[dict[str, Any]] = []
    if os.path.isdir(lay.job(job_id, P.RESULT_DIR)) or os.path.islink(lay.job(job_id, P.RESULT_DIR)):
        files.extend(_result_files(jdir))
    run_dir = lay.job(job_id, P.RUN_DIR)
    _no_link(run_dir, P.RUN_DIR + "/")
    globs = safe_globs(run.get("outputs")) + safe_globs(run.get("checkpoint"))
    metrics = run.get("metrics")
    if isinstance(metrics, str) and metrics not in ("", "log"):
        globs += safe_globs([metrics])  # a path or a glob (lightning_logs/version_*/metrics.csv)
    found, refused = gpuq_own.scan(run_dir, globs, bundles=lay.p(P.BUNDLES_DIR))
    chosen: dict[str, str] = {}
    for item in found:
        inner = gpuq_own.dir_files(item.real) if item.kind == "dir" else [("", item.real)]
        for sub, full in inner:
            rel = item.rel + "/" + sub if sub else item.rel
            why = gpuq_own.path_problem(rel)
            if why is not None:
                refused.append((rel, why))
            elif not rel.endswith(".tmp"):  # an interrupted write, never a result
                chosen[rel] = full
    if refused:
        listed = "; ".join("%r: %s" % (rel[:120], why) for rel, why in refused[:5])
        raise Refused("%d path(s) that [run] outputs/checkpoint match cannot travel: %s%s (rename them, or "
                      "narrow the globs)" % (len(refused), listed, " ..." if len(refused) > 5 else ""))
    for rel in sorted(chosen):
        files.append(_hash_regular(chosen[rel], P.RUN_DIR + "/" + rel))
    best = lay.job(job_id, P.CKPT_DIR, P.BEST_CKPT)
    if os.path.isfile(best) and not os.path.islink(best):
        files.append(_hash_regular(best, "%s/%s" % (P.CKPT_DIR, P.BEST_CKPT)))
    return files  # the attempt's log and exit record join them: a pull always has evidence


def _payload_files(lay: Layout, job_id: str, jdir: str, exit_doc: dict[str, Any]) -> list[dict[str, Any]]:
    """gpuq's own payload: result/** with result/metrics.jsonl, and the verified ckpt/best.pt."""
    files = _result_files(jdir)
    if not any(f["path"] == "%s/%s" % (P.RESULT_DIR, P.METRICS_FILE) for f in files):
        raise Refused("%s/%s is missing" % (P.RESULT_DIR, P.METRICS_FILE))
    ckpt_dir = lay.job(job_id, P.CKPT_DIR)
    best = os.path.join(ckpt_dir, P.BEST_CKPT)
    _no_link(ckpt_dir, P.CKPT_DIR + "/")
    _no_link(best, "%s/%s" % (P.CKPT_DIR, P.BEST_CKPT))
    if not os.path.exists(best):
        raise Refused("the best checkpoint %s/%s is missing" % (P.CKPT_DIR, P.BEST_CKPT))
    best_entry = _hash_regular(best, "%s/%s" % (P.CKPT_DIR, P.BEST_CKPT))
    recorded = exit_doc.get("best_sha256")
    if recorded and recorded != best_entry["sha256"]:
        raise Refused("%s/%s changed after the wrapper verified it (sha256 %s, exit record says %s)"
                      % (P.CKPT_DIR, P.BEST_CKPT, best_entry["sha256"][:12], str(recorded)[:12]))
    files.append(best_entry)
    return files


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
    run = spec_run(job_spec(root, job_id))
    if run is not None and safe_globs(run.get("checkpoint")):
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
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(src, flags)
    except OSError as e:
        raise Refused("cannot read %s: %s" % (rel, e.strerror or e)) from e
    try:
        before = os.fstat(fd)
        if not stat.S_ISREG(before.st_mode):
            raise Refused("%s is not a regular file" % rel)
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


def _snapshot_run(lay: Layout, job_id: str, run: dict[str, Any]) -> int:
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
        newest = gpuq_own.newest_checkpoint(run_dir, run.get("checkpoint"), settle_s=gpuq_own.SETTLE_S)
        if newest is None:
            print("gpuq snapshot: nothing of the job's own under %s matches the checkpoint globs %r"
                  % (run_dir, run.get("checkpoint")), file=sys.stderr)
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
