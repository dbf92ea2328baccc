"""The tick's part of a multi-node attempt (orchestrator/tick/multinode.py), with a real ledger and
FakeHosts that record what gpuq asked of each node host: nodes that never all started are given up
without spending retries=, and an ended attempt has its other nodes stopped.

The same flows with real agents and torchrun run in tests/integration/test_multinode_ssh.py."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.context import Context, open_context
from orchestrator.core.specs import JobSpec, job_id_for
from orchestrator.core.states import AttemptState, JobState
from orchestrator.ledger import HostRow
from orchestrator.tick import gangs, host_answers, multinode
from orchestrator.tick.gangs import Part
from orchestrator.tick.probe import Probe
from tests.support.fakehost import FakeHost
from tests.support.wire import entry, status

SHA = "b" * 64


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Context, str, dict[str, FakeHost]]]:
    monkeypatch.setenv("GPUQ_HOME", str(tmp_path / "home"))
    ctx = open_context(overrides={"gang_timeout_s": 60})
    hosts = {}
    for name in ("a", "b"):
        host = FakeHost(tmp_path / f"host-{name}", name=name)
        Path(host.root).mkdir(parents=True)
        ctx.ledger.add_host(HostRow(name=name, kind="ssh", target=f"fake@{name}", root=host.root, slots_kind="cpu",
                                    slots_total=2, created_at=0, agent_bundle=SHA))
        ctx.fleet._hosts[name] = host
        hosts[name] = host
    ctx.ledger.add_sweep(sweep_id="qaaaaaa", queue_path="q.txt", workdir=str(tmp_path), queue_text="",
                         jobs=[JobSpec(name="wide", config="c.yaml", task="t", nodes=2, gpus=2)], default_retries=1)
    job = job_id_for("qaaaaaa", "wide")
    ctx.ledger.start_attempt(job, host="a", bundle_sha=SHA, peers=["b"])
    try:
        yield ctx, job, hosts
    finally:
        ctx.close()


def _verbs(host: FakeHost) -> list[str]:
    return [" ".join(call[call.index("--root") + 2:]) for call in host.calls if "--root" in call]


def _parts(job_id: str, head: str, peer: str) -> list[Part]:
    return [Part(0, "a", True, entry({"job_id": job_id, "attempt": 1, "state": head})),
            Part(1, "b", True, entry({"job_id": job_id, "attempt": 1, "state": peer}))]


def test_nodes_that_never_all_started_are_given_up_without_spending_a_retry(
        world: tuple[Context, str, dict[str, FakeHost]], monkeypatch: pytest.MonkeyPatch) -> None:
    ctx, job, hosts = world
    actions: list[str] = []
    multinode.after_reconcile(ctx, {job: _parts(job, "running", "queued")}, [], actions)
    assert actions == [] and ctx.ledger.job(job).state == JobState.ASSIGNED.value  # within gang_timeout_s
    created = ctx.ledger.attempt(job, 1).created_at
    monkeypatch.setattr(time, "time", lambda: created + 61)
    multinode.after_reconcile(ctx, {job: _parts(job, "running", "queued")}, [], actions)
    why = ("node 1 on b did not start within 60 s of the others (gang_timeout_s); requeued, not counted "
           "against retries=")
    assert actions == [f"wide ({job}): {why}"]
    assert (ctx.ledger.job(job).state, ctx.ledger.attempt(job, 1).state) == ("QUEUED", AttemptState.KILLED.value)
    assert ctx.ledger.failed_attempts(job) == 0
    assert _verbs(hosts["a"]) == [f"kill {job} 1"]  # node 0 runs: killed by its group
    assert _verbs(hosts["b"]) == [f"withdraw {job}", f"kill {job} 1"]  # node 1 waits: taken out of the inbox
    told = [e.message for e in ctx.ledger.events(subject=job)]
    assert any(m.startswith("attempt 1: its nodes did not all start; stopped the other nodes: node 0 on a: ")
               for m in told), told


def test_none_started_is_no_reason_to_give_up(world: tuple[Context, str, dict[str, FakeHost]],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    ctx, job, hosts = world
    monkeypatch.setattr(time, "time", lambda: ctx.ledger.attempt(job, 1).created_at + 3600)
    multinode.after_reconcile(ctx, {job: _parts(job, "queued", "queued")}, [], [])
    assert ctx.ledger.job(job).state == JobState.ASSIGNED.value and not _verbs(hosts["a"]) + _verbs(hosts["b"])


def test_an_ended_attempt_has_its_other_nodes_stopped(world: tuple[Context, str, dict[str, FakeHost]]) -> None:
    ctx, job, hosts = world
    ctx.ledger.transition(job, AttemptState.EXITED, attempt=1, message="exit 1")
    ctx.ledger.transition(job, JobState.FAILED, message="exit 1", of_attempt=1)
    parts = [Part(0, "a", True, entry({"job_id": job, "attempt": 1, "state": "exited", "exit": {"wrapper_code": 1}})),
             Part(1, "b", True, entry({"job_id": job, "attempt": 1, "state": "running"}))]
    multinode.after_reconcile(ctx, {job: parts}, [job], [])
    assert _verbs(hosts["a"]) == [] and _verbs(hosts["b"]) == [f"kill {job} 1"]
    assert any(e.message.startswith("attempt 1: it ended; stopped the other nodes: node 1 on b: ")
               for e in ctx.ledger.events(subject=job))


def test_a_running_gang_seen_through_the_ticks_filter_is_never_given_up(
        world: tuple[Context, str, dict[str, FakeHost]], monkeypatch: pytest.MonkeyPatch) -> None:
    """The tick cuts each host's document to the jobs placed there (host_answers.only_known): node 1's
    host must keep its part, or a gang that runs past gang_timeout_s looks half-started and is killed."""
    ctx, job, hosts = world
    stranger = job_id_for("qzzzzzz", "other")
    probes = [Probe("a", True, status({"jobs": [{"job_id": job, "attempt": 1, "state": "running"}]})),
              Probe("b", True, status({"jobs": [{"job_id": job, "attempt": 1, "state": "running"},
                                                {"job_id": stranger, "attempt": 1, "state": "running"}]}))]
    kept = host_answers.only_known(ctx.ledger, probes)
    assert [[j.job_id for j in p.doc.jobs] for p in kept if p.doc] == [[job], [job]]  # the stranger is dropped
    active = ctx.ledger.jobs(states=[JobState.ASSIGNED])
    parts = gangs.parts_this_tick(active, ctx.ledger.latest_attempts([job]), {p.host: p.doc for p in kept})
    assert [(p.host, p.state) for p in parts[job]] == [("a", "running"), ("b", "running")]
    monkeypatch.setattr(time, "time", lambda: ctx.ledger.attempt(job, 1).created_at + 3600)
    actions: list[str] = []
    multinode.after_reconcile(ctx, parts, [], actions)
    assert actions == [] and ctx.ledger.job(job).state == JobState.ASSIGNED.value
    assert not _verbs(hosts["a"]) + _verbs(hosts["b"])


def test_a_gang_of_a_sweep_whose_run_cannot_be_read_is_not_sent(
        world: tuple[Context, str, dict[str, FakeHost]]) -> None:
    from orchestrator.core.specs import Assignment

    ctx, _, hosts = world
    (job,) = ctx.ledger.add_sweep(sweep_id="qbadrun", queue_path="q.txt", workdir="/w", queue_text="",
                                  jobs=[JobSpec(name="wide", config="c.yaml", task="t", nodes=2, gpus=2)],
                                  default_retries=1, run='{"command": "t.py"}')
    assert gangs.deliver(ctx.ledger, ctx.fleet, ctx.settings, [Assignment(job_id=job.id, host="a", peers=("b",))],
                         {job.id: job}, SHA) == {}
    got = ctx.ledger.job(job.id)
    assert (got.state, got.attempt_count) == (JobState.QUEUED.value, 0)
    assert "its recorded [run] table cannot be read" in ctx.ledger.events(job.id)[-1].message
    assert not _verbs(hosts["a"]) and not _verbs(hosts["b"])
