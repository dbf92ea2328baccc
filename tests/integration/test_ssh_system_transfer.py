"""Pulls over a real sshd, through the system OpenSSH client and through paramiko's fallback: both verify
what they copied, hash it while copying (nothing is read again), and catch a byte changed on the host
between its manifest and the copy (docs/results.md, hosts/sshsystem.py)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.agent import client
from orchestrator.core import protocol
from orchestrator.core.specs import JobSpec
from orchestrator.core.states import AttemptState, JobState
from orchestrator.hosts.ssh import SSHHost
from orchestrator.hosts.sshconfig import resolve
from orchestrator.hosts.sshconnect import SSHOptions
from orchestrator.ledger import Ledger
from orchestrator.transfer import pull as pull_module
from orchestrator.transfer import pull_jobs
from orchestrator.transfer import verify as verify_module
from tests.support.jobtree import SHA, finished_job, install_agent, pulled_paths
from tests.support.testhosts import FarmFactory, HostFarm

pytestmark = pytest.mark.integration

SWEEP = "qwire01"


@pytest.fixture(scope="module")
def farm(host_farm_module: FarmFactory) -> HostFarm:
    return host_farm_module(n=1, gpus=1, sftp=True)


@pytest.fixture(params=["system-ssh", "paramiko"])
def ssh(request: pytest.FixtureRequest, farm: HostFarm, tmp_path: Path) -> Iterator[SSHHost]:
    config = tmp_path / "ssh_config"
    config.write_text("")
    endpoint = resolve(f"root@{farm.hosts[0].address}", key_file=str(farm.client_key), ssh_config=config,
                       system_config=None)
    options = SSHOptions(known_hosts=farm.known_hosts, ssh_config=config, system_ssh=request.param == "system-ssh",
                         system_ssh_min_bytes=0, transfer_stall_s=10.0)
    host = SSHHost("wire0", endpoint, root=f"/tmp/{tmp_path.name}", python=sys.executable, options=options)
    yield host
    host.close()


def _world(farm: HostFarm, host: SSHHost, home: Path) -> tuple[Ledger, Path, list[Any]]:
    root = farm.hosts[0].tmp / Path(host.root).name  # the host's /tmp/<name>, seen from here
    install_agent(root)
    ledger = Ledger(home / "ledger.db")
    ledger.ensure_host(host.name, kind="ssh", root=host.root)
    specs = [JobSpec(name=n, config="c.yaml", task="classify", config_sha256="0" * 64, line=i + 1)
             for i, n in enumerate(["alpha", "beta"])]
    rows = ledger.add_sweep(sweep_id=SWEEP, queue_path="q.txt", workdir="/w", queue_text="", jobs=specs,
                            default_retries=1)
    for row in rows:
        ledger.start_attempt(row.id, host=host.name, bundle_sha=SHA)
        ledger.transition(row.id, AttemptState.RUNNING, attempt=1)
        ledger.transition(row.id, JobState.RUNNING)
        ledger.transition(row.id, AttemptState.EXITED, attempt=1)
        ledger.transition(row.id, JobState.SUCCEEDED)
        finished_job(root, row.id, queue_id=SWEEP)
    return ledger, root, [ledger.job(r.id) for r in rows]


def test_a_pull_verifies_in_one_pass_and_catches_a_byte_changed_during_the_copy(
        ssh: SSHHost, farm: HostFarm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    ledger, root, (alpha, beta) = _world(farm, ssh, home)
    tampered = root / protocol.JOBS_DIR / beta.id / "result" / "plots" / "curve.csv"
    real_manifests = pull_module.request_manifests

    def manifests_then_tamper(*args: Any, **kw: Any) -> Any:
        replies = real_manifests(*args, **kw)
        data = bytearray(tampered.read_bytes())
        data[len(data) // 2] ^= 0x01  # one bit, same size: only the sha256 can tell
        tampered.write_bytes(bytes(data))
        return replies

    reread: list[Path] = []
    real_sha = verify_module.file_sha256
    monkeypatch.setattr(pull_module, "request_manifests", manifests_then_tamper)
    monkeypatch.setattr(verify_module, "file_sha256", _counting(reread, real_sha))
    try:
        got = {o.job_id: o for o in pull_jobs(ledger, ssh, client.command(ssh, SHA), [alpha, beta],
                                              home / "results", home / "quarantine", tries=2, sleep=lambda _s: None)}
    finally:
        ledger.close()
    assert got[alpha.id].state == "verified", got[alpha.id].reason
    final = home / "results" / SWEEP / alpha.id
    for rel in pulled_paths():
        assert (final / rel).read_bytes() == (root / protocol.JOBS_DIR / alpha.id / rel).read_bytes()
    assert got[beta.id].state == "quarantined" and "result/plots/curve.csv has sha256" in got[beta.id].reason
    assert reread == []  # every sha256 came from the copy as it was written: one pass on this side
    copied = 2 * len(pulled_paths()) + 2  # each job's files and its MANIFEST.json
    if ssh.options.system_ssh:
        assert ssh.system_transfers == copied
    else:
        assert ssh.system_transfers == 0


def _counting(seen: list[Path], real: Any) -> Any:
    def sha(path: Path) -> str:
        seen.append(path)
        return str(real(path))

    return sha
