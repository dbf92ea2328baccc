#!/usr/bin/env python3
"""Mutation testing of the modules that decide what is safe and what runs (mutmut).

For each chosen module set this script copies the repository's tracked files into a scratch
directory, writes a ``[tool.mutmut]`` section there naming the module's source files and ONLY the
unit tests that exercise them, runs ``mutmut run`` (niced, ``--max-children`` workers), and prints
per module how many mutants the tests killed, how many survived, timed out, or had no test at all:

    python scripts/mutation.py verify patrol          # two module sets
    python scripts/mutation.py --list                 # the module sets and their tests
    python scripts/mutation.py scheduler --survivors  # also name every surviving mutant
    python scripts/mutation.py ledger --keep /tmp/mut # keep the scratch copy (mutmut show <name> there)

Score = (killed + timeout) / (all mutants - skipped), the same figure mutmut's own badge uses.
This is a benchmark of the test suite, not part of it: it takes minutes per module (each mutant is
one pytest run of the matching tests), so run one or two module sets at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class ModuleSet:
    sources: tuple[str, ...]
    tests: tuple[str, ...]
    deselect: tuple[str, ...] = ()  # test ids that read the (trampolined) source text instead of running it


MODULES: dict[str, ModuleSet] = {
    "verify": ModuleSet(("orchestrator/transfer/verify.py",), ("tests/unit/test_transfer.py",)),
    "pull": ModuleSet(
        ("orchestrator/transfer/pull.py", "orchestrator/transfer/job_copy.py", "orchestrator/transfer/durable.py"),
        ("tests/unit/test_transfer.py", "tests/unit/test_pull_outcomes.py")
    ),
    "patrol": ModuleSet(
        ("orchestrator/health/patrol.py", "orchestrator/health/verdicts.py", "orchestrator/health/host_lines.py"),
        ("tests/unit/test_patrol_rules.py", "tests/unit/test_patrol_findings.py")
    ),
    "scheduler": ModuleSet(
        ("orchestrator/scheduling/scheduler.py", "orchestrator/scheduling/placements.py",
         "orchestrator/scheduling/candidates.py", "orchestrator/scheduling/list_scheduling.py",
         "orchestrator/scheduling/stealing.py", "orchestrator/scheduling/estimates.py"),
        ("tests/unit/test_scheduler.py", "tests/unit/test_scheduler_edges.py", "tests/unit/test_capacity.py",
         "tests/unit/test_scheduler_gangs.py", "tests/unit/test_slurm_hosts.py"),
    ),
    "queuefile": ModuleSet(
        ("orchestrator/queue/queuefile.py", "orchestrator/queue/queueline.py", "orchestrator/queue/queuegrid.py"),
        (
            "tests/unit/test_queuefile.py",
            "tests/unit/test_queue_args.py",
            "tests/unit/test_queuegrid_words.py",
            "tests/unit/test_queueline_messages.py",
        ),
    ),
    "ledger": ModuleSet(
        ("orchestrator/ledger/store.py", "orchestrator/ledger/host_records.py", "orchestrator/ledger/sweep_records.py",
         "orchestrator/ledger/attempt_records.py", "orchestrator/ledger/events.py", "orchestrator/ledger/results.py"),
        ("tests/unit/test_ledger.py", "tests/unit/test_ledger_queries.py"),
    ),
    "specs": ModuleSet(
        ("orchestrator/core/specs.py",),
        ("tests/unit/test_specs.py", "tests/unit/test_run_spec.py", "tests/unit/test_runconfig.py"),
    ),
    "checkpoints": ModuleSet(
        ("orchestrator/tick/checkpoints.py",),
        (
            "tests/unit/test_ship_checkpoint.py",
            "tests/unit/test_place_run_checkpoint.py",
            "tests/unit/test_place_checkpoint.py",
            "tests/unit/test_late_preemption.py",
            "tests/unit/test_checkpoint_transfers.py",
        ),
    ),
    # The agent's claim path (enqueue: which launch orders are written, "busy" while another attempt
    # lives) and what collect sends home for a finished job, tested in process.
    "inbox": ModuleSet(("payload/agent/gpuq_records/gpuq_inbox.py",), ("tests/unit/test_agent_enqueue.py",
                                                          "tests/unit/test_agent_collect.py")),
    # What the agent launches for an attempt (environment, argv, run-dir links, secrets, grace), in process.
    "launch": ModuleSet(("payload/agent/gpuq_attempt/gpuq_launch.py",), ("tests/unit/test_agent_launch.py",)),
    # Which claimed or queued job starts on which slots, waits or fails: the serve loop's pure admission.
    "admission": ModuleSet(("payload/agent/gpuq_serving/gpuq_admission.py",), ("tests/unit/test_agent_admission.py",)),
    # The money code: what a host and a run cost, the budget's caps and holds, which offers a rent plan takes.
    "money": ModuleSet(
        ("orchestrator/money/cost.py", "orchestrator/money/budget.py", "orchestrator/money/rentplan.py"),
        ("tests/unit/test_cost.py", "tests/unit/test_budget_rules.py", "tests/unit/test_rentplan_words.py",
         "tests/unit/test_budget.py", "tests/unit/test_rent_for.py", "tests/unit/test_honest_numbers_rules.py",
         "tests/unit/test_provider_vastai_wire.py", "tests/unit/test_billed_interval.py"),
    ),
    # The tick's billing stage: which rented hosts bill, their work, down-when-done's blockers, the idle alert and
    # the findings the stage writes, as rules and on a real ledger (test_billing_rules.py).  test_billing.py is
    # left out: it runs the same stage end to end with the real agent on FakeHosts against the fake RunPod, and
    # covers every function of the module, so each mutant would cost its whole 5-20 s.  (test_notify_forms.py's
    # slow preemption cases never reach billing.py: mutmut runs only the tests that call a mutated function.)
    "billing": ModuleSet(
        ("orchestrator/tick/billing.py",),
        ("tests/unit/test_billing_rules.py", "tests/unit/test_billing_findings.py", "tests/unit/test_cloud_rows.py",
         "tests/unit/test_notify_forms.py", "tests/unit/test_runpod_graphql_era_rows.py"),
    ),
    # A rented host's own stop: the latest it can have stopped by gpuq's clock and what its idle time cost
    # (money/selfstop.py), on a real ledger against the fake vast.ai (test_self_stop_record.py).
    "selfstop": ModuleSet(
        ("orchestrator/money/selfstop.py",),
        ("tests/unit/test_self_stop_record.py",),
    ),
    # The teardown gate and termination of a rented host, and the ledger's lease and hold writers.
    # (test_billing.py, whose down-when-done runs through here too, is left out: 19 s a mutant.)
    "teardown": ModuleSet(
        ("orchestrator/tick/teardown.py", "orchestrator/ledger/leases.py"),
        ("tests/unit/test_teardown_gate.py", "tests/unit/test_teardown_terminate.py", "tests/unit/test_leases.py",
         "tests/unit/test_down_plan.py", "tests/unit/test_rented_address.py"),
    ),
    # The tick's watch over rented machines stuck provisioning (a killed `gpuq up`, a create whose answer never
    # came): ended, or their row removed, or escalated once; on a real ledger against the in-process fake Lambda.
    "provisioning": ModuleSet(
        ("orchestrator/tick/provisioning.py",),
        ("tests/unit/test_provisioning_watch.py",),
    ),
    # Renting (`gpuq up`, `gpuq rent-for`) and the budget commands, through the api in process (the fake clouds
    # on loopback; every machine is refused at registration, so no SSH: `_register`'s audit and the GPU preflight
    # are tests/integration/test_cloud*.py's).
    "renting": ModuleSet(
        ("orchestrator/api/renting.py", "orchestrator/api/renting_for.py", "orchestrator/api/budgeting.py"),
        ("tests/unit/test_cloud_rows.py", "tests/unit/test_rented_address.py", "tests/unit/test_rent_for.py",
         "tests/unit/test_budget.py", "tests/unit/test_up_rows.py"),
    ),
    # The providers' money parsing (parse_money, to_cents, price caps, offers) and SSH endpoints.
    "prices": ModuleSet(
        ("orchestrator/providers/models.py",),
        ("tests/unit/test_provider_values.py", "tests/unit/test_providers_units.py", "tests/unit/test_price_cap.py",
         "tests/unit/test_rent_for.py", "tests/unit/test_cloud_rows.py", "tests/unit/test_provider_vastai_wire.py",
         "tests/unit/test_rented_address.py"),
        deselect=("tests/unit/test_providers_units.py::test_providers_import_only_their_allowed_layers",),
    ),
    # gpuq_serve.py (the agent's serve loop: claiming from the inbox, starting wrappers, reaping) is not a
    # set: it runs in the host agent's own process, started by tests/integration/test_agent.py, where
    # mutmut's coverage and mutant switch do not reach.
}

# Directories mutmut copies as they are (it copies the source roots and tests itself).
ALSO_COPY = ("pyproject.toml", "docs", "examples", "profiles", "scripts", "README.md")


def _status_names() -> dict[int | None, str]:
    from mutmut.stats import status_by_exit_code  # mutmut's own exit-code -> status table

    return status_by_exit_code  # type: ignore[no-any-return]


def _toml_list(items: tuple[str, ...] | list[str]) -> str:
    return "[" + ", ".join(json.dumps(i) for i in items) + "]"


def prepare(scratch: Path, module: ModuleSet) -> None:
    tracked = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.split()
    for rel in tracked:
        src = ROOT / rel
        if not src.is_file():
            continue
        dst = scratch / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
    also = [p for p in ALSO_COPY if (scratch / p).exists()]
    section = "\n".join(
        [
            "",
            "[tool.mutmut]",
            f"source_paths = {_toml_list(['orchestrator', 'payload'])}",
            f"paths_to_mutate = {_toml_list(['orchestrator', 'payload'])}",
            f"only_mutate = {_toml_list(module.sources)}",
            f"tests_dir = {_toml_list(module.tests)}",
            f"also_copy = {_toml_list(also)}",
            "pytest_add_cli_args = "
            + _toml_list(["-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                          *(arg for test in module.deselect for arg in ("--deselect", test))]),
            "",
        ]
    )
    with (scratch / "pyproject.toml").open("a") as fh:
        fh.write(section)


def count(scratch: Path, module: ModuleSet) -> tuple[Counter[str], list[str]]:
    names = _status_names()
    counts: Counter[str] = Counter()
    survivors: list[str] = []
    for source in module.sources:
        meta = scratch / "mutants" / (source + ".meta")
        if not meta.is_file():
            continue
        data = json.loads(meta.read_text())
        for key, code in data.get("exit_code_by_key", {}).items():
            status = names[code]
            counts[status] += 1
            if status == "survived":
                survivors.append(key)
    return counts, survivors


def score(counts: Counter[str]) -> float | None:
    tested = sum(counts.values()) - counts["skipped"]
    if tested <= 0:
        return None
    return 100.0 * (counts["killed"] + counts["timeout"]) / tested


def run_one(name: str, module: ModuleSet, args: argparse.Namespace) -> tuple[Counter[str], list[str]]:
    keep = Path(args.keep) / name if args.keep else None
    scratch = keep or Path(tempfile.mkdtemp(prefix=f"gpuq-mutation-{name}-"))
    if keep and keep.exists():
        shutil.rmtree(keep)
    scratch.mkdir(parents=True, exist_ok=True)
    try:
        prepare(scratch, module)
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)  # the copies under mutants/ must win over the checkout
        cmd = ["nice", "-n", str(args.nice), sys.executable, "-m", "mutmut", "run", "--max-children", str(args.jobs)]
        proc = subprocess.run(cmd, cwd=scratch, env=env, capture_output=True, text=True)
        found = count(scratch, module) if (scratch / "mutants").is_dir() else (Counter[str](), [])
        if proc.returncode != 0 and score(found[0]) in (None, 0.0):  # e.g. a test failed on the clean code
            sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
            raise SystemExit(f"mutmut failed for {name} (exit {proc.returncode}); rerun with --keep DIR to inspect")
        return found
    finally:
        if not keep:
            shutil.rmtree(scratch, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("modules", nargs="*", help=f"module sets: {', '.join(MODULES)} (default: all)")
    parser.add_argument("--list", action="store_true", help="print the module sets and their tests")
    parser.add_argument("--jobs", type=int, default=1, help="mutmut workers (default 1)")
    parser.add_argument("--nice", type=int, default=10)
    parser.add_argument("--survivors", action="store_true", help="name every surviving mutant")
    parser.add_argument("--keep", metavar="DIR", help="keep each module's scratch copy under DIR/<module>")
    args = parser.parse_args()
    if args.list:
        for name, m in MODULES.items():
            print(f"{name:12} {' '.join(m.sources)}\n{'':12} tests: {' '.join(m.tests)}")
        return 0
    unknown = [m for m in args.modules if m not in MODULES]
    if unknown:
        parser.error(f"unknown module set(s) {', '.join(unknown)}; choose from {', '.join(MODULES)}")
    chosen = args.modules or list(MODULES)
    header = f"{'module':12} {'mutants':>7} {'killed':>6} {'survived':>8} {'timeout':>7} {'no tests':>8} {'score':>6}"
    rows = []
    for name in chosen:
        counts, survivors = run_one(name, MODULES[name], args)
        s = score(counts)
        rows.append(
            f"{name:12} {sum(counts.values()):7} {counts['killed']:6} {counts['survived']:8} "
            f"{counts['timeout']:7} {counts['no tests']:8} {'-' if s is None else f'{s:.1f}%':>6}"
        )
        print(f"[{name}] done: {rows[-1]}", flush=True)
        if args.survivors:
            for key in survivors:
                print(f"    survived: {key}", flush=True)
    print(header)
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
