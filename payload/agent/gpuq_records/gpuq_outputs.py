"""What a job's results are made of, hashed, and the attempt's end record ``attempts/<n>/outputs.json``
(docs/results.md).

stdlib only, Python >= 3.8.

:func:`selection` is the one list of a job's result files, shared by the wrapper (as an attempt ends)
and the ``manifest`` verb (``gpuq pull``): ``result/**``, ``ckpt/best.pt`` when present, and for a
project's own trainer (spec ``run``) everything of the job's own under ``run/`` that an ``outputs``,
``checkpoint`` or ``metrics`` glob matches (gpuq_own).  Each file is hashed through a descriptor that
follows no link, streamed in 1 MiB reads; hard links to one inode (a trainer's ``last.pth.tar`` and
``checkpoint-N.pth.tar``) are read once.

:func:`record`: when an attempt ends well (trainer exit 0, its artifacts verified, node 0), the wrapper
writes its end record before ``exit.json``: ``{"schema": "gpuq.outputs/1", "job_id", "attempt",
"created_at", "files": [{"path", "bytes", "sha256"}], "total_files", "total_bytes", "hashed_bytes",
"seconds", "error"}``.  Bounded: at most ``OUTPUTS_MAX_FILES`` files of paths of at most
``OUTPUTS_MAX_PATH`` characters.  A selection that cannot travel (an unsafe name, a link out of the run
dir, a FIFO) or passes a bound records ``error`` and no file; the ``manifest`` verb then refuses the
job, naming why.  ``collect`` and ``status --results-for`` carry the record (:func:`carried`), so the
controller keeps it with the attempt's end; a pull is verified against it.
"""

# ruff: noqa: UP031  (%-formatting on purpose, as in the other agent modules)
from __future__ import annotations

import hashlib
import json
import os
import stat
import time
from typing import Any

from gpuq_records import gpuq_own
from gpuq_base import gpuq_protocol as P
from gpuq_base.gpuq_files import Layout, atomic_write, read_json, utc
from gpuq_records.gpuq_summary import project_summary
from gpuq_base.gpuq_jobspec import JobSpec, RunSection
from gpuq_records.gpuq_observe import safe_globs

CHUNK = 1 << 20
MAX_RECORD_BYTES = 64 << 20  # an end record of OUTPUTS_MAX_FILES files of the longest paths fits


class Refused(Exception):
    """This job's files cannot be listed; the message says why."""


def safe_name(name: str, where: str) -> None:
    why = gpuq_own.name_problem(name)
    if why is not None:
        raise Refused("unsafe name %r in %s: %s" % (name[:120], where, why))


def no_link(path: str, what: str) -> None:
    if os.path.islink(path):
        raise Refused("%s is a symlink: %s" % (what, path))


class Hasher:
    """Size and sha256 of regular files, each inode read once (hard links share one reading)."""

    def __init__(self) -> None:
        self.seen: dict[tuple[int, int], tuple[int, int, str]] = {}
        self.bytes_read = 0

    def entry(self, path: str, rel: str) -> dict[str, Any]:
        """{"path": rel, "bytes", "sha256"} of one regular file, from one open file (never a link)."""
        fd, st = open_regular(path, rel)
        try:
            known = self.seen.get((st.st_dev, st.st_ino))
            if known is not None and known[:2] == (st.st_size, st.st_mtime_ns):
                return {"path": rel, "bytes": known[0], "sha256": known[2]}
            h = hashlib.sha256()
            size = 0
            with os.fdopen(fd, "rb", closefd=False) as f:
                for chunk in iter(lambda: f.read(CHUNK), b""):
                    h.update(chunk)
                    size += len(chunk)
        finally:
            os.close(fd)
        self.bytes_read += size
        if size == st.st_size:
            self.seen[(st.st_dev, st.st_ino)] = (size, st.st_mtime_ns, h.hexdigest())
        return {"path": rel, "bytes": size, "sha256": h.hexdigest()}


def open_regular(path: str, rel: str) -> tuple[int, os.stat_result]:
    """An open descriptor of ``path`` and its stat, refused (``rel`` named) unless it is a regular file
    reached without following a link; the caller closes it."""
    # O_NONBLOCK: a FIFO must be refused, not wait forever for a writer (no effect on regular files)
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        raise Refused("cannot read %s: %s" % (rel, e.strerror or e)) from e
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise Refused("%s is not a regular file" % rel)
    return fd, st


def result_files(jdir: str, hasher: Hasher) -> list[dict[str, Any]]:
    rdir = os.path.join(jdir, P.RESULT_DIR)
    no_link(rdir, P.RESULT_DIR + "/")
    if not os.path.isdir(rdir):
        raise Refused("no %s/ directory: the job left no results" % P.RESULT_DIR)
    found: list[dict[str, Any]] = []
    for dirpath, dirnames, filenames in os.walk(rdir):
        rel_dir = os.path.relpath(dirpath, jdir).replace(os.sep, "/")
        for name in sorted(dirnames):
            safe_name(name, rel_dir + "/")
            no_link(os.path.join(dirpath, name), "%s/%s" % (rel_dir, name))
        dirnames.sort()
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            no_link(full, "%s/%s" % (rel_dir, name))
            if name.endswith(".tmp"):
                continue  # an interrupted atomic write, never a result
            safe_name(name, rel_dir + "/")
            found.append(hasher.entry(full, "%s/%s" % (rel_dir, name)))
    return found


def run_files(lay: Layout, job_id: str, spec: JobSpec, run: RunSection,
              hasher: Hasher) -> list[dict[str, Any]]:
    """A project's own trainer (spec "run"): result/** when any (its summary, written now from its
    metrics), everything of the job's own that an ``outputs`` or ``checkpoint`` glob matches under run/
    (gpuq_own: real files, links to its own files as those files, every file of a matched directory),
    the metrics file, and ckpt/best.pt only when present.  Links into the project are not the job's;
    ``*.tmp`` files are interrupted writes.  Anything else the globs match that cannot travel (an unsafe
    name, a link out of the run dir, a FIFO) refuses the whole list, naming it: a pull never leaves
    a file behind in silence."""
    jdir = lay.job(job_id)
    project_summary(lay.root, job_id, spec, write=True)
    files: list[dict[str, Any]] = []
    if os.path.isdir(lay.job(job_id, P.RESULT_DIR)) or os.path.islink(lay.job(job_id, P.RESULT_DIR)):
        files.extend(result_files(jdir, hasher))
    run_dir = lay.job(job_id, P.RUN_DIR)
    no_link(run_dir, P.RUN_DIR + "/")
    globs = safe_globs(run.outputs) + safe_globs(run.checkpoint)
    metrics = run.metrics
    if metrics not in ("", "log"):
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
        files.append(hasher.entry(chosen[rel], P.RUN_DIR + "/" + rel))
    best = lay.job(job_id, P.CKPT_DIR, P.BEST_CKPT)
    if os.path.isfile(best) and not os.path.islink(best):
        files.append(hasher.entry(best, "%s/%s" % (P.CKPT_DIR, P.BEST_CKPT)))
    return files


def payload_files(lay: Layout, job_id: str, hasher: Hasher) -> list[dict[str, Any]]:
    """gpuq's own payload: result/** and ckpt/best.pt when present (the manifest verb requires both)."""
    files = result_files(lay.job(job_id), hasher)
    ckpt_dir = lay.job(job_id, P.CKPT_DIR)
    best = os.path.join(ckpt_dir, P.BEST_CKPT)
    no_link(ckpt_dir, P.CKPT_DIR + "/")
    no_link(best, "%s/%s" % (P.CKPT_DIR, P.BEST_CKPT))
    if os.path.exists(best):
        files.append(hasher.entry(best, "%s/%s" % (P.CKPT_DIR, P.BEST_CKPT)))
    return files


def selection(lay: Layout, job_id: str, spec: JobSpec | None, hasher: Hasher) -> list[dict[str, Any]]:
    """The job's result files, hashed, sorted by path (Refused when they cannot travel)."""
    if spec is not None and spec.run is not None:
        files = run_files(lay, job_id, spec, spec.run, hasher)
    else:
        files = payload_files(lay, job_id, hasher)
    return sorted(files, key=lambda f: f["path"])


def _bounded(files: list[dict[str, Any]]) -> None:
    if len(files) > P.OUTPUTS_MAX_FILES:
        raise Refused("%d result files, more than the %d an end record lists (narrow the [run] globs)"
                      % (len(files), P.OUTPUTS_MAX_FILES))
    long = [f["path"] for f in files if len(f["path"]) > P.OUTPUTS_MAX_PATH]
    if long:
        raise Refused("a path of more than %d characters: %r..." % (P.OUTPUTS_MAX_PATH, long[0][:120]))


def record(lay: Layout, job_id: str, attempt: int, spec: JobSpec, adir: str) -> dict[str, Any]:
    """Write ``adir``/outputs.json, the end record of an attempt that ended well; returns what exit.json
    says of it: {"files", "bytes", "hashed_bytes", "seconds", "error"} (and "best_sha256" when the
    record lists ckpt/best.pt, so that the wrapper reads that file once)."""
    started = time.monotonic()
    hasher = Hasher()
    error = None
    try:
        files = selection(lay, job_id, spec, hasher)
        _bounded(files)
    except (Refused, OSError) as e:
        files, error = [], str(e)[:2000]
    seconds = round(time.monotonic() - started, 3)
    doc = {"schema": P.OUTPUTS_SCHEMA, "job_id": job_id, "attempt": attempt, "created_at": utc(),
           "files": files, "total_files": len(files), "total_bytes": sum(f["bytes"] for f in files),
           "hashed_bytes": hasher.bytes_read, "seconds": seconds, "error": error}
    try:
        atomic_write(os.path.join(adir, P.OUTPUTS_FILE), json.dumps(doc, sort_keys=True, indent=1) + "\n")
    except OSError as e:  # exit.json still says so: collect carries "gone", and no pull is verified
        doc.update(files=[], total_files=0, total_bytes=0, error="cannot write %s: %s" % (P.OUTPUTS_FILE, e))
    said = {k: doc[k] for k in ("hashed_bytes", "seconds", "error")}
    said.update(files=doc["total_files"], bytes=doc["total_bytes"])
    best = next((f["sha256"] for f in files if f["path"] == "%s/%s" % (P.CKPT_DIR, P.BEST_CKPT)), None)
    return {"outputs": said, "best_sha256": best}


def _read_record(path: str) -> tuple[bytes | None, str | None]:
    """(the record's bytes, None) or (None, why it cannot be read); never follows a link."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None, None
    except OSError as e:
        return None, "cannot read it: %s" % (e.strerror or e)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_RECORD_BYTES:
            return None, "not a regular file of at most %d bytes" % MAX_RECORD_BYTES
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(MAX_RECORD_BYTES + 1), None
    finally:
        os.close(fd)


def carried(lay: Layout, job_id: str, attempt: int) -> dict[str, Any] | None:
    """The attempt's end record as ``collect`` carries it: {"attempt", "sha256" and "bytes" of the record
    file, "files", "seconds", "error"}; None when the attempt has none and its exit record says none was
    written (an attempt that ended under an older agent).  A record that is gone or unreadable is carried
    with its ``error`` and no file: the controller then holds nothing a pull could match."""
    adir = lay.attempt(job_id, attempt)
    raw, why = _read_record(os.path.join(adir, P.OUTPUTS_FILE))
    if raw is None and why is None:
        exit_doc = read_json(os.path.join(adir, P.EXIT_FILE))
        if not (isinstance(exit_doc, dict) and isinstance(exit_doc.get("outputs"), dict)):
            return None
        why = "it is gone, though exit.json says it was written"
    doc: Any = None
    if raw is not None:
        try:
            doc = json.loads(raw.decode("utf-8"))
        except ValueError:
            why = "it is not JSON"
    if why is None and not (isinstance(doc, dict) and doc.get("attempt") == attempt
                            and isinstance(doc.get("files"), list)):
        why = "it is not the end record of attempt %d" % attempt
    out: dict[str, Any] = {"attempt": attempt, "files": [], "seconds": None,
                           "sha256": hashlib.sha256(raw).hexdigest() if raw is not None else None,
                           "bytes": len(raw) if raw is not None else None}
    if why is not None:
        out["error"] = "%s/%d/%s: %s" % (P.ATTEMPTS_DIR, attempt, P.OUTPUTS_FILE, why)
        return out
    out.update(files=doc["files"], seconds=doc.get("seconds"), error=doc.get("error"))
    return out


def check(lay: Layout, job_id: str, attempt: int) -> str | None:
    """For the ``manifest`` verb: the record's path relative to the job dir when the attempt has a sound
    end record, None when it has none (an older agent's attempt); Refused when it recorded an error or
    cannot be read."""
    got = carried(lay, job_id, attempt)
    if got is None:
        return None
    if got.get("error"):
        raise Refused("the end record of attempt %d says its results cannot be vouched for: %s"
                      % (attempt, str(got["error"])[:600]))
    return "%s/%d/%s" % (P.ATTEMPTS_DIR, attempt, P.OUTPUTS_FILE)
