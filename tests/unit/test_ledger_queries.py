"""The ledger's hosts, queries, findings, checkpoints, prices and run history, value for value
(orchestrator/ledger/store.py; scripts/mutation.py ledger).  tests/unit/test_ledger.py covers
transitions, atomic sweeps and the file itself."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from orchestrator.core.errors import IllegalTransition, JobNotFound, LedgerError
from orchestrator.core.specs import JobSpec
from orchestrator.core.states import AttemptState, HoldChange, HoldKind, JobState
from orchestrator.host_documents import ResultCheckpoint
from orchestrator.ledger import Ledger
from orchestrator.ledger.tables import Event, HostRow

_ck = ResultCheckpoint.model_validate  # a checkpoint as checked at the edge


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "home" / "ledger.db")


def _sweep(ledger: Ledger, sweep_id: str, names: tuple[str, ...] = ("a", "b", "c"), *, config: str = "c.yaml",
           gpus: int = 1) -> list[str]:
    specs = [JobSpec(name=n, config=config, task="classify", config_sha256="0" * 64, line=i + 1, gpus=gpus,
                     epochs=3) for i, n in enumerate(names)]
    rows = ledger.add_sweep(sweep_id=sweep_id, queue_path="q.txt", workdir="/w", queue_text="...", jobs=specs,
                            default_retries=1)
    return [r.id for r in rows]


def _events(ledger: Ledger, subject: str) -> list[tuple[str, str, str]]:
    """The subject's own events, oldest first (``events`` matches subjects by prefix)."""
    return [(e.old, e.new, e.message) for e in ledger.events(subject) if e.subject == subject]


def _run(ledger: Ledger, job: str, host: str = "local", *, code: int = 0, started: float = 100.0,
         ended: float = 160.0) -> None:
    """A job's attempt runs and exits ``code``; the job ends SUCCEEDED or FAILED."""
    n = ledger.start_attempt(job, host=host, bundle_sha="s").number
    ledger.transition(job, AttemptState.RUNNING, attempt=n)
    ledger.transition(job, JobState.RUNNING)
    ledger.update_attempt(job, n, started_at=started, ended_at=ended, exit_code=code)
    ledger.transition(job, AttemptState.EXITED, attempt=n)
    ledger.transition(job, JobState.SUCCEEDED if code == 0 else JobState.FAILED)


# --- hosts --------------------------------------------------------------------------------------


def test_ensure_host_adds_once_then_updates_root_and_python(ledger: Ledger) -> None:
    first = ledger.ensure_host("h1", kind="ssh", root="/r1", python="/p1", target="root@h1")
    assert (first.name, first.kind, first.root, first.python, first.target) == ("h1", "ssh", "/r1", "/p1", "root@h1")
    assert first.created_at > 0
    again = ledger.ensure_host("h1", kind="local", root="/r2", python="/p2", target="other")
    assert (again.kind, again.root, again.python, again.target) == ("ssh", "/r2", "/p2", "root@h1")
    assert _events(ledger, "h1") == [("", "added", "ssh root=/r1")]
    assert [h.name for h in ledger.hosts()] == ["h1"]


def test_add_update_and_remove_a_host(ledger: Ledger) -> None:
    ledger.add_host(HostRow(name="zz", kind="ssh", target="root@zz", root="/r", profile="p1"))
    ledger.add_host(HostRow(name="aa", kind="ssh", target="root@aa", root="/r"))
    assert [h.name for h in ledger.hosts()] == ["aa", "zz"]
    with pytest.raises(LedgerError) as info:
        ledger.add_host(HostRow(name="zz", kind="ssh", target="x", root="/r"))
    assert str(info.value) == 'host "zz" is already registered'
    ledger.change_hold("zz", HoldChange(HoldKind.DISK, "97% used"), slots_total=4)
    row = ledger.host("zz")
    assert row is not None and (row.slots_total, row.hold, row.hold_text, row.root) == (
        4, HoldKind.DISK, "disk: 97% used", "/r")
    with pytest.raises(LedgerError) as info:
        ledger.update_host("nope", slots_total=1)
    assert str(info.value) == "unknown host 'nope'"
    ledger.remove_host("zz", "removed by the user")
    ledger.remove_host("never-there", "x")  # nothing to remove: no event
    assert ledger.host("zz") is None and [h.name for h in ledger.hosts()] == ["aa"]
    assert _events(ledger, "zz") == [("", "added", "ssh root@zz root=/r profile=p1"),
                                     ("added", "removed", "removed by the user")]
    assert _events(ledger, "never-there") == []


# --- sweeps and jobs ----------------------------------------------------------------------------


def test_sweeps_in_order_and_their_hosts(ledger: Ledger) -> None:
    _sweep(ledger, "q1aaaaa")
    time.sleep(0.01)
    _sweep(ledger, "q1bbbbb", ("d",))
    assert [s.id for s in ledger.sweeps()] == ["q1aaaaa", "q1bbbbb"]
    assert ledger.sweep_ids() == {"q1aaaaa", "q1bbbbb"}
    assert ledger.sweep("nope") is None
    ledger.set_sweep_hosts("q1aaaaa", ["h2", "h1", "h2"])
    sweep = ledger.sweep("q1aaaaa")
    assert sweep is not None and sweep.hosts == "h1,h2"
    assert _events(ledger, "q1aaaaa")[-1] == ("", "", "may use hosts h1,h2")
    with pytest.raises(LedgerError) as info:
        ledger.set_sweep_hosts("nope", ["h1"])
    assert str(info.value) == "no sweep 'nope'"


def test_resolve_sweep_by_newest_id_and_prefix(ledger: Ledger) -> None:
    with pytest.raises(JobNotFound) as info:
        ledger.resolve_sweep(None)
    assert str(info.value) == "no sweeps yet; submit one with `gpuq submit QUEUE`"
    _sweep(ledger, "q1aaaaa")
    time.sleep(0.01)
    _sweep(ledger, "q1abbbb", ("d",))
    assert ledger.resolve_sweep(None).id == "q1abbbb"
    assert ledger.resolve_sweep("q1aa").id == "q1aaaaa"
    assert ledger.resolve_sweep("q1aaaaa").id == "q1aaaaa"
    with pytest.raises(JobNotFound) as info:
        ledger.resolve_sweep("q1a")
    assert str(info.value) == "sweep prefix 'q1a' is ambiguous: q1aaaaa, q1abbbb"
    with pytest.raises(JobNotFound) as info:
        ledger.resolve_sweep("zz")
    assert str(info.value) == "no sweep matches 'zz'; `gpuq status` lists the sweeps"
    with pytest.raises(JobNotFound) as info:
        ledger.job("nope")
    assert str(info.value) == "no job 'nope'"


def test_jobs_by_sweep_and_state_and_the_counts(ledger: Ledger) -> None:
    a, b, c = _sweep(ledger, "q1aaaaa")
    (d,) = _sweep(ledger, "q1bbbbb", ("d",))
    _run(ledger, a)
    _run(ledger, b, code=1)
    assert [j.id for j in ledger.jobs()] == [a, b, c, d]
    assert [j.id for j in ledger.jobs(sweep_id="q1aaaaa")] == [a, b, c]
    assert [j.id for j in ledger.jobs(states=[JobState.QUEUED])] == [c, d]
    assert [j.id for j in ledger.jobs(sweep_id="q1aaaaa", states=[JobState.SUCCEEDED, JobState.FAILED])] == [a, b]
    assert ledger.state_counts() == {"q1aaaaa": {"SUCCEEDED": 1, "FAILED": 1, "QUEUED": 1}, "q1bbbbb": {"QUEUED": 1}}
    done = ledger.job(a)
    assert ledger.succeeded_with([done.spec_hash, ledger.job(b).spec_hash, "x"]) == {done.spec_hash: done}


# --- attempts -----------------------------------------------------------------------------------


def test_start_attempt_only_from_queued_and_with_the_hosts_price(ledger: Ledger) -> None:
    a, b, c = _sweep(ledger, "q1aaaaa", gpus=2)
    ledger.add_host(HostRow(name="paid", kind="ssh", target="t", root="/r", price_per_hour=4.0, gpu_count=8))
    ledger.add_host(HostRow(name="slots", kind="ssh", target="t", root="/r", price_per_hour=1.0, slots_total=1))
    ledger.add_host(HostRow(name="free", kind="ssh", target="t", root="/r"))
    first = ledger.start_attempt(a, host="paid", bundle_sha="b1", resume_from="ck")
    assert (first.job_id, first.number, first.host, first.state, first.bundle_sha, first.resume_from) == (
        a, 1, "paid", "STARTING", "b1", "ck")
    assert (first.price_per_hour, first.gpu_share) == (4.0, 0.25)
    assert ledger.start_attempt(b, host="slots", bundle_sha="b").gpu_share == 1.0  # 2 GPUs of 1 slot: the whole host
    free = ledger.start_attempt(c, host="free", bundle_sha="b")
    assert (free.price_per_hour, free.gpu_share) == (None, 1.0)
    job = ledger.job(a)
    assert (job.state, job.attempt_count, job.host) == ("ASSIGNED", 1, "paid")
    assert _events(ledger, a)[-1] == ("QUEUED", "ASSIGNED", "attempt 1 on paid")
    assert _events(ledger, f"{a}/a1") == [("", "STARTING", "paid")]
    with pytest.raises(IllegalTransition) as info:
        ledger.start_attempt(a, host="other", bundle_sha="b")
    assert str(info.value) == (f"job {a}: cannot go from ASSIGNED to ASSIGNED (attempt 2 on other: only a QUEUED "
                               "job starts)")
    with pytest.raises(JobNotFound):
        ledger.start_attempt("nope", host="x", bundle_sha="b")
    assert ledger.attempt(a, 1) is not None and ledger.attempt(a, 2) is None


def test_a_multi_node_attempt_names_its_nodes_and_pays_for_every_nodes_host(ledger: Ledger) -> None:
    a, b, c = _sweep(ledger, "q1bbbbb", gpus=2)
    ledger.add_host(HostRow(name="h0", kind="ssh", target="t", root="/r", price_per_hour=4.0, gpu_count=8))
    ledger.add_host(HostRow(name="h1", kind="ssh", target="t", root="/r", price_per_hour=2.0, gpu_count=4))
    ledger.add_host(HostRow(name="own", kind="ssh", target="t", root="/r"))
    both = ledger.start_attempt(a, host="h0", bundle_sha="b", peers=["h1"])
    assert both.node_hosts() == ["h0", "h1"] and ledger.job(a).host == "h0"
    assert (both.price_per_hour, both.gpu_share) == (4.0 * 0.25 + 2.0 * 0.5, 1.0)
    mixed = ledger.start_attempt(b, host="own", bundle_sha="b", peers=["h1"])  # a box you own costs nothing
    assert (mixed.price_per_hour, mixed.gpu_share) == (1.0, 1.0)
    one = ledger.start_attempt(c, host="h1", bundle_sha="b")
    assert one.node_hosts() == [] and one.nodes == "" and (one.price_per_hour, one.gpu_share) == (2.0, 0.5)


def test_move_job_word_for_word(ledger: Ledger) -> None:
    (a,) = _sweep(ledger, "q1aaaaa", ("a",))
    ledger.add_host(HostRow(name="paid", kind="ssh", target="t", root="/r", price_per_hour=2.0, gpu_count=2))
    ledger.start_attempt(a, host="busy", bundle_sha="b1", resume_from="ck")
    moved = ledger.move_job(a, from_attempt=1, to_host="paid", bundle_sha="b2", message="stolen by paid")
    assert (moved.number, moved.host, moved.state, moved.bundle_sha, moved.resume_from) == (
        2, "paid", "STARTING", "b2", "ck")
    assert (moved.price_per_hour, moved.gpu_share) == (2.0, 0.5)
    old = ledger.attempt(a, 1)
    assert old is not None and (old.state, old.message) == ("KILLED", "stolen by paid") and old.ended_at
    job = ledger.job(a)
    assert (job.state, job.attempt_count, job.host) == ("ASSIGNED", 2, "paid")
    assert _events(ledger, f"{a}/a1")[-1] == ("STARTING", "KILLED", "stolen by paid")
    assert _events(ledger, a)[-1] == ("ASSIGNED", "ASSIGNED", "stolen by paid")
    assert _events(ledger, f"{a}/a2") == [("", "STARTING", "paid")]
    with pytest.raises(IllegalTransition) as info:
        ledger.move_job(a, from_attempt=1, to_host="x", bundle_sha="b", message="m")
    assert str(info.value) == f"job {a}: cannot go from ASSIGNED to moved (attempt 1 is not current)"
    with pytest.raises(JobNotFound) as info:
        ledger.move_job(a, from_attempt=7, to_host="x", bundle_sha="b", message="m")
    assert str(info.value) == f"no attempt 7 of job {a!r}"
    ledger.transition(a, AttemptState.RUNNING, attempt=2)
    ledger.transition(a, AttemptState.EXITED, attempt=2)
    with pytest.raises(IllegalTransition) as info:  # an attempt that ended cannot be withdrawn
        ledger.move_job(a, from_attempt=2, to_host="x", bundle_sha="b", message="m")
    assert str(info.value) == f"attempt {a}/a2: cannot go from EXITED to KILLED"


def test_attempt_queries(ledger: Ledger) -> None:
    a, b, c = _sweep(ledger, "q1aaaaa")
    ledger.start_attempt(a, host="h", bundle_sha="s")
    ledger.transition(a, AttemptState.LOST, attempt=1)
    ledger.transition(a, JobState.LOST)
    ledger.transition(a, JobState.QUEUED)  # requeued with resume
    _run(ledger, a)
    _run(ledger, b)
    assert [(x.job_id, x.number) for x in ledger.attempts()] == sorted([(a, 1), (a, 2), (b, 1)])
    assert [x.number for x in ledger.attempts(a)] == [1, 2]
    assert [(x.job_id, x.number) for x in ledger.attempts_of([b, a, a, c])] == sorted([(a, 1), (a, 2), (b, 1)])
    latest = ledger.latest_attempts([a, b, c])
    assert {k: v.number for k, v in latest.items()} == {a: 2, b: 1}
    ledger.update_attempt(a, 2, step=40, loss=0.5)
    row = ledger.attempt(a, 2)
    assert row is not None and (row.step, row.loss, row.state) == (40, 0.5, "EXITED")
    with pytest.raises(LedgerError) as info:
        ledger.update_attempt(a, 2, state="RUNNING")
    assert str(info.value) == "update_attempt cannot change a state; use Ledger.transition"


def test_attempt_queries_cross_their_500_id_chunks(ledger: Ledger) -> None:
    names = tuple(f"j{i:04d}" for i in range(1003))
    ids = _sweep(ledger, "q1aaaaa", names)
    for job in (ids[0], ids[499], ids[500], ids[1002]):
        ledger.start_attempt(job, host="h", bundle_sha="b")
    assert len(ledger.attempts_of(ids)) == 4
    assert set(ledger.latest_attempts(ids)) == {ids[0], ids[499], ids[500], ids[1002]}
    for job in (ids[0], ids[1002]):
        ledger.record_finding("job", job, severity="warn", rule="stalled", message="m")
    assert set(ledger.open_findings(ids)) == {(ids[0], "stalled"), (ids[1002], "stalled")}


# --- events and findings ------------------------------------------------------------------------


def test_an_event_repeated_only_when_asked(ledger: Ledger) -> None:
    ledger.record_event("host", "h1", "cannot place c1")
    ledger.record_event("host", "h1", "cannot place c1", unless_repeated=True)
    ledger.record_event("host", "h1", "cannot place c1")
    ledger.record_event("host", "h1", "other", unless_repeated=True)
    ledger.record_event("host", "h2", "cannot place c1", unless_repeated=True)
    assert [e.message for e in ledger.events("h1")] == ["cannot place c1", "cannot place c1", "other"]
    assert [(e.kind, e.subject) for e in ledger.events("h2")] == [("host", "h2")]
    assert [e.message for e in ledger.events(limit=2)] == ["other", "cannot place c1"]  # the newest, oldest first


def test_findings_open_close_and_alerts(ledger: Ledger) -> None:
    made = ledger.record_finding("host", "h1", severity="warn", rule="disk", message="disk 91%", action="free it")
    assert isinstance(made, Event) and made.id is not None
    assert (made.kind, made.subject, made.severity, made.rule, made.message, made.action) == (
        "host", "h1", "warn", "disk", "disk 91%", "free it")
    ledger.record_finding("host", "h1", severity="escalate", rule="disk", message="disk 96%")
    ledger.record_finding("host", "h1", severity="escalate", rule="xid", message="Xid 79")
    ledger.record_finding("host", "h1", severity="info", rule="xid", message="cleared")
    ledger.record_finding("host", "h2", severity="warn", rule="memory", message="memory 91%")
    ledger.record_event("host", "h1", "a plain event")  # no rule: never a finding
    found = ledger.open_findings(["h1", "h1", "h3"])
    assert {k: (v.severity, v.message) for k, v in found.items()} == {("h1", "disk"): ("escalate", "disk 96%")}
    assert [a.message for a in ledger.alerts()] == ["memory 91%", "cleared", "Xid 79", "disk 96%", "disk 91%"]
    assert [a.message for a in ledger.alerts(limit=2)] == ["memory 91%", "cleared"]
    assert ledger.alerts(since=time.time() + 60) == []
    assert len(ledger.alerts(since=made.time)) == 5


# --- checkpoints, metrics, history -------------------------------------------------------------


def test_checkpoints_are_recorded_once_per_sha_and_one_copy_is_durable(ledger: Ledger) -> None:
    a, b, _ = _sweep(ledger, "q1aaaaa", config="big.yaml")
    ledger.start_attempt(a, host="h", bundle_sha="s")
    ledger.record_checkpoint(a, 1, _ck({"file": "latest-000020.pt", "step": 20, "epoch": 1, "sha256": "b" * 64,
                                    "bytes": 300, "written_at": 5.0}))
    ledger.record_checkpoint(a, 1, _ck({"file": "latest-000010.pt", "step": 10, "sha256": "a" * 64, "bytes": 900}))
    ledger.record_checkpoint(a, 1, _ck({"file": "dup.pt", "step": 99, "sha256": "a" * 64, "bytes": 1}))  # seen
    ledger.record_checkpoint(a, 1, _ck({"file": "nosha.pt", "step": 5}))  # no sha: nothing to pin
    rows = ledger.checkpoints(a)
    assert [(r.file, r.step, r.epoch, r.sha256[0], r.bytes, r.attempt) for r in rows] == [
        ("latest-000010.pt", 10, None, "a", 900, 1), ("latest-000020.pt", 20, 1, "b", 300, 1)]
    assert rows[1].written_at == 5.0 and rows[0].written_at > 1e9
    ledger.mark_checkpoint_durable(a, "a" * 64, "/home/ck/a.pt", "h")
    ledger.mark_checkpoint_durable(a, "b" * 64, "/home/ck/b.pt", "h2")
    assert [(r.durable_path, r.host) for r in ledger.checkpoints(a)] == [("", "h"), ("/home/ck/b.pt", "h2")]
    ledger.mark_checkpoint_durable(a, "c" * 64, "/x", "h3")  # unknown sha: the known copies lose the mark
    assert [r.durable_path for r in ledger.checkpoints(a)] == ["", ""]
    ledger.start_attempt(b, host="h", bundle_sha="s")
    ledger.record_checkpoint(b, 1, _ck({"file": "x.pt", "step": 1, "sha256": "d" * 64, "bytes": 1200}))
    assert ledger.checkpoint_bytes_by_config() == {"big.yaml": 1200}
    # the same bytes in another job are that job's own checkpoint; a bare pointer gets empty values
    ledger.record_checkpoint(b, 1, _ck({"file": "same.pt", "step": 3, "sha256": "a" * 64, "bytes": 900}))
    ledger.record_checkpoint(b, 1, _ck({"sha256": "e" * 64}))
    assert {(r.file, r.step, r.sha256[0], r.bytes) for r in ledger.checkpoints(b)} == {
        ("x.pt", 1, "d", 1200), ("same.pt", 3, "a", 900), ("", 0, "e", 0)}
    assert len(ledger.checkpoints(a)) == 2


def test_metrics_scopes_and_curves_in_step_order(ledger: Ledger) -> None:
    a, b, _ = _sweep(ledger, "q1aaaaa")
    _run(ledger, a)
    ledger.record_results(a, 1, metrics=[("final", "val_acc", 0.8, 30, 3), ("best", "val_acc", 0.9, 20, 2),
                                         ("curve", "val_acc", 0.7, 20, None), ("curve", "val_acc", 0.5, 10, None),
                                         ("curve", "loss", 1.5, 0, None)], artifacts=[("r/b.txt", 2, "f" * 64),
                                                                                     ("r/a.txt", 1, "e" * 64)])
    assert [(m.scope, m.value) for m in ledger.metrics([a])] == [("final", 0.8), ("best", 0.9)]
    assert [m.value for m in ledger.metrics([a, b], scopes=("curve",))] == [0.7, 0.5, 1.5]
    assert ledger.curves([a, b]) == {a: {"val_acc": [(10, 0.5), (20, 0.7)], "loss": [(0, 1.5)]}}
    assert [x.path for x in ledger.artifacts(a)] == ["r/a.txt", "r/b.txt"]


def test_run_history_counts_only_clean_runs_from_scratch(ledger: Ledger) -> None:
    a, b, c = _sweep(ledger, "q1aaaaa", config="h.yaml")
    d, e = _sweep(ledger, "q1bbbbb", ("d", "e"), config="h.yaml")
    _run(ledger, a, started=100.0, ended=160.0)
    _run(ledger, b, code=1)  # failed
    _run(ledger, c, started=100.0, ended=100.0)  # no duration
    ledger.start_attempt(d, host="h", bundle_sha="s", resume_from="ck")  # a resumed run trained part of it
    ledger.transition(d, AttemptState.RUNNING, attempt=1)
    ledger.transition(d, JobState.RUNNING)
    ledger.update_attempt(d, 1, started_at=0.0, ended_at=30.0, exit_code=0)
    ledger.transition(d, AttemptState.EXITED, attempt=1)
    ledger.transition(d, JobState.SUCCEEDED)
    _run(ledger, e, started=10.0, ended=100.0)
    assert ledger.run_history() == [("h.yaml", "classify", 3, 60.0), ("h.yaml", "classify", 3, 90.0)]


# --- sweeps, transitions and results, field for field ------------------------------------------


def test_add_sweep_stores_every_field_and_one_event(ledger: Ledger) -> None:
    specs = [JobSpec(name="a", config="c.yaml", task="classify", config_sha256="0" * 64, line=1, est_min=12.5,
                     seed=7, host="g0", retries=4, args=("--lr", "0.1"), cell="grid", raw="c.yaml classify"),
             JobSpec(name="b", config="c.yaml", task="classify", config_sha256="0" * 64, line=2)]
    rows = ledger.add_sweep(sweep_id="q1aaaaa", queue_path="q.txt", workdir="/w", queue_text="text", jobs=specs,
                            default_retries=2, bundle_sha="f" * 64, hosts=["g0", "g1"], entry="train.py",
                            launcher="python", verify=["metrics"], run='{"command": "x"}')
    sweep = ledger.sweep("q1aaaaa")
    assert sweep is not None
    assert (sweep.queue_path, sweep.workdir, sweep.queue_text, sweep.bundle_sha, sweep.hosts, sweep.entry,
            sweep.launcher, sweep.verify, sweep.run, sweep.job_count) == (
        "q.txt", "/w", "text", "f" * 64, "g0,g1", "train.py", "python", "metrics", '{"command": "x"}', 2)
    a, b = (ledger.job(r.id) for r in rows)
    assert (a.est_min, a.seed, a.host_pin, a.retries, a.args, a.cell, a.raw, a.line, a.state) == (
        12.5, 7, "g0", 4, '["--lr", "0.1"]', "grid", "c.yaml classify", 1, "QUEUED")
    assert (b.est_min, b.seed, b.host_pin, b.retries, b.args, b.cell) == (None, None, None, 2, "[]", "b")
    assert [(e.kind, e.old, e.new, e.message) for e in ledger.events("q1aaaaa") if e.subject == "q1aaaaa"] == [
        ("sweep", "", "submitted", "2 jobs from q.txt")]
    ledger.add_sweep(sweep_id="q2aaaaa", queue_path="q.txt", workdir="/w", queue_text="", jobs=specs[1:],
                     default_retries=0)
    plain = ledger.sweep("q2aaaaa")
    assert plain is not None and (plain.bundle_sha, plain.hosts, plain.entry, plain.launcher, plain.verify,
                                  plain.run) == ("", "", "", "torchrun", "metrics,best_ckpt", "")
    with pytest.raises(LedgerError) as info:
        ledger.add_sweep(sweep_id="q1aaaaa", queue_path="q", workdir="/w", queue_text="", jobs=[],
                         default_retries=0)
    assert str(info.value) == "sweep q1aaaaa already exists"


def test_transitions_word_for_word(ledger: Ledger) -> None:
    a, b = _sweep(ledger, "q1aaaaa", ("a", "b"))
    with pytest.raises(LedgerError) as info:
        ledger.transition(a, AttemptState.RUNNING)
    assert str(info.value) == "<AttemptState.RUNNING: 'RUNNING'> is not a job state"
    with pytest.raises(LedgerError) as info:
        ledger.transition(a, JobState.RUNNING, attempt=1)
    assert str(info.value) == "<JobState.RUNNING: 'RUNNING'> is not an attempt state"
    with pytest.raises(JobNotFound) as info:
        ledger.transition("nope", JobState.CANCELLED)
    assert str(info.value) == "no job 'nope'"
    with pytest.raises(JobNotFound) as info:
        ledger.transition(a, AttemptState.RUNNING, attempt=1)
    assert str(info.value) == f"no attempt 1 of job {a!r}"
    with pytest.raises(IllegalTransition) as info:
        ledger.transition(a, JobState.SUCCEEDED)
    assert str(info.value) == f"job {a}: cannot go from QUEUED to SUCCEEDED"
    ledger.start_attempt(a, host="h", bundle_sha="s")
    ledger.start_attempt(b, host="h", bundle_sha="s")
    assert ledger.transition(b, AttemptState.RUNNING, attempt=1, message="b runs") is True
    assert [(x.job_id, x.state) for x in ledger.attempts()] == sorted([(a, "STARTING"), (b, "RUNNING")])
    assert ledger.transition(b, AttemptState.RUNNING, attempt=1) is False  # already: idempotent
    assert _events(ledger, f"{b}/a1")[-1] == ("STARTING", "RUNNING", "b runs")
    with pytest.raises(IllegalTransition) as info:
        ledger.transition(b, AttemptState.STARTING, attempt=1)
    assert str(info.value) == f"attempt {b}/a1: cannot go from RUNNING to STARTING"
    assert ledger.transition(a, JobState.RUNNING, message="a runs") is True
    assert ledger.transition(a, JobState.RUNNING) is False
    assert _events(ledger, a)[-1] == ("ASSIGNED", "RUNNING", "a runs")
    # news of attempt 1 cannot change a job whose current attempt is another one
    assert ledger.transition(a, JobState.LOST, of_attempt=2) is False and ledger.job(a).state == "RUNNING"
    assert ledger.transition(a, JobState.LOST, of_attempt=1) is True and ledger.job(a).state == "LOST"
    ledger.update_attempt(b, 1, step=5)
    assert ledger.attempt(a, 1).step is None  # type: ignore[union-attr]
    assert ledger.attempt(b, 1).step == 5  # type: ignore[union-attr]
    ledger.record_event("job", a, "plain")
    assert _events(ledger, a)[-1] == ("", "", "plain")


def test_results_keep_each_metrics_step_and_epoch(ledger: Ledger) -> None:
    (a,) = _sweep(ledger, "q1aaaaa", ("a",))
    ledger.start_attempt(a, host="h", bundle_sha="s")
    ledger.record_results(a, 1, metrics=[("final", "val_acc", 0.8, 30, 3)], artifacts=[],
                          checkpoint=_ck({"file": "best.pt", "step": 30, "sha256": "c" * 64, "bytes": 10}))
    [m] = ledger.metrics([a])
    assert (m.attempt, m.scope, m.name, m.value, m.step, m.epoch) == (1, "final", "val_acc", 0.8, 30, 3)
    assert [c.file for c in ledger.checkpoints(a)] == ["best.pt"]


def test_events_default_to_the_newest_200(ledger: Ledger) -> None:
    for i in range(205):
        ledger.record_event("host", "h1", f"e{i}")
    got = ledger.events("h1")
    assert len(got) == 200 and (got[0].message, got[-1].message) == ("e5", "e204")


def test_a_hosts_events_are_its_own_not_those_of_a_host_it_prefixes(ledger: Ledger, gpuq_home: Path) -> None:
    """`gpuq hosts show gpu1` lists gpu1's events only: gpu10's start with "gpu1" too (a job's events
    are read by prefix, its attempts' subjects being ``JOB/aN``; a host's are not)."""
    for name in ("gpu1", "gpu10"):
        ledger.ensure_host(name, kind="ssh", root="/r")
        ledger.record_event("host", name, f"{name} said hello")
    own = ledger.events("gpu1", exact=True)
    assert {e.subject for e in own} == {"gpu1"} and "gpu1 said hello" in [e.message for e in own]
    assert {e.subject for e in ledger.events("gpu1")} == {"gpu1", "gpu10"}  # the prefix read
    from orchestrator.api.hosts import hosts_show
    from orchestrator.context import open_context

    ctx = open_context()
    try:
        for name in ("gpu1", "gpu10"):
            ctx.ledger.ensure_host(name, kind="ssh", root="/r")
            ctx.ledger.record_event("host", name, f"{name} said hello")
        shown = hosts_show(ctx, "gpu1").events
        assert {e.subject for e in shown} == {"gpu1"} and "gpu1 said hello" in [e.message for e in shown]
    finally:
        ctx.close()
