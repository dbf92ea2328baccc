"""What stands behind a fake pod or instance: the host backend seam.

The fake clouds call a :class:`HostBackend` whenever the machine behind a pod/instance appears,
loses its workload or is deleted.  The default :class:`AddressBackend` only hands out addresses
(TEST-NET-3, 203.0.113.0/24, which routes nowhere); a later backend can start a real OpenSSH host in
a network namespace (tests/support/testhosts/) so that SSH, signals and probes run end to end.

Backends are called with the fake's state lock held: keep them quick, or do the slow part in the
background and let the fake's readiness polls (``slow_ready``) cover the start-up time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol


class HostBackend(Protocol):
    def provision(self, instance_id: str, gpu_count: int) -> tuple[str, int]:
        """Bring up (or back up) the machine for ``instance_id`` with ``gpu_count`` GPUs visible and
        return its public SSH endpoint ``(ip, port)``.  Called on create and on every resume/restart;
        may return a new endpoint each time (RunPod changes the public port on every start).  Lambda
        exposes no port in its API: a backend behind the fake Lambda must serve SSH on port 22."""
        ...

    def preempt(self, instance_id: str, grace_s: float) -> None:
        """Take the machine away with ``grace_s`` seconds of warning: SIGTERM to every workload process
        group, SIGKILL ``grace_s`` later; local volume disk kept, container state lost.  Used for a spot
        outbid (grace about 5 s), a user stop and a platform stop."""
        ...

    def destroy(self, instance_id: str) -> None:
        """Delete the machine and its disks (terminate).  Idempotent."""
        ...


def give_instance(backend: HostBackend, instance_id: str, env: dict[str, str],
                  tools: dict[str, Callable[[str], str]]) -> None:
    """What the provider puts inside the instance (tests/support/fakecloud/instance_tools.py): its container
    environment ``env`` and CLI ``tools`` (name -> the script's text for a host that reaches the provider's API
    from the given gateway address).  Called before the instance's first ``provision``; a backend with no
    machine behind it (AddressBackend) has nowhere to put them."""
    hook = getattr(backend, "in_instance", None)
    if hook is not None:
        hook(instance_id, env, tools)


class AddressBackend:
    """The default backend: no machine at all, a distinct fake address per instance and a new port per
    (re)provision.  ``events`` records every call for assertions."""

    def __init__(self, first_port: int = 22000) -> None:
        self._lock = threading.Lock()
        self._next_port = first_port
        self._hosts: dict[str, str] = {}
        self.events: list[tuple[str, str, float]] = []

    def provision(self, instance_id: str, gpu_count: int) -> tuple[str, int]:
        with self._lock:
            ip = self._hosts.get(instance_id)
            if ip is None:
                ip = f"203.0.113.{len(self._hosts) % 250 + 2}"
                self._hosts[instance_id] = ip
            port = self._next_port
            self._next_port += 1
            self.events.append(("provision", instance_id, float(gpu_count)))
            return ip, port

    def preempt(self, instance_id: str, grace_s: float) -> None:
        with self._lock:
            self.events.append(("preempt", instance_id, grace_s))

    def destroy(self, instance_id: str) -> None:
        with self._lock:
            self._hosts.pop(instance_id, None)
            self.events.append(("destroy", instance_id, 0.0))
