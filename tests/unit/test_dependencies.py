"""``after=`` (issue 41): the parser and its whole-file checks, cycles, the scheduler's critical path first, the
gate over a real ledger, and what a waiting job's spec is handed (docs/queue.md, "Dependencies")."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from orchestrator.agent.handed import handed_env, remote_path, render_args
from orchestrator.api.explaining import waits_of
from orchestrator.context import Context
from orchestrator.core.errors import QueueParseError
from orchestrator.core.specs import DependencyEdge, HostSlots, ParsedQueue, job_id_for
from orchestrator.core.states import JobState
from orchestrator.ledger import Ledger
from orchestrator.queue.dependencies import env_name, find_cycle, folded_keys
from orchestrator.queue.queuefile import parse_bytes
from orchestrator.scheduling.chains import tail_of
from orchestrator.scheduling.placements import PlanJob
from orchestrator.scheduling.scheduler import plan
from orchestrator.tick.waiting import gate


def _parse(text: str) -> ParsedQueue:
    return parse_bytes(text.encode(), label="q.txt", workdir=None, needs_config=False)


def _errors(text: str) -> list[str]:
    with pytest.raises(QueueParseError) as caught:
        _parse(text)
    return str(caught.value).splitlines()[:-1]


def _edges(parsed: ParsedQueue) -> set[tuple[str, str, str]]:
    return {(e.job, e.needs, e.via) for e in parsed.edges}


# --- the parser ----------------------------------------------------------------------------------


def test_after_names_a_cell_or_a_job_case_insensitively() -> None:
    parsed = _parse("name=train seeds=2 -- fit\n"
                    "name=eval after=TRAIN -- score\n"
                    "name=one after=train-seed1 -- --ckpt {checkpoint.train-seed1}\n"
                    "name=both after=eval,one -- report\n")
    assert _edges(parsed) == {("eval", "train-seed0", "TRAIN"), ("eval", "train-seed1", "TRAIN"),
                              ("one", "train-seed1", "train-seed1"), ("both", "eval", "eval"), ("both", "one", "one")}
    one = next(j for j in parsed.jobs if j.name == "one")
    assert one.after == ("train-seed1",) and one.args == ("--ckpt", "{checkpoint.train-seed1}")
    quoted = _parse("name=t -- x\nname=e after=t -- '{checkpoint.t}'\n")
    assert quoted.jobs[1].args == ("{{checkpoint.t}}",)  # a literal, rendered back to its text (handed.py)


def test_unknown_names_self_waits_and_bad_values_are_one_line_each_at_their_column() -> None:
    assert _errors("name=a after=zz -- x\nname=b after=b -- y\nname=c after=a,,b -- z\n") == [
        'q.txt:1:14: after=zz: no job or cell of this queue is named "zz"',
        "q.txt:2:14: after=b: a line cannot wait for its own jobs",
        'q.txt:3:8: after= names cells or jobs joined by "," (after=train or after=a,b); "" is not a name of '
        "[A-Za-z0-9._-]",
    ]


def test_a_cycle_is_refused_naming_its_jobs() -> None:
    assert _errors("name=a after=c -- x\nname=b after=a -- y\nname=c after=b -- z\n") == [
        "q.txt:1: after= makes a cycle: a -> c -> b -> a; no job of it could ever start"]


def test_a_checkpoint_placeholder_needs_its_line_to_wait_for_exactly_one_job() -> None:
    assert _errors("name=t seeds=2 -- x\nname=u -- y\nname=e after=t -- {checkpoint.t} {checkpoint.u}\n") == [
        "q.txt:3:19: {checkpoint.t}: after=t names 2 jobs (t-seed0, t-seed1); name one job (after=t-seed0)",
        "q.txt:3:34: {checkpoint.u} needs after=u on the line (the job whose checkpoint it hands over)",
    ]


def test_find_cycle() -> None:
    assert find_cycle({"a": ["b"], "b": ["c"], "c": []}) == []
    assert find_cycle({"a": ["b"], "b": ["c"], "c": ["a"]}) == ["a", "b", "c"]
    assert find_cycle({"x": ["x"]}) == ["x"]
    long = {f"j{i + 1}": [f"j{i}"] for i in range(5000)}  # no recursion limit
    assert find_cycle(long) == [] and find_cycle(long | {"j0": ["j5000"]})


def test_a_changed_dependency_changes_the_cache_key_of_what_waits_on_it() -> None:
    edges = [DependencyEdge(job="eval", needs="train", via="train"),
             DependencyEdge(job="rep", needs="eval", via="eval")]
    before = folded_keys({"train": "A", "eval": "B", "rep": "C", "other": "D"}, edges)
    after = folded_keys({"train": "A2", "eval": "B", "rep": "C", "other": "D"}, edges)
    assert before["other"] == after["other"] == "D" and before["train"] == "A"
    assert before["eval"] != after["eval"] and before["rep"] != after["rep"]
    assert folded_keys({"train": "A", "eval": "B", "rep": "C", "other": "D"}, edges) == before  # stable


# --- the scheduler -------------------------------------------------------------------------------


def test_chains_count_the_longest_work_waiting_behind_a_job() -> None:
    needs = {"eval": ["train"], "report": ["eval"], "quick": ["train"], "b2": ["b"]}
    est = {"train": 100.0, "eval": 50.0, "report": 30.0, "quick": 500.0, "b": 10.0, "b2": 10.0}
    assert tail_of(est, needs) == {"train": 500.0, "eval": 30.0, "b": 10.0}
    assert tail_of({}, {f"j{i + 1}": [f"j{i}"] for i in range(3000)})["j0"] == 3000.0


def test_the_critical_path_starts_first() -> None:
    # one slot: longest-first alone would start the 10-minute solo job and leave the chain for later
    jobs = [PlanJob("solo", 1, 600.0), PlanJob("train", 1, 60.0, tail_s=900.0), PlanJob("short", 1, 30.0, tail_s=40.0)]
    decided = plan(jobs, [HostSlots(host="h", total=1)])
    assert [a.job_id for a in decided.assignments] == ["train", "short", "solo"]
    without = plan([PlanJob(j.job_id, 1, j.est_s) for j in jobs], [HostSlots(host="h", total=1)])
    assert [a.job_id for a in without.assignments] == ["solo", "train", "short"]  # as ever without after=


# --- the gate, over a real ledger ----------------------------------------------------------------


def _ledger(tmp_path: Path, text: str) -> tuple[Ledger, ParsedQueue]:
    ledger = Ledger(tmp_path / "ledger.db")
    parsed = _parse(text)
    ledger.add_sweep(sweep_id="qabcdef", queue_path="q.txt", workdir=str(tmp_path), queue_text=text,
                     jobs=parsed.jobs, default_retries=0, edges=parsed.edges)
    return ledger, parsed


def _run(ledger: Ledger, name: str, end: JobState) -> None:
    job_id = job_id_for("qabcdef", name)
    ledger.start_attempt(job_id, host="h", bundle_sha="s" * 64)
    ledger.transition(job_id, JobState.RUNNING)
    ledger.transition(job_id, end)


def test_the_gate_holds_waiting_jobs_and_ends_them_when_what_they_wait_for_fails(tmp_path: Path) -> None:
    ledger, _ = _ledger(tmp_path, "name=train -- x\nname=eval after=train -- y\nname=rep after=eval -- z\n"
                                  "name=free -- w\n")
    ctx = cast(Context, SimpleNamespace(ledger=ledger))
    ids = {n: job_id_for("qabcdef", n) for n in ("train", "eval", "rep", "free")}
    assert {e.needs_id for e in ledger.dependencies([ids["rep"]])[ids["rep"]]} == {ids["eval"]}
    first = gate(ctx, ledger.jobs(states=[JobState.QUEUED]))
    assert sorted(j.name for j in first.ready) == ["free", "train"]
    assert sorted(j.name for j in first.waiting) == ["eval", "rep"]
    assert any("still queued: waits for train" in e.message for e in ledger.events(subject=ids["eval"]))
    _run(ledger, "train", JobState.FAILED)
    second = gate(ctx, ledger.jobs(states=[JobState.QUEUED]))
    assert [j.name for j in second.ready] == ["free"] and second.waiting == []
    for name in ("eval", "rep"):  # ended, never started, the reason naming what it waited for
        job = ledger.job(ids[name])
        assert job.state == JobState.CANCELLED.value and job.attempt_count == 0
    reason = ledger.events(subject=ids["eval"])[-1].message
    assert f"train {ids['train']}" in reason and "ended FAILED" in reason
    assert "ended CANCELLED" in ledger.events(subject=ids["rep"])[-1].message
    assert waits_of(ctx, ledger.job(ids["eval"])) == [  # what `gpuq explain eval` says
        f"after=train: waits for train ({ids['train']}): FAILED", f"ended CANCELLED without starting: {reason}"]


def test_the_gate_frees_a_job_once_what_it_waits_for_succeeded(tmp_path: Path) -> None:
    ledger, _ = _ledger(tmp_path, "name=train -- x\nname=eval after=train -- y\n")
    ctx = cast(Context, SimpleNamespace(ledger=ledger))
    _run(ledger, "train", JobState.SUCCEEDED)
    gated = gate(ctx, ledger.jobs(states=[JobState.QUEUED]))
    assert [j.name for j in gated.ready] == ["eval"]


# --- what the spec is handed -----------------------------------------------------------------------


def test_the_spec_gets_the_checkpoint_as_an_argument_and_an_environment_variable() -> None:
    path = remote_path("/data/gpuq", "c0123456789ab", "run/ckpt/model.pt")
    assert path == "/data/gpuq/jobs/c0123456789ab/run/ckpt/model.pt"
    assert remote_path("/r/", "c1", "latest-40.pt") == "/r/jobs/c1/ckpt/latest-40.pt"
    handed = {"Train-v2": path}
    assert render_args(["--ckpt", "{checkpoint.train-v2}", "x={checkpoint.Train-v2}", "{{checkpoint.train-v2}}",
                        "{seed}"], handed) == ("--ckpt", path, f"x={path}", "{checkpoint.train-v2}", "{seed}")
    assert handed_env(handed) == {"GPUQ_CHECKPOINT_TRAIN_V2": path} and env_name("a.b") == "GPUQ_CHECKPOINT_A_B"
