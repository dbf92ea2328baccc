"""One node of a multi-node job over SSH hosts: the spec's ``node`` section, torchrun's static
rendezvous, and the check that the head's rendezvous port can be reached before the trainer starts.

The controller sends every node the same spec plus ``node``: {"rank", "nodes", "hosts",
"master_addrs", "master_port", "timeout_s"}, checked by gpuq_jobspec.parse_node (``NodeSection``).
Node 0 (the head) hosts the rendezvous on ``master_port``; the other nodes connect to it on the
first of ``master_addrs`` that answers.  A node that cannot reach the head within ``timeout_s``
ends its attempt with a message that names the address and port, never a torchrun hanging for
half an hour.

stdlib only, Python >= 3.8.
"""

# ruff: noqa: UP031  (%-formatting on purpose: one style for every Python >= 3.8 the agent meets)
from __future__ import annotations

import errno
import socket
import subprocess
import time
from typing import Callable

from gpuq_base.gpuq_jobspec import NodeSection


def rendezvous(node: NodeSection, master: str) -> tuple[list[str], dict[str, str]]:
    """torchrun's arguments for this node (static rendezvous: node ranks are the controller's, so node 0
    is the host the ledger names, where checkpoints are written) and the environment every node gets
    alike; ``master`` is the head's address this node reaches it on."""
    args = ["--nnodes=%d" % node.nodes, "--node-rank=%d" % node.rank, "--master-addr=%s" % master,
            "--master-port=%d" % node.master_port, "--rdzv-conf=timeout=%d" % max(1, int(node.timeout_s))]
    env = {"MASTER_ADDR": master, "MASTER_PORT": str(node.master_port), "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
    iface = interface_to(master)
    if iface:
        env["GLOO_SOCKET_IFNAME"] = iface
        env["NCCL_SOCKET_IFNAME"] = iface
    return args, env


def port_free(port: int) -> str:
    """"" when this host can listen on ``port`` (node 0, before its rendezvous), else why not."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # as torchrun's store binds it: a previous attempt's connections in TIME_WAIT do not make it taken
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError as e:
            return "rendezvous port %d is taken on this host (%s)" % (port, e.strerror or e)
    return ""


def reach_head(node: NodeSection, log: Callable[[str], None], *, poll_s: float = 1.0) -> tuple[str, str]:
    """Node r > 0: wait until node 0's rendezvous port answers on one of its addresses.  Returns (the
    address that answered, "") or ("", why none did within ``timeout_s``)."""
    port = node.master_port
    deadline = time.monotonic() + node.timeout_s
    last: dict[str, str] = {}
    logged = False
    while True:
        for addr in node.master_addrs:
            why = _connect(addr, port, min(5.0, max(0.5, deadline - time.monotonic())))
            if not why:
                return addr, ""
            last[addr] = why
        if time.monotonic() >= deadline:
            break
        if not logged:
            log("gpuq: node %d waits for node 0's rendezvous port %d (%s)" % (
                node.rank, port, ", ".join("%s: %s" % kv for kv in last.items())))
            logged = True
        time.sleep(poll_s)
    tried = "; ".join("%s:%d %s" % (a, port, w) for a, w in last.items())
    return "", ("node %d could not reach node 0's rendezvous port within %.0f s (%s): node 0 did not start, "
                "or TCP port %d is blocked between the hosts (open the rendezvous ports 20000-50000 between "
                "them, or run the job on one host)" % (node.rank, node.timeout_s, tried, port))


def _connect(addr: str, port: int, timeout: float) -> str:
    try:
        with socket.create_connection((addr, port), timeout=timeout):
            return ""
    except socket.timeout:
        return "timed out"
    except OSError as e:
        if e.errno == errno.ECONNREFUSED:
            return "refused"
        return e.strerror or str(e)


def interface_to(address: str) -> str:
    """The network interface this host uses to reach ``address`` ("" when unknown): the one holding the
    address when it is this host's own, else the route's device (never lo, which other hosts cannot reach)."""
    if not address:
        return ""
    for argv in (["ip", "-o", "-4", "addr", "show", "to", address + "/32"], ["ip", "-o", "route", "get", address]):
        try:
            out = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return ""
        words = out.stdout.decode("utf-8", "replace").split()
        if argv[3] == "addr" and len(words) > 1:
            return words[1].rstrip(":").split("@")[0]
        if "dev" in words and words.index("dev") + 1 < len(words):
            dev = words[words.index("dev") + 1]
            return "" if dev == "lo" else dev
    return ""
