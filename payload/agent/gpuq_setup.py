"""The project's setup hook: once per host and setup_key (docs/your-project.md).

Under flock <root>/setup/<key>.lock: ok.json -> skip; failed.json -> fail fast; else run
``sh -c <setup>`` in a fresh writable copy of the project (setup/<key>/project), output to
setup/<key>/setup.log, and record ok.json or failed.json {"code", "tail", "bundle_sha", "at"}; the
tail has the job's forwarded secret values redacted (gpuq_secrets.py).
Concurrent wrappers wait on the lock, so the hook runs once.

stdlib only, Python >= 3.8.
"""

# ruff: noqa: UP031  (%-formatting on purpose, as in the other agent modules)
from __future__ import annotations

import fcntl
import os
import re
import shutil
import socket
import subprocess
from typing import Any

import gpuq_protocol as P
from gpuq_files import Layout, atomic_write_json, read_json, utc
from gpuq_secrets import redact

KEY_RE = re.compile(r"^[0-9a-f]{8,128}$")
TAIL_LINES = 20


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


def run_setup(lay: Layout, spec: dict[str, Any], workdir: str, env: dict[str, str],
              hide: list[str] | None = None) -> str:
    """"" when the project's setup has succeeded on this host (now or before); else the message.
    ``hide``: forwarded secret values, redacted from the recorded tail (and so from the message)."""
    run = spec.get("run") if isinstance(spec.get("run"), dict) else {}
    script = str(run.get("setup") or "")
    key = str(run.get("setup_key") or "")
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
            return ""
        failed = read_json(os.path.join(kdir, "failed.json"))
        if isinstance(failed, dict):
            return redact(_failure(key, failed), hide or [])
        project = os.path.join(kdir, "project")
        if os.path.isdir(project):
            subprocess.run(["chmod", "-R", "u+w", project], check=False)
            shutil.rmtree(project, ignore_errors=True)
        os.makedirs(kdir, exist_ok=True)
        shutil.copytree(workdir, project, symlinks=True)
        subprocess.run(["chmod", "-R", "u+w", project], check=False)
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
        rec = {"code": code, "tail": tail, "bundle_sha": str(spec.get("bundle_sha", "")), "at": utc()}
        if code == 0:
            atomic_write_json(os.path.join(kdir, "ok.json"), rec)
            return ""
        atomic_write_json(os.path.join(kdir, "failed.json"), rec)
        return _failure(key, rec)
    finally:
        os.close(fd)  # closing drops the flock
