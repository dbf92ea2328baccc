"""A Slurm host as the controller sees it (orchestrator/fleet/slurm.py): the settings `gpuq hosts add
--slurm` accepts, GPUs per node from sinfo's GRES, and what the scheduler may assume (a slot is a
place in Slurm's queue; a job larger than a node has nowhere to go)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from orchestrator.core import documents
from orchestrator.core.errors import HostError
from orchestrator.core.specs import HostSlots
from orchestrator.fleet.registering import Registered
from orchestrator.fleet.slurm import SlurmSettings, _gres_gpus, _slurm_checks, sbatch_arg_problem, settings_of
from orchestrator.hosts.local import LocalHost
from orchestrator.ledger import HostRow
from orchestrator.scheduling.placements import PlanJob
from orchestrator.scheduling.scheduler import plan


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


# --- the --sbatch-arg guard reads each word the way sbatch's getopt_long does --------------------------
@pytest.mark.parametrize(("arg", "refused"), [
    ("-o/x", "gpuq sets -o (--output) itself"),  # a short option's value attached
    ("-Jname", "gpuq sets -J (--job-name) itself"),
    ("-HJname", "gpuq sets -J (--job-name) itself"),  # clustered after a flag
    ("-QHo/x", "gpuq sets -o (--output) itself"),
    ("-e/tmp/err", "gpuq sets -e (--error) itself"),
    ("-D/", "gpuq sets -D (--chdir) itself"),
    ("-a1-9", "gpuq sets -a (--array) itself"),
    ("-N4", "gpuq sets -N (--nodes) itself"),
    ("-n4", "gpuq sets -n (--ntasks) itself"),
    ("-dafterok:1", "gpuq sets -d (--dependency) itself"),
    ("--out=/x", "gpuq sets --out (which sbatch reads as --output) itself"),  # a unique prefix
    ("--comm=x", "gpuq sets --comm (which sbatch reads as --comment) itself"),
    ("--dep=afterok:1", "gpuq sets --dep (which sbatch reads as --dependency) itself"),
    ("--open=truncate", "gpuq sets --open (which sbatch reads as --open-mode) itself"),
    ("--output=/x", "gpuq sets --output itself"),
    ("--job-name", "gpuq sets --job-name itself"),
    ("--err=/x", "gpuq sets --err (which sbatch reads as --error) itself"),
    ("--export=ALL", "gpuq sets --export itself"),  # the job's environment is gpuq's to choose
    ("--expo=ALL", "gpuq sets --expo (which sbatch reads as --export) itself"),
    ("--no-req", "gpuq sets --no-req (which sbatch reads as --no-requeue) itself"),
    ("--n=2", "--n could mean --no-requeue, --nodes, --ntasks"),  # ambiguous: sbatch refuses it too
    ("--", "a bare -- would end sbatch's options"),
    ("--=x", "a bare -- would end sbatch's options"),
    ("-", "give each sbatch option as one --name=value word"),
    ("x", "give each sbatch option as one --name=value word"),
    ("-p", "-p needs its value in the same word"),  # it would take the next word (the script path)
    ("-Z", "-Z is not an sbatch option gpuq can pass on"),
    ("-h", "-h is not an sbatch option gpuq can pass on"),  # prints help and exits: every job would fail
])
def test_the_sbatch_arg_guard_reads_options_the_way_sbatch_does(arg: str, refused: str) -> None:
    assert refused in sbatch_arg_problem(arg)
    with pytest.raises(ValidationError) as info:
        SlurmSettings(sbatch_args=("--mem=4G", arg))
    assert refused in str(info.value)


@pytest.mark.parametrize("arg", [
    "--constraint=a100", "--mem=64G", "--exclusive", "-pgpu", "-Cv100", "-HQ", "-x/node[1-3]", "-t10",
    "-Hpgpu-o", "--export-file=/x", "--gres-flags=enforce-binding", "--ntasks-per-node=1", "--nodelist=n1",
    "--mail-user=a@b", "-wnode1", "--time=10", "-Aoops-J",  # after -A, "oops-J" is -A's value
])
def test_the_sbatch_arg_guard_keeps_what_is_not_gpuqs(arg: str) -> None:
    assert sbatch_arg_problem(arg) == ""
    assert SlurmSettings(sbatch_args=(arg,)).sbatch_args == (arg,)


# --- the registration audit is host input: parsed at the edge, bounded, validated again ---------------------
def _audit(tmp_path: Path, doc: object) -> tuple[LocalHost, Registered]:
    """A login node whose interpreter answers the audit with ``doc`` (a real process, framed like the agent's)."""
    answer = tmp_path / "answer.txt"
    answer.write_text(f"{documents.DOCUMENT_BEGIN}\n{json.dumps(doc) if not isinstance(doc, str) else doc}\n"
                      f"{documents.DOCUMENT_END}\n")
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\ncat {answer}\n")
    python.chmod(0o755)
    root = tmp_path / "root"
    root.mkdir(exist_ok=True)
    row = HostRow(name="hpc", kind="ssh", root=str(root), python=str(python), created_at=0.0)
    return LocalHost(root, name="hpc", python=str(python)), Registered(row, {})


def _doc(nodes: str = "4", gres: str = "gpu:4") -> dict[str, object]:
    return {"root": "/r", "versions": {"sbatch": "slurm 23.02"}, "missing": [], "probe": "shared", "probe_detail": "",
            "partitions": [{"name": "gpu", "default": True, "avail": "up", "nodes": nodes, "gres": gres,
                            "cpus": "64", "time_limit": "infinite"}]}


def test_an_honest_audit_records_the_partitions_counts(tmp_path: Path) -> None:
    host, out = _audit(tmp_path, _doc())
    _slurm_checks(host, out, SlurmSettings(), 0)
    final = settings_of(out.row)
    assert final is not None and (final.nodes, final.gpus_per_node, final.partition) == (4, 4, "gpu")
    assert json.loads((tmp_path / "root" / "slurm.json").read_text())["nodes"] == 4


@pytest.mark.parametrize(("doc", "message"), [
    (_doc(nodes="9" * 5000), "(partitions.0.nodes: String should have at most 32 characters)"),  # was a traceback
    (_doc(nodes="9" * 20), "the Slurm audit reported a partition of 999999999999... nodes"),
    (_doc(nodes="2000000"), "the Slurm audit reported nodes = 2000000, which gpuq refuses"),  # was stored
    (_doc(gres="gpu:99999"), "the Slurm audit reported gpus_per_node = 99999, which gpuq refuses"),
    (_doc(gres="gpu:" + "9" * 400), "partitions.0.gres"),
    ({**_doc(), "partitions": [_doc()["partitions"][0]] * 1001}, "the Slurm audit's answer is not a valid document "
                                                                 "(partitions"),
    ({**_doc(), "probe": "yes"}, "(probe: Input should be"),
    ({**_doc(), "missing": "sinfo"}, "(missing: Input should be a valid array"),
    ("[1, 2]", "the Slurm audit's answer is not a valid document"),
    ("{" * 5000, "the Slurm audit's answer is not a valid document"),
])
def test_a_lying_audit_is_refused_in_one_line(tmp_path: Path, doc: object, message: str) -> None:
    host, out = _audit(tmp_path, doc)
    with pytest.raises(HostError) as info:
        _slurm_checks(host, out, SlurmSettings(), 0)
    assert message in str(info.value) and "\n" not in str(info.value)
    assert out.row.slurm == "" and not (tmp_path / "root" / "slurm.json").exists()  # nothing recorded
