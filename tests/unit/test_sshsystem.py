"""The system ssh client is used only with host-key checks as strict as paramiko's (hosts/sshsystem.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import paramiko
import pytest

from orchestrator.hosts import sshsystem
from orchestrator.hosts.sshconfig import Endpoint


@pytest.fixture(scope="module")
def key() -> paramiko.PKey:
    return paramiko.ECDSAKey.generate()


def _line(host: str, key: paramiko.PKey, marker: str = "") -> str:
    return f"{marker}{host} {key.get_name()} {key.get_base64()}\n".lstrip()


@pytest.fixture(autouse=True)
def no_user_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr("shutil.which", lambda _name: "/usr/bin/ssh")


def _argv(tmp_path: Path, text: str, endpoint: Endpoint) -> list[str] | None:
    known = tmp_path / "known_hosts"
    known.write_text(text)
    return sshsystem.system_ssh(endpoint, known, connect_timeout_s=5)


ENDPOINT = Endpoint(hostname="10.9.0.2", port=2222, user="root", key_files=("/keys/id",))


def test_a_host_gpuq_knows_gets_strict_options_and_nothing_else(tmp_path: Path, key: paramiko.PKey) -> None:
    argv = _argv(tmp_path, _line("[10.9.0.2]:2222", key), ENDPOINT)
    assert argv is not None and argv[-2:] == ["--", "10.9.0.2"]
    opts = {argv[i + 1] for i, a in enumerate(argv) if a == "-o"}
    assert {"StrictHostKeyChecking=yes", f"UserKnownHostsFile={tmp_path / 'known_hosts'}",
            "GlobalKnownHostsFile=/dev/null", "BatchMode=yes", "ForwardAgent=no", "IdentitiesOnly=yes",
            "IdentityAgent=none", "UpdateHostKeys=no"} <= opts
    assert argv[argv.index("-i") + 1] == "/keys/id" and argv[argv.index("-p") + 1] == "2222"
    assert argv[argv.index("-F") + 1] == "/dev/null"  # the user's ~/.ssh/config cannot loosen anything


@pytest.mark.parametrize("why", ["unknown", "revoked-here", "revoked-in-user-file", "cert-authority", "jump",
                                 "proxy", "no-key-file", "odd-path"])
def test_anything_paramiko_checks_differently_falls_back(tmp_path: Path, key: paramiko.PKey, why: str) -> None:
    known = _line("[10.9.0.2]:2222", key)
    endpoint = ENDPOINT
    if why == "unknown":
        known = _line("[10.9.0.3]:2222", key)
    elif why == "revoked-here":
        known += _line("*", key, "@revoked ")
    elif why == "revoked-in-user-file":
        (tmp_path / "home" / ".ssh").mkdir(parents=True)
        (tmp_path / "home" / ".ssh" / "known_hosts").write_text(_line("*", key, "@revoked "))
    elif why == "cert-authority":
        known += _line("10.9.0.*", key, "@cert-authority ")
    elif why == "jump":
        endpoint = replace(ENDPOINT, jump=(Endpoint(hostname="bastion"),))
    elif why == "proxy":
        endpoint = replace(ENDPOINT, proxy_command="nc %h %p")
    elif why == "no-key-file":
        endpoint = replace(ENDPOINT, key_files=())
    elif why == "odd-path":
        endpoint = replace(ENDPOINT, key_files=("/keys/my id",))
    assert _argv(tmp_path, known, endpoint) is None


def test_no_ssh_on_this_machine_falls_back(tmp_path: Path, key: paramiko.PKey,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shutil.which", lambda _name: None)
    assert _argv(tmp_path, _line("[10.9.0.2]:2222", key), ENDPOINT) is None
