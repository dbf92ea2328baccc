"""Multi-node jobs over SSH hosts in the planner (list_scheduling._gang) and in delivery (gangs.hold_back):
K distinct hosts reserved together, sent only when all start now, never starved by the jobs behind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.core.specs import Assignment, HostSlots
from orchestrator.host_documents import JobEntry
from orchestrator.hosts.sshconfig import Endpoint
from orchestrator.scheduling.placements import Plan, PlanJob
from orchestrator.scheduling.scheduler import plan
from orchestrator.tick.gangs import Part, head_addresses, hold_back, rendezvous_port, standing_entry, waiting
from tests.support.fakehost import FakeHost


def _hosts(*busy: tuple[float, ...], total: int = 2) -> list[HostSlots]:
    return [HostSlots(host=f"h{i}", total=total, gang=True, slot_free_at=times or (0.0,) * total)
            for i, times in enumerate(busy)]


def test_a_gang_takes_k_distinct_hosts_with_its_gpus_each_and_starts_when_the_last_is_free() -> None:
    decided = plan([PlanJob("g", 2, 100.0, nodes=2)], _hosts((0.0, 50.0), (), (0.0, 0.0)))
    (placed,) = decided.placements
    assert (placed.host, placed.peers, placed.start_s, placed.end_s) == ("h1", ("h2",), 0.0, 100.0)
    late = plan([PlanJob("g", 2, 100.0, nodes=2)], _hosts((0.0, 50.0), (0.0, 80.0)))
    assert [(p.host, p.peers, p.start_s) for p in late.placements] == [("h0", ("h1",), 80.0)]


def test_a_gang_runs_at_its_slowest_hosts_speed_and_honours_a_pin_as_node_0() -> None:
    hosts = [HostSlots(host="fast", total=2, gang=True, speed=2.0), HostSlots(host="slow", total=2, gang=True)]
    (placed,) = plan([PlanJob("g", 2, 100.0, nodes=2, host_pin="slow")], hosts).placements
    assert (placed.host, placed.peers, placed.end_s) == ("slow", ("fast",), 100.0)


def test_a_gang_that_no_set_of_hosts_fits_says_why() -> None:
    too_few = plan([PlanJob("g", 2, 100.0, nodes=3)], _hosts((), ()))
    assert too_few.unplaced == (("g", "needs 3 nodes with gpus=2 each: 3 SSH hosts with 2 slots each (2 usable), "
                                      "or a Slurm host with 3 nodes"),)
    local = HostSlots(host="local", total=8)  # the local machine is never a node of a gang
    assert not plan([PlanJob("g", 1, 1.0, nodes=2)], [local, *_hosts(())]).assignments


def test_one_host_jobs_fill_around_a_gang_and_the_plan_keeps_the_gang_reserved() -> None:
    jobs = [PlanJob("g", 2, 100.0, nodes=2), PlanJob("a", 1, 30.0), PlanJob("b", 1, 30.0)]
    decided = plan(jobs, _hosts((0.0, 0.0), (0.0, 60.0), (0.0, 0.0)))
    by_id = {p.job_id: p for p in decided.placements}
    assert by_id["g"].start_s == 0.0 and {by_id["g"].host, *by_id["g"].peers} == {"h0", "h2"}
    assert {by_id["a"].host, by_id["b"].host} == {"h1"}  # the one-GPU jobs take the host the gang cannot use


def test_a_gang_that_cannot_start_now_is_held_back_with_the_jobs_planned_after_it_on_its_hosts() -> None:
    decided = Plan(assignments=(
        Assignment(job_id="early", host="h0", start_s=0.0),  # backfill that ends before the gang starts
        Assignment(job_id="elsewhere", host="h2", start_s=90.0),
        Assignment(job_id="g", host="h0", peers=("h1",), start_s=40.0),
        Assignment(job_id="after", host="h1", start_s=40.0),
    ), unplaced=())
    sent, held = hold_back(decided)
    assert [a.job_id for a in sent.assignments] == ["early", "elsewhere"]
    assert held == [("g", "waiting for 2 hosts with its GPUs free at once (h0, h1, in about 1 min)"),
                    ("after", "waiting behind a multi-node job that reserved h1")]
    ready = plan([PlanJob("g", 2, 100.0, nodes=2)], _hosts((), ()))
    assert ready.assignments[0].start_s == 0.0 and hold_back(ready) == (ready, [])


def test_the_rendezvous_port_is_known_to_every_node_and_new_for_each_attempt() -> None:
    ports = {rendezvous_port("c000000000001", n) for n in range(1, 50)}
    assert len(ports) == 49 and all(20000 <= p < 50000 for p in ports)
    assert rendezvous_port("c000000000001", 3) == rendezvous_port("c000000000001", 3)


def _dict(entry: JobEntry | None) -> dict[str, Any]:
    """The entry as the host would have written it (what the controller set included)."""
    assert entry is not None
    return dict(entry.model_dump(exclude_unset=True))


def _part(rank: int, state: str, code: int | None = None, **exit_extra: object) -> Part:
    entry: dict[str, object] = {"job_id": "c1", "attempt": 1, "state": state}
    if code is not None:
        entry["exit"] = {"wrapper_code": code, "message": f"exit of node {rank}", **exit_extra}
    return Part(rank, f"h{rank}", True, JobEntry.model_validate(entry))


def test_the_attempt_stands_on_node_0_until_any_node_fails() -> None:
    assert _dict(standing_entry([_part(0, "running"), _part(1, "running")]))["state"] == "running"
    assert standing_entry([Part(0, "h0", True, None), _part(1, "running")]) is None
    done = _dict(standing_entry([_part(0, "exited", 0), _part(1, "running")]))
    assert done["exit"]["wrapper_code"] == 0 and "gang_cause" not in done


def test_a_killed_node_is_the_cause_even_when_node_0_failed_too() -> None:
    killed = _dict(standing_entry([_part(0, "exited", 1), _part(1, "exited", 137, vanished=True)]))
    assert killed["state"] == "exited" and killed["exit"]["wrapper_code"] == 137
    assert killed["exit"]["message"] == "node 1 on h1: exit of node 1" and killed["gang_cause"] == "node 1 on h1"
    dead = _dict(standing_entry([_part(0, "running"), _part(1, "dead")]))
    assert dead["state"] == "dead" and dead.get("exit") is None and dead["gang_cause"] == "node 1 on h1"
    own = _dict(standing_entry([_part(0, "exited", 1), _part(1, "exited", 1)]))
    assert own["exit"]["message"] == "node 0 on h0: exit of node 0"  # node 0's own error when nothing was killed
    peer = _dict(standing_entry([_part(0, "running"), _part(1, "exited", 1)]))
    assert peer["exit"]["message"] == "node 1 on h1: exit of node 1"


def test_nodes_not_started_while_another_runs_are_waiting() -> None:
    assert waiting([_part(0, "queued"), _part(1, "queued")]) == []  # none started: no slot is held
    late = waiting([_part(0, "running"), _part(1, "queued"), Part(2, "h2", True, None), Part(3, "h3", False, None)])
    assert [p.rank for p in late] == [1, 2]


def test_a_gang_prefers_faster_hosts_among_those_free_at_once_and_needs_disk_on_every_node() -> None:
    hosts = [HostSlots(host="a", total=2, gang=True, speed=1.0), HostSlots(host="b", total=2, gang=True, speed=2.0),
             HostSlots(host="c", total=2, gang=True, speed=4.0)]
    (placed,) = plan([PlanJob("g", 2, 100.0, nodes=2)], hosts).placements
    assert (placed.host, placed.peers, placed.end_s) == ("c", ("b",), 50.0)  # the slower of the two: speed 2
    disks = (10**9, 10**9, 10**9 - 1)
    budget = [h.model_copy(update={"disk_free_bytes": d}) for h, d in zip(hosts, disks, strict=True)]
    (fits,) = plan([PlanJob("g", 2, 100.0, nodes=2, disk_bytes=10**9)], budget).placements
    assert (fits.host, fits.peers) == ("b", ("a",))  # exactly enough disk is enough; one byte short is not
    short = plan([PlanJob("g", 2, 100.0, nodes=3, disk_bytes=10**9)], budget)
    assert not short.assignments and short.unplaced[0][1] == ("needs 3 hosts with 1.0 GB of disk each; 2 have that "
                                                              "much left (a, b)")  # said, never an empty reason
    pinned = plan([PlanJob("g", 2, 100.0, nodes=2, disk_bytes=10**9, host_pin="c")], budget)
    assert pinned.unplaced[0][1] == "needs 2 hosts with 1.0 GB of disk each, c among them; 2 have that much left (a, b)"


def test_a_gang_pinned_to_a_host_that_cannot_take_it_is_not_placed_elsewhere() -> None:
    hosts = [HostSlots(host="a", total=1, gang=True), HostSlots(host="b", total=2, gang=True),
             HostSlots(host="c", total=2, gang=True)]
    pinned = plan([PlanJob("g", 2, 100.0, nodes=2, host_pin="a")], hosts)
    assert not pinned.assignments and pinned.unplaced == (("g", "needs 2 slots (gpus=2); host a has 1"),)
    free = plan([PlanJob("g", 2, 100.0, nodes=2)], hosts)
    assert [(p.host, p.peers) for p in free.placements] == [("b", ("c",))]


def test_the_heads_address_is_the_one_gpuq_reaches_it_by_never_what_it_says(tmp_path: Path) -> None:
    """Node 0 is one rented host: what it would say about itself (``hostname -I``) could point the
    other nodes' torchrun at a machine of its choosing; the address is the SSH endpoint's, and the
    head is not even asked (issue 23 item 3)."""
    head = FakeHost(tmp_path / "h0", name="h0")
    for hostname, expected in (("10.0.0.5", ["10.0.0.5"]), ("gpu1.lan", ["gpu1.lan"]), ("fd00::7", ["fd00::7"]),
                               ("127.0.0.1", []), ("localhost", []), ("::1", []), ("0.0.0.0", []),
                               ("-oProxyCommand=x", []), ("", [])):
        head.endpoint = Endpoint(hostname=hostname)  # type: ignore[attr-defined]
        assert head_addresses(head) == expected, hostname
    assert head.calls == []
    assert head_addresses(FakeHost(tmp_path / "h1", name="h1")) == []  # no endpoint: no address
