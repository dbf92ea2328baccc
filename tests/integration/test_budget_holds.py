"""A budget that holds (docs/cost.md), end to end on the embedded local host priced like a rented one, with
the light stdlib trainer (no torch): the dry run projects the sweep's cost against its cap, submit starts
exactly the jobs whose estimates fit (the one that would cross the cap stays QUEUED, saying why), a cap
lowered below what is committed stops dispatch while the running jobs finish, a raised one lets the rest
start, and `gpuq budget`, `gpuq status --json` and `gpuq results` agree on what was spent, to the cent."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator import api
from orchestrator.ledger import Ledger
from tests.conftest import run_gpuq
from tests.support.lightproject import light_config, light_project

pytestmark = [pytest.mark.integration]

ENV = {"GPUQ_LOCAL_CPU_SLOTS": "2", "GPUQ_HEARTBEAT_S": "1"}
PRICE = 360.0  # dollars per hour of the whole local machine (one "GPU"): 10 cents a second
JOB_USD = 6.0  # est_min=1 at $360/h, the whole machine's share


def _ok(*args: str, timeout: float = 120, env: dict[str, str] = ENV) -> str:
    done = run_gpuq(*args, env=env, timeout=timeout)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _status(env: dict[str, str] = ENV) -> dict[str, Any]:
    doc = json.loads(_ok("status", "--json", env=env))  # one tick: collect, dispatch, the budget's stage
    assert isinstance(doc, dict)
    return doc


def _states(doc: dict[str, Any]) -> dict[str, str]:
    return {j["name"]: j["state"] for j in doc["jobs"]}


def _until(names: set[str], state: str, timeout: float = 120, env: dict[str, str] = ENV) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        doc = _status(env)
        if all(_states(doc).get(n) == state for n in names) or time.monotonic() > deadline:
            return doc
        time.sleep(0.5)


def _cents(value: float) -> int:
    return round(100 * value)


def _spent_in_budget_command(sweep: str) -> float:
    found = re.search(r"spent\s+\$([0-9,.]+)", _ok("budget", sweep))
    assert found, "gpuq budget printed no spent line"
    return float(found.group(1).replace(",", ""))


def _reconciled(sweep: str) -> float:
    """`gpuq results`' job costs, `gpuq status --json`'s budget and `gpuq budget` agree to the cent."""
    results = json.loads(_ok("results", "--json", "--sweep", sweep))
    by_jobs = sum(j["cost"] or 0.0 for j in results["jobs"])
    status = json.loads(_ok("status", "--json", "--no-probe", "--sweep", sweep))
    (budget,) = [s["budget"] for s in status["sweeps"] if s["id"] == sweep]
    assert _cents(by_jobs) == _cents(budget["spent"]) == _cents(_spent_in_budget_command(sweep)), (
        by_jobs, budget, results["jobs"])
    return float(budget["spent"])


def _events(home: Path, job_id: str) -> list[str]:
    ledger = Ledger(home / "ledger.db")
    try:
        return [e.message for e in ledger.events(subject=job_id, exact=True)]
    finally:
        ledger.close()


def test_the_budget_stops_dispatch_where_the_cap_would_be_crossed(gpuq_home: Path, tmp_path: Path) -> None:
    ctx = api.open_context()
    try:  # the local host priced like a rented machine; its one "GPU" is what a 1-GPU job's share divides
        ctx.ledger.ensure_host("local", kind="local", root=str(gpuq_home / "local"))
        ctx.ledger.update_host("local", price_per_hour=PRICE, gpu_count=1)
    finally:
        ctx.close()
    queue = light_project(tmp_path, {"tiny": light_config(steps=3, step_s=0.3)},
                          [f"configs/tiny.yaml classify 1 name=j{i} est_min=1" for i in range(4)])

    dry = _ok("submit", "--dry-run", "--budget", "12", str(queue))
    assert f"projected cost ${4 * JOB_USD:.2f}" in dry and "budget $12.00: the projection does not fit" in dry

    submitted = _ok("submit", "--budget", "12", str(queue))  # j0 + j1 land on the cap exactly; j2 would cross it
    sweep = re.search(r"sweep (\S+):", submitted).group(1)  # type: ignore[union-attr]
    assert "budget $12.00: 2 of 4 jobs fit it; 2 stay queued (budget: the sweep's budget of $12.00 does not fit" \
        in submitted, submitted
    ledger = Ledger(gpuq_home / "ledger.db")
    try:
        jobs = {j.name: j for j in ledger.jobs(sweep_id=sweep)}
    finally:
        ledger.close()
    placed = {n for n, j in jobs.items() if j.state == "ASSIGNED"}  # the first two of the plan's order
    held = {n for n, j in jobs.items() if j.state == "QUEUED"}
    assert len(placed) == len(held) == 2, {n: j.state for n, j in jobs.items()}
    assert all("still queued: budget: " in _events(gpuq_home, jobs[n].id)[-1] for n in held)

    lowered = _ok("budget", sweep, "5")  # below what the two placed jobs commit: nothing new starts
    assert "dispatch stops" in lowered and "budget $5.00" in lowered
    doc = _until(placed, "SUCCEEDED")
    assert {n: s for n, s in _states(doc).items() if n in held} == dict.fromkeys(held, "QUEUED"), doc["jobs"]
    doc = _status()  # both ended well under their estimates, yet one more $6 job would cross $5
    for name in held:
        assert _states(doc)[name] == "QUEUED" and "still queued: budget: " in _events(gpuq_home, jobs[name].id)[-1]
    (line,) = [s["budget"] for s in doc["sweeps"] if s["id"] == sweep]
    assert line["cap"] == 5.0 and line["committed"] == 0.0 and 0 < line["spent"] < 5.0
    alerts = [a for a in doc["alerts"] if a["rule"] == "budget" and a["subject"] == sweep]
    assert [a["severity"] for a in alerts] == ["escalate", "info", "escalate"], alerts  # once per cap, newest first
    first = _reconciled(sweep)
    waited = run_gpuq("wait", "--timeout", "60", env=ENV, timeout=90)  # not for ever, nor to its timeout (4)
    assert waited.returncode == 1 and f"gpuq: sweep {sweep}: stopped by its budget" in waited.stderr, waited
    watched = _ok("watch", "--sweep", sweep, "--interval", "0.2", timeout=90)
    assert f"watch: sweep {sweep}: stopped by its budget" in watched and "`gpuq budget " in watched, watched

    raised = _ok("budget", sweep, "100")
    assert "queued jobs it fits start at the next tick" in raised
    doc = _until(set(jobs), "SUCCEEDED")
    assert set(_states(doc).values()) == {"SUCCEEDED"}, doc["jobs"]
    assert _reconciled(sweep) > first


def _attempts(home: Path, job_id: str) -> list[tuple[int, str, str]]:
    ledger = Ledger(home / "ledger.db")
    try:
        return [(a.number, a.state, a.withdrawing) for a in ledger.attempts(job_id)]
    finally:
        ledger.close()


def test_a_cap_lowered_below_the_committed_takes_unstarted_jobs_back_out_of_the_inbox(gpuq_home: Path,
                                                                                      tmp_path: Path) -> None:
    """One slot: the first job runs, the other two wait in the host's inbox (placed, their attempts priced and
    committed).  The cap lowered under that: the next tick withdraws the newest placements until the sweep fits
    its cap again, and they wait QUEUED saying why; the withdrawn attempts count against no retries=."""
    ctx = api.open_context()
    try:
        ctx.ledger.ensure_host("local", kind="local", root=str(gpuq_home / "local"))
        ctx.ledger.update_host("local", price_per_hour=PRICE, gpu_count=1)
    finally:
        ctx.close()
    env = {**ENV, "GPUQ_LOCAL_CPU_SLOTS": "1"}
    queue = light_project(tmp_path, {"six": light_config(steps=12, step_s=0.5)},
                          [f"configs/six.yaml classify 1 name=j{i} est_min=1" for i in range(3)])
    submitted = run_gpuq("submit", "--budget", "100", str(queue), env=env, timeout=120)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    sweep = re.search(r"sweep (\S+):", submitted.stdout).group(1)  # type: ignore[union-attr]
    doc = _status(env)
    assert set(_states(doc).values()) <= {"ASSIGNED", "RUNNING"}, doc["jobs"]  # all three placed
    running = _until_one_runs(env)

    lowered = run_gpuq("budget", sweep, "7", env=env)  # one commits up to $6, the other two $6 each: > $7
    assert lowered.returncode == 0, lowered.stdout + lowered.stderr
    doc = _status(env)  # the tick that takes them back
    states = _states(doc)
    waiting = sorted(set(states) - {running})
    assert states[running] == "RUNNING" and {states[n] for n in waiting} == {"QUEUED"}, doc["jobs"]
    (line,) = [s["budget"] for s in doc["sweeps"] if s["id"] == sweep]
    assert line["spent"] + line["committed"] <= 7.0 + 1e-6, line
    ids = {j["name"]: j["id"] for j in doc["jobs"]}
    for name in waiting:
        assert _attempts(gpuq_home, ids[name]) == [(1, "KILLED", "budget")]
        said = _events(gpuq_home, ids[name])
        assert any(m.startswith("withdrawn unstarted from local: budget: the sweep's budget of $7.00 is passed")
                   for m in said), said
    raised = run_gpuq("budget", sweep, "100", env=env)
    assert raised.returncode == 0
    doc = _until(set(ids), "SUCCEEDED", env=env)
    assert set(_states(doc).values()) == {"SUCCEEDED"}, doc["jobs"]
    for name in waiting:  # attempt 1 withdrawn, attempt 2 ran: no retry spent
        assert [(n, s) for n, s, _ in _attempts(gpuq_home, ids[name])] == [(1, "KILLED"), (2, "EXITED")]


def _until_one_runs(env: dict[str, str]) -> str:
    """The one slot's job, once the agent has claimed it (which one it takes first is the host's business)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        running = [n for n, s in _states(_status(env)).items() if s == "RUNNING"]
        if running:
            return running[0]
        time.sleep(0.3)
    raise AssertionError("no job started within 60 s")


def test_a_withdrawal_gpuq_did_not_live_to_record_puts_the_job_back_in_the_queue(gpuq_home: Path,
                                                                                tmp_path: Path) -> None:
    """gpuq killed between the agent's withdraw and its own record (work stealing, a budget): the attempt's
    mark, written first, tells the next tick to queue the job again; an unmarked withdrawal is a cancel."""
    from orchestrator.agent import client

    env = {**ENV, "GPUQ_LOCAL_CPU_SLOTS": "1"}
    queue = light_project(tmp_path, {"long": light_config(steps=30, step_s=0.5)},
                          [f"configs/long.yaml classify 1 name=j{i}" for i in range(3)])
    submitted = run_gpuq("submit", str(queue), env=env, timeout=120)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    running = _until_one_runs(env)
    waiting = sorted(n for n, st in _states(_status(env)).items() if n != running)
    assert len(waiting) == 2
    ctx = api.open_context()
    try:
        jobs = {j.name: j for j in ctx.ledger.jobs()}
        marked, unmarked = jobs[waiting[0]], jobs[waiting[1]]
        ctx.ledger.update_attempt(marked.id, 1, withdrawing="steal")  # the record, then the side effect
        host = ctx.fleet.named("local")
        bundle = ctx.ledger.host("local").agent_bundle  # type: ignore[union-attr]
        done = client.run(host, bundle, "withdraw", marked.id, unmarked.id, timeout=60)
        assert done.exit_code == 0 and done.stdout.count('"withdrawn"') == 2, done.stdout + done.stderr
    finally:
        ctx.close()
    # ... and gpuq died here: the next tick reads "withdrawn" for both
    states = _states(_status(env))
    assert states[unmarked.name] == "CANCELLED"
    assert states[marked.name] in ("QUEUED", "ASSIGNED", "RUNNING")  # queued again (and maybe placed)
    said = _events(gpuq_home, marked.id)
    assert "withdrawn unstarted from local (steal); queued again" in said, said
    assert _attempts(gpuq_home, marked.id)[0] == (1, "KILLED", "steal")
    _ok("cancel", "--all", "-y", env=env)  # the rest is not worth 30 s more
