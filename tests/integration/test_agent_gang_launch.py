"""One node of a multi-node job through the real agent and wrapper (stub trainer, local root): the
check before the launch ends the attempt with the port named when node 0 cannot be reached or its port
is taken, and lets the trainer start once node 0 answers.  The full jobs over SSH hosts are in
test_multinode_ssh.py."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.test_agent import Host

pytestmark = pytest.mark.integration


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Host]:
    h = Host(tmp_path / "root", tmp_path / "runs.jsonl")
    yield h
    h.cleanup()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _node(rank: int, port: int, timeout_s: float = 30) -> dict[str, object]:
    return {"rank": rank, "nodes": 2, "hosts": ["h0", "h1"], "master_addrs": ["127.0.0.1"], "master_port": port,
            "timeout_s": timeout_s}


def test_node_checks_before_the_launch(host: Host) -> None:
    agent = host.serve(slots=3, idle=30)
    host.wait_agent(agent)
    closed = _free_port()
    unreachable = host.spec("far", host.config("far"), nodes=2, node=_node(1, closed, timeout_s=2))
    with socket.socket() as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        held.bind(("", 0))
        held.listen()
        taken_port = int(held.getsockname()[1])
        taken = host.spec("taken", host.config("taken"), nodes=2, node=_node(0, taken_port))
        # no results here: rank 0 writes them on node 0, whose wrapper alone verifies them
        meets = host.spec("meets", host.config("meets", no_metrics=True), nodes=2, node=_node(1, taken_port))
        far = host.wait_exit(unreachable["job_id"])
        head = host.wait_exit(taken["job_id"])
        ok = host.wait_exit(meets["job_id"])
    assert far["wrapper_code"] == 1 and far["phase"] == "rendezvous", far
    assert far["message"].startswith(f"node 1 could not reach node 0's rendezvous port within 2 s (127.0.0.1:{closed} "
                                     "refused)"), far["message"]
    assert head["wrapper_code"] == 3 and head["message"].startswith(f"rendezvous port {taken_port} is taken on this "
                                                                    "host"), head  # retried: a new attempt, a new port
    assert host.runs_of(unreachable["job_id"]) == [] and host.runs_of(taken["job_id"]) == []  # no trainer started
    assert (ok["wrapper_code"], ok["message"]) == (0, "trained as node 1; node 0 verifies the artifacts"), ok
    log = (host.attempt(meets["job_id"]) / "job.log").read_text()
    assert f"gpuq: node 1 of 2 reaches node 0 at 127.0.0.1:{taken_port}" in log, log
