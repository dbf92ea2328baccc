"""No invented numbers and honest seeds, unit by unit: epochs only when something gives them, the
identical-seeds warning, CPU-hours apart from GPU-hours, progress without a made-up total, and the
report's judgement of identical or mixed seeds (orchestrator/report/trust.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.core.specs import DEFAULT_EPOCHS
from orchestrator.host_documents import Provenance
from orchestrator.ledger import Attempt, Job
from orchestrator.money.cost import job_cost
from orchestrator.queue.project_checks import seed_warnings
from orchestrator.queue.queuefile import parse_bytes
from orchestrator.queue.runconfig import RunConfig
from orchestrator.report import trust
from orchestrator.views.jobs import JobView

T0 = 1_800_000_000.0


def _parse(text: str, workdir: Path | None = None, **kw: bool) -> list[int | None]:
    parsed = parse_bytes(text.encode(), label="q.txt", workdir=workdir, **kw)
    return [j.epochs for j in parsed.jobs]


def test_epochs_come_from_the_line_the_config_or_a_command_that_passes_them(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("epochs: 7\n")
    (tmp_path / "b.yaml").write_text("lr: 1\n")
    lines = "a.yaml t\nb.yaml t\nb.yaml t 3 name=three\n"
    assert _parse(lines, tmp_path, needs_config=True, uses_epochs=False) == [7, None, 3]
    # a command with {epochs} gets the config's, else the default: the trainer is really given it
    assert _parse(lines, tmp_path, uses_epochs=True) == [7, DEFAULT_EPOCHS, 3]
    assert _parse("name=x -- 1 2\n", None, needs_config=False, uses_epochs=False) == [None]


def test_seeds_with_identical_argv_warn_unless_the_command_uses_the_seed() -> None:
    own = RunConfig(command=("train.py", "{args}"))
    jobs = parse_bytes(b"name=a seeds=2 -- --lr 1\nname=b -- --seed {1,2}\n", label="q.txt", workdir=None,
                       needs_config=False, uses_epochs=False).jobs
    (warning,) = seed_warnings(jobs, own, "q.txt")
    assert warning.startswith("q.txt:1: jobs a-seed0, a-seed1 differ only by their seed") and "GPUQ_SEED" in warning
    assert seed_warnings(jobs, RunConfig(command=("train.py", "--seed", "{seed}", "{args}")), "q.txt") == []


def _attempt(host: str, kind: str | None) -> Attempt:
    ran = Provenance(slot_kind=kind).stored() if kind else ""
    return Attempt(job_id="c1", number=1, host=host, state="EXITED", bundle_sha="s", created_at=T0, started_at=T0,
                   ended_at=T0 + 3600, provenance=ran)


def test_cpu_slots_count_as_cpu_hours_never_as_gpu_hours() -> None:
    def on_cpu(att: Attempt) -> bool:
        return (Provenance.from_stored(att.provenance) or Provenance()).slot_kind == "cpu"

    cost = job_cost(2, [_attempt("c", "cpu"), _attempt("g", "gpu")], [], T0 + 7200, on_cpu)
    assert cost.cpu_hours == pytest.approx(2.0) and cost.gpu_hours == pytest.approx(2.0)
    assert job_cost(2, [_attempt("c", "cpu")], [], T0 + 7200).gpu_hours == pytest.approx(2.0)  # no predicate: as before


def _view(epochs: int, step: int, epoch: int | None, told: int | None = None) -> JobView:
    job = Job(id="c1", sweep_id="q", name="a", line=1, raw="", config="", config_sha256="", task="", epochs=epochs,
              gpus=1, nodes=1, retries=0, spec_hash="", state="RUNNING", created_at=T0, updated_at=T0)
    att = Attempt(job_id="c1", number=1, host="h", state="RUNNING", bundle_sha="s", created_at=T0, step=step,
                  epoch=epoch)
    return JobView(job=job, attempt=att, host_gpus=[], fraction=None, eta_s=None, heartbeat_age_s=None, cost=None,
                   epochs=epochs or told or None)


def test_progress_shows_no_total_nothing_gave() -> None:
    assert _view(0, 120, None).progress == "step 120"
    assert _view(0, 120, 3).progress == "ep 3 step 120"
    assert _view(0, 120, 3, told=6).progress == "ep 3/6 step 120"  # the progress regex's total
    assert _view(6, 120, 3).progress == "ep 3/6 step 120"


def test_provenance_from_a_host_is_short_printable_text_or_unknown() -> None:
    ran = Provenance.model_validate({"gpu_model": "A100\x1b[31m\n" + "x" * 500, "gpu_count": 10**9, "driver": 5,
                                     "torch": "2.3.1", "python": "", "extra": {"kept": "never read"}})
    assert ran.gpu_model is not None and "\x1b" not in ran.gpu_model and len(ran.gpu_model) <= 120
    assert (ran.gpu_count, ran.driver, ran.python, ran.torch) == (None, None, None, "2.3.1")
    again = Provenance.from_stored(ran.stored())
    assert again is not None and again.stored() == ran.stored()
    assert "extra" not in ran.stored() and Provenance.from_stored("{not json") is None
    assert ran.software()["driver"] == "unknown" and ran.gpus().endswith(ran.gpu_model)


def test_identical_seeds_and_mixed_machines_are_told_apart() -> None:
    curve = [("val_acc", 1, 0.5), ("val_acc", 2, 0.7)]
    assert trust.identical([trust.signature(curve, 0.7), trust.signature(list(reversed(curve)), 0.7)])
    assert not trust.identical([trust.signature(curve, 0.7), trust.signature(curve[:1], 0.7)])
    assert not trust.identical([trust.signature(curve, 0.7)])  # one seed is no evidence
    assert not trust.identical([trust.signature([], 0.7)] * 3)  # equal finals without curves: a saturated metric
    a100 = Provenance(slot_kind="gpu", gpu_model="A100", gpu_count=1, torch="2.3.1")
    rtx = Provenance(slot_kind="gpu", gpu_model="RTX 4090", gpu_count=1, torch="2.3.1")
    unknown = Provenance()
    assert trust.mixed({"s0": [a100], "s1": [a100.model_copy(update={"gpu_count": 2})]}) == ""
    assert trust.mixed({"s0": [a100], "s1": [unknown]}) == ""  # unknown says nothing
    assert trust.mixed({"s0": [a100], "s1": [rtx]}) == "mixed machines across seeds: GPUs A100 vs RTX 4090"
    newer = a100.model_copy(update={"torch": "2.4.0"})
    assert "torch 2.3.1 vs 2.4.0" in trust.mixed({"s0": [a100], "s1": [newer]})
    assert trust.unlike_baseline([rtx], [a100]).startswith("ran on other machines than the baseline: GPUs RTX 4090")
    assert trust.unlike_baseline([a100], [a100, unknown]) == ""


def test_the_agent_reads_versions_from_the_jobs_interpreter_without_importing_torch() -> None:
    import importlib.metadata
    import os
    import platform
    import sys

    from tests.support.agentmodule import load_agent_module

    probe = load_agent_module("gpuq_attempt.gpuq_provenance")
    found = probe.versions(sys.executable, dict(os.environ))
    assert found["python"] == platform.python_version()
    assert found["torch"] == importlib.metadata.version("torch") and found["cuda"] is not None
    missing = probe.versions("/nonexistent/python", {})
    assert {k: missing[k] for k in ("python", "torch", "cuda", "nccl")} == dict.fromkeys(("python", "torch", "cuda",
                                                                                          "nccl"))
    assert probe.gpu_facts("cpu", [0, 1]) == {"slot_kind": "cpu", "gpu_model": None, "gpu_count": 0, "driver": None}
