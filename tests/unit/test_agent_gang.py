"""One node of a multi-node job over SSH hosts, in process (payload/agent/gpuq_base/gpuq_gang.py): the spec's
node section checked as untrusted input, torchrun's static rendezvous, and the check before the launch
that node 0's port is free there and reachable from the other nodes.

tests/integration/test_multinode_ssh.py runs real 2-node jobs over namespace SSH hosts.
"""

from __future__ import annotations

import socket
import subprocess
import time
from typing import Any

import pytest

from tests.support.agentmodule import load_agent_module
from tests.support.jobspecs import spec_doc

gang = load_agent_module("gpuq_base.gpuq_gang")
jobspec = load_agent_module("gpuq_base.gpuq_jobspec")


def _node(**kw: Any) -> dict[str, Any]:
    node = {"rank": 1, "nodes": 2, "hosts": ["h0", "h1"], "master_addrs": ["127.0.0.1"], "master_port": 23456,
            "timeout_s": 30}
    node.update(kw)
    return node


def _section(**kw: Any) -> Any:
    return jobspec.parse_node(_node(**kw))


def test_a_sound_node_section_is_kept_and_bounded() -> None:
    got = _section(master_addrs=["10.0.0.1", "fd00::1", "head.lan"] + ["10.0.0.9"] * 9, timeout_s=10 ** 9)
    assert got == jobspec.NodeSection(rank=1, nodes=2, hosts=("h0", "h1"),
                                      master_addrs=("10.0.0.1", "fd00::1", "head.lan") + ("10.0.0.9",) * 5,
                                      master_port=23456, timeout_s=24 * 3600.0)
    assert jobspec.parse_spec(spec_doc()).node is None and jobspec.parse_spec(spec_doc(node=None)).node is None


@pytest.mark.parametrize(("bad", "field"), [
    ({"rank": 2}, "rank"), ({"rank": -1}, "rank"), ({"nodes": 1}, "nodes"), ({"nodes": 65}, "nodes"),
    ({"master_port": 80}, "master_port"), ({"master_port": 70000}, "master_port"),
    ({"master_addrs": []}, "master_addrs"), ({"master_addrs": ["-oProxyCommand=x"]}, "master_addrs"),
    ({"master_addrs": ["a b"]}, "master_addrs"), ({"master_addrs": "x"}, "master_addrs"),
    ({"timeout_s": 0}, "timeout_s"), ({"rank": "one"}, "rank"), ({"master_port": None}, "master_port"),
])
def test_a_malformed_node_section_refuses_the_spec_naming_the_field(bad: dict[str, Any], field: str) -> None:
    with pytest.raises(jobspec.SpecError, match=rf"^node\.{field} "):
        jobspec.parse_spec(spec_doc(node=_node(**bad)))
    assert jobspec.spec_or_reason(spec_doc(node="x")) == "malformed job spec: node must be an object or null, not 'x'"


def test_the_rendezvous_is_static_with_the_controllers_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gang, "interface_to", lambda addr: "veth1" if addr == "10.0.0.1" else "")
    args, env = gang.rendezvous(_section(timeout_s=42.9), "10.0.0.1")
    assert args == ["--nnodes=2", "--node-rank=1", "--master-addr=10.0.0.1", "--master-port=23456",
                    "--rdzv-conf=timeout=42"]
    assert env == {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "23456", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
                   "GLOO_SOCKET_IFNAME": "veth1", "NCCL_SOCKET_IFNAME": "veth1"}
    assert "GLOO_SOCKET_IFNAME" not in gang.rendezvous(_section(), "10.9.9.9")[1]


def test_node_0_refuses_a_taken_port() -> None:
    with socket.socket() as held:
        held.bind(("", 0))
        held.listen()
        port = held.getsockname()[1]
        assert f"rendezvous port {port} is taken on this host" in gang.port_free(port)
    assert gang.port_free(port) == ""


def test_another_node_waits_for_node_0_then_reaches_it() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    lines: list[str] = []
    node = _section(master_addrs=["127.0.0.1"], master_port=port, timeout_s=60)
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)

    def listen_later() -> None:
        while not lines:  # node 1 has said it waits: node 0 comes up now
            time.sleep(0.05)
        server.bind(("127.0.0.1", port))
        server.listen()

    import threading

    later = threading.Thread(target=listen_later)
    later.start()
    try:
        addr, why = gang.reach_head(node, lines.append, poll_s=0.1)
    finally:
        later.join()
        server.close()
    assert (addr, why) == ("127.0.0.1", "")
    assert lines[0].startswith(f"gpuq: node 1 waits for node 0's rendezvous port {port} (127.0.0.1: refused")


def test_an_unreachable_head_ends_the_node_with_the_port_named() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    node = _section(master_addrs=["127.0.0.1"], master_port=port, timeout_s=1)
    addr, why = gang.reach_head(node, lambda line: None, poll_s=0.2)
    assert addr == ""
    assert why.startswith(f"node 1 could not reach node 0's rendezvous port within 1 s (127.0.0.1:{port} refused)")
    assert f"TCP port {port} is blocked between the hosts" in why


def test_the_interface_is_the_one_holding_or_routing_to_the_master(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = {"addr": "", "route": ""}

    def fake_run(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[bytes]:
        return subprocess.CompletedProcess(argv, 0, answers[argv[3] if argv[3] == "addr" else "route"].encode(), b"")

    monkeypatch.setattr(gang.subprocess, "run", fake_run)
    answers["addr"] = "2: eth0    inet 10.0.0.5/30 brd 10.0.0.7 scope global eth0"
    assert gang.interface_to("10.0.0.5") == "eth0"  # node 0 itself: never lo
    answers["addr"], answers["route"] = "", "10.0.0.5 via 10.0.1.1 dev ens5 src 10.0.1.2 uid 0"
    assert gang.interface_to("10.0.0.5") == "ens5"
    answers["route"] = "local 10.0.0.5 dev lo src 10.0.0.5"
    assert gang.interface_to("10.0.0.5") == ""
    assert gang.interface_to("") == ""
