"""A Slurm host as the controller sees it (orchestrator/slurm_hosts.py): the settings `gpuq hosts add
--slurm` accepts, GPUs per node from sinfo's GRES, and what the scheduler may assume (a slot is a
place in Slurm's queue; a job larger than a node has nowhere to go)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from orchestrator.ledger import HostRow
from orchestrator.scheduler import PlanJob, plan
from orchestrator.slurm_hosts import SlurmSettings, _gres_gpus, settings_of
from orchestrator.specs import HostSlots


@pytest.mark.parametrize("fields", [
    {"partition": "gpu a100"}, {"account": "-x"}, {"qos": "a;b"}, {"time_limit": "2 hours"},
    {"sbatch_args": ("constraint=a100",)}, {"sbatch_args": ("--output=/tmp/x",)}, {"sbatch_args": ("-J", "x")},
    {"sbatch_args": ("--no-requeue",)}, {"max_jobs": 0},
])
def test_settings_refuse_what_slurm_or_gpuq_would_choke_on(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        SlurmSettings(**fields)


def test_settings_keep_what_slurm_accepts() -> None:
    s = SlurmSettings(partition="gpu-a100", account="lab.x", qos="normal", time_limit="1-12:00:00",
                      sbatch_args=("--constraint=a100", "--mem=64G", "--exclusive"), max_jobs=500)
    assert SlurmSettings.model_validate_json(s.model_dump_json()) == s
    for limit in ("90", "1:30:00", "2-00", "UNLIMITED"):
        assert SlurmSettings(time_limit=limit).time_limit == limit


@pytest.mark.parametrize(("gres", "gpus"), [
    ("gpu:4", 4), ("gpu:a100:8(S:0-1)", 8), ("gpu:2,shard:8", 2), ("(null)", 0), ("", 0), ("shard:4", 0),
    ("gpu:tesla:2,gpu:a100:4", 4),
])
def test_gpus_per_node_come_from_sinfos_gres(gres: str, gpus: int) -> None:
    assert _gres_gpus(gres) == gpus


def test_only_a_slurm_row_with_valid_settings_has_settings() -> None:
    row = HostRow(name="hpc", kind="slurm", root="/s", created_at=0, slurm=SlurmSettings(max_jobs=3).model_dump_json())
    got = settings_of(row)
    assert got is not None and got.max_jobs == 3
    assert settings_of(row.model_copy(update={"kind": "ssh"})) is None
    assert settings_of(row.model_copy(update={"slurm": '{"max_jobs": "lots"}'})) is None


def test_on_a_slurm_host_every_job_takes_one_place_in_the_queue_and_fits_a_node() -> None:
    hpc = HostSlots(host="hpc", total=3, job_slots=1, max_gpus=4)
    jobs = [PlanJob(f"j{i}", 4, 100.0) for i in range(3)]
    decided = plan(jobs, [hpc])
    assert sorted(a.job_id for a in decided.assignments) == ["j0", "j1", "j2"]
    assert all(a.host == "hpc" for a in decided.assignments)  # three 4-GPU jobs in three places, not 12 slots
    too_big = plan([PlanJob("big", 8, 100.0)], [hpc])
    assert not too_big.assignments and "needs 8" in too_big.unplaced[0][1] and "has 4" in too_big.unplaced[0][1]
    box = HostSlots(host="box", total=8)
    both = plan([PlanJob("big", 8, 100.0)], [hpc, box])
    assert [a.host for a in both.assignments] == ["box"]


def test_a_job_waiting_in_slurms_queue_says_slurms_state_and_reason() -> None:
    from tests.support.wire import observed

    slurm_wait = observed.slurm_wait

    pending = {"slurm": {"id": "41", "state": "PENDING", "reason": "Priority"}}
    assert slurm_wait(pending) == "Slurm job 41 PENDING (Priority)"
    assert slurm_wait({"slurm": {"id": "41", "state": "REQUEUED", "reason": "None"}}) == "Slurm job 41 REQUEUED"
    assert slurm_wait({"slurm": {"id": "", "state": "SUBMITTING", "reason": ""}}) == "Slurm SUBMITTING"
    assert slurm_wait({"slurm": {"id": "41", "state": "PENDING", "reason": "x\x1b[2J" + "y" * 200}}).startswith(
        "Slurm job 41 PENDING (x[2Jyy")  # the host's text is printable only, and bounded
    assert len(slurm_wait({"slurm": {"id": "41", "state": "PENDING", "reason": "y" * 200}})) == 80
    assert slurm_wait({"slurm": {"id": "41", "state": "RUNNING", "reason": "None"}}) == ""
    assert slurm_wait({}) == "" and slurm_wait({"slurm": "PENDING"}) == ""


def test_a_multi_node_job_goes_only_where_that_many_nodes_are() -> None:
    hpc = HostSlots(host="hpc", total=10, job_slots=1, max_gpus=4, max_nodes=4)
    box = HostSlots(host="box", total=8)
    decided = plan([PlanJob("wide", 4, 100.0, nodes=3)], [box, hpc])
    assert [a.host for a in decided.assignments] == ["hpc"]
    nowhere = plan([PlanJob("wider", 4, 100.0, nodes=8)], [box, hpc])
    assert not nowhere.assignments
    assert nowhere.unplaced[0][1] == ("needs 8 nodes with gpus=4 each: 8 SSH hosts with 4 slots each (0 usable), "
                                      "or a Slurm host with 8 nodes (the most any has is 4)")
    fat = plan([PlanJob("fat", 8, 100.0, nodes=2)], [box, hpc])
    assert not fat.assignments and "needs 8 slots" in fat.unplaced[0][1]  # 8 GPUs on each node: none has 8
