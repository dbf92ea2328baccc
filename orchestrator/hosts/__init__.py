"""Machines gpuq runs commands on (the Host seam: local, SSH); imports core alone.

Only the SSH modules (ssh, sshconnect, sshconfig, sshexec, sshcommand, knownhosts) import paramiko.
"""

from orchestrator.hosts.base import Host
from orchestrator.hosts.local import LocalHost

__all__ = ["Host", "LocalHost"]
