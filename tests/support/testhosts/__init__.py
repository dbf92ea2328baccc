"""A farm of real OpenSSH "GPU hosts" for integration tests (needs root, sshd, iproute2, util-linux).

Each host is a faithful stand-in for a rented GPU container:

- its own **network namespace** ``gpuq-th-<farm>-<i>`` joined to the root namespace by a veth pair
  (root side ``gqth<farm>h<i>``, host side ``eth0``) on a private /30 of 10.231.0.0/16; sshd listens
  on the host side address, port 22, and nowhere else;
- its own **PID, mount, UTS and IPC namespaces**: ``ps`` inside sees only the host, the hostname is the
  host's name, /dev is private (a tmpfs with the machine's null/zero/random/tty/pts nodes bound in,
  a private /dev/shm, and fake GPU nodes /dev/nvidia0.., /dev/nvidiactl, /dev/nvidia-uvm that open
  like /dev/null, so ``fuser`` sees who holds a "GPU"), and per-host directories are bound over
  ``/root``, ``/tmp``, ``/run`` and ``/usr/local/bin`` (hosts never share files).  PID 1 is
  ``hostinit.py``, which runs sshd and reaps orphans; SIGKILL of it from the root namespace
  (``preempt``) kills the whole host;
- ``/usr/local/bin/python3`` and ``python`` run the test run's interpreter (its directories are bound
  into the per-host dirs at their real paths, so a venv under /tmp or a pyenv under /root still works),
  ``/usr/local/bin/nvidia-smi`` is ``fake_nvidia_smi.py`` over a per-host JSON GPU state, and
  ``/usr/local/bin/dmesg`` is ``fake_dmesg.py`` over a per-host kernel-log fixture (``dmesg.log``;
  ``dmesg.log.unreadable`` makes it fail like a restricted kernel log);
- a farm-wide authorized ed25519 client key and a pinned ed25519 host key per host;
- hosts reach only their own gateway, unless the farm is **routed** (``routed=True``): then each host
  routes 10.231.0.0/16 via its gateway and the root namespace forwards packets that arrive on the
  farm's veths (``net.ipv4.conf.<veth>.forwarding=1``, per interface: the machine's
  ``net.ipv4.ip_forward`` is never touched, and the setting vanishes with the veth), so the hosts of
  the farm reach each other (a Slurm cluster: tests/support/slurmcluster/);
- ``sshd_extra``: lines appended to every host's sshd_config (``set_sshd_extra`` changes one host's
  later and restarts its sshd), e.g. ``SetEnv SLURM_CONF=...`` for the commands sessions run.

Files outside the per-host dirs (/etc, /usr, /var/tmp, ...) are the machine's own, shared by every
host: a directory there can serve as a cluster's shared filesystem; ``attach_dir`` records one in
farm.json so that teardown (and ``down`` after a crash) removes it.

Controller-side layout of a farm (``base_dir``)::

    farm.json              farm id, hosts (netns, veth, addresses, init pid + start time), attached dirs:
                           enough to tear down after a crash (``scripts/testhosts.py down --dir D``)
    client_ed25519[.pub]   the authorized client key;  known_hosts: "<address> ssh-ed25519 AAAA..."
    host-<i>/root/         the host's /root (.ssh/authorized_keys)
    host-<i>/tmp/          the host's /tmp
    host-<i>/bin/          the host's /usr/local/bin (python3, python, nvidia-smi, links to the real ones)
    host-<i>/run/          the host's /run: sshd/ (privsep), sshd.pid, gpuq-testhost/ (sshd_config,
                           host key, gpus.json, fake_nvidia_smi.py, dmesg.log, fake_dmesg.py)
    host-<i>/init.json     what hostinit does;  host-<i>/init.log: hostinit's and sshd's stderr

Everything is torn down by recorded pid (checked against its start time) and namespace name.

The package: ``host.py`` (a host's layout, ``TestHost``, its GPUs and sshd_config), ``procs.py`` (/proc,
signals, commands), ``farm.py`` (``HostFarm``: start, teardown, SSH) over its bases ``building.py`` (a
host's namespaces, dirs, keys and PID 1), ``faults.py``, ``rentals.py`` and ``gpus.py`` (GPU state,
kernel log, GPU holders).
"""
from __future__ import annotations

from tests.support.testhosts.building import list_netns, used_slots
from tests.support.testhosts.farm import FarmFactory, HostFarm
from tests.support.testhosts.gpus import fake_dmesg_flag
from tests.support.testhosts.host import (
    ALT_SSH_PORT,
    COVERED,
    FAKE_DMESG,
    FAKE_NVSMI,
    H100_MIB,
    H100_NAME,
    HOSTINIT,
    IN_HOST,
    INSTALL_HINT,
    LOCAL_BIN,
    LOCK_FILE,
    NETNS_PREFIX,
    SLOTS,
    SSHD,
    SSHD_COMMS,
    SSHD_CONFIG,
    SUBNET,
    SUPPORT,
    VETH_PREFIX,
    TestHost,
    default_gpus,
    requirements_problem,
)
from tests.support.testhosts.procs import _atomic_write, _kill, _tail, _wait, all_pids, pid_ns, proc_stat

__all__ = [
    "ALT_SSH_PORT",
    "COVERED",
    "FAKE_DMESG",
    "FAKE_NVSMI",
    "H100_MIB",
    "H100_NAME",
    "HOSTINIT",
    "INSTALL_HINT",
    "IN_HOST",
    "LOCAL_BIN",
    "LOCK_FILE",
    "NETNS_PREFIX",
    "SLOTS",
    "SSHD",
    "SSHD_COMMS",
    "SSHD_CONFIG",
    "SUBNET",
    "SUPPORT",
    "VETH_PREFIX",
    "FarmFactory",
    "HostFarm",
    "TestHost",
    "_atomic_write",
    "_kill",
    "_tail",
    "_wait",
    "all_pids",
    "default_gpus",
    "fake_dmesg_flag",
    "list_netns",
    "pid_ns",
    "proc_stat",
    "requirements_problem",
    "used_slots",
]
