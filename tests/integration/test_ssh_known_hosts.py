"""Which host keys an SSHHost trusts, against a real OpenSSH server: gpuq's known_hosts wins over the
user's, ``@revoked`` keys are refused, ``@cert-authority`` lines never crash, and a host printing
without end is stopped (docs/security.md)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import paramiko
import pytest

from orchestrator.core.errors import HostError, HostKeyError
from orchestrator.fleet.host_keys import key_fingerprint
from orchestrator.hosts.ssh import SSHHost
from tests.conftest import ROOT
from tests.integration.test_ssh_host import make_host
from tests.support.testhosts import FarmFactory, HostFarm

pytestmark = pytest.mark.integration

OTHER_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"


@pytest.fixture(scope="module")
def farm(host_farm_module: FarmFactory) -> HostFarm:
    return host_farm_module(n=1, gpus=1)


@pytest.fixture
def no_ssh_config(tmp_path: Path) -> Path:
    path = tmp_path / "ssh_config"
    path.write_text("")
    return path


@pytest.fixture
def user_known_hosts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    return home / ".ssh" / "known_hosts"


def _run_true(host: SSHHost) -> int:
    try:
        return host.run(["true"]).exit_code
    finally:
        host.close()


def test_cert_authority_and_revoked_lines_of_other_hosts_do_not_break_a_connection(
        farm: HostFarm, no_ssh_config: Path, user_known_hosts: Path) -> None:
    user_known_hosts.write_text(f"@cert-authority *.corp.example {OTHER_KEY}\n@revoked * {OTHER_KEY}\n"
                                "garbage line\n")
    assert _run_true(make_host(farm, no_ssh_config)) == 0


def test_a_revoked_host_key_is_refused_even_when_pinned(farm: HostFarm, no_ssh_config: Path,
                                                        user_known_hosts: Path) -> None:
    h = farm.hosts[0]
    user_known_hosts.write_text(f"@revoked * {h.host_key_line}\n")
    for trust_new in (False, True):
        host = make_host(farm, no_ssh_config, trust_new_host_key=trust_new)
        with pytest.raises(HostKeyError, match="@revoked") as info:
            host.run(["true"])
        assert key_fingerprint(h.host_key_line) in str(info.value)


def test_certificate_only_trust_is_refused_with_a_clear_message(farm: HostFarm, no_ssh_config: Path,
                                                                user_known_hosts: Path, tmp_path: Path) -> None:
    h = farm.hosts[0]
    user_known_hosts.write_text(f"@cert-authority {h.address} {OTHER_KEY}\n")
    known = tmp_path / "gpuq" / "known_hosts"
    host = make_host(farm, no_ssh_config, known_hosts=known, trust_new_host_key=True)
    with pytest.raises(HostKeyError, match="@cert-authority"):
        host.run(["true"])
    assert not known.exists()


def test_gpuqs_own_known_hosts_wins_over_a_stale_user_entry(farm: HostFarm, no_ssh_config: Path,
                                                            user_known_hosts: Path) -> None:
    """`gpuq hosts trust` re-pins a changed key in gpuq's file; the user's stale line must not overrule it."""
    user_known_hosts.write_text(f"{farm.hosts[0].address} {OTHER_KEY}\n")
    assert _run_true(make_host(farm, no_ssh_config)) == 0


def test_a_changed_key_message_never_prefills_the_offered_fingerprint(farm: HostFarm, no_ssh_config: Path,
                                                                      user_known_hosts: Path, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(f"{farm.hosts[0].address} {OTHER_KEY}\n")
    host = make_host(farm, no_ssh_config, known_hosts=known)
    with pytest.raises(HostKeyError, match="CHANGED") as info:
        host.run(["true"])
    message = str(info.value)
    offered = key_fingerprint(farm.hosts[0].host_key_line)
    assert f"--fingerprint {offered}" not in message
    assert "provider" in message and "--fingerprint <" in message


def test_endless_output_is_cut_at_the_cap_with_a_clear_error(farm: HostFarm, no_ssh_config: Path,
                                                            user_known_hosts: Path) -> None:
    host = make_host(farm, no_ssh_config, max_output_bytes=1 << 20)
    try:
        with pytest.raises(HostError, match="more than 1 MiB"):
            host.run(["sh", "-c", "yes gpuq | head -c 5000000"])
        assert host.run(["echo", "still here"]).stdout == "still here\n"
    finally:
        host.close()


def test_a_channel_that_cannot_be_closed_never_hides_the_hosts_error(farm: HostFarm, no_ssh_config: Path,
                                                                      user_known_hosts: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """paramiko raises EOFError from Channel.close when the close cannot be sent; closing after the
    output cap must still end in the cap's HostError (a bare EOFError became "aborted" in CI)."""
    real_close = paramiko.Channel.close
    closes: list[tuple[object, int]] = []  # (transport, channel id): any Channel in this process may close

    def close_then_fail(chan: paramiko.Channel) -> None:
        real_close(chan)
        closes.append((chan.get_transport(), chan.get_id()))
        raise EOFError()

    host = make_host(farm, no_ssh_config, max_output_bytes=1 << 20)
    try:
        monkeypatch.setattr(paramiko.Channel, "close", close_then_fail)
        with pytest.raises(HostError, match="more than 1 MiB"):
            host.run(["sh", "-c", "yes gpuq | head -c 5000000"])
        assert host.run(["echo", "still here"]).stdout == "still here\n"
        # both commands' channels went through the failing close (a channel of an earlier test's connection
        # collected meanwhile closes too: only this host's connection counts)
        assert host._client is not None
        mine = host._client.get_transport()
        assert len({cid for transport, cid in closes if transport is mine}) == 2
    finally:
        monkeypatch.undo()
        host.close()


def test_known_hosts_edits_are_locked_across_processes(tmp_path: Path) -> None:
    """A second process cannot take the lock while this one holds it."""
    from orchestrator.hosts.knownhosts import locked

    known = tmp_path / "known_hosts"
    probe = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR); "
             "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)")
    with locked(known):
        busy = subprocess.run(["python3", "-c", probe, str(known) + ".lock"], capture_output=True)
        assert busy.returncode != 0 and b"BlockingIOError" in busy.stderr
    free = subprocess.run(["python3", "-c", probe, str(known) + ".lock"], capture_output=True)
    assert free.returncode == 0


RACER = r"""
import sys, threading, time
from pathlib import Path
from types import SimpleNamespace

import paramiko

from orchestrator.fleet.host_keys import forget_keys
from orchestrator.hosts.knownhosts import TrustPolicy, load_trust
from orchestrator.hosts.sshconfig import Endpoint

role, home, start, rounds = sys.argv[1], Path(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
known = home / "known_hosts"
key = paramiko.RSAKey.generate(1024)
settings = SimpleNamespace(home=home)
while time.time() < start:  # both processes begin together
    time.sleep(0.001)
for i in range(rounds):
    host = f"[10.9.{i // 250}.{i % 250}]:2222" if role == "tofu" else "[10.8.0.1]:2222"
    policy = TrustPolicy(host, known, True, threading.Lock(), load_trust(known, home / "user_known_hosts"))
    policy.missing_host_key(paramiko.SSHClient(), host, key)  # trust on first use: append, locked
    if role == "churn":
        assert forget_keys(settings, Endpoint(hostname="10.8.0.1", port=2222)) == 1  # read, rewrite, replace
"""


def test_trust_on_first_use_in_one_process_survives_rewrites_in_another(tmp_path: Path) -> None:
    """Two gpuq processes on one known_hosts: one trusts new hosts (append), the other keeps adding and
    forgetting a key (read-modify-write, as `gpuq down` and `gpuq hosts trust` do).  Every entry the
    first one recorded must be there at the end; without the cross-process lock the rewrite drops some."""
    rounds = 300
    script = tmp_path / "racer.py"
    script.write_text(RACER)
    start = time.time() + 3.0  # after both interpreters have imported paramiko
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, str(script), role, str(tmp_path), str(start), str(rounds)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for role in ("tofu", "churn")]
    try:
        outs = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], outs
    lines = (tmp_path / "known_hosts").read_text().splitlines()
    recorded = {line.split()[0] for line in lines}
    missing = [f"[10.9.{i // 250}.{i % 250}]:2222" for i in range(rounds)
               if f"[10.9.{i // 250}.{i % 250}]:2222" not in recorded]
    assert not missing, f"{len(missing)} trusted entries lost, e.g. {missing[:3]}"
    assert "[10.8.0.1]:2222" not in recorded and len(lines) == rounds
