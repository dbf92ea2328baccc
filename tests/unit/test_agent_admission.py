"""The serving loop's admission (payload/agent/gpuq_serving/gpuq_admission.py), called directly: which claimed or
queued job starts on which slots, which waits and which fails; and the loop acting on it
(gpuq_serve.py): a job's live attempt looked up only when it would start, a start that took no slots
leaving them to the jobs after it."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from tests.support.agentmodule import load_agent_module
from tests.support.jobspecs import spec_doc

A = load_agent_module("gpuq_serving.gpuq_admission", qualified=True)  # the module path scripts/mutation.py mutates
serve_mod = load_agent_module("gpuq_serving.gpuq_serve")
files_mod = load_agent_module("gpuq_base.gpuq_files")
jobspec = load_agent_module("gpuq_base.gpuq_jobspec")

C = A.Candidate


def _plan(cands: list[Any], free: list[int], total: int = 4, kind: str = "gpu") -> list[tuple[str, str, Any]]:
    out = []
    for d in A.admit(cands, free, total, kind):
        out.append((d.job_id, d.action, d.slots if d.action == A.START else d.why or d.alive))
    return out


def test_starts_pack_onto_the_lowest_free_slots_in_order() -> None:
    assert _plan([C("a", 1), C("b", 2), C("c", 1)], [0, 1, 2, 3]) == [
        ("a", "start", (0,)), ("b", "start", (1, 2)), ("c", "start", (3,))]
    assert _plan([C("a", 1), C("b", 1)], [3, 1]) == [("a", "start", (3,)), ("b", "start", (1,))]  # as given


def test_a_job_that_does_not_fit_waits_and_a_smaller_one_behind_it_backfills() -> None:
    assert _plan([C("big", 3), C("small", 1), C("two", 2)], [1, 2]) == [
        ("big", "wait", None), ("small", "start", (1,)), ("two", "wait", None)]
    assert _plan([C("two", 2), C("one", 1)], [0, 1]) == [("two", "start", (0, 1)), ("one", "wait", None)]
    assert _plan([C("a", 1)], []) == [("a", "wait", None)]


def test_a_job_larger_than_the_host_fails_and_takes_nothing() -> None:
    assert _plan([C("big", 5), C("a", 4)], [0, 1, 2, 3]) == [
        ("big", "fail", "job needs 5 slots and the host has 4 (gpu)"), ("a", "start", (0, 1, 2, 3))]
    assert _plan([C("big", 2)], [0], total=1, kind="cpu") == [
        ("big", "fail", "job needs 2 slots and the host has 1 (cpu)")]
    assert _plan([C("full", 4)], [0], total=4) == [("full", "wait", None)]  # as big as the host: waits


def test_an_unfit_spec_fails_with_its_reason_before_any_slot_count() -> None:
    assert _plan([C("odd", 9, unfit="job spec is not a JSON object"), C("a", 1)], [0]) == [
        ("odd", "fail", "job spec is not a JSON object"), ("a", "start", (0,))]


def test_a_job_with_an_attempt_alive_here_waits_and_leaves_its_slots_to_the_next() -> None:
    assert _plan([C("r", 1, alive=1), C("b", 1)], [0]) == [("r", "wait", 1), ("b", "start", (0,))]
    # room is judged first: a job that does not fit waits for room, whatever lives
    assert _plan([C("a", 1), C("r", 1, alive=2)], [0]) == [("a", "start", (0,)), ("r", "wait", None)]


def test_one_decision_per_candidate_in_their_order() -> None:
    cands = [C(f"j{i}", 1 + i % 3) for i in range(12)]
    decisions = A.admit(cands, [0, 1, 2, 3, 4, 5], 8, "gpu")
    assert [d.job_id for d in decisions] == [c.job_id for c in cands]
    started = [s for d in decisions if d.action == A.START for s in d.slots]
    assert sorted(started) == list(range(6)) and len(set(started)) == len(started)


def test_what_a_spec_makes_of_a_candidate() -> None:
    """A parsed spec asks for its slots (at least one); a document the parser refused is unfit with the
    parser's reason, word for word, and asks for one slot."""
    assert A.spec_unfit(jobspec.parse_spec(spec_doc(gpus=3))) == ""
    assert A.candidate("a", jobspec.parse_spec(spec_doc(gpus=3))) == C("a", 3)
    assert A.candidate("a", jobspec.parse_spec(spec_doc(gpus=0))) == C("a", 1)
    assert A.candidate("a", jobspec.parse_spec(spec_doc(schema="gpuq.job/1.4"))) == C("a", 1)
    newer = "job spec schema gpuq.job/2 is newer than this agent (gpuq.job/1); upgrade the bundle"
    for doc, why in [
        (None, "job spec is not a JSON object"),
        ({"schema": "junk"}, "job spec has no valid schema ('junk'); this agent reads gpuq.job/1"),
        ({}, "job spec has no valid schema (None); this agent reads gpuq.job/1"),
        (spec_doc(schema="gpuq.job/2"), newer),
        (spec_doc(gpus="2"), "malformed job spec: gpus must be an integer >= 0 <= 4096, not '2'"),
    ]:
        refused = jobspec.spec_or_reason(doc)
        assert (refused, A.spec_unfit(refused)) == (why, why), doc
        assert A.candidate("a", refused) == C("a", 1, why)


# --- the loop acting on it --------------------------------------------------------------------------


def _agent(tmp_path: Path, slots: int) -> tuple[Any, list[tuple[str, tuple[int, ...]]], Path]:
    root = tmp_path / "root"
    for d in ("inbox", "claimed", "jobs"):
        (root / d).mkdir(parents=True)
    args = argparse.Namespace(idle_exit_s=600.0, poll_s=0.1, cpu_slots=slots, train_device="cpu")
    agent = serve_mod.Agent(files_mod.Layout(str(root)), args)
    agent.slots = {"kind": "cpu", "ids": list(range(slots))}
    launched: list[tuple[str, tuple[int, ...]]] = []

    def launch(job_id: str, spec: Any, slots: tuple[int, ...]) -> None:
        launched.append((job_id, tuple(slots)))
        for s in slots:
            agent.busy[s] = job_id

    agent.launch = launch
    return agent, launched, root / "inbox"


def _enqueue(inbox: Path, job_id: str, created: float, gpus: int = 1) -> None:
    (inbox / f"{job_id}.json").write_text(json.dumps(spec_doc(job_id=job_id, gpus=gpus, created_at=created)))


def test_the_loop_looks_up_a_live_attempt_only_for_a_job_that_would_start(tmp_path: Path) -> None:
    agent, launched, inbox = _agent(tmp_path, 2)
    for i in range(6):
        _enqueue(inbox, f"j{i}", float(i))
    looked: list[str] = []

    def alive_other(job_id: str, n: int) -> int | None:
        looked.append(job_id)
        return 7 if job_id == "j0" else None  # another attempt of j0 still lives here

    agent.alive_other = alive_other
    assert agent.claim_and_launch() == 4  # j0 waits for its attempt, j3..j5 for room
    assert launched == [("j1", (0,)), ("j2", (1,))]
    assert looked == ["j0", "j1", "j2"]  # never the jobs that wait for room
    assert sorted(os.listdir(inbox)) == ["j0.json", "j3.json", "j4.json", "j5.json"]
    assert "WAITING j0 a1: attempt 7 of this job is still alive here" in (tmp_path / "root" / "agent.log").read_text()


def test_a_start_that_took_no_slots_leaves_them_to_the_jobs_behind_it(tmp_path: Path) -> None:
    agent, launched, inbox = _agent(tmp_path, 2)
    _enqueue(inbox, "gone", 1.0)
    _enqueue(inbox, "pair", 2.0, gpus=2)
    _enqueue(inbox, "one", 3.0)
    claim = agent._claim

    def withdrawn_meanwhile(job_id: str) -> bool:
        if job_id == "gone":
            os.unlink(inbox / "gone.json")  # the controller withdrew it while the round ran
        return bool(claim(job_id))

    agent._claim = withdrawn_meanwhile
    assert agent.claim_and_launch() == 1  # "one" waits: "pair" got both slots
    assert launched == [("pair", (0, 1))]
