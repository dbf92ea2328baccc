"""scheduler.plan is pure: table-driven cases, no sockets, no clock."""

from __future__ import annotations

from orchestrator.scheduler import PlanJob, plan
from orchestrator.specs import HostSlots


def test_longest_first_balances_two_hosts() -> None:
    jobs = [PlanJob("a", 1, 100), PlanJob("b", 1, 90), PlanJob("c", 1, 50), PlanJob("d", 1, 40)]
    result = plan(jobs, [HostSlots(host="h1", total=1), HostSlots(host="h2", total=1)])
    by_host: dict[str, float] = {}
    est = {j.job_id: j.est_s for j in jobs}
    for a in result.assignments:
        by_host[a.host] = by_host.get(a.host, 0) + est[a.job_id]
    assert sorted(by_host.values()) == [140, 140]


def test_job_too_big_is_unplaced_with_reason() -> None:
    result = plan([PlanJob("big", 4, 10)], [HostSlots(host="h", total=2)])
    assert result.assignments == ()
    assert result.unplaced == (("big", "needs 4 slots; any usable host has at most 2"),)


def test_pin_and_unusable_hosts() -> None:
    hosts = [HostSlots(host="a", total=8), HostSlots(host="b", total=8, usable=False)]
    result = plan([PlanJob("j", 1, 1, host_pin="a"), PlanJob("k", 1, 1, host_pin="b")], hosts)
    assert [(x.job_id, x.host) for x in result.assignments] == [("j", "a")]
    assert result.unplaced[0][0] == "k"
