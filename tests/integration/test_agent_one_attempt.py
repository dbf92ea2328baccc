"""One job, one live attempt per host: the agent never starts attempt n+1 of a job while attempt n
still lives there, never overwrites n's records, never ends n with a "vanished" exit and never frees
its slots (a controller that re-delivered a job it believed lost must not get two runs)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from orchestrator.host_documents import unframe
from tests.integration.test_agent import AGENT_PY, Host, read_json, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def host(tmp_path: Path):
    h = Host(tmp_path / "root", tmp_path / "runs.jsonl")
    yield h
    h.cleanup()


def test_attempt_two_waits_while_attempt_one_lives(host: Host) -> None:
    gate = host.root / "gate"
    cfg = host.config("held", wait_file=str(gate), sleep=0.1)
    agent = host.serve(slots=2, idle=30)
    host.wait_agent(agent)
    first = host.spec("j", cfg)
    job_id = first["job_id"]
    wait_for(lambda: (host.attempt(job_id, 1) / "pgid").exists(), 20, "attempt 1 launched")
    second = dict(first, attempt=2, created_at=first["created_at"] + 1)

    # enqueue refuses attempt 2 outright: nothing is written
    r = subprocess.run([AGENT_PY, host.agent, "--root", str(host.root), "enqueue"], input=json.dumps([second]),
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert json.loads(unframe(r.stdout)[0]) == {job_id: "busy"}
    assert not (host.root / "inbox" / f"{job_id}.json").exists()

    # a spec that reached the inbox anyway waits there until attempt 1 has ended
    tmp = host.root / "inbox" / f".{job_id}.tmp"
    tmp.write_text(json.dumps(second))
    tmp.rename(host.root / "inbox" / f"{job_id}.json")
    wait_for(lambda: f"WAITING {job_id} a2" in (host.root / "agent.log").read_text(), 20, "the agent to hold a2")
    assert not (host.attempt(job_id, 2) / "launch.json").exists()
    assert read_json(host.root / "claimed" / f"{job_id}.json")["attempt"] == 1
    assert host.exit_of(job_id, 1) is None
    assert host.job_state(job_id) == "running"

    gate.touch()
    one = host.wait_exit(job_id)
    assert one["wrapper_code"] == 0 and not one.get("vanished"), one
    two = wait_for(lambda: host.exit_of(job_id, 2), 30, "attempt 2 ran after attempt 1")
    assert two["wrapper_code"] == 0, two
    assert iso_launch(host, job_id, 2) >= iso_launch(host, job_id, 1)
    assert len(host.runs_of(job_id)) == 4  # two runs, one after the other: start+end each
    assert host.exit_of(job_id, 1) == one  # attempt 1's verdict was never rewritten


def iso_launch(host: Host, job_id: str, n: int) -> str:
    return str(read_json(host.attempt(job_id, n) / "launch.json")["time"])
