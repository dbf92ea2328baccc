"""The ``--json`` documents of gpuq's commands, as pydantic models.

Their JSON Schemas (draft 2020-12) are generated from these models into ``docs/schemas/``:
``python -m orchestrator.cli.documents`` rewrites them, and a test fails when a committed schema
differs from the generated one.  A document's ``schema`` field names it and its version; a
version changes only when a field is removed or changes meaning.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from orchestrator.cli.docbase import Doc, JobStateName, OpenPart, ProviderName, Severity
from orchestrator.cli.offers_document import OffersDocument
from orchestrator.report.model import Report

# --- gpuq status --json -------------------------------------------------------------------------


class Slots(OpenPart):
    """Empty when the probe failed."""

    kind: Literal["gpu", "cpu", "slurm"] | None = None
    total: int | None = Field(default=None, ge=0)
    free: int | None = Field(default=None, ge=0)


class Gpu(OpenPart):
    index: int = Field(ge=0)
    name: str | None = None
    uuid: str | None = None
    util_pct: float | None = None
    mem_used_mib: float | None = None
    mem_total_mib: float | None = None
    temp_c: float | None = None


class Disk(OpenPart):
    """The host root's file system (statvfs); empty when the probe failed."""

    path: str | None = None
    total_bytes: int | None = None
    free_bytes: int | None = None
    used_pct: float | None = None
    inodes_total: int | None = None
    inodes_free: int | None = None
    inodes_used_pct: float | None = None


class Memory(OpenPart):
    """cgroup (or host) memory; empty when the probe failed."""

    source: str | None = None
    used_bytes: int | None = None
    limit_bytes: int | None = None
    used_pct: float | None = None
    oom_kill: int | None = None


class HostStatus(Doc):
    name: str = Field(min_length=1)
    kind: str = Field(description='"local" or "ssh" (providers add their own).')
    reachable: bool = Field(description="This tick's probe got the agent's status document.")
    error: str = Field(description='Why the probe failed ("" when it did not).')
    unreachable_since: float | None = Field(
        description="First failed probe of the current outage; null when reachable.")
    last_probe_at: float | None = Field(description="The last probe that reached the host.")
    probe_s: float | None = Field(ge=0, description="How long this tick's probe took; null when not probed.")
    agent_alive: bool | None = Field(description="null when the probe failed.")
    health: Literal["", "pass", "warn", "fail"] = Field(description='The last GPU preflight\'s verdict; "" = never.')
    health_detail: str
    hold_reason: str = Field(description="Non-empty: the host gets no new jobs, and why.")
    price_per_hour: float | None = Field(ge=0, description="What the host costs per hour; null when unknown (or free).")
    provider: ProviderName = Field(description='Who rents it; "" for a host the user brought.')
    instance_id: str = Field(description='The provider\'s pod or instance id ("" if not rented).')
    spot: bool
    lease_state: Literal["", "provisioning", "running", "preempted", "stopped", "failed", "terminated"] = Field(
        description='What the provider last said about a rented host ("provisioning": recorded before its create '
                    'call, not up yet; it may bill).')
    lease_reason: str = Field(description="Why the lease is in its state: the provider's words where it gives any.")
    slots: Slots
    gpus: list[Gpu]
    disk: Disk
    memory: Memory


class SweepBudget(Doc):
    """A sweep's spending against its cap (docs/cost.md): the same cost policy as each job's ``cost``."""

    cap: float | None = Field(gt=0, description="The sweep's cap in dollars (`gpuq submit --budget`, `gpuq budget`); "
                                                "null: no cap.")
    spent: float = Field(ge=0, description="Dollars its attempts cost so far: the sum of its jobs' `cost`.")
    committed: float = Field(ge=0, description="Dollars its placed and running attempts will still cost if each "
                                               "runs to its estimate, at the price share it fixed.")


class SweepPartStatus(Doc):
    """One submit that added jobs to the sweep: part 1 made it, each `submit --into` the next."""

    number: int = Field(ge=1)
    joined_at: float = Field(description="When it joined (epoch seconds; part 1: the sweep's created_at).")
    queue_path: str
    jobs: int = Field(ge=0, description="The jobs it added.")
    bundle_sha: str = Field(description="The bundle its jobs run with.")


class SweepStatus(Doc):
    id: str = Field(min_length=1)
    queue_path: str
    created_at: float
    jobs: int = Field(ge=0)
    states: dict[JobStateName, int] = Field(description="Jobs of the sweep per state (states with none left out).")
    budget: SweepBudget
    parts: list[SweepPartStatus] = Field(default_factory=list, description="Its parts by number (`submit --into`).")


class JobStatus(Doc):
    id: str = Field(min_length=1)
    sweep_id: str = Field(min_length=1)
    name: str
    task: str
    epochs: int | None = Field(ge=1, description="null: nothing gave the job epochs (the queue line, its config "
                                                 "or a command with {epochs}); gpuq never invents them.")
    gpus: int = Field(ge=1)
    state: JobStateName
    host: str | None = Field(description="Where the job is placed; null before placement.")
    host_gpus: list[int] = Field(description="Slots (GPU indices, or CPU slot ids) the running attempt holds on "
                                             "`host`; empty when not running.")
    attempt: int = Field(ge=0, description="Number of the latest attempt (0: none yet).")
    step: int | None = Field(ge=0)
    total_steps: int | None = Field(ge=0)
    epoch: int | None = Field(ge=0)
    loss: float | None
    eta_s: float | None = Field(ge=0, description="Seconds to the last step at the current step rate; null unless "
                                                  "running with a known rate.")
    heartbeat_age_s: float | None = Field(ge=0, description="Age of the last heartbeat; null for finished jobs and "
                                                            "before the first.")
    cost: float | None = Field(ge=0, description="Spent so far: hours run x host price per hour x the job's share of "
                                                 "the host's slots, over its attempts; null without a price.")
    exit_code: int | None
    message: str
    waiting: str = Field("", description="Why a placed job has not started yet: a job in a Slurm queue says Slurm's "
                                         "state and reason (`Slurm job 41 PENDING (Priority)`); empty otherwise.")
    node_hosts: list[str] = Field(default_factory=list, description="A multi-node job over SSH hosts: the host of "
                                  "each node rank of its current attempt (node 0 is `host`); empty for a one-host job.")


class Alert(Doc):
    time: float
    severity: Severity
    rule: str = Field(description="The rule that fired: stalled, disk, crash, nan, xid, dead, unreachable, ...")
    subject: str = Field(description="The job, host or sweep id the finding is about.")
    message: str
    action: str = Field(description='What to do about it ("" when nothing).')


class StatusDocument(Doc):
    """`gpuq status --json`: hosts, sweeps, the jobs shown, the latest findings."""

    schema_: Literal["gpuq.cli.status/1"] = Field(alias="schema")
    generated_at: float = Field(description="When the snapshot was taken.")
    hosts: list[HostStatus]
    sweeps: list[SweepStatus]
    jobs: list[JobStatus]
    alerts: list[Alert] = Field(description="The latest patrol findings, newest first.")


# --- gpuq submit --json ---------------------------------------------------------------------------


class SubmittedJob(Doc):
    id: str
    name: str
    host: str | None = Field(description="Where the scheduler placed it; null when not placed yet.")


class SubmitDocument(Doc):
    """`gpuq submit --json`: the sweep id and its jobs (like `sbatch --parsable`)."""

    schema_: Literal["gpuq.cli.submit/1"] = Field(alias="schema")
    sweep: str
    jobs: list[SubmittedJob]
    launch_error: str = Field(description='Why the launch failed ("" when it did not; `gpuq status` retries).')
    part: int = Field(default=1, description="The part of the sweep this submit made: 1 for a new sweep, 2, 3, ... "
                      "for `--into`; 0: `--into` found nothing new (jobs is empty).")


# --- gpuq results --json --------------------------------------------------------------------------


class RanWith(Doc):
    """What an attempt ran with, as its host said (docs/results.md, "Provenance"); null: it could not say."""

    host: str
    slot_kind: str | None = Field(description='"gpu" or "cpu"')
    gpu_model: str | None = Field(description='the GPUs\' model ("A + B" when they differ)')
    gpu_count: int | None
    driver: str | None
    cuda: str | None = Field(description='the CUDA torch was built with ("none": a CPU build)')
    torch: str | None
    nccl: str | None
    python: str | None


class ResultJob(Doc):
    id: str
    sweep_id: str
    name: str
    task: str
    epochs: int | None = Field(description="null: nothing gave the job epochs; gpuq never invents them.")
    state: JobStateName
    attempts: int = Field(ge=0)
    final: dict[str, float] = Field(description="The last metrics the trainer reported.")
    best: dict[str, float] = Field(description="Each metric's own best by its direction: the sweep's [run] mode for "
                                   "its headline metric, lower for loss-like names, higher for accuracy-like "
                                   "ones; a metric whose name says neither has none.")
    best_row: dict[str, float] = Field(default_factory=dict,
                                       description="Every metric in the row where the headline metric was best.")
    gpu_hours: float | None
    cpu_hours: float | None = Field(default=None, description="Hours of attempts on CPU slots, times the slots "
                                                              "(never counted as GPU-hours).")
    cost: float | None
    lost_gpu_hours: float | None
    preemptions: int | None
    pulled: Literal["", "verified", "missing"] = Field(
        description='"verified": a verified copy is in local_dir; "missing": verified, the copy is gone.')
    local_dir: str
    restarts_from_scratch: int = Field(default=0, ge=0, description="Retries that found no checkpoint to resume "
                                       "from and trained again from the start (never counted as resumed).")
    error: str = Field(default="", description='Why the job\'s results could not be read from its host '
                       '(unreachable, or a non-finite metric), or why its [run] metrics gave no value (a setting '
                       'that matched no file, names the setting); "" when nothing failed.')
    ran_with: RanWith | None = Field(default=None, description="What the newest attempt ran with; null before "
                                                               "its host said.")
    git_commit: str | None = Field(default=None, description="The project's git commit at submit; null: not "
                                                             "a git checkout, or unknown.")
    git_dirty: bool | None = Field(default=None, description="Uncommitted changes under the project root at "
                                                             "submit; null: unknown.")
    reused_from: str = Field(default="", description="The result cache: the job whose verified results this one "
                             "reuses (it never ran; its metrics and pulled copy are that job's); \"\" when it ran.")
    part: int = Field(default=1, description="The part of its sweep that added it: 1, the submit that made the sweep; "
                      "2, 3, ...: each `submit --into`.")
    joined_at: float | None = Field(default=None, description="When its part joined the sweep (epoch seconds); "
                                    "null for part 1.")


class ResultsDocument(Doc):
    """`gpuq results --json`: one entry per job of the sweep."""

    schema_: Literal["gpuq.cli.results/1"] = Field(alias="schema")
    sweep: str
    metric: str = Field(description="The sweep's headline metric (the [run] table's metric, else val_acc).")
    mode: Literal["max", "min"] = Field(description="Whether the headline metric is better high or low.")
    jobs: list[ResultJob]


# --- gpuq hosts list|show --json ------------------------------------------------------------------


class HostEntry(Doc):
    name: str
    kind: str
    target: str
    profile: str
    root: str
    slots_total: int
    slots_kind: str
    last_probe_at: float | None
    unreachable_since: float | None
    health: str
    hold_reason: str
    price_per_hour: float | None
    provider: str


class HostsDocument(Doc):
    """`gpuq hosts list --json`."""

    schema_: Literal["gpuq.cli.hosts/1"] = Field(alias="schema")
    hosts: list[HostEntry]


class HostEvent(Doc):
    time: float
    state: str
    message: str


class HostDocument(Doc):
    """`gpuq hosts show NAME --json`."""

    schema_: Literal["gpuq.cli.host/1"] = Field(alias="schema")
    host: HostEntry
    python: str
    port: int | None
    fingerprint: str
    agent_bundle: str
    active_jobs: list[str] = Field(description="Ids of the host's unfinished jobs.")
    unverified_jobs: list[str] = Field(description="Ids of jobs whose results there are not pulled yet.")
    events: list[HostEvent]
    ran_with: RanWith | None = Field(default=None, description="What the newest attempt there ran with (GPUs, "
                                                               "driver, CUDA, torch, NCCL, Python); null: none said.")


# --- gpuq pull --json -----------------------------------------------------------------------------


class PulledJob(Doc):
    id: str
    name: str
    host: str
    state: str = Field(description="verified, already verified, incomplete, quarantined, not pulled")
    verified: bool
    reason: str
    files: int
    bytes: int
    transferred: int
    local_dir: str


class PullDocument(Doc):
    """`gpuq pull --json`; ok is the exit status's verdict (exit 1 when false)."""

    schema_: Literal["gpuq.cli.pull/1"] = Field(alias="schema")
    sweep: str
    results_dir: str
    ok: bool
    jobs: list[PulledJob]


# --- gpuq wait --json -----------------------------------------------------------------------------


class WaitDocument(Doc):
    """`gpuq wait --json`: how the sweep ended (exit 1 unless every job succeeded)."""

    schema_: Literal["gpuq.cli.wait/1"] = Field(alias="schema")
    sweep: str
    ok: bool = Field(description="Every job succeeded.")
    timed_out: bool = Field(False, description="`--timeout` ran out first: the jobs as they stood then (exit 4).")
    states: dict[JobStateName, int]
    jobs: list[JobStatus]


DOCUMENTS: dict[str, type[BaseModel]] = {
    "status": StatusDocument, "submit": SubmitDocument, "results": ResultsDocument, "hosts": HostsDocument,
    "host": HostDocument, "pull": PullDocument, "wait": WaitDocument, "report": Report, "offers": OffersDocument,
}
SCHEMA_DIR = Path("docs") / "schemas"


def json_schema(name: str) -> dict[str, Any]:
    """The published JSON Schema of document ``name`` (``docs/schemas/<name>.schema.json``)."""
    model = DOCUMENTS[name]
    schema = model.model_json_schema(by_alias=True, mode="serialization")
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": f"https://gpuq.invalid/schemas/{name}.schema.json", **schema}


def render_schema(name: str) -> str:
    return json.dumps(json_schema(name), indent=2, sort_keys=True) + "\n"


def main(root: Path) -> int:
    """Write every schema under ``root/docs/schemas``."""
    out = root / SCHEMA_DIR
    out.mkdir(parents=True, exist_ok=True)
    for name in DOCUMENTS:
        (out / f"{name}.schema.json").write_text(render_schema(name))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(__file__).resolve().parents[2]))
