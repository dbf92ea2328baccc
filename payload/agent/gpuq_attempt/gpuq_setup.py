"""The project's setup hook: once per host and setup_key (docs/your-project.md).

Under flock <root>/setup/<key>.lock: ok.json -> skip; failed.json -> fail fast; else run
``sh -c <setup>`` in a fresh writable copy of the project (bundles/.setup/<key>/project), output to
setup/<key>/setup.log, and record ok.json or failed.json {"code", "tail", "bundle_sha", "at"}; the
tail has the job's forwarded secret values redacted (gpuq_secrets.py).
Concurrent wrappers wait on the lock, so the hook runs once.

What the hook adds or changes in the project (its *products*: prepared data, a compiled extension,
downloaded weights) is what the jobs see.  The products are listed in bundles/.setup/<key>/products.json
and, once per bundle and key, the *prepared tree* bundles/.prepared/<sha>-<key>/ is built under the
same lock: a copy of the bundle's project with the products hard-linked in, then made read-only.
Jobs link that tree (``project_root``).  Both live under bundles/, which a root trainer sees
bind-mounted read-only (gpuq_jail.read_only_prefix), so no job can change what another job reads.

stdlib only, Python >= 3.8.
"""

# ruff: noqa: UP031  (%-formatting on purpose, as in the other agent modules)
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import socket
import subprocess
from typing import Any

from gpuq_base import gpuq_protocol as P
from gpuq_base.gpuq_files import Layout, atomic_write_json, read_json, utc
from gpuq_base.gpuq_jobspec import JobSpec
from gpuq_base.gpuq_secrets import redact

KEY_RE = re.compile(r"^[0-9a-f]{8,128}$")
TAIL_LINES = 20
SETUP_TREES = ".setup"  # bundles/.setup/<key>/{project/,products.json}: where the hook ran
PREPARED = ".prepared"  # bundles/.prepared/<sha>-<key>/: the project as the hook left it, read-only
PRODUCTS_FILE = "products.json"


def setup_key_of(spec: JobSpec) -> str:
    run = spec.run
    return run.setup_key if run is not None and run.setup else ""


def project_root(lay: Layout, spec: JobSpec) -> str:
    """The directory jobs of ``spec`` see as their project: the bundle's workdir, or, with a setup
    hook, its prepared tree (built by ``run_setup`` before the trainer starts)."""
    sha = spec.bundle_sha
    key = setup_key_of(spec)
    if key and KEY_RE.match(key) and sha and "/" not in sha and not sha.startswith("."):
        return lay.p(P.BUNDLES_DIR, PREPARED, "%s-%s" % (sha, key[:32]))
    return lay.p(P.BUNDLES_DIR, sha, P.BUNDLE_WORKDIR)


def _files(top: str) -> dict[str, list[Any]]:
    """{relative path: [kind, size, mtime_ns]} of everything under ``top`` (links not followed)."""
    out: dict[str, list[Any]] = {}
    for base, dirs, files in os.walk(top):
        for name in dirs + files:
            path = os.path.join(base, name)
            with contextlib.suppress(OSError):
                st = os.lstat(path)
                kind = "l" if os.path.islink(path) else "d" if os.path.isdir(path) else "f"
                out[os.path.relpath(path, top)] = [kind, st.st_size if kind == "f" else 0,
                                                   st.st_mtime_ns if kind != "d" else 0]
    return out


def _writable(top: str, on: bool) -> None:
    subprocess.run(["chmod", "-R", "u+w" if on else "a-w", top], check=False,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _remove(top: str) -> None:
    if os.path.lexists(top):
        _writable(top, True)
        shutil.rmtree(top, ignore_errors=True)


def _place(src: str, dst: str) -> None:
    """``src`` (a product) at ``dst`` in a prepared tree: a hard link (no copy of a big dataset), a copy
    where links fail, the link itself for a symlink."""
    if os.path.islink(dst) or os.path.isfile(dst):
        os.unlink(dst)
    elif os.path.isdir(dst) and not os.path.isdir(src):
        shutil.rmtree(dst)
    if os.path.islink(src):
        os.symlink(os.readlink(src), dst)
    elif os.path.isdir(src):
        os.makedirs(dst, exist_ok=True)
    else:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)


def prepare_tree(lay: Layout, spec: JobSpec, workdir: str) -> str:
    """Build bundles/.prepared/<sha>-<key> once (the caller holds the setup lock): the bundle's project
    plus the hook's products.  "" when it is there, else why not."""
    final = project_root(lay, spec)
    if os.path.isdir(final):
        return ""
    key = setup_key_of(spec)
    tree = lay.p(P.BUNDLES_DIR, SETUP_TREES, key, "project")
    products = read_json(lay.p(P.BUNDLES_DIR, SETUP_TREES, key, PRODUCTS_FILE))
    tmp = "%s.tmp.%d" % (final, os.getpid())
    _remove(tmp)
    try:
        os.makedirs(os.path.dirname(final), exist_ok=True)
        shutil.copytree(workdir, tmp, symlinks=True)
        _writable(tmp, True)
        for rel in sorted(products if isinstance(products, list) else [], key=lambda r: str(r).count("/")):
            rel = str(rel)
            if rel.startswith("/") or ".." in rel.split("/"):
                continue
            src = os.path.join(tree, rel)
            if os.path.lexists(src):
                os.makedirs(os.path.dirname(os.path.join(tmp, rel)), exist_ok=True)
                _place(src, os.path.join(tmp, rel))
        _writable(tmp, False)
        os.chmod(tmp, 0o700)  # a directory without write permission may not be renamed
        os.rename(tmp, final)
        os.chmod(final, 0o500)
    except OSError as e:
        _remove(tmp)
        return "cannot prepare the project tree for the jobs on %s: %s" % (socket.gethostname(), e)
    return ""


def _tail(path: str) -> list[str]:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - 65536))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return []
    return [ln for ln in text.splitlines() if ln.strip()][-TAIL_LINES:]


def _failure(key: str, rec: dict[str, Any]) -> str:
    tail = rec.get("tail") or [""]
    return "setup failed (exit %s) on %s: %s" % (rec.get("code"), socket.gethostname(), tail[-1] if tail else "")


def run_setup(lay: Layout, spec: JobSpec, workdir: str, env: dict[str, str],
              hide: list[str] | None = None) -> str:
    """"" when the project's setup has succeeded on this host (now or before); else the message.
    ``hide``: forwarded secret values, redacted from the recorded tail (and so from the message)."""
    script = spec.run.setup if spec.run is not None else ""
    key = spec.run.setup_key if spec.run is not None else ""
    if not script or not key:
        return ""
    if not KEY_RE.match(key):
        return "setup_key %r is not a hex digest" % key
    sdir = lay.p(P.SETUP_DIR)
    os.makedirs(sdir, exist_ok=True)
    kdir = os.path.join(sdir, key)
    fd = os.open(os.path.join(sdir, key + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if os.path.exists(os.path.join(kdir, "ok.json")):
            return prepare_tree(lay, spec, workdir)
        failed = read_json(os.path.join(kdir, "failed.json"))
        if isinstance(failed, dict):
            return redact(_failure(key, failed), hide or [])
        problem = _run_hook(lay, spec, workdir, env, script, hide)
        return problem or prepare_tree(lay, spec, workdir)
    finally:
        os.close(fd)  # closing drops the flock


def _run_hook(lay: Layout, spec: JobSpec, workdir: str, env: dict[str, str], script: str,
              hide: list[str] | None) -> str:
    """Run the hook in a fresh writable copy of the project; record ok.json (and the products) or
    failed.json.  "" on success, else the message."""
    key = setup_key_of(spec)
    kdir = lay.p(P.SETUP_DIR, key)
    trees = lay.p(P.BUNDLES_DIR, SETUP_TREES, key)
    project = os.path.join(trees, "project")
    _remove(trees)
    os.makedirs(kdir, exist_ok=True)
    os.makedirs(trees)
    shutil.copytree(workdir, project, symlinks=True)
    _writable(project, True)
    before = _files(project)
    log_path = os.path.join(kdir, "setup.log")
    with open(log_path, "ab") as logf:
        logf.write(("=== gpuq setup %s start %s ===\n" % (key[:12], utc())).encode())
        logf.flush()
        try:
            code = subprocess.run(["sh", "-c", script], cwd=project, env=env, stdin=subprocess.DEVNULL,
                                  stdout=logf, stderr=subprocess.STDOUT).returncode
        except OSError as e:
            logf.write(("cannot run sh: %s\n" % e).encode())
            code = 127
    tail = [redact(line, hide or []) for line in _tail(log_path)]
    rec = {"code": code, "tail": tail, "bundle_sha": spec.bundle_sha, "at": utc()}
    if code == 0:
        after = _files(project)
        products = sorted(rel for rel, st in after.items() if before.get(rel) != st)
        with open(os.path.join(trees, PRODUCTS_FILE), "w") as f:
            json.dump(products, f)
        _writable(project, False)  # its products are hard-linked into prepared trees
        rec["products"] = len(products)
        atomic_write_json(os.path.join(kdir, "ok.json"), rec)
        return ""
    atomic_write_json(os.path.join(kdir, "failed.json"), rec)
    return _failure(key, rec)
