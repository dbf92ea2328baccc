"""hosts.sshconfig.resolve: ~/.ssh/config aliases and targets, the way OpenSSH reads them."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.core.errors import HostError
from orchestrator.hosts.sshconfig import known_hosts_key, resolve

CONFIG = """
Host bastion
    HostName 10.0.0.1
    User jump
    Port 2200

Host gpu-*
    User trainer
    IdentityFile ~/.ssh/gpu_key
    ProxyJump bastion

Host gpu-a
    HostName 192.168.7.10

Host loop
    HostName gpu-a
    ProxyJump loop
"""


@pytest.fixture
def cfg(tmp_path: Path) -> Path:
    path = tmp_path / "config"
    path.write_text(CONFIG)
    return path


def test_plain_targets(cfg: Path) -> None:
    ep = resolve("root@10.1.2.3", ssh_config=cfg)
    assert (ep.hostname, ep.port, ep.user, ep.jump) == ("10.1.2.3", 22, "root", ())
    assert resolve("ubuntu@host.example:2222", ssh_config=cfg).port == 2222
    assert resolve("u@[fe80::1]:2022", ssh_config=cfg).hostname == "fe80::1"
    assert resolve("u@10.1.2.3", port=2201, ssh_config=cfg).port == 2201  # the flag wins


def test_alias_with_proxy_jump(cfg: Path) -> None:
    ep = resolve("gpu-a", ssh_config=cfg)
    assert (ep.hostname, ep.user, ep.port) == ("192.168.7.10", "trainer", 22)
    assert ep.key_files == (str(Path("~/.ssh/gpu_key").expanduser()),)
    assert len(ep.jump) == 1
    assert (ep.jump[0].hostname, ep.jump[0].user, ep.jump[0].port) == ("10.0.0.1", "jump", 2200)
    assert resolve("me@gpu-a", key_file="/k", ssh_config=cfg).user == "me"
    assert resolve("me@gpu-a", key_file="/k", ssh_config=cfg).key_files == ("/k",)


def test_proxy_jump_loop_is_refused(cfg: Path) -> None:
    with pytest.raises(HostError, match="ProxyJump chain"):
        resolve("loop", ssh_config=cfg)


def test_empty_target_is_refused(cfg: Path) -> None:
    with pytest.raises(HostError, match="no address"):
        resolve("root@", ssh_config=cfg)


def test_known_hosts_key_uses_brackets_off_port_22() -> None:
    assert known_hosts_key("10.0.0.5", 22) == "10.0.0.5"
    assert known_hosts_key("10.0.0.5", 2222) == "[10.0.0.5]:2222"
