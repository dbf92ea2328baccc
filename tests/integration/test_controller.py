"""Controller tick against a real host agent's `status --json`, on fabricated host-side files.

No trainer runs here: the attempt files an agent and a wrapper would leave are written directly,
so each state predicate is driven on purpose and fast.
"""

from __future__ import annotations

import fcntl
import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.agent.launcher import job_spec
from orchestrator.core import protocol
from orchestrator.core.config import Settings
from orchestrator.core.specs import JobSpec
from orchestrator.core.states import JobState
from orchestrator.ledger import Ledger
from orchestrator.tick.answers import _settled_findings
from orchestrator.tick.collect import collect
from orchestrator.tick.findings import TickReport
from orchestrator.tick.probe import probe, probe_all
from orchestrator.tick.reconcile import reconcile
from tests.conftest import ROOT, kill_recorded_groups
from tests.support.fakehost import FakeHost

pytestmark = pytest.mark.integration
SHA = "f" * 64


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[Ledger, FakeHost, Settings, list[str]]]:
    settings = Settings(home=tmp_path / "home")
    ledger = Ledger(settings.ledger_path)
    host = FakeHost(tmp_path / "root")
    Path(host.root).mkdir(parents=True)
    # Hold the agent lock: `enqueue --serve` then finds a "running" agent and starts none, so the
    # inbox stays exactly as the controller left it and nothing trains.
    lock = open(Path(host.root) / protocol.AGENT_LOCK, "a+")  # noqa: SIM115
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    agent_dir = Path(host.root) / "bundles" / SHA / "payload" / "agent"
    shutil.copytree(ROOT / "payload" / "agent", agent_dir, ignore=shutil.ignore_patterns("__pycache__"))
    ledger.ensure_host(host.name, kind="local", root=host.root)
    ledger.update_host(host.name, agent_bundle=SHA)
    specs = [JobSpec(name=n, config="c.yaml", task="classify", config_sha256="0" * 64, line=i + 1)
             for i, n in enumerate(["ok", "badcfg", "dead", "running", "undelivered", "withdrawn"])]
    rows = ledger.add_sweep(sweep_id="qtest01", queue_path="q.txt", workdir="/w", queue_text="",
                            jobs=specs, default_retries=1)
    for row in rows:
        ledger.start_attempt(row.id, host=host.name, bundle_sha=SHA)
    yield ledger, host, settings, [r.id for r in rows]
    kill_recorded_groups(Path(host.root))
    lock.close()


def _write(path: Path, doc: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))


def _fabricate(ledger: Ledger, host: FakeHost, settings: Settings, ids: list[str]) -> subprocess.Popen[bytes]:
    root = Path(host.root)
    now = time.time()
    iso = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(now))
    for job_id in ids:
        job = ledger.job(job_id)
        attempt = ledger.attempt(job_id, 1)
        assert attempt is not None
        spec = job_spec(job, attempt, settings).as_document()
        if job.name == "undelivered":
            continue  # the controller "died" before the spec reached the host
        if job.name == "withdrawn":
            _write(root / protocol.WITHDRAWN_DIR / f"{job_id}.json", spec)
            continue
        _write(root / protocol.CLAIMED_DIR / f"{job_id}.json", spec)
        adir = root / protocol.JOBS_DIR / job_id / protocol.ATTEMPTS_DIR / "1"
        _write(adir / protocol.LAUNCH_FILE, {"time": iso, "slots": [0]})
        _write(adir / protocol.HEARTBEAT_FILE, {"time": now, "step": 5, "total_steps": 10, "epoch": 1,
                                                "loss": 0.5})
        if job.name in ("ok", "badcfg"):
            code = 0 if job.name == "ok" else protocol.EXIT_CONFIG
            _write(adir / protocol.EXIT_FILE, {"wrapper_code": code, "trainer_code": code, "phase": "train",
                                               "started_at": iso, "ended_at": iso, "message": "m"})
            _write(root / protocol.JOBS_DIR / job_id / protocol.RESULT_DIR / protocol.SUMMARY_FILE,
                   {"final": {"val_acc": 0.75, "step": 10}, "best": {"val_acc": 0.8, "step": 8}})
    dead_dir = root / protocol.JOBS_DIR / ids[2] / protocol.ATTEMPTS_DIR / "1"
    boot_now = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    _write(dead_dir / protocol.PGID_FILE, {"pgid": 2**22 - 3, "start_ticks": 1, "boot_id": boot_now})
    # a live group for "running": a real process in its own session whose cmdline names the job
    live = subprocess.Popen(["sh", "-c", f"sleep 60 # {ids[3]}"], start_new_session=True)
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    ticks = int(Path(f"/proc/{live.pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    _write(root / protocol.JOBS_DIR / ids[3] / protocol.ATTEMPTS_DIR / "1" / protocol.PGID_FILE,
           {"pgid": live.pid, "start_ticks": ticks, "boot_id": boot})
    return live


def test_reconcile_maps_every_host_state(setup: tuple[Ledger, FakeHost, Settings, list[str]]) -> None:
    ledger, host, settings, ids = setup
    live = _fabricate(ledger, host, settings, ids)
    try:
        report = probe(host, SHA, settings)
        assert report.ok, report.error
        done = reconcile(ledger, host, settings, report)
        collect(ledger, host, SHA, done.succeeded)
    finally:
        live.kill()
        live.wait()
    states = {ledger.job(i).name: ledger.job(i).state for i in ids}
    # the vanished attempt is LOST and its job requeued with resume (retries left); the config
    # error is never retried
    assert states == {"ok": "SUCCEEDED", "badcfg": "FAILED", "dead": "QUEUED", "running": "RUNNING",
                      "undelivered": "ASSIGNED", "withdrawn": "CANCELLED"}
    assert done.succeeded == [ids[0]]
    settled = {item.job_id: (item.klass, item.decision.action) for item in done.settled}
    assert settled == {ids[1]: ("config", "fail"), ids[2]: ("vanished", "requeue")}
    # each settled attempt names its job and attempt as reconcile read them: the tick's report needs no
    # list of the host's jobs taken before (a racing command may have placed one here since; that list
    # lacked it, and `gpuq status` once died on a KeyError in the race storm)
    assert {(item.name, item.attempt) for item in done.settled} == {("badcfg", 1), ("dead", 1)}
    told = TickReport()
    found = _settled_findings(SimpleNamespace(ledger=ledger), host.name, done.settled, told)  # type: ignore[arg-type]
    assert sorted(a.split(" ", 1)[0] for a in told.actions) == ["badcfg", "dead"] and len(found) == 2
    assert ledger.attempt(ids[2], 1).state == "LOST"  # type: ignore[union-attr]
    bad = ledger.attempt(ids[1], 1)
    assert bad is not None and bad.exit_code == 4 and "configuration error" in bad.message
    assert ledger.attempt(ids[3], 1).step == 5  # type: ignore[union-attr]
    assert {(m.scope, m.value) for m in ledger.metrics([ids[0]])} == {("final", 0.75), ("best", 0.8)}
    # the undelivered spec was handed over again, exactly once
    assert (Path(host.root) / protocol.INBOX_DIR / f"{ids[4]}.json").is_file()
    again = probe(host, SHA, settings)
    reconcile(ledger, host, settings, again)
    inbox = list((Path(host.root) / protocol.INBOX_DIR).glob("*.json"))
    assert [p.stem for p in inbox] == [ids[4]]


def test_one_round_trip_per_probe(setup: tuple[Ledger, FakeHost, Settings, list[str]]) -> None:
    _ledger, host, settings, _ids = setup
    host.calls.clear()
    probes = probe_all([(host, SHA, (), ())], settings)
    assert probes[0].ok and len(host.calls) == 1 and "status" in host.calls[0]


def test_a_job_that_finished_costs_no_second_round_trip(setup: tuple[Ledger, FakeHost, Settings, list[str]]) -> None:
    ledger, host, settings, ids = setup
    live = _fabricate(ledger, host, settings, ids)
    try:
        host.calls.clear()
        report = probe(host, SHA, settings, results_for=ids)
        done = reconcile(ledger, host, settings, report)
        status_calls = len(host.calls)
        collect(ledger, host, SHA, done.succeeded, report)
    finally:
        live.kill()
        live.wait()
    assert done.succeeded == [ids[0]]
    carried = [j for j in report.document.jobs if j.results is not None]
    assert [j.job_id for j in carried] == [ids[0]]  # only the job that exited 0 carries results
    assert status_calls >= 1 and len(host.calls) == status_calls  # collect() made no call of its own
    assert {(m.scope, m.value) for m in ledger.metrics([ids[0]])} == {("final", 0.75), ("best", 0.8)}


def test_transport_failure_changes_no_job(setup: tuple[Ledger, FakeHost, Settings, list[str]]) -> None:
    ledger, host, settings, ids = setup
    before = {i: ledger.job(i).state for i in ids}
    host.down = True
    report = probe(host, SHA, settings)
    assert not report.ok and "link cut" in report.error
    assert {i: ledger.job(i).state for i in ids} == before
    assert all(s == JobState.ASSIGNED.value for s in before.values())
