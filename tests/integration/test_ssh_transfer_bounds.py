"""Downloads never read past the size the caller expects (a manifest's), over SFTP and over the
exec-channel fallback; both report progress for the CLI's bars."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.core.errors import HostError
from orchestrator.hosts.local import LocalHost
from orchestrator.hosts.ssh import SSHHost
from orchestrator.hosts.sshconfig import resolve
from orchestrator.hosts.sshconnect import SSHOptions
from tests.support.testhosts import FarmFactory

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", params=["sftp", "exec", "system-ssh"])
def ssh(request: pytest.FixtureRequest, host_farm_module: FarmFactory, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    farm = host_farm_module(n=1, gpus=1, sftp=request.param != "exec")
    config = tmp_path_factory.mktemp("cfg") / "ssh_config"
    config.write_text("")
    endpoint = resolve(f"root@{farm.hosts[0].address}", key_file=str(farm.client_key), ssh_config=config,
                       system_config=None)
    host = SSHHost("bound0", endpoint, root="/tmp", python="python3",
                   options=SSHOptions(known_hosts=farm.known_hosts, ssh_config=config,
                                      system_ssh=request.param == "system-ssh", system_ssh_min_bytes=0))
    yield host
    host.close()


def test_a_file_larger_than_expected_is_refused_and_not_read_past_the_size(ssh: SSHHost, tmp_path: Path) -> None:
    src = tmp_path / "big.bin"
    data = os.urandom(3 << 20)
    src.write_bytes(data)
    seen: list[int] = []
    ssh.put(src, "/tmp/bounds/big.bin", progress=seen.append)
    assert seen and seen[-1] == len(data) and seen == sorted(seen)
    dst = tmp_path / "back.bin"
    with pytest.raises(HostError, match="more than the 1000 expected"):
        ssh.get("/tmp/bounds/big.bin", dst, size=1000)
    assert not dst.exists() or dst.stat().st_size <= 1000
    got: list[int] = []
    ssh.get("/tmp/bounds/big.bin", dst, size=len(data), progress=got.append)
    assert dst.read_bytes() == data and got[-1] == len(data)
    assert ssh.system_transfers == (2 if ssh.options.system_ssh else 0)  # the put and the whole get


def test_the_local_host_honours_the_same_bound(tmp_path: Path) -> None:
    host = LocalHost(tmp_path)
    big = tmp_path / "big.bin"
    big.write_bytes(b"x" * 5000)
    with pytest.raises(HostError, match="more than the 10 expected"):
        host.get(str(big), tmp_path / "out.bin", size=10)
