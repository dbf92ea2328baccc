"""Machines gpuq runs commands on.  Only hosts/ssh.py (later) imports paramiko/fabric."""

from orchestrator.hosts.base import Host
from orchestrator.hosts.local import LocalHost

__all__ = ["Host", "LocalHost"]
