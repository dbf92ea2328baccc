"""Forwarded secrets on a host (payload/agent/gpuq_base/gpuq_secrets.py): redacted from the host text the agent
reports, and deleted once no job of their sweep is queued or alive, by ``cancel``/``withdraw`` and, on a
Slurm login node where no agent runs, by ``status`` (docs/security.md).  Also: the agent keeps what it
creates private (umask 077, the root 0700)."""

from __future__ import annotations

import argparse
import json
import os
import stat
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.support.agentmodule import AGENT, load_agent_module
from tests.support.jobspecs import spec_doc

secrets = load_agent_module("gpuq_base.gpuq_secrets")
cancel = load_agent_module("gpuq_verbs.gpuq_cancel")
status = load_agent_module("gpuq_verbs.gpuq_status")
slurm = load_agent_module("gpuq_slurmmode.gpuq_slurm")
files = load_agent_module("gpuq_base.gpuq_files")
P = load_agent_module("gpuq_base.gpuq_protocol")

TOKEN = "hf_" + "Zq7" * 8


def _secret(root: Path, qid: str, **values: str) -> Path:
    sdir = root / P.SECRETS_DIR
    sdir.mkdir(mode=0o700, exist_ok=True)
    path = sdir / (qid + ".json")
    path.write_text(json.dumps(values))
    return path


def _spec(root: Path, where: str, job_id: str, qid: str, attempt: int = 1) -> dict[str, Any]:
    spec = spec_doc(job_id=job_id, queue_id=qid, attempt=attempt, name=job_id, run={"forward_env": ["HF_TOKEN"]},
                    kill_grace_s=0)
    (root / where).mkdir(exist_ok=True)
    (root / where / (job_id + ".json")).write_text(json.dumps(spec))
    return spec


def test_every_held_value_is_redacted_from_every_string_of_a_document(tmp_path: Path) -> None:
    lay = files.Layout(str(tmp_path))
    _secret(tmp_path, "q1", HF_TOKEN=TOKEN, N="3")
    _secret(tmp_path, "q2", WANDB_API_KEY="wandb-" + "k" * 20)
    hide = secrets.held_values(lay)
    assert "3" not in hide  # too short to tell from ordinary text
    doc = {"message": "setup failed: token " + TOKEN, "tail": ["a", "x" + TOKEN + "y"], "step": 3,
           TOKEN: {"nested": ["wandb-" + "k" * 20]}}
    out = secrets.redact_doc(doc, hide)
    assert TOKEN not in json.dumps(out) and "wandb-" not in json.dumps(out)
    assert out["message"] == "setup failed: token [redacted]" and out["tail"] == ["a", "x[redacted]y"]
    assert out["step"] == 3 and out["[redacted]"] == {"nested": ["[redacted]"]}
    assert secrets.held_values(files.Layout(str(tmp_path / "none"))) == []


def test_cancel_deletes_the_secrets_of_a_sweep_with_nothing_left(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    lay = files.Layout(str(tmp_path))
    q1 = _secret(tmp_path, "q1", HF_TOKEN=TOKEN)
    q2 = _secret(tmp_path, "q2", HF_TOKEN=TOKEN)
    _spec(tmp_path, P.INBOX_DIR, "c1", "q1")
    _spec(tmp_path, P.CLAIMED_DIR, "c2", "q1")  # claimed, never launched: "not running"
    _spec(tmp_path, P.INBOX_DIR, "c3", "q2")
    assert cancel.cmd_cancel(lay, ["c1"]) == 0
    assert q1.exists() and q2.exists()  # c2 of q1 may still start
    assert cancel.cmd_cancel(lay, ["c2"]) == 0
    assert capsys.readouterr().out.splitlines() == ["withdrawn", "not running"]
    assert not q1.exists() and q2.exists()  # q2 still has a queued job


def test_withdraw_deletes_the_secrets_of_a_sweep_with_nothing_left(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    lay = files.Layout(str(tmp_path))
    q1 = _secret(tmp_path, "q1", HF_TOKEN=TOKEN)
    _spec(tmp_path, P.INBOX_DIR, "c1", "q1")
    _spec(tmp_path, P.INBOX_DIR, "c2", "q1")
    assert cancel.cmd_withdraw(lay, ["c1"]) == 0
    assert q1.exists()
    assert cancel.cmd_withdraw(lay, ["c2"]) == 0
    assert not q1.exists()
    assert [json.loads(x) for x in capsys.readouterr().out.splitlines()] == [{"c1": "withdrawn"}, {"c2": "withdrawn"}]


def _slurm_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                seen: dict[str, dict[str, str]] | Exception) -> files.Layout:
    (tmp_path / "slurm.json").write_text(json.dumps({"max_jobs": 4}))
    _spec(tmp_path, P.CLAIMED_DIR, "c1", "q1")
    adir = tmp_path / P.JOBS_DIR / "c1" / P.ATTEMPTS_DIR / "1"
    adir.mkdir(parents=True)
    (adir / P.LAUNCH_FILE).write_text(json.dumps({"slurm": True, "kind": "slurm"}))
    (adir / "slurm.json").write_text(json.dumps({"job_id": "41"}))

    def fake(lay: Any, ids: list[str], comments: Sequence[str] = ()) -> dict[str, dict[str, str]]:
        if isinstance(seen, Exception):
            raise seen
        return {k: v for k, v in seen.items() if k in ids}

    monkeypatch.setattr(slurm, "slurm_states", fake)
    return files.Layout(str(tmp_path))


def _status(lay: Any, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    args = argparse.Namespace(json=True, results_for=(), kernel_since=None, scan=())
    assert status.cmd_status(lay, args) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(("seen", "kept"), [
    ({"41": {"state": "RUNNING", "reason": "None", "nodes": "n1"}}, True),
    ({"41": {"state": "PENDING", "reason": "Resources", "nodes": ""}}, True),
    (OSError("squeue did not answer"), True),  # nothing is concluded
    ({"41": {"state": "COMPLETED", "reason": "None", "nodes": "n1"}}, False),
    ({}, False),  # forgotten by Slurm
])
def test_slurm_status_deletes_the_secrets_once_no_attempt_of_the_sweep_lives(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        seen: dict[str, dict[str, str]] | Exception, kept: bool) -> None:
    lay = _slurm_root(tmp_path, monkeypatch, seen)
    q1 = _secret(tmp_path, "q1", HF_TOKEN=TOKEN)
    doc = _status(lay, capsys)
    assert q1.exists() is kept, doc["jobs"]


def test_slurm_status_keeps_the_secrets_of_a_sweep_with_a_queued_or_newer_attempt(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    lay = _slurm_root(tmp_path, monkeypatch, {"41": {"state": "COMPLETED", "reason": "None", "nodes": "n1"}})
    q1 = _secret(tmp_path, "q1", HF_TOKEN=TOKEN)
    _spec(tmp_path, P.INBOX_DIR, "c9", "q1")
    _status(lay, capsys)
    assert q1.exists()
    os.unlink(tmp_path / P.INBOX_DIR / "c9.json")
    real = secrets.drop_unused

    def then_attempt_2(lay: Any, lives: Any) -> list[str]:  # a new attempt claimed after the entries were made
        _spec(tmp_path, P.CLAIMED_DIR, "c1", "q1", attempt=2)
        return list(real(lay, lives))

    monkeypatch.setattr(secrets, "drop_unused", then_attempt_2)
    _status(lay, capsys)
    assert q1.exists()


def test_status_redacts_held_values_from_progress_lines_and_scans(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    lay = files.Layout(str(tmp_path))
    _secret(tmp_path, "q1", HF_TOKEN=TOKEN)
    _spec(tmp_path, P.CLAIMED_DIR, "c1", "q1")
    adir = tmp_path / P.JOBS_DIR / "c1" / P.ATTEMPTS_DIR / "1"
    adir.mkdir(parents=True)
    (adir / P.LAUNCH_FILE).write_text(json.dumps({"slots": [0], "kind": "cpu", "time": "t"}))
    (adir / P.PGID_FILE).write_text(json.dumps({"pgid": os.getpgrp(), "start_ticks": None, "boot_id": "x"}))
    (adir / P.JOB_LOG).write_text("Traceback (most recent call last):\n  File \"t.py\", line 1\n"
                                  f"ValueError: CUDA out of memory for {TOKEN}\nepoch 1 step 5/10 loss=0.5 {TOKEN}\n")
    args = argparse.Namespace(json=True, results_for=(), kernel_since=None, scan=["c1:1:0:0"])
    assert status.cmd_status(lay, args) == 0
    out = capsys.readouterr().out
    job = json.loads(out)["jobs"][0]
    assert TOKEN not in out
    assert job["progress"]["line"].endswith("[redacted]") and job["progress"]["step"] == 5
    assert job["scan"]["hits"] and all("[redacted]" in h["line"] for h in job["scan"]["hits"][1:])
    assert job["scan"]["traceback"][-1] == "ValueError: CUDA out of memory for [redacted]"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_agent_creates_everything_private_and_closes_its_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir(mode=0o755)
    os.chmod(root, 0o755)  # as `mkdir -p` under the usual umask 022 leaves it
    spec = spec_doc(job_id="c1", queue_id="q1", attempt=1)
    r = subprocess.run([sys.executable, str(AGENT / "gpuq_agent.py"), "--root", str(root), "enqueue"],
                       input=json.dumps({"specs": [spec], "secrets": {"q1": {"A": "b"}}}), capture_output=True,
                       text=True, check=False, env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
    assert r.returncode == 0, r.stderr
    assert _mode(root) == 0o700
    assert _mode(root / P.INBOX_DIR) == 0o700 and _mode(root / P.INBOX_DIR / "c1.json") == 0o600
    assert _mode(root / P.SECRETS_DIR / "q1.json") == 0o600
