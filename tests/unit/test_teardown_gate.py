"""The teardown gate of a rented host (orchestrator/tick/teardown.py ``refusal``), which ``gpuq down`` and
down-when-done pass before they end a machine: never one gpuq did not rent or already ended, never while a
job there runs, never while a job there has results not pulled and verified at home, unless forced."""

from __future__ import annotations

import pytest

from orchestrator.core.states import JobState, LeaseState
from orchestrator.ledger import HostRow, Job
from orchestrator.tick.teardown import refusal


def _row(**over: object) -> HostRow:
    fields: dict[str, object] = {"name": "rp", "kind": "ssh", "target": "", "root": "/w", "provider": "runpod",
                                 "instance_id": "pod1", "lease_state": LeaseState.RUNNING.value}
    fields.update(over)
    return HostRow(**fields)


def _job(name: str, state: JobState, host: str | None = "rp") -> Job:
    return Job(id=f"id-{name}", name=name, state=state.value, host=host)


def test_an_idle_rented_machine_may_go() -> None:
    assert refusal(_row(), [], set()) is None
    assert refusal(_row(instance_id="", instance_name="gpuq-0a1b2c3d-abc123"), [], set()) is None  # named only
    done = [_job("a", JobState.FAILED), _job("b", JobState.CANCELLED), _job("c", JobState.SUCCEEDED)]
    assert refusal(_row(), done, {"id-c"}) is None


@pytest.mark.parametrize("over", [{"provider": ""}, {"provider": None}, {"instance_id": "", "instance_name": ""}])
def test_a_machine_gpuq_did_not_rent_is_never_ended(over: dict[str, object]) -> None:
    why = refusal(_row(**over), [], set(), force=True)
    assert why == "not rented by gpuq (no provider instance): release it yourself"


def test_an_ended_machine_is_not_ended_again() -> None:
    assert refusal(_row(lease_state=LeaseState.TERMINATED.value), [], set(), force=True) == "already terminated"


@pytest.mark.parametrize("state", [JobState.ASSIGNED, JobState.RUNNING])
def test_a_machine_where_a_job_runs_stays_unless_forced(state: JobState) -> None:
    jobs = [_job("a", state), _job("b", JobState.QUEUED), _job("c", state, host="other")]
    assert refusal(_row(), jobs, set()) == "1 job(s) still run there (a); cancel them or pass --force"
    assert refusal(_row(), jobs, set(), force=True) is None


def test_the_refusal_counts_every_running_job_and_names_three() -> None:
    jobs = [_job(n, JobState.RUNNING) for n in "abcd"]
    assert refusal(_row(), jobs, set()) == "4 job(s) still run there (a, b, c); cancel them or pass --force"


def test_results_not_verified_at_home_keep_the_machine_unless_forced() -> None:
    jobs = [_job(n, JobState.SUCCEEDED) for n in "abcde"] + [_job("f", JobState.SUCCEEDED, host="other")]
    assert refusal(_row(), jobs, {"id-b"}) == (
        "4 job(s) with results not pulled and verified (a, c, d); `gpuq pull` first, or --force to lose them")
    assert refusal(_row(), jobs, {f"id-{n}" for n in "abcde"}) is None  # another host's results do not count
    assert refusal(_row(), jobs, set(), force=True) is None


def test_a_running_job_is_named_before_unverified_results() -> None:
    jobs = [_job("a", JobState.SUCCEEDED), _job("b", JobState.RUNNING)]
    why = refusal(_row(), jobs, set())
    assert why is not None and why.startswith("1 job(s) still run there (b)")
