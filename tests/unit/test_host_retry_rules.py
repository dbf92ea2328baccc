"""Host retries (docs/checkpoints.md, "Who retries what"): the agent's rule on real attempt files, who decides
attempt n+1 (``next.json``, whichever side comes first), and the tick recording a host's retry exactly as
its own (the real agent verb ``decide-retry`` on a FakeHost root).

The end-to-end runs (a trainer SIGKILLed with no gpuq command running, on a namespace SSH host; the races
against a controller requeue and a cancel) are tests/integration/test_host_retries.py.
"""

from __future__ import annotations

import json
import signal
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from orchestrator.agent import launcher
from orchestrator.core import protocol
from orchestrator.core.config import Settings
from orchestrator.core.errors import IllegalTransition
from orchestrator.core.specs import JobSpec
from orchestrator.core.states import AttemptState, JobState
from orchestrator.host_documents import MAX_HOST_RETRIES, MAX_LINE
from orchestrator.ledger import HostRow, Ledger
from orchestrator.tick import host_retries
from orchestrator.tick.probe import Probe
from orchestrator.tick.reconcile import reconcile
from tests.support.agentmodule import AGENT, load_agent_module
from tests.support.fakehost import FakeHost
from tests.support.jobspecs import spec_doc
from tests.support.wire import status

gpuq_retry = load_agent_module("gpuq_watch.gpuq_retry")
gpuq_files = load_agent_module("gpuq_base.gpuq_files")
gpuq_jobspec = load_agent_module("gpuq_base.gpuq_jobspec")
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SHA = "ab" * 32
SHM_LOG = "shm-dataloader-bus-error-torch-2.13.log"
RAISED_LOG = "rank1-raises-gloo-cpu-torch-2.13.log"
POLICY = {"left": 2, "on": ["killed", "host_oom", "vanished"], "signals": [9, 11, 7], "deadlock_left": 1,
          "stall_after_s": 900.0, "startup_grace_s": 600.0, "start_stall_after_s": 300.0}
KILLED = {"wrapper_code": 137, "trainer_code": -9, "signal": 9, "phase": "train", "wrapper_signal": None,
          "started_at": "2026-01-01T00:00:00.000Z", "last_step": 40, "message": "trainer killed by signal 9"}


def _attempt(root: Path, job_id: str, n: int, exit_doc: dict[str, Any] | None, log: str = "step 40\n",
             policy: dict[str, Any] | None = POLICY) -> Any:
    """Attempt ``n`` of ``job_id`` launched under ``root`` (claimed spec, launch record, log), ended with
    ``exit_doc``; returns its spec as the agent reads it."""
    spec = spec_doc(job_id=job_id, name="victim", queue_id="qhr", attempt=n, gpus=1, nodes=1, bundle_sha=SHA,
                    min_free_gb=0, created_at=1.0, retry=policy)
    adir = root / protocol.JOBS_DIR / job_id / protocol.ATTEMPTS_DIR / str(n)
    adir.mkdir(parents=True, exist_ok=True)
    (root / protocol.CLAIMED_DIR).mkdir(parents=True, exist_ok=True)
    (root / protocol.CLAIMED_DIR / f"{job_id}.json").write_text(json.dumps(spec))
    (adir / protocol.LAUNCH_FILE).write_text(json.dumps({"time": "2026-01-01T00:00:00.000Z", "slots": [0]}))
    (adir / protocol.JOB_LOG).write_text(log)
    if exit_doc is not None:
        (adir / protocol.EXIT_FILE).write_text(json.dumps({"job_id": job_id, "attempt": n, **exit_doc}))
    return gpuq_jobspec.parse_spec(spec)


def _inbox(root: Path, job_id: str) -> dict[str, Any] | None:
    path = root / protocol.INBOX_DIR / f"{job_id}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _next(root: Path, job_id: str, n: int) -> dict[str, Any] | None:
    path = root / protocol.JOBS_DIR / job_id / protocol.ATTEMPTS_DIR / str(n) / protocol.NEXT_FILE
    return json.loads(path.read_text()) if path.is_file() else None


# --- the agent's rule --------------------------------------------------------------------------------------


def test_a_trainer_killed_by_sigkill_is_retried_by_the_host_with_one_retry_less(tmp_path: Path) -> None:
    spec = _attempt(tmp_path, "c1", 1, KILLED)
    rec = gpuq_retry.retry_after(gpuq_files.Layout(str(tmp_path)), "c1", spec, 1)
    assert rec is not None and rec["by"] == "host" and rec["attempt"] == 2 and rec["class"] == "killed", rec
    nxt = _inbox(tmp_path, "c1")
    assert nxt is not None and nxt["attempt"] == 2 and nxt["started_by"] == "host", nxt
    assert nxt["retry"] == dict(POLICY, left=1, deadlock_left=0)  # a failure came: no deadlock_at_start retry
    assert {k: v for k, v in nxt.items() if k not in ("attempt", "started_by", "retry", "created_at")} == \
        {k: v for k, v in spec.document.items() if k not in ("attempt", "retry", "created_at")}  # the same job
    assert _next(tmp_path, "c1", 1) == rec
    # once decided, never again: a second look (an adopted group's end, a restart) starts nothing more
    assert gpuq_retry.retry_after(gpuq_files.Layout(str(tmp_path)), "c1", spec, 1) is None


def test_a_vanished_group_and_a_rank_killed_under_torchrun_are_retried_too(tmp_path: Path) -> None:
    lay = gpuq_files.Layout(str(tmp_path))
    spec = _attempt(tmp_path, "c1", 1, {"wrapper_code": 137, "trainer_code": None, "signal": 9, "phase": "train",
                                        "vanished": True, "message": "wrapper killed by signal 9"})
    assert gpuq_retry.judge(lay, "c1", spec, 1)[0] == "vanished"
    torchrun = (FIXTURES / "torchrun" / "rank1-sigkill-gloo-cpu-torch-2.13.log").read_text()
    spec = _attempt(tmp_path, "c2", 1, {"wrapper_code": 1, "trainer_code": 1, "phase": "train"}, log=torchrun)
    assert gpuq_retry.judge(lay, "c2", spec, 1) == ("killed", "a rank died of signal 9")


LEFT_TO_THE_CONTROLLER = {
    "no policy (retries=0)": ({}, None, "step 1\n"),
    "no retries left": ({}, dict(POLICY, left=0), "step 1\n"),
    "a stop: the wrapper got SIGTERM": ({"wrapper_signal": 15, "wrapper_code": 143, "trainer_code": -15}, POLICY, ""),
    "SIGTERM to the trainer": ({"wrapper_code": 143, "trainer_code": -15, "signal": 15}, POLICY, ""),
    "a signal the spec does not name": ({"wrapper_code": 134, "trainer_code": -6, "signal": 6}, POLICY, ""),
    "its own exception": ({"wrapper_code": 1, "trainer_code": 1, "signal": None},
                          POLICY, "Traceback (most recent call last):\nValueError: bad shape\n"),
    "killed, but the log says CUDA OOM": ({}, POLICY, "torch.OutOfMemoryError: CUDA out of memory.\n"),
    "killed, but the log says /dev/shm": ({}, POLICY, (FIXTURES / "failures" / SHM_LOG).read_text()),
    "a rank raised under torchrun": ({"wrapper_code": 1, "trainer_code": 1, "signal": None}, POLICY,
                                     (FIXTURES / "torchrun" / RAISED_LOG).read_text()),
    "ended in setup": ({"phase": "setup"}, POLICY, ""),
    "a group stopped by SIGTERM": ({"vanished": True, "wrapper_code": 143, "trainer_code": None, "signal": 15},
                                   POLICY, ""),
}


@pytest.mark.parametrize("case", sorted(LEFT_TO_THE_CONTROLLER))
def test_what_the_agent_leaves_to_the_controller(tmp_path: Path, case: str) -> None:
    changes, policy, log = LEFT_TO_THE_CONTROLLER[case]
    spec = _attempt(tmp_path, "c1", 1, {**KILLED, **changes}, log=log, policy=policy)
    lay = gpuq_files.Layout(str(tmp_path))
    klass, why = gpuq_retry.judge(lay, "c1", spec, 1)
    assert klass == "" and why, (case, why)
    assert gpuq_retry.retry_after(lay, "c1", spec, 1) is None
    assert _inbox(tmp_path, "c1") is None and _next(tmp_path, "c1", 1) is None  # nothing decided: the tick's


def test_a_cancel_and_a_death_at_the_same_step_as_before_are_the_controllers(tmp_path: Path) -> None:
    lay = gpuq_files.Layout(str(tmp_path))
    spec = _attempt(tmp_path, "c1", 1, KILLED)
    (tmp_path / protocol.JOBS_DIR / "c1" / protocol.CANCEL_FILE).touch()
    assert gpuq_retry.retry_after(lay, "c1", spec, 1) is None
    _attempt(tmp_path, "c2", 1, KILLED)  # attempt 1 died at step 40 ...
    spec = _attempt(tmp_path, "c2", 2, KILLED)  # ... and so did attempt 2: a host OOM that recurs
    assert gpuq_retry.judge(lay, "c2", spec, 2) == ("", "attempt 1 died the same way at the same step 40")
    spec = _attempt(tmp_path, "c3", 1, KILLED)
    (tmp_path / protocol.JOBS_DIR / "c3" / protocol.ATTEMPTS_DIR / "2").mkdir()  # attempt 2 exists already
    assert gpuq_retry.retry_after(lay, "c3", spec, 1) is None and _inbox(tmp_path, "c3") is None


def test_whoever_decides_first_decides(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lay = gpuq_files.Layout(str(tmp_path))
    host_first = _attempt(tmp_path, "c1", 1, KILLED)
    controller_first = _attempt(tmp_path, "c2", 1, KILLED)
    assert gpuq_retry.retry_after(lay, "c1", host_first, 1) is not None
    assert gpuq_retry.cmd_decide_retry(lay, ["c1:1", "c2:1"]) == 0
    said = json.loads(capsys.readouterr().out)
    assert said["c1"]["by"] == "host" and said["c1"]["attempt"] == 2
    assert said["c2"]["by"] == "controller" and _next(tmp_path, "c2", 1) == said["c2"]
    assert gpuq_retry.retry_after(lay, "c2", controller_first, 1) is None and _inbox(tmp_path, "c2") is None
    assert gpuq_retry.cmd_decide_retry(lay, ["c2:1"]) == 0  # asked again (a second tick): the same answer
    assert json.loads(capsys.readouterr().out)["c2"] == said["c2"]
    assert gpuq_retry.cmd_decide_retry(lay, ["../x:1"]) == protocol.AGENT_EXIT_USAGE


def test_gpuqs_own_kill_is_never_retried_by_the_host(tmp_path: Path) -> None:
    """The patrol's stall kill (agent verb ``kill``): the decision is the controller's before the group dies,
    even when the kill ends in SIGKILL of the whole group (a vanished attempt)."""
    gpuq_cancel = load_agent_module("gpuq_verbs.gpuq_cancel")
    spec = _attempt(tmp_path, "c1", 1, None)
    lay = gpuq_files.Layout(str(tmp_path))
    assert gpuq_cancel.cmd_kill(lay, "c1", 1) == 1  # nothing runs here: "not running"; decided all the same
    assert (_next(tmp_path, "c1", 1) or {}).get("by") == "controller"
    exit_doc = {**KILLED, "vanished": True, "trainer_code": None}
    (tmp_path / protocol.JOBS_DIR / "c1" / protocol.ATTEMPTS_DIR / "1" / protocol.EXIT_FILE).write_text(
        json.dumps(exit_doc))
    assert gpuq_retry.retry_after(lay, "c1", spec, 1) is None and _inbox(tmp_path, "c1") is None


# --- the spec's policy -------------------------------------------------------------------------------------


def _ledger_job(ledger: Ledger, *, retries: int = 2, name: str = "victim") -> str:
    if ledger.host("h") is None:
        ledger.add_host(HostRow(name="h", kind="ssh", target="u@h", root="/r", slots_kind="cpu", slots_total=2,
                                created_at=0, agent_bundle=SHA))
    spec = JobSpec(name=name, config="c.yaml", task="t", retries=retries)
    (row,) = ledger.add_sweep(sweep_id=f"q{name[:6]:0<6}", queue_path="q.txt", workdir="/w", queue_text="",
                              jobs=[spec], default_retries=retries)
    return row.id


def test_the_spec_carries_what_the_host_may_retry(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.db")
    try:
        job = ledger.job(_ledger_job(ledger, retries=2))
        row = ledger.host("h")
        policy = launcher.host_retry(job, 0, Settings(), host=row, sweep=None)
        assert policy is not None
        assert policy.as_document() == {
            "left": 2, "on": ["killed", "host_oom", "vanished", "stalled", "deadlock_at_start"],
            "signals": [int(signal.SIGKILL), int(signal.SIGSEGV), int(signal.SIGBUS)],
            "deadlock_left": 1, "stall_after_s": 900.0, "startup_grace_s": 600.0,
            "start_stall_after_s": 300.0}  # the patrol's limits: the host heals a stall itself
        # after a failure a stall before the first step is not retried again (verdicts.decide)
        assert launcher.host_retry(job, 1, Settings(), host=row, sweep=None) == replace(policy, left=1, deadlock_left=0)
        assert launcher.host_retry(job, 2, Settings(), host=row, sweep=None) is None  # spent: the controller's
        assert row is not None
        held = row.model_copy(update={"hold_kind": "disk", "hold_detail": "97% used"})
        assert launcher.host_retry(job, 0, Settings(), host=held, sweep=None) is None  # its jobs go elsewhere
        slurm = row.model_copy(update={"kind": "slurm"})
        assert launcher.host_retry(job, 0, Settings(), host=slurm, sweep=None) is None
        pinned = job.model_copy(update={"host_pin": "other"})
        assert launcher.host_retry(pinned, 0, Settings(), host=row, sweep=None) is None
        gang = job.model_copy(update={"nodes": 2})
        assert launcher.host_retry(gang, 0, Settings(), host=row, sweep=None) is None
        sweep = ledger.sweep(job.sweep_id)
        assert sweep is not None
        capped = sweep.model_copy(update={"budget_usd": 10.0})
        assert launcher.host_retry(job, 0, Settings(), host=row, sweep=capped) is None  # the budget admits starts
        none_left = job.model_copy(update={"retries": 0})
        assert launcher.host_retry(none_left, 0, Settings(), host=row, sweep=None) is None
        attempt = ledger.start_attempt(job.id, host="h", bundle_sha=SHA)
        assert "retry" not in launcher.job_spec(job, attempt, Settings()).as_document()
        assert launcher.job_spec(job, attempt, Settings(), retry=policy).as_document()["retry"] == policy.as_document()
    finally:
        ledger.close()


# --- the tick records the host's retry as its own ----------------------------------------------------------


@pytest.fixture
def world(tmp_path: Path) -> Any:
    """A ledger whose job runs attempt 1 on FakeHost "h", whose root holds the real agent as bundle SHA."""
    ledger = Ledger(tmp_path / "ledger.db")
    job_id = _ledger_job(ledger)
    ledger.start_attempt(job_id, host="h", bundle_sha=SHA)
    ledger.transition(job_id, AttemptState.RUNNING, attempt=1)
    ledger.transition(job_id, JobState.RUNNING)
    host = FakeHost(tmp_path / "host", name="h")
    bundle = tmp_path / "host" / protocol.BUNDLES_DIR / SHA
    bundle.mkdir(parents=True)
    (bundle / "payload").symlink_to(AGENT.parent)
    yield ledger, host, job_id
    ledger.close()


def _probe(entry: dict[str, Any]) -> Probe:
    return Probe("h", True, status({"jobs": [entry]}))


def _history(ledger: Ledger, job_id: str) -> list[str]:
    return [e.message for e in ledger.events(subject=job_id, limit=100)]


def test_the_tick_adopts_a_retry_the_host_made_after_its_probe(world: Any) -> None:
    ledger, host, job_id = world
    root = Path(host.root)
    spec = _attempt(root, job_id, 1, KILLED)
    assert gpuq_retry.retry_after(gpuq_files.Layout(str(root)), job_id, spec, 1) is not None
    # the probe saw attempt 1 exited (attempt 2's spec still in the inbox): the tick asks who retries it
    done = reconcile(ledger, host, Settings(), _probe({"job_id": job_id, "attempt": 1, "state": "exited",
                                                       "exit": KILLED}))
    assert [c[c.index("decide-retry") + 1:] for c in host.calls if "decide-retry" in c] == [(f"{job_id}:1",)]
    (settled,) = done.settled
    assert settled.klass == "killed" and settled.decision.action == "requeue"
    job = ledger.job(job_id)
    assert job.state == JobState.ASSIGNED.value and job.attempt_count == 2 and job.host == "h"
    first, second = ledger.attempts(job_id)
    assert (first.state, first.exit_code, second.state, second.host) == ("EXITED", 137, "STARTING", "h")
    history = _history(ledger, job_id)
    assert "killed: requeued with resume (retry 1 of 2)" in history and "attempt 2 on h" in history
    assert any(m.startswith("started by the host: its agent retried attempt 1 with resume") for m in history)
    assert ledger.failed_attempts(job_id) == 1  # the same accounting as gpuq's own retry


def test_the_tick_that_decides_first_keeps_the_host_from_retrying(world: Any) -> None:
    ledger, host, job_id = world
    root = Path(host.root)
    spec = _attempt(root, job_id, 1, KILLED)
    reconcile(ledger, host, Settings(), _probe({"job_id": job_id, "attempt": 1, "state": "exited", "exit": KILLED}))
    job = ledger.job(job_id)
    assert job.state == JobState.QUEUED.value and job.attempt_count == 1  # gpuq's own requeue: dispatch places it
    assert (_next(root, job_id, 1) or {}).get("by") == "controller"
    assert gpuq_retry.retry_after(gpuq_files.Layout(str(root)), job_id, spec, 1) is None
    assert _inbox(root, job_id) is None


def test_attempts_the_host_retried_before_the_tick_looked_come_in_the_probe(world: Any) -> None:
    ledger, host, job_id = world
    root = Path(host.root)
    spec = _attempt(root, job_id, 1, KILLED)
    lay = gpuq_files.Layout(str(root))
    assert gpuq_retry.retry_after(lay, job_id, spec, 1) is not None
    (root / protocol.INBOX_DIR / f"{job_id}.json").rename(root / protocol.CLAIMED_DIR / f"{job_id}.json")
    chain = gpuq_retry.chain(lay, job_id, 1, 2)  # what the status probe adds for the attempt the tick scanned
    assert [(c["attempt"], c["class"], c["exit"]["wrapper_code"]) for c in chain] == [(1, "killed", 137)]
    assert gpuq_retry.chain(lay, job_id, 2, 2) == []
    entry = {"job_id": job_id, "attempt": 2, "state": "running", "group_alive": True, "host_retried": chain}
    done = reconcile(ledger, host, Settings(), _probe(entry))
    assert not [c for c in host.calls if "decide-retry" in c]  # nothing to ask: the probe said it all
    assert [s.klass for s in done.settled] == ["killed"]
    assert [(a.number, a.state) for a in ledger.attempts(job_id)] == [(1, "EXITED"), (2, "RUNNING")]
    assert ledger.job(job_id).state == JobState.RUNNING.value
    reconcile(ledger, host, Settings(), _probe(entry))  # the next look changes nothing
    assert [(a.number, a.state) for a in ledger.attempts(job_id)] == [(1, "EXITED"), (2, "RUNNING")]


def _stand_in_chain(job_id: str, links: int, klass: str) -> dict[str, Any]:
    """What a lying agent claims: it retried attempts 1..``links`` of ``job_id`` itself, one after another,
    each with a long account of why."""
    chain = [{"attempt": k, "exit": {"job_id": job_id, "attempt": k, **KILLED}, "class": klass,
              "why": "the trainer died of signal 9 " + "\x1b[8m" + "x" * 100_000, "stacks": "saved " + "y" * 100_000}
             for k in range(1, links + 1)]
    return {"job_id": job_id, "attempt": links + 1, "state": "running", "group_alive": True, "host_retried": chain}


def test_the_controller_bounds_a_hosts_chain_as_the_agent_does() -> None:
    assert MAX_HOST_RETRIES == gpuq_retry.MAX_CHAIN


@pytest.mark.parametrize("klass", ["killed", "stalled"])
def test_a_host_that_claims_more_retries_than_the_job_has_gets_only_those(world: Any, klass: str) -> None:
    """retries=2 and a host that says it retried the job 20 times: two are adopted, the third attempt is settled
    as gpuq's own end (no retries left: LOST), never forced back into the queue; what the host said of each
    is one short line in the history."""
    ledger, host, job_id = world
    done = reconcile(ledger, host, Settings(), _probe(_stand_in_chain(job_id, MAX_HOST_RETRIES, klass)))
    assert [a.number for a in ledger.attempts(job_id)] == [1, 2, 3]
    job = ledger.job(job_id)
    assert job.state == JobState.LOST.value and job.attempt_count == 3
    assert [s.decision.action for s in done.settled] == ["requeue", "requeue", "keep_lost"]
    history = _history(ledger, job_id)
    assert any("retried attempt 3 itself, past retries=2: not adopted" in m for m in history), history
    assert max(len(m) for m in history) < 2 * MAX_LINE + 200 and not any("\x1b" in m for m in history)
    reconcile(ledger, host, Settings(), _probe(_stand_in_chain(job_id, MAX_HOST_RETRIES, klass)))  # asked again
    assert [a.number for a in ledger.attempts(job_id)] == [1, 2, 3] and _history(ledger, job_id) == history


def test_a_host_that_cannot_say_who_retries_leaves_the_attempt_to_the_next_look(world: Any) -> None:
    ledger, host, job_id = world
    _attempt(Path(host.root), job_id, 1, KILLED)
    seen = {"job_id": job_id, "attempt": 1, "state": "exited", "exit": KILLED}
    host.down = True
    assert reconcile(ledger, host, Settings(), _probe(seen)).settled == []
    assert ledger.job(job_id).state == JobState.RUNNING.value and ledger.attempt(job_id, 1).state == "RUNNING"
    host.down = False
    (settled,) = reconcile(ledger, host, Settings(), _probe(seen)).settled
    assert settled.decision.action == "requeue" and ledger.job(job_id).state == JobState.QUEUED.value


def test_restart_on_host_is_stale_after_another_command_and_refused_after_a_cancel(world: Any) -> None:
    ledger, _host, job_id = world
    ledger.transition(job_id, AttemptState.EXITED, attempt=1)
    assert ledger.restart_on_host(job_id, of_attempt=2, host="h", message="m", note="n") is None
    ledger.transition(job_id, JobState.CANCELLED, message="cancelled by user")
    with pytest.raises(IllegalTransition):
        ledger.restart_on_host(job_id, of_attempt=1, host="h", message="m", note="n")
    assert [a.number for a in ledger.attempts(job_id)] == [1]  # nothing changed


def test_a_cancel_records_the_hosts_retry_first_and_forbids_the_next(world: Any) -> None:
    """``before_cancel``: an attempt the host already started is in the ledger before the cancel ends it; a
    job whose host has not retried it never will (its next.json is gpuq's)."""
    ledger, host, job_id = world
    root = Path(host.root)
    spec = _attempt(root, job_id, 1, KILLED)
    assert gpuq_retry.retry_after(gpuq_files.Layout(str(root)), job_id, spec, 1) is not None
    host_retries.before_cancel(ledger, host, [ledger.job(job_id)], Settings())
    assert [(a.number, a.state) for a in ledger.attempts(job_id)] == [(1, "EXITED"), (2, "STARTING")]
    assert any(m.startswith("started by the host") for m in _history(ledger, job_id))
    assert (_next(root, job_id, 2) or {}).get("by") is None  # attempt 2 was never launched: nothing to decide

    other = _ledger_job(ledger, name="other")
    ledger.start_attempt(other, host="h", bundle_sha=SHA)
    running = _attempt(root, other, 1, None)  # still running when the cancel comes
    host_retries.before_cancel(ledger, host, [ledger.job(other)], Settings())
    assert (_next(root, other, 1) or {}).get("by") == "controller"
    (root / protocol.JOBS_DIR / other / protocol.ATTEMPTS_DIR / "1" / protocol.EXIT_FILE).write_text(
        json.dumps(KILLED))  # it dies as the cancel lands: the host does not retry it
    assert gpuq_retry.retry_after(gpuq_files.Layout(str(root)), other, running, 1) is None
    assert [a.number for a in ledger.attempts(other)] == [1]
