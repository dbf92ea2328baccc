"""`gpuq hosts` mistakes: each gets one clear line, exit 2, and changes nothing (no SSH needed).

The flows that do connect (keys, audits, faults) are in test_ssh_hosts.py against real sshd hosts.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from orchestrator.core.specs import JobSpec
from orchestrator.ledger import HostRow, Ledger
from tests.conftest import run_gpuq
from tests.support.rented import add_rented

pytestmark = pytest.mark.integration


def _usage(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in result.stderr, result.stderr


def _register(home: Path, name: str = "gpu1") -> Ledger:
    ledger = Ledger(home / "ledger.db")
    ledger.add_host(HostRow(name=name, kind="ssh", target="root@192.0.2.1", root="/root/gpuq", created_at=0))
    return ledger


def test_bad_names_and_missing_key_are_refused_before_connecting(gpuq_home: Path, tmp_path: Path) -> None:
    _usage(run_gpuq("hosts", "add", "Bad Name!", "root@192.0.2.1"), 'host name "Bad Name!"')
    _usage(run_gpuq("hosts", "add", "local", "root@192.0.2.1"), 'not "local"')
    _usage(run_gpuq("hosts", "add", "gpu1", "root@192.0.2.1", "--key", str(tmp_path / "nokey")),
           "--key", "no such file")
    _usage(run_gpuq("hosts", "add", "gpu1", "root@192.0.2.1", "--profile", "nosuch"), "unknown profile 'nosuch'")
    assert "gpu1" not in run_gpuq("hosts", "list").stdout


def test_registered_names_and_unknown_hosts(gpuq_home: Path, tmp_path: Path) -> None:
    _register(gpuq_home).close()
    _usage(run_gpuq("hosts", "add", "gpu1", "root@192.0.2.9"), 'host "gpu1" is already registered')
    _usage(run_gpuq("hosts", "show", "nosuch"), 'unknown host "nosuch"', "gpuq hosts list")
    _usage(run_gpuq("hosts", "rm", "nosuch"), 'unknown host "nosuch"')
    _usage(run_gpuq("hosts", "trust", "nosuch", "--fingerprint", "SHA256:x"), 'unknown SSH host "nosuch"')
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "a.yaml").write_text("seed: 1\n")
    (tmp_path / "q.txt").write_text("configs/a.yaml classify 1\n")
    _usage(run_gpuq("submit", str(tmp_path / "q.txt"), "--host", "nosuch"), 'unknown host "nosuch"',
           "gpuq hosts add")
    shown = run_gpuq("hosts", "show", "gpu1")
    assert shown.returncode == 0 and "root@192.0.2.1" in shown.stdout and "never" in shown.stdout


def test_rm_is_refused_while_jobs_run_there_or_results_are_unpulled(gpuq_home: Path) -> None:
    ledger = _register(gpuq_home)
    spec = JobSpec(name="j", config="c.yaml", task="classify", config_sha256="0" * 64, line=1)
    job = ledger.add_sweep(sweep_id="qhosts1", queue_path="q.txt", workdir="/w", queue_text="", jobs=[spec],
                           default_retries=1)[0]
    ledger.start_attempt(job.id, host="gpu1", bundle_sha="s")
    ledger.close()
    _usage(run_gpuq("hosts", "rm", "gpu1"), "host gpu1 has 1 unfinished jobs", "gpuq cancel")
    from orchestrator.core.states import AttemptState, JobState

    ledger = Ledger(gpuq_home / "ledger.db")
    ledger.transition(job.id, AttemptState.EXITED, attempt=1)
    ledger.transition(job.id, JobState.SUCCEEDED)
    ledger.close()
    _usage(run_gpuq("hosts", "rm", "gpu1"), "unverified results of 1 jobs", "gpuq pull", "--force")
    assert "gpu1" in run_gpuq("hosts", "list").stdout  # refused: nothing changed
    forced = run_gpuq("hosts", "rm", "gpu1", "--force")
    assert forced.returncode == 0 and "nothing on the machine was touched" in forced.stdout
    assert "gpu1" not in run_gpuq("hosts", "list").stdout
    ledger = Ledger(gpuq_home / "ledger.db")
    ledger.ensure_host("local", kind="local", root=str(gpuq_home / "local"))
    ledger.close()
    _usage(run_gpuq("hosts", "rm", "local"), '"local" is the embedded local host')


def test_a_rented_host_not_yet_ended_is_not_forgotten_and_orphans_take_no_hosts(gpuq_home: Path) -> None:
    ledger = Ledger(gpuq_home / "ledger.db")
    add_rented(ledger, HostRow(name="runpod-abc-0", kind="ssh", target="root@192.0.2.1", root="/root/gpuq",
                               provider="runpod", instance_id="pod123", lease_state="running", created_at=0))
    ledger.close()
    _usage(run_gpuq("hosts", "rm", "runpod-abc-0"), "may still bill", "`gpuq down runpod-abc-0`", "--force")
    assert "runpod-abc-0" in run_gpuq("hosts", "list").stdout  # nothing changed
    _usage(run_gpuq("down", "--orphans", "runpod-abc-0"), "--orphans takes no HOSTS")
