"""The host agent's `manifest` verb (docs/results.md), run as a real subprocess on fabricated job trees.

Runs under GPUQ_TEST_AGENT_PYTHON when set (e.g. ~/.pyenv/versions/3.8.18/bin/python), like
test_agent.py, so the verb is proven on the oldest Python the agent supports.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core import protocol
from orchestrator.host_documents import unframe
from tests.support.jobtree import SHA, finished_job, install_agent, pulled_paths

pytestmark = pytest.mark.integration

AGENT_PY = os.environ.get("GPUQ_TEST_AGENT_PYTHON") or sys.executable


def manifest(root: Path, *job_ids: str) -> tuple[int, Any, str]:
    agent = root / protocol.BUNDLES_DIR / SHA / protocol.AGENT_ENTRY
    proc = subprocess.run([AGENT_PY, str(agent), "--root", str(root), "manifest", *job_ids],
                          capture_output=True, text=True, timeout=60, check=False)
    doc = json.loads(unframe(proc.stdout)[0]) if proc.stdout.strip() else None
    return proc.returncode, doc, proc.stderr


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "root"
    install_agent(r)
    return r


def test_manifest_hashes_results_checkpoint_and_evidence(root: Path) -> None:
    jdir = finished_job(root, "c000000000001", attempt=2)
    code, doc, err = manifest(root, "c000000000001")
    assert code == 0, err
    reply = doc["c000000000001"]
    path = Path(reply["manifest"])
    assert path == jdir / protocol.JOB_MANIFEST_FILE
    raw = path.read_bytes()
    assert reply["sha256"] == hashlib.sha256(raw).hexdigest()
    man = json.loads(raw)
    assert man["schema"] == protocol.MANIFEST_SCHEMA
    assert (man["job_id"], man["queue_id"], man["attempt"]) == ("c000000000001", "qtest01", 2)
    paths = [f["path"] for f in man["files"]]
    assert paths == sorted(paths) and set(paths) == pulled_paths(2)  # no latest.pt, no *.tmp, no LATEST
    for entry in man["files"]:
        data = (jdir / entry["path"]).read_bytes()
        assert entry["bytes"] == len(data) and entry["sha256"] == hashlib.sha256(data).hexdigest()
    assert man["total_files"] == reply["files"] == 6
    assert man["total_bytes"] == reply["bytes"] == sum(f["bytes"] for f in man["files"])
    assert not list(jdir.glob("*.tmp"))
    # idempotent: a rebuild lists the same files (only created_at may differ)
    code, again, _ = manifest(root, "c000000000001")
    assert code == 0 and json.loads(path.read_bytes())["files"] == man["files"]
    assert again["c000000000001"]["files"] == 6


def test_every_unsafe_job_fails_closed_alone(root: Path) -> None:
    finished_job(root, "cgood")
    finished_job(root, "clink")
    os.symlink("../ckpt/best.pt", root / "jobs" / "clink" / "result" / "alias.pt")
    finished_job(root, "cname", extra={"result/bad\x1bname.txt": b"x"})  # a control character (a space is fine)
    finished_job(root, "cnobest")
    (root / "jobs" / "cnobest" / "ckpt" / "best.pt").unlink()
    finished_job(root, "cnometrics")
    (root / "jobs" / "cnometrics" / "result" / "metrics.jsonl").unlink()
    finished_job(root, "cfailed", code=4)
    finished_job(root, "cswapped")
    (root / "jobs" / "cswapped" / "ckpt" / "best.pt").write_bytes(b"not what the wrapper loaded")
    finished_job(root, "crunning")
    (root / "jobs" / "crunning" / "attempts" / "1" / "exit.json").unlink()
    finished_job(root, "clinkdir")
    os.symlink("/etc", root / "jobs" / "clinkdir" / "result" / "etc")
    finished_job(root, "cfifo")
    os.mkfifo(root / "jobs" / "cfifo" / "result" / "pipe")
    code, doc, err = manifest(root, "cgood", "clink", "cname", "cnobest", "cnometrics", "cfailed", "cswapped",
                              "crunning", "clinkdir", "cfifo", "cnothere")
    assert code == 0, err  # one manifest was built
    assert set(doc["cgood"]) >= {"manifest", "sha256", "files", "bytes"}
    expected = {
        "clink": "symlink", "cname": "unsafe name 'bad\\x1bname.txt'", "cnobest": "best checkpoint",
        "cnometrics": "metrics.jsonl is missing", "cfailed": "exited 4, not 0", "cswapped": "changed after the wrapper",
        "crunning": "no exit record", "clinkdir": "symlink", "cfifo": "not a regular file",
        "cnothere": "no job directory",
    }
    for job_id, needle in expected.items():
        assert needle in doc[job_id].get("error", ""), (job_id, doc[job_id])
        assert not (root / "jobs" / job_id / protocol.JOB_MANIFEST_FILE).exists(), job_id


def test_no_manifest_at_all_is_a_failure_and_a_bad_roster_writes_nothing(root: Path) -> None:
    finished_job(root, "cfailed", code=137)
    code, doc, _ = manifest(root, "cfailed")
    assert code == 1 and "exited 137" in doc["cfailed"]["error"]
    finished_job(root, "cgood")
    for roster in (["cgood", "cgood"], ["cgood", "../etc"]):
        code, doc, err = manifest(root, *roster)
        assert code == protocol.AGENT_EXIT_USAGE and doc is None and err.strip()
        assert not (root / "jobs" / "cgood" / protocol.JOB_MANIFEST_FILE).exists()
