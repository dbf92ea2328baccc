"""~/.ssh/config as OpenSSH reads it, against real OpenSSH servers: ProxyCommand through a bastion,
a jump host's own ProxyJump, ConnectTimeout, IdentitiesOnly and /etc/ssh/ssh_config.

The farm's hosts route only to the root namespace, so a bastion tunnels to its own address (the
path through the bastion is the same as for any target behind it); sshd sees the session coming
from the bastion's address instead of the root namespace's gateway."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.hosts.ssh import SSHHost
from orchestrator.hosts.sshconfig import resolve
from orchestrator.hosts.sshconnect import SSHOptions
from tests.support.testhosts import FarmFactory, HostFarm

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def farm(host_farm_module: FarmFactory) -> HostFarm:
    return host_farm_module(n=1, gpus=1)


def _via(farm: HostFarm, endpoint_name: str, config: Path) -> list[str]:
    endpoint = resolve(endpoint_name, ssh_config=config, system_config=None)
    host = SSHHost(endpoint_name, endpoint, root="/tmp", python="python3",
                   options=SSHOptions(known_hosts=farm.known_hosts, ssh_config=config))
    try:
        return host.run(["sh", "-c", "echo $(hostname) $SSH_CONNECTION"]).stdout.split()
    finally:
        host.close()


def test_proxy_command_through_a_bastion(farm: HostFarm, tmp_path: Path) -> None:
    bastion = target = farm.hosts[0]
    config = tmp_path / "ssh_config"
    ssh = (f"ssh -i {farm.client_key} -o UserKnownHostsFile={farm.known_hosts} -o StrictHostKeyChecking=yes "
           f"-o BatchMode=yes -F /dev/null root@{bastion.address} -W %h:%p")
    config.write_text(f"Host behind\n    HostName {target.address}\n    User root\n"
                      f"    IdentityFile {farm.client_key}\n    ProxyCommand {ssh}\n")
    endpoint = resolve("behind", ssh_config=config, system_config=None)
    assert f"-W {target.address}:22" in endpoint.proxy_command  # %h and %p expanded
    name, client_ip, *_ = _via(farm, "behind", config)
    assert name == target.name
    assert client_ip == bastion.address  # the session came out of the bastion's namespace


def test_a_jump_hosts_own_proxy_jump_is_followed(farm: HostFarm, tmp_path: Path) -> None:
    outer = inner = farm.hosts[0]
    config = tmp_path / "ssh_config"
    key = farm.client_key
    config.write_text(
        f"Host outer\n    HostName {outer.address}\n    User root\n    IdentityFile {key}\n\n"
        f"Host inner\n    HostName {inner.address}\n    User root\n    IdentityFile {key}\n    ProxyJump outer\n\n"
        f"Host behind\n    HostName {outer.address}\n    User root\n    IdentityFile {key}\n    ProxyJump inner\n"
    )
    endpoint = resolve("behind", ssh_config=config, system_config=None)
    assert [j.hostname for j in endpoint.jump] == [outer.address, inner.address]
    name, client_ip, *_ = _via(farm, "behind", config)
    assert name == outer.name and client_ip == inner.address  # outer -> inner -> behind


def test_system_config_is_read_after_the_users_and_first_value_wins(farm: HostFarm, tmp_path: Path) -> None:
    user = tmp_path / "user_config"
    system = tmp_path / "system_config"
    user.write_text("Host box\n    User alice\n    ConnectTimeout 7\n")
    system.write_text(f"Host box\n    HostName {farm.hosts[0].address}\n    User bob\n    Port 2222\n"
                      "    IdentitiesOnly yes\n    IdentityFile /keys/sys\n")
    endpoint = resolve("box", ssh_config=user, system_config=system)
    assert (endpoint.hostname, endpoint.user, endpoint.port) == (farm.hosts[0].address, "alice", 2222)
    assert endpoint.connect_timeout_s == 7.0 and endpoint.identities_only
    assert endpoint.key_files == ("/keys/sys",)


def test_trust_on_first_use_through_a_jump_host_keeps_each_hops_key_its_own(farm: HostFarm, tmp_path: Path) -> None:
    """The bastion (here the same machine on its second port) is recorded under its own endpoint,
    never as the host's key."""
    h = farm.hosts[0]
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host bastion\n    HostName {h.address}\n    Port 2222\n    User root\n    IdentityFile {farm.client_key}\n\n"
        f"Host behind\n    HostName {h.address}\n    User root\n    IdentityFile {farm.client_key}\n"
        "    ProxyJump bastion\n"
    )
    known = tmp_path / "gpuq" / "known_hosts"
    endpoint = resolve("behind", ssh_config=config, system_config=None)
    host = SSHHost("behind", endpoint, root="/tmp", python="python3",
                   options=SSHOptions(known_hosts=known, ssh_config=config, trust_new_host_key=True))
    try:
        assert host.run(["true"]).exit_code == 0
    finally:
        host.close()
    assert host.trusted_keys == [h.host_key_line]
    assert [(hop.port, key) for hop, key in host.trusted_hop_keys] == [(2222, h.host_key_line)]
    assert sorted(line.split()[0] for line in known.read_text().splitlines()) == sorted(
        [h.address, f"[{h.address}]:2222"])
