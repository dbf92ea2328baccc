"""A host whose sshd has no SFTP subsystem (minimal images, Alpine without openssh-sftp-server)
still receives and returns files: they stream over an exec channel, like ``scp -O``."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.core.errors import HostError
from orchestrator.hosts.ssh import SSHHost
from orchestrator.hosts.sshconfig import resolve
from orchestrator.hosts.sshconnect import SSHOptions
from tests.support.testhosts import FarmFactory, HostFarm

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def farm(host_farm_module: FarmFactory) -> HostFarm:
    return host_farm_module(n=1, gpus=1, sftp=False)


@pytest.fixture
def ssh(farm: HostFarm, tmp_path: Path) -> Iterator[SSHHost]:
    config = tmp_path / "ssh_config"
    config.write_text("")
    endpoint = resolve(f"root@{farm.hosts[0].address}", key_file=str(farm.client_key), ssh_config=config)
    host = SSHHost("bare0", endpoint, root="/tmp", python="python3",
                   options=SSHOptions(known_hosts=farm.known_hosts, ssh_config=config))
    yield host
    host.close()


def test_the_host_really_has_no_sftp(farm: HostFarm, ssh: SSHHost) -> None:
    client = ssh._connection()
    with pytest.raises(Exception):  # noqa: B017 - whatever paramiko raises: the subsystem is absent
        client.open_sftp()


def test_put_and_get_round_trip_over_exec(farm: HostFarm, ssh: SSHHost, tmp_path: Path) -> None:
    data = os.urandom(3 * (1 << 20) + 12345)
    src = tmp_path / "bundle.tar"
    src.write_bytes(data)
    remote = "/tmp/no-sftp/it's a dir/bundle $(x).tar"
    ssh.put(src, remote)
    on_host = farm.hosts[0].tmp / "no-sftp" / "it's a dir" / "bundle $(x).tar"
    assert hashlib.sha256(on_host.read_bytes()).hexdigest() == hashlib.sha256(data).hexdigest()
    assert not [p for p in on_host.parent.iterdir() if ".tmp." in p.name]

    back = tmp_path / "back.tar"
    ssh.get(remote, back)
    assert back.read_bytes() == data
    # resume from an offset: the first part is kept, the rest fetched
    partial = tmp_path / "partial.tar"
    partial.write_bytes(data[:1000] + b"junk")
    ssh.get(remote, partial, offset=1000)
    assert partial.read_bytes() == data


def test_missing_files_and_directories_are_host_errors(ssh: SSHHost, tmp_path: Path) -> None:
    with pytest.raises(HostError, match="does not exist"):
        ssh.get("/tmp/nothing-here", tmp_path / "x")
    with pytest.raises(HostError, match="is a directory"):
        ssh.get("/tmp", tmp_path / "y")
    src = tmp_path / "f"
    src.write_bytes(b"x")
    with pytest.raises(HostError, match="cannot write"):
        ssh.put(src, "/proc/no/such/place")
