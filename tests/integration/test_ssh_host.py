"""SSHHost against real OpenSSH servers (the test host farm): the Host contract, then what only SSH has.

The farm's hosts live in their own network namespaces; each routes only to the root namespace, so
the ProxyJump test tunnels through host A to host A's own address (the ``direct-tcpip`` path is the
same as for any target behind a bastion).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.core.errors import HostAuthFailed, HostKeyError, HostUnreachable
from orchestrator.fleet.host_keys import key_fingerprint
from orchestrator.hosts.ssh import SSHHost
from orchestrator.hosts.sshconfig import resolve
from orchestrator.hosts.sshconnect import SSHOptions
from tests.support.testhosts import FarmFactory, HostFarm
from tests.unit import test_hosts_contract as contract

pytestmark = pytest.mark.integration

ECHO_ARGV = "import sys, json; print(json.dumps(sys.argv[1:]))"


@pytest.fixture(scope="module")
def farm(host_farm_module: FarmFactory) -> HostFarm:
    """One host shared by every test here; a test that changes it (sshd stopped, new host key)
    puts it back in a ``finally``."""
    return host_farm_module(n=1, gpus=2)


@pytest.fixture
def no_ssh_config(tmp_path: Path) -> Path:
    """An empty ssh config, so root's own ~/.ssh/config can never change what a test connects to."""
    path = tmp_path / "ssh_config"
    path.write_text("")
    return path


def make_host(farm: HostFarm, ssh_config: Path, *, known_hosts: Path | None = None, root: str = "/root/gpuq",
              **options: object) -> SSHHost:
    h = farm.hosts[0]
    endpoint = resolve(f"root@{h.address}", key_file=str(farm.client_key), ssh_config=ssh_config)
    opts = SSHOptions(known_hosts=known_hosts or farm.known_hosts, ssh_config=ssh_config, **options)  # type: ignore[arg-type]
    return SSHHost("farm0", endpoint, root=root, python="python3", options=opts)


@pytest.fixture
def ssh(farm: HostFarm, no_ssh_config: Path) -> Iterator[SSHHost]:
    host = make_host(farm, no_ssh_config, root=f"/tmp/ssh-test-{uuid.uuid4().hex[:8]}")
    yield host
    host.close()


def in_host_tmp(farm: HostFarm, remote: str) -> Path:
    """The controller-side path of a file under the host's /tmp."""
    assert remote.startswith("/tmp/")
    return farm.hosts[0].tmp / remote[len("/tmp/"):]


# --- the Host contract (tests/unit/test_hosts_contract.py), over real SSH ------------------------------


class TestSSHHostContract(contract.TestHostContract):
    @pytest.fixture
    def host(self, ssh: SSHHost) -> SSHHost:  # type: ignore[override]
        return ssh


# --- commands ------------------------------------------------------------------------------------------


HOSTILE = [
    "two words", "it's", 'say "hi"', "$(touch /tmp/pwned)", "`touch /tmp/pwned`", "a; touch /tmp/pwned",
    "x && touch /tmp/pwned", "| touch /tmp/pwned", "> /tmp/pwned", "line1\nline2\n", "", " ", "*", "~", "$HOME",
    "back\\slash", "--", "-c", "tab\there", "ünïcødé ✓", "'; touch /tmp/pwned; '", "\"$(touch /tmp/pwned)\"",
]


def test_argv_reaches_the_remote_program_literally(farm: HostFarm, ssh: SSHHost) -> None:
    pwned = farm.hosts[0].tmp / "pwned"
    pwned.unlink(missing_ok=True)
    result = ssh.run(["python3", "-c", ECHO_ARGV, *HOSTILE])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == HOSTILE
    assert not pwned.exists()
    marker = f"/tmp/marker-{uuid.uuid4().hex[:8]}"  # the check above looked at the host's real /tmp
    assert ssh.run(["touch", marker]).exit_code == 0 and in_host_tmp(farm, marker).exists()


def test_stdin_arrives_intact(ssh: SSHHost) -> None:
    payload = os.urandom(5_000_000)
    result = ssh.run(["sha256sum"], stdin=payload, timeout=60)
    assert result.stdout.split()[0] == hashlib.sha256(payload).hexdigest()
    # a command that echoes its input while reading it: stdin must be fed between reads
    text = os.urandom(2_500_000).hex()
    started = time.monotonic()
    echoed = ssh.run(["cat"], stdin=text.encode(), timeout=30)
    assert echoed.stdout == text and time.monotonic() - started < 25


def test_large_output_is_complete(ssh: SSHHost) -> None:
    """OpenSSH may send the exit status before the last output: nothing may be cut off."""
    script = "head -c 3000000 /dev/zero | tr '\\0' x; printf END; head -c 200000 /dev/zero | tr '\\0' y >&2"
    for _ in range(20):  # the race hit about one run in four before the fix
        result = ssh.run(["sh", "-c", script])
        assert (len(result.stdout), len(result.stderr)) == (3_000_003, 200_000)
        assert result.stdout.endswith("END")


def test_exit_codes_pass_through(ssh: SSHHost) -> None:
    for code in (0, 1, 2, 3, 42, 126, 255):
        assert ssh.run(["sh", "-c", f"exit {code}"]).exit_code == code
    # killed by a signal: 128 + N, as a shell reports it (not a dropped connection)
    assert ssh.run(["sh", "-c", "kill -TERM $$"]).exit_code == 143
    # a program that exits 127 itself is not "missing"
    assert ssh.run(["sh", "-c", "echo gone >&2; exit 127"]).exit_code == 127


def test_timeout_raises_unreachable_and_keeps_the_connection(ssh: SSHHost) -> None:
    assert ssh.run(["true"]).exit_code == 0
    started = time.monotonic()
    with pytest.raises(HostUnreachable, match="did not finish within"):
        ssh.run(["sleep", "30"], timeout=1)
    assert time.monotonic() - started < 5
    assert ssh.run(["echo", "still here"]).stdout == "still here\n"
    assert ssh.connects == 1


def test_one_connection_for_many_commands_and_transfers(farm: HostFarm, ssh: SSHHost, tmp_path: Path) -> None:
    for i in range(20):
        assert ssh.run(["echo", str(i)]).stdout == f"{i}\n"
    src = tmp_path / "up.bin"
    src.write_bytes(os.urandom(100_000))
    ssh.put(src, ssh.path("f.bin"))
    ssh.get(ssh.path("f.bin"), tmp_path / "down.bin")
    assert (tmp_path / "down.bin").read_bytes() == src.read_bytes()
    assert (ssh.connects, ssh.round_trips) == (1, 20)


# --- files -----------------------------------------------------------------------------------------------


def test_get_resumes_from_an_offset(farm: HostFarm, ssh: SSHHost, tmp_path: Path) -> None:
    data = os.urandom(3_000_000 + 123)
    remote = f"/tmp/resume-{uuid.uuid4().hex[:8]}.bin"
    in_host_tmp(farm, remote).write_bytes(data)
    for offset in (1, 1_048_576, 2_999_999, len(data)):
        local = tmp_path / f"part-{offset}.bin"
        # a partial copy, plus junk past the offset (an interrupted write): cut, then the rest appended
        local.write_bytes(data[:offset] + b"junk" * 10)
        ssh.get(remote, local, offset=offset)
        assert hashlib.sha256(local.read_bytes()).hexdigest() == hashlib.sha256(data).hexdigest(), offset
    fresh = tmp_path / "fresh.bin"
    fresh.write_bytes(b"old contents, longer than nothing")
    ssh.get(remote, fresh)
    assert fresh.read_bytes() == data


def test_put_replaces_atomically(farm: HostFarm, ssh: SSHHost, tmp_path: Path) -> None:
    remote = f"/tmp/atomic-{uuid.uuid4().hex[:8]}/deep/target.bin"
    seen = in_host_tmp(farm, remote)
    old, new = os.urandom(2_000_000), os.urandom(1_500_000)
    (tmp_path / "old").write_bytes(old)
    (tmp_path / "new").write_bytes(new)
    ssh.put(tmp_path / "old", remote)  # creates the missing directories
    assert seen.read_bytes() == old
    with open(seen, "rb") as reader:  # a reader of the old file keeps a whole old file
        inode = os.fstat(reader.fileno()).st_ino
        ssh.put(tmp_path / "new", remote)
        assert reader.read() == old
    assert seen.read_bytes() == new
    assert seen.stat().st_ino != inode  # renamed over, never rewritten in place
    assert sorted(p.name for p in seen.parent.iterdir()) == ["target.bin"]  # no temp file left


# --- host keys -------------------------------------------------------------------------------------------


def test_unknown_host_key_is_refused_unless_trusted_on_first_use(farm: HostFarm, no_ssh_config: Path,
                                                                 tmp_path: Path) -> None:
    known = tmp_path / "gpuq-home" / "known_hosts"
    h = farm.hosts[0]
    strict = make_host(farm, no_ssh_config, known_hosts=known)
    with pytest.raises(HostKeyError, match="unknown SSH host key") as info:
        strict.run(["true"])
    assert key_fingerprint(h.host_key_line) in str(info.value)
    assert not known.exists() and strict.connects == 0

    tofu = make_host(farm, no_ssh_config, known_hosts=known, trust_new_host_key=True)
    try:
        assert tofu.run(["hostname"]).stdout.strip() == h.name
        assert tofu.trusted_keys == [h.host_key_line]
    finally:
        tofu.close()
    assert known.read_text() == f"{h.address} {h.host_key_line}\n"
    assert stat.S_IMODE(known.stat().st_mode) == 0o600
    # recorded: a strict host now connects
    strict = make_host(farm, no_ssh_config, known_hosts=known)
    try:
        assert strict.run(["true"]).exit_code == 0
    finally:
        strict.close()


def test_changed_host_key_is_refused_and_the_old_entry_kept(farm: HostFarm, no_ssh_config: Path,
                                                            tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    shutil.copyfile(farm.known_hosts, known)
    pinned = known.read_text()
    old_fp = key_fingerprint(farm.hosts[0].host_key_line)
    try:
        new_fp = key_fingerprint(farm.regenerate_host_key(0))
        assert new_fp != old_fp
        for trust_new in (False, True):  # trust on first use never covers a changed key
            host = make_host(farm, no_ssh_config, known_hosts=known, trust_new_host_key=trust_new)
            with pytest.raises(HostKeyError) as info:
                host.run(["true"])
            message = str(info.value)
            assert "CHANGED" in message and old_fp in message and new_fp in message
            assert host.connects == 0
        assert known.read_text() == pinned
    finally:
        farm.write_known_hosts()  # pin the new key for the rest of the module


def test_a_key_the_host_does_not_know_is_auth_failure(farm: HostFarm, no_ssh_config: Path, tmp_path: Path) -> None:
    stranger = tmp_path / "stranger_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    endpoint = resolve(f"root@{farm.hosts[0].address}", key_file=str(stranger), ssh_config=no_ssh_config)
    host = SSHHost("farm0", endpoint, root="/root", python="python3",
                   options=SSHOptions(known_hosts=farm.known_hosts, ssh_config=no_ssh_config))
    with pytest.raises(HostAuthFailed, match="refused"):
        host.run(["true"])


# --- losing the host, and getting it back ----------------------------------------------------------------


def test_sshd_down_is_unreachable_after_bounded_retries_then_the_same_object_reconnects(
        farm: HostFarm, no_ssh_config: Path) -> None:
    sleeps: list[float] = []
    host = make_host(farm, no_ssh_config, sleep=sleeps.append)
    try:
        assert host.run(["true"]).exit_code == 0
        farm.stop_sshd(0)
        try:
            started = time.monotonic()
            with pytest.raises(HostUnreachable, match="cannot connect"):
                host.run(["true"])
            assert time.monotonic() - started < 5
            # 3 tries: two backoffs, exponential with jitter (base 0.5 s, half to full)
            assert len(sleeps) == 2
            assert 0.25 <= sleeps[0] <= 0.5 and 0.5 <= sleeps[1] <= 1.0
        finally:
            farm.start_sshd(0)
        assert host.run(["echo", "back"]).stdout == "back\n"
        assert host.connects == 2
    finally:
        host.close()


def test_a_cut_connection_is_replaced_on_the_next_call(farm: HostFarm, ssh: SSHHost, tmp_path: Path) -> None:
    src = tmp_path / "f.txt"
    src.write_text("payload")
    assert ssh.run(["true"]).exit_code == 0
    ssh.put(src, ssh.path("f.txt"))
    assert farm.cut_connections(0) >= 1
    assert ssh.run(["echo", "again"]).stdout == "again\n"  # transparently on a new connection
    assert ssh.connects == 2
    assert farm.cut_connections(0) >= 1
    ssh.get(ssh.path("f.txt"), tmp_path / "back.txt")  # files too
    assert (tmp_path / "back.txt").read_text() == "payload"
    assert ssh.connects == 3


# --- ProxyJump -------------------------------------------------------------------------------------------


def test_proxy_jump_tunnels_through_the_jump_host(farm: HostFarm, tmp_path: Path) -> None:
    h = farm.hosts[0]
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host jumpbox\n    HostName {h.address}\n    User root\n    IdentityFile {farm.client_key}\n\n"
        f"Host behind\n    HostName {h.address}\n    User root\n    IdentityFile {farm.client_key}\n"
        "    ProxyJump jumpbox\n"
    )
    endpoint = resolve("behind", ssh_config=config)
    assert [j.hostname for j in endpoint.jump] == [h.address]
    host = SSHHost("behind", endpoint, root=f"/tmp/jump-{uuid.uuid4().hex[:8]}", python="python3",
                   options=SSHOptions(known_hosts=farm.known_hosts, ssh_config=config))
    try:
        # seen from sshd, the session comes from the jump host's side of the tunnel, not from us
        via = host.run(["sh", "-c", "echo $SSH_CONNECTION"]).stdout.split()
        assert via[0] == h.address and via[2] == h.address, via
        direct = make_host(farm, config)
        try:
            assert direct.run(["sh", "-c", "echo $SSH_CONNECTION"]).stdout.split()[0] == h.gateway
        finally:
            direct.close()
        assert json.loads(host.run(["python3", "-c", ECHO_ARGV, *HOSTILE]).stdout) == HOSTILE
        src = tmp_path / "through.bin"
        src.write_bytes(os.urandom(500_000))
        host.put(src, host.path("through.bin"))
        host.get(host.path("through.bin"), tmp_path / "back.bin")
        assert (tmp_path / "back.bin").read_bytes() == src.read_bytes()
        assert host.connects == 1
    finally:
        host.close()
    # the jump host's key is verified like any other
    empty = tmp_path / "empty_known_hosts"
    strict = SSHHost("behind", endpoint, root="/tmp", python="python3",
                     options=SSHOptions(known_hosts=empty, ssh_config=config))
    with pytest.raises(HostKeyError, match="unknown SSH host key"):
        strict.run(["true"])
    assert not empty.exists()


def test_a_transfer_over_a_dead_link_fails_within_the_stall_limit(farm: HostFarm, no_ssh_config: Path,
                                                                  tmp_path: Path) -> None:
    host = make_host(farm, no_ssh_config, transfer_stall_s=2.0, connect_tries=1)
    remote = f"/tmp/stall-{uuid.uuid4().hex[:8]}.bin"
    in_host_tmp(farm, remote).write_bytes(os.urandom(1 << 20))
    local = tmp_path / "copy.bin"
    host.get(remote, local)  # connection and SFTP session are up
    farm.set_link(0, False)
    try:
        with pytest.raises(HostUnreachable) as err:
            host.get(remote, local)
        # the channel's stall timer ended it (a socket timeout without an errno), not TCP giving up
        # after its minutes of retransmissions ("[Errno 110] Connection timed out")
        assert str(err.value).endswith(": timed out"), err.value
        cause = err.value.__cause__
        assert isinstance(cause, TimeoutError) and cause.errno is None, repr(cause)
    finally:
        farm.set_link(0, True)
    host.get(remote, local)  # a fresh connection once the link is back
    assert local.read_bytes() == in_host_tmp(farm, remote).read_bytes()
    host.close()
