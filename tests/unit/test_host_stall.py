"""Stalls the host heals itself (docs/health.md; issue 25): the agent's stall rule is the patrol's, judged on
real attempt files; its stall kill decides under ``retry.lock`` against gpuq's ``kill``; the tick records a
stall the host healed exactly as its own stall kill and retry (the real agent verbs on a FakeHost root).

The end-to-end runs (a trainer that checkpoints and hangs, with no gpuq command running, on a namespace SSH
host; a hang before the first step; the two stall kills racing) are tests/integration/test_host_stalls.py.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from orchestrator.agent import launcher
from orchestrator.agent.spec import OutboundSpec
from orchestrator.core import protocol
from orchestrator.core.config import Settings
from orchestrator.core.states import AttemptState, JobState
from orchestrator.health import patrol, verdicts
from orchestrator.health.patrol import JobView, Thresholds
from orchestrator.host_documents import Verdicts
from orchestrator.ledger import Ledger
from orchestrator.tick import host_retries
from orchestrator.tick.probe import Probe
from orchestrator.tick.reconcile import HEALED, reconcile
from tests.support.agentmodule import AGENT, load_agent_module
from tests.support.fakehost import FakeHost
from tests.support.jobspecs import spec_doc
from tests.support.wire import entry, status
from tests.unit.test_host_retry_rules import SHA, _ledger_job

gpuq_stall = load_agent_module("gpuq_serving.gpuq_stall")
gpuq_retry = load_agent_module("gpuq_watch.gpuq_retry")
gpuq_files = load_agent_module("gpuq_base.gpuq_files")
gpuq_procs = load_agent_module("gpuq_base.gpuq_procs")
gpuq_serve = load_agent_module("gpuq_serving.gpuq_serve")
gpuq_serve_watch = load_agent_module("gpuq_serving.gpuq_serve_watch")
gpuq_cancel = load_agent_module("gpuq_verbs.gpuq_cancel")
gpuq_stacks = load_agent_module("gpuq_verbs.gpuq_stacks")
gpuq_jobspec = load_agent_module("gpuq_base.gpuq_jobspec")

LIMITS = {"stall_after_s": 10.0, "startup_grace_s": 6.0, "start_stall_after_s": 5.0}
POLICY = {"left": 2, "on": list(launcher.HOST_RETRY_CLASSES), "signals": [9], "deadlock_left": 1, **LIMITS}
STOPPED = {"wrapper_code": 143, "trainer_code": -15, "signal": 15, "wrapper_signal": 15, "phase": "train",
           "started_at": "2026-01-01T00:00:00.000Z", "ended_at": "2026-01-01T00:10:00.000Z", "last_step": 7,
           "message": "stopped by signal 15"}


# --- the rule is the patrol's -------------------------------------------------------------------------------


def _entry(now: float, launched: float, beat: tuple[float, int] | None, log: float | None, pointer: float | None,
           run_ckpt: float | None, metrics: float | None, progress: dict[str, Any] | None) -> dict[str, Any]:
    """A running attempt's status entry (gpuq_status.job_entry's fields), each age in seconds before ``now``."""
    return {"job_id": "c000000000001", "name": "j", "attempt": 1, "state": "running", "group_alive": True,
            "launched_at": gpuq_files.utc(now - launched),
            "heartbeat": None if beat is None else {"step": beat[1], "time": now - beat[0]},
            "heartbeat_age_s": None if beat is None else beat[0],
            "log_mtime": None if log is None else now - log,
            "ckpt": None if pointer is None else {"file": "x.pt", "step": 4, "mtime": now - pointer},
            "run_ckpt_mtime": None if run_ckpt is None else now - run_ckpt,
            "run_metrics_mtime": None if metrics is None else now - metrics, "progress": progress}


def test_the_agents_stall_rule_gives_the_patrols_verdict_on_every_combination_of_signs() -> None:
    """Ages below, between and above the limits, with and without each sign of life and of a first step:
    the agent's class and words are the patrol's (orchestrator/health/patrol.py ``job_findings``)."""
    now = 1_800_000_000.0
    th = Thresholds(stall_after_s=LIMITS["stall_after_s"], startup_grace_s=LIMITS["startup_grace_s"],
                    start_stall_after_s=LIMITS["start_stall_after_s"])
    verdicts: set[str] = set()
    for launched, beat, log, pointer, run_ckpt, metrics, progress, stepped in itertools.product(
            (2.0, 5.5, 8.0, 100.0), (None, (3.0, 0), (30.0, 0), (30.0, 9)), (None, 1.0, 5.5, 8.0, 50.0),
            (None, 50.0), (None, 2.0, 50.0), (None, 50.0), (None, {"step": 3}, {"pct": 0}), (False, True)):
        doc = _entry(now, launched, beat, log, pointer, run_ckpt, metrics, progress)
        seen = entry(doc)
        assert seen is not None
        found = [f for f in patrol.job_findings("h", JobView("c000000000001", "j", 1, stepped=stepped),
                                                seen, now, th) if f.klass]
        klass, what = gpuq_stall.stall_of(doc, now, LIMITS, stepped)
        assert klass == (found[0].klass if found else ""), doc
        if found:
            assert found[0].message.startswith(f"j a1: {what}"), (found[0].message, what)
        verdicts.add(klass)
    assert verdicts == {"", "stalled", "deadlock_at_start"}  # the grid reaches every verdict


def test_the_host_never_watches_a_job_it_may_not_retry() -> None:
    def limits(retry: Any) -> Any:
        return gpuq_stall.limits(gpuq_jobspec.parse_spec(spec_doc(retry=retry)))

    assert limits(POLICY) == LIMITS
    assert limits(dict(POLICY, left=0)) is None
    assert limits(dict(POLICY, on=["killed"])) is None  # an older controller's spec
    assert limits(None) is None
    with pytest.raises(gpuq_jobspec.SpecError, match=r"^retry\.stall_after_s is missing$"):  # refused at the edge
        limits({k: v for k, v in POLICY.items() if k != "stall_after_s"})
    assert launcher.DEADLOCK_RETRIES == verdicts.DEADLOCK_RETRIES  # the spec's deadlock_left follows the policy


# --- on real attempt files ----------------------------------------------------------------------------------


@pytest.fixture
def hung(tmp_path: Path) -> Iterator[tuple[Any, dict[str, Any], subprocess.Popen[bytes]]]:
    """Attempt 1 of job c1 under a root: a live process group (its leader standing for the wrapper, a trainer
    sleeping forever) recorded as the attempt's, launched 60 s ago, its log and checkpoint written 30 s ago."""
    proc = subprocess.Popen(["sh", "-c", "sleep 600 & wait", "wrap", "c1"], start_new_session=True)  # job id in argv
    lay = gpuq_files.Layout(str(tmp_path))
    spec = spec_doc(job_id="c1", name="victim", queue_id="qhs", attempt=1, gpus=1, nodes=1, bundle_sha=SHA,
                    min_free_gb=0, created_at=1.0, kill_grace_s=2, resume_from=None, retry=POLICY,
                    run={"checkpoint": ["ckpt.json"], "command": [], "outputs": []})
    adir = Path(lay.attempt("c1", 1))
    adir.mkdir(parents=True)
    (tmp_path / protocol.CLAIMED_DIR).mkdir()
    (tmp_path / protocol.CLAIMED_DIR / "c1.json").write_text(json.dumps(spec))
    now = time.time()
    (adir / protocol.LAUNCH_FILE).write_text(json.dumps({"time": gpuq_files.utc(now - 60), "slots": [0]}))
    (adir / protocol.PGID_FILE).write_text(json.dumps({"pgid": proc.pid, "start_ticks": gpuq_procs.start_ticks(
        proc.pid), "boot_id": gpuq_procs.boot_id()}))
    run = tmp_path / protocol.JOBS_DIR / "c1" / protocol.RUN_DIR
    run.mkdir()
    for path in (adir / protocol.JOB_LOG, run / "ckpt.json"):
        path.write_text("step 7\n")
        os.utime(path, (now - 30, now - 30))
    yield lay, gpuq_jobspec.parse_spec(spec), proc
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def test_the_stacks_list_the_attempts_processes_not_the_wrappers_own_helpers(tmp_path: Path) -> None:
    """The wrapper runs nvidia-smi (its memory samples) and the provenance probe beside the trainer, as its own
    children: they are gpuq's, marked by their environment (gpuq_procs.helper_env), and a stall's stacks.txt
    lists the trainer only."""
    marked = f"{gpuq_procs.HELPER_MARK}=1"
    proc = subprocess.Popen(["sh", "-c", f"sleep 600 & {marked} sh -c 'sleep 601 & wait' & wait"],
                            start_new_session=True)
    try:
        rec = {"pgid": proc.pid, "start_ticks": gpuq_procs.start_ticks(proc.pid), "boot_id": gpuq_procs.boot_id()}
        deadline = time.monotonic() + 10
        while len(gpuq_procs.descendants(proc.pid)) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        every = gpuq_procs.descendants(proc.pid)
        assert len(every) == 3  # the trainer, the helper and the helper's own child
        (trainer,) = gpuq_stacks.attempt_processes(rec)
        assert gpuq_procs.proc_cmdline(trainer) == ["sleep", "600"]
        assert sum(gpuq_procs.is_helper(p) for p in every) == 2
        lay = gpuq_files.Layout(str(tmp_path))
        Path(lay.attempt("c1", 1)).mkdir(parents=True)
        path, summary = gpuq_stacks.save_stacks(lay, "c1", 1, rec)
        assert "1 process(es)" in summary and "sleep 601" not in Path(path).read_text()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _next(lay: Any, n: int = 1) -> dict[str, Any] | None:
    path = Path(lay.attempt("c1", n, protocol.NEXT_FILE))
    return json.loads(path.read_text()) if path.is_file() else None


def _inbox(lay: Any) -> dict[str, Any] | None:
    path = Path(lay.root) / protocol.INBOX_DIR / "c1.json"
    return json.loads(path.read_text()) if path.is_file() else None


def test_a_quiet_attempt_is_judged_stalled_and_a_fresh_log_line_keeps_it_alive(hung: Any) -> None:
    lay, spec, _ = hung
    now = time.time()
    assert not gpuq_stall.surely_alive(lay, "c1", 1, LIMITS, now)
    klass, what, why_not = gpuq_stall.judge(lay, "c1", spec, 1, LIMITS, now)
    assert (klass, why_not) == ("stalled", "") and "nothing written for 30s" in what, what
    os.utime(lay.attempt("c1", 1, protocol.JOB_LOG))  # it wrote a line just now
    assert gpuq_stall.surely_alive(lay, "c1", 1, LIMITS, time.time())


def test_a_stall_before_the_first_step_is_retried_once_and_never_after_a_failure(hung: Any) -> None:
    lay, spec, _ = hung
    os.unlink(os.path.join(lay.job("c1", protocol.RUN_DIR), "ckpt.json"))  # no checkpoint, no step in its log
    log = lay.attempt("c1", 1, protocol.JOB_LOG)
    Path(log).write_text("loading the data\n")
    os.utime(log, (time.time() - 30, time.time() - 30))
    klass, what, why_not = gpuq_stall.judge(lay, "c1", spec, 1, LIMITS, time.time())
    assert (klass, why_not) == ("deadlock_at_start", "") and what.startswith("stalled before its first step")
    spent = replace(spec, retry=replace(spec.retry, deadlock_left=0))
    assert gpuq_stall.judge(lay, "c1", spent, 1, LIMITS, time.time())[2].startswith("a stall before the first step")
    assert gpuq_stall.judge(lay, "c1", replace(spec, resume_from="ckpt.json"), 1, LIMITS, time.time())[0] == "stalled"


def test_a_stall_with_a_non_finite_loss_or_a_cancel_is_left_to_gpuq(hung: Any) -> None:
    lay, spec, _ = hung
    result = Path(lay.job("c1", protocol.RESULT_DIR))
    result.mkdir()
    (result / "metrics.jsonl").write_text('{"kind": "train", "step": 7, "loss": NaN}\n')
    assert "non-finite" in gpuq_stall.judge(lay, "c1", spec, 1, LIMITS, time.time())[2]
    (result / "metrics.jsonl").unlink()
    Path(lay.job("c1", protocol.CANCEL_FILE)).touch()
    assert gpuq_stall.judge(lay, "c1", spec, 1, LIMITS, time.time())[2] == "cancel requested"


def _agent(lay: Any) -> Any:
    args = argparse.Namespace(idle_exit_s=60, poll_s=0.1, cpu_slots=1, train_device="cpu")
    return gpuq_serve.Agent(lay, args)


def test_the_agent_heals_a_stall_stacks_kill_then_attempt_two_with_one_retry_less(hung: Any) -> None:
    lay, spec, proc = hung
    agent = _agent(lay)
    rec = json.loads(Path(lay.attempt("c1", 1, protocol.PGID_FILE)).read_text())
    run = gpuq_serve_watch.Running("c1", 1, [], spec, None, rec)
    agent.running["c1"] = run
    gpuq_serve_watch.watch_stalls(lay, list(agent.running.values()), agent.log)  # the agent's round
    decided = _next(lay) or {}
    assert (decided.get("by"), decided.get("attempt"), decided.get("class")) == ("host", 2, "stalled"), decided
    assert str(decided.get("stacks", "")).startswith("saved attempts/1/stacks.txt: 1 process(es)"), decided
    assert "sleep 600" in Path(lay.attempt("c1", 1, protocol.STACKS_FILE)).read_text()
    assert proc.wait(timeout=10) == -signal.SIGTERM and run.kill_at is not None  # TERM now, KILL after the grace
    assert _inbox(lay) is None  # attempt 2 waits for attempt 1 to end
    agent.retry(run)  # attempt 1 has ended (the agent's finish)
    nxt = _inbox(lay) or {}
    assert (nxt.get("attempt"), nxt.get("started_by")) == (2, "host"), nxt
    assert nxt["retry"] == dict(POLICY, left=1, deadlock_left=0)
    agent.retry(run)  # once only
    assert (_inbox(lay) or {}).get("created_at") == nxt["created_at"]
    assert "STALL KILL c1 a1" in Path(lay.p(protocol.AGENT_LOG)).read_text()


def test_gpuqs_stall_kill_and_the_hosts_decide_once_whichever_comes_first(
        hung: Any, capsys: pytest.CaptureFixture[str]) -> None:
    lay, _spec, proc = hung
    assert gpuq_stall.claim(lay, "c1", 1, "stalled", "stalled: ...") is not None  # the host first
    assert gpuq_stacks.cmd_stacks(lay, "c1", 1) == 0  # gpuq's stacks keep the host's
    assert capsys.readouterr().out.startswith("not saved again: this host's agent ended attempt 1 as stalled")
    assert not os.path.exists(lay.attempt("c1", 1, protocol.STACKS_FILE))
    assert gpuq_cancel.cmd_kill(lay, "c1", 1) == 0  # gpuq's kill comes second: it kills, and says whose it is
    said = capsys.readouterr().out.strip()
    assert said.startswith(protocol.KILL_HOST_RETRIED + ": attempt 2 (stalled)"), said
    assert proc.wait(timeout=10) < 0 and (_next(lay) or {}).get("by") == "host"
    os.unlink(lay.attempt("c1", 1, protocol.NEXT_FILE))
    gpuq_retry.forgo(lay, "c1", 1, "gpuq killed attempt 1")  # gpuq first: the host's claim is refused
    assert gpuq_stall.claim(lay, "c1", 1, "stalled", "stalled: ...") is None
    assert (_next(lay) or {}).get("by") == "controller"


# --- the tick records the host's stall kill as its own ------------------------------------------------------


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[Ledger, FakeHost, str, Any]]:
    ledger = Ledger(tmp_path / "ledger.db")
    job_id = _ledger_job(ledger)
    ledger.start_attempt(job_id, host="h", bundle_sha=SHA)
    ledger.transition(job_id, AttemptState.RUNNING, attempt=1)
    ledger.transition(job_id, JobState.RUNNING)
    host = FakeHost(tmp_path / "host", name="h")
    bundle = tmp_path / "host" / protocol.BUNDLES_DIR / SHA
    bundle.mkdir(parents=True)
    (bundle / "payload").symlink_to(AGENT.parent)
    lay = gpuq_files.Layout(str(host.root))
    Path(lay.attempt(job_id, 1)).mkdir(parents=True)
    Path(lay.attempt(job_id, 1, protocol.EXIT_FILE)).write_text(json.dumps({"job_id": job_id, "attempt": 1,
                                                                            **STOPPED}))
    yield ledger, host, job_id, lay
    ledger.close()


def _healed(lay: Any, job_id: str, klass: str) -> None:
    what = "stalled: heartbeat never, nothing written for 12s (last step 7)"
    assert gpuq_stall.claim(lay, job_id, 1, klass, what) is not None
    gpuq_stall.noted(lay, job_id, 1, stacks="saved attempts/1/stacks.txt: 1 process(es), by /proc")


def _probe(doc: dict[str, Any]) -> Probe:
    return Probe("h", True, status({"jobs": [doc]}))


def _history(ledger: Ledger, job_id: str) -> list[str]:
    return [e.message for e in ledger.events(subject=job_id, limit=100)]


def test_the_tick_records_a_stall_the_host_healed_as_its_own_stall_kill(world: Any) -> None:
    ledger, host, job_id, lay = world
    _healed(lay, job_id, "stalled")
    done = reconcile(ledger, host, Settings(), _probe({"job_id": job_id, "attempt": 1, "state": "exited",
                                                       "exit": STOPPED}))
    (settled,) = done.settled
    assert (settled.outcome, settled.klass, settled.decision.action) == (HEALED, "stalled", "requeue")
    first, second = ledger.attempts(job_id)
    assert (first.state, second.state, second.host) == ("LOST", "STARTING", "h")  # as gpuq's own stall kill
    assert first.message == "stalled: killed group of attempt 1 (killed); where it hung: attempts/1/stacks.txt"
    history = _history(ledger, job_id)
    assert "stalled: requeued with resume (retry 1 of 2)" in history, history  # not "stopped": the host's class
    assert any(m.startswith("started by the host: its agent retried attempt 1 with resume (stalled: heartbeat")
               for m in history), history
    assert ledger.failed_attempts(job_id) == 1


def test_a_deadlock_at_start_the_host_healed_before_the_tick_looked_is_its_one_retry(world: Any) -> None:
    ledger, host, job_id, lay = world
    _healed(lay, job_id, "deadlock_at_start")
    chain = gpuq_retry.chain(lay, job_id, 1, 2)  # the probe's word on attempt 1, the host now runs attempt 2
    assert [(c["class"], c["stacks"][:5]) for c in chain] == [("deadlock_at_start", "saved")]
    doc = {"job_id": job_id, "attempt": 2, "state": "running", "group_alive": True, "host_retried": chain}
    reconcile(ledger, host, Settings(), _probe(doc))
    assert [(a.number, a.state) for a in ledger.attempts(job_id)] == [(1, "LOST"), (2, "RUNNING")]
    assert ledger.attempt(job_id, 1).message.startswith("deadlock_at_start: no step reached; killed group")
    assert any(m.startswith("deadlock_at_start: requeued (retry 1 of 1") for m in _history(ledger, job_id))


def test_a_hosts_decide_retry_answer_naming_no_gpuq_class_is_recorded_as_killed(world: Any) -> None:
    """A hostile host's ``decide-retry`` answer: its class text never becomes a class in the ledger."""
    ledger, host, job_id, lay = world
    word = "no_such_class; rm -rf /"
    Path(lay.attempt(job_id, 1, protocol.NEXT_FILE)).write_text(json.dumps(
        {"by": "host", "attempt": 2, "class": word, "why": "because", "time": "2026-01-01T00:00:00.000Z"}))
    host_retries.before_cancel(ledger, host, [ledger.job(job_id)], Settings())
    assert [(a.number, a.state) for a in ledger.attempts(job_id)] == [(1, "EXITED"), (2, "STARTING")]
    history = _history(ledger, job_id)
    assert "killed: requeued with resume (retry 1 of 2)" in history, history
    assert not any(word in m for m in history)


def test_a_spec_sent_again_or_moved_carries_the_same_host_retries(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Re-sent (the host never got it) or moved (work stealing): the spec says what the host may retry itself,
    stall limits included, as the first delivery did.  Only the transport (``enqueue``) is replaced."""
    from orchestrator.ledger import HostRow
    from orchestrator.scheduling.stealing import Move
    from orchestrator.tick import reconcile as reconcile_module
    from orchestrator.tick import steal
    sent: list[OutboundSpec] = []

    def enqueue(host: Any, sha: str, specs: list[OutboundSpec], settings: Settings) -> Verdicts:
        sent.extend(specs)
        return Verdicts({spec.job_id: "queued" for spec in specs})

    for module in (reconcile_module, steal):
        monkeypatch.setattr(module, "enqueue", enqueue)
    ledger = Ledger(tmp_path / "ledger.db")
    try:
        job_id = _ledger_job(ledger)
        ledger.add_host(HostRow(name="g", kind="ssh", target="u@g", root="/r", slots_kind="cpu", slots_total=2,
                                created_at=0, agent_bundle=SHA))
        first = launcher.record_attempts(ledger, "h", SHA, [ledger.job(job_id)], Settings())[0]
        assert first.retry is not None and first.retry.stall_after_s == Settings().stall_after_s
        host = FakeHost(tmp_path / "host", name="h")
        reconcile(ledger, host, Settings(), Probe("h", True, status({"jobs": []})))  # the spec never arrived
        fleet = argparse.Namespace(named=lambda name: FakeHost(tmp_path / name, name=name))
        assert steal._move_one(ledger, fleet, Settings(), Move(job_id, "h", "g"), ledger.job(job_id))  # type: ignore[arg-type]
    finally:
        ledger.close()
    resent, moved = sent
    assert (resent.attempt, moved.attempt) == (1, 2)
    assert resent.retry == first.retry and moved.retry == first.retry, sent
