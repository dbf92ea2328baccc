"""Every failure is named, with its evidence and its fix (docs/health.md, issue 25): real logs recorded once
(tests/fixtures/failures, tests/fixtures/torchrun; each file's header says how), scanned as the agent scans
them and classed as the tick classes them (``failures.classify``), then settled by the retry policy.

- torchrun: the first failing rank's exception decides; torchrun's SIGTERM to the other ranks is no stop,
  and the alert shows the exception line, never "Traceback (most recent call last):".
- ``shm_exhausted`` (a DataLoader's Bus error, torch's shared-memory ENOSPC), ``checkpoint_mismatch``
  (state-dict keys and sizes) are never retried; ``host_oom`` also from torch's CPU allocator.
- a crash retried with resume whose exception repeats in the next attempt is not retried again.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from orchestrator.core.config import Settings
from orchestrator.core.specs import JobSpec
from orchestrator.core.states import JobState
from orchestrator.health import failures, hints, patrol, verdicts
from orchestrator.health.patrol import JobView, Thresholds
from orchestrator.host_documents import Scan, ScanHit
from orchestrator.ledger import HostRow, Ledger
from orchestrator.tick.probe import Probe
from orchestrator.tick.reconcile import reconcile
from tests.support.agentmodule import load_agent_module
from tests.support.wire import entry, status

gpuq_scan = load_agent_module("gpuq_watch.gpuq_scan")
ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
RAISED = FIXTURES / "torchrun" / "rank1-raises-gloo-cpu-torch-2.13.log"
SIGKILL = FIXTURES / "torchrun" / "rank1-sigkill-gloo-cpu-torch-2.13.log"
SHM_ENOSPC = FIXTURES / "failures" / "shm-dataloader-enospc-torch-2.13.log"
SHM_BUS = FIXTURES / "failures" / "shm-dataloader-bus-error-torch-2.13.log"
CPU_ALLOC = FIXTURES / "failures" / "cpu-allocator-torch-2.13.log"
STATE_DICT = FIXTURES / "failures" / "state-dict-mismatch-torch-2.13.log"
ATTRIBUTE = "AttributeError: 'Tensor' object has no attribute 'no_such_attribute'"
NOW = 1_800_000_000.0
JOB = JobView("c000000000001", "grid-a", 1, launched_at=NOW - 600)


def _scan(log: Path, offset: int = 0) -> Scan:
    return Scan.model_validate(gpuq_scan.scan_log(str(log), offset))  # typed at the edge, as the tick reads it


def _classify(log: Path, exit_code: int = 1, trainer_code: int | None = 1, **kw: Any) -> str:
    scan = _scan(log)
    return failures.classify(exit_code, trainer_code, scan.hits, scan.traceback, **kw)


def _crash_alert(scan: Scan) -> patrol.Finding:
    (crash,) = [f for f in patrol.job_findings("h", JOB, entry({"state": "exited", "scan": scan.model_dump()}),
                                               NOW, Thresholds()) if f.rule == "crash"]
    return crash


# --- torchrun: the first failing rank decides ----------------------------------------------------


def test_torchrun_rank1_raising_is_classed_by_its_exception_never_a_stop() -> None:
    text = RAISED.read_text()
    assert "Signal 15 (SIGTERM) received by PID" in text and "exitcode  : 1 (pid:" in text  # what fooled it
    scan = _scan(RAISED)
    assert scan.hits[0].signature == "rank_failed" and scan.hits[0].line == f"root cause: rank 1: {ATTRIBUTE}"
    assert scan.traceback[-1] == f"[rank1]: {ATTRIBUTE}"  # rank 1's traceback, not rank 0's nor torchrun's
    assert not any("[rank0]" in line for line in scan.traceback)
    assert _classify(RAISED) == "config"  # AttributeError: never retried
    assert failures.decide("config", 1, 2).action == "fail"
    crash = _crash_alert(scan)
    assert ATTRIBUTE in crash.message and "Traceback (most recent call last)" not in crash.message
    assert crash.evidence[-1] == f"[rank1]: {ATTRIBUTE}"


def test_torchrun_rank1_raising_seen_over_two_ticks_is_still_its_exception(tmp_path: Path) -> None:
    """The tick before the exit read rank 1's traceback; the last tick reads only torchrun's report. The
    earlier crash finding (what the ledger keeps of it) carries the exception line to the verdict."""
    text = RAISED.read_text()
    cut = text.index("[rank0]: Traceback")
    log = tmp_path / "job.log"
    log.write_text(text[:cut])
    first = _scan(log)
    earlier = _crash_alert(first)
    assert ATTRIBUTE in earlier.message
    log.write_text(text)
    last = _scan(log, first.log_to)
    assert last.hits[0].line == "root cause: rank 1: exitcode 1"  # the exception is not among these bytes
    kept = [ScanHit(signature=name, line=earlier.reason) for name in earlier.signatures]
    assert failures.classify(1, 1, [*kept, *last.hits], last.traceback) == "config"
    assert failures.exception_line([*kept, *last.hits], last.traceback) == ATTRIBUTE
    assert verdicts.classify(1, 1, last.hits, last.traceback) != "stopped"  # torchrun's SIGTERMs are not a stop


def test_the_root_cause_exception_wins_over_a_later_signal_death_of_another_rank() -> None:
    """A rank raised first; another rank then died of SIGKILL (torchrun's report lists both): the
    exception decides, so a RuntimeError stays `unknown` (not retried), never `killed`."""
    text = RAISED.read_text().replace(ATTRIBUTE, "RuntimeError: shapes do not match")
    text = text.replace("exitcode  : -15 (pid: 21394)  (SIGTERM)", "exitcode  : -9 (pid: 21394)  (SIGKILL)")
    text = text.replace("Signal 15 (SIGTERM) received by PID 21394", "Signal 9 (SIGKILL) received by PID 21394")
    scan = _scan_text(text)
    assert "rank_killed" in {h.signature for h in scan.hits}
    assert failures.classify(1, 1, scan.hits, scan.traceback) == "unknown"


def test_a_survivor_named_first_for_losing_its_killed_peer_is_still_killed() -> None:
    """torchrun dates failures to the second: when rank 0 exits on the lost peer in the same poll that finds
    rank 1 SIGKILLed, its report can name rank 0 (exit 1) first. The death still decides."""
    text = SIGKILL.read_text()
    other = text[text.index("Failures:\n"):text.index("Root Cause")]
    root = text[text.index("Root Cause (first observed failure):\n"):]
    killed = (other.replace("rank      : 0 (local_rank: 0)", "rank      : 1 (local_rank: 1)")
              .replace("exitcode  : -15 (pid: 27315)  (SIGTERM)", "exitcode  : -9 (pid: 27317)  (SIGKILL)")
              .replace("Signal 15 (SIGTERM) received by PID 27315", "Signal 9 (SIGKILL) received by PID 27317"))
    swapped = text.replace(other, killed)
    swapped = swapped.replace(root, root.replace("rank      : 1 (local_rank: 1)", "rank      : 0 (local_rank: 0)")
                              .replace("exitcode  : -9 (pid: 27317)  (SIGKILL)", "exitcode  : 1 (pid: 27315)")
                              .replace("traceback : Signal 9 (SIGKILL) received by PID 27317",
                                       "traceback : To enable traceback see: https://pytorch.org/docs/stable/"))
    scan = _scan_text(swapped)
    assert scan.hits[0].signature == "rank_failed" and "Connection reset by peer" in scan.hits[0].line
    assert failures.classify(1, 1, scan.hits, scan.traceback) == "killed"
    assert failures.classify(1, 1, scan.hits, scan.traceback, oom_kill_rose=True) == "host_oom"


def test_a_torchrun_report_of_a_ranks_sigkill_stays_killed() -> None:
    scan = _scan(SIGKILL)
    assert scan.hits[0].signature == "rank_killed"
    assert scan.hits[0].line == "root cause: rank 1: Signal 9 (SIGKILL) received by PID 27317"
    assert _classify(SIGKILL) == "killed"
    assert failures.decide("killed", 1, 2).action == "requeue"  # retried with resume
    assert _crash_alert(scan).message.endswith("root cause: rank 1: Signal 9 (SIGKILL) received by PID 27317")


def test_interleaved_rank_tracebacks_stay_apart(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text("[rank0]: Traceback (most recent call last):\n"
                   "[rank1]: Traceback (most recent call last):\n"
                   '[rank0]:   File "train.py", line 3, in <module>\n'
                   '[rank1]:   File "train.py", line 9, in <module>\n'
                   "[rank1]: KeyError: 'lr'\n"
                   "[rank0]: ValueError: bad shape\n")
    scan = _scan(log)
    assert [h.line for h in scan.hits] == ["[rank0]: ValueError: bad shape", "[rank1]: KeyError: 'lr'"]
    assert scan.traceback == ["[rank0]: Traceback (most recent call last):",
                              '[rank0]:   File "train.py", line 3, in <module>', "[rank0]: ValueError: bad shape"]


# --- new classes from real processes -------------------------------------------------------------


@pytest.mark.parametrize("log", [SHM_ENOSPC, SHM_BUS], ids=["enospc", "bus-error"])
def test_an_exhausted_dev_shm_is_shm_exhausted_not_a_full_disk(log: Path) -> None:
    scan = _scan(log)
    names = {h.signature for h in scan.hits}
    assert "shm_exhausted" in names and "disk_full" not in names
    assert _classify(log) == "shm_exhausted"
    assert _classify(log, 135, -7) == "shm_exhausted"  # the trainer itself died of SIGBUS: still not `killed`
    decision = failures.decide("shm_exhausted", 1, 5)
    assert decision.action == "fail" and decision.reason.startswith("shm_exhausted: never retried")
    for fix in ("--shm-size", "--ipc=host", "fewer workers", "set_sharing_strategy('file_system')"):
        assert fix in decision.reason
    assert "prune" not in decision.reason


def test_shm_words_of_other_writers(tmp_path: Path) -> None:
    """Older torch's and NCCL's wording (NCCL's as public reports quote it; not recorded here)."""
    for line in ("RuntimeError: unable to write to file </torch_3318_1976212917>: No space left on device (28)",
                 "OSError: [Errno 28] No space left on device: '/dev/shm/cache-00012.npy'",
                 "ncclSystemError: Error while creating shared memory segment /dev/shm/nccl-cjY8K5 (size 10617216), "
                 "error: No space left on device (28)"):
        assert _classify(_log(tmp_path, line)) == "shm_exhausted", line
    assert _classify(_log(tmp_path, "OSError: [Errno 28] No space left on device: '/data/ckpt/step-9.pt'")) \
        == "disk_full"
    assert _classify(_log(tmp_path, "Bus error (core dumped)"), 135, -7) == "killed"  # not the loader's


def test_torchs_cpu_allocator_is_host_oom_and_retried() -> None:
    assert "DefaultCPUAllocator: can't allocate memory" in CPU_ALLOC.read_text()
    assert _classify(CPU_ALLOC) == "host_oom"
    assert failures.decide("host_oom", 1, 2).action == "requeue"
    assert failures.decide("host_oom", 3, 2).action == "keep_lost"


def test_a_checkpoint_of_another_config_is_checkpoint_mismatch_never_retried(tmp_path: Path) -> None:
    text = STATE_DICT.read_text()
    assert _classify(STATE_DICT) == "checkpoint_mismatch"
    for words in ("Missing key(s) in state_dict", "Unexpected key(s) in state_dict", "size mismatch for enc.weight"):
        (line,) = [x for x in text.splitlines() if words in x]
        alone = "Traceback (most recent call last):\nRuntimeError: Error(s) in loading state_dict for Net:\n" + line
        assert _classify(_log(tmp_path, alone)) == "checkpoint_mismatch", words
        assert _classify(_log(tmp_path, "[rank0]: " + line.strip())) == "checkpoint_mismatch", words
    decision = failures.decide("checkpoint_mismatch", 1, 5)
    assert decision.action == "fail" and decision.reason.startswith("checkpoint_mismatch: never retried")
    assert "config changed since it was saved" in decision.reason and "start fresh" in decision.reason


def test_a_stop_still_wins() -> None:
    """The wrapper itself was sent SIGTERM (a preemption's grace) while the loader failed: a stop."""
    assert _classify(SHM_BUS, 1, 1, wrapper_signal=15) == "stopped"


# --- a crash that repeats is not retried again ---------------------------------------------------


def test_same_exception_ignores_pids_ports_and_addresses() -> None:
    a = "RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:22433 (pid 4242 at 0x7f2ee96884a0)"
    b = "RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:41907 (pid 977 at 0x7f00c0ffee00)"
    assert failures.same_exception(a, b)
    assert not failures.same_exception(a, "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1970")
    assert not failures.same_exception("", "")


def test_decide_stops_a_repeated_crash_but_never_a_repeated_interruption() -> None:
    again = failures.decide("transient", 1, 3, repeated="RuntimeError: NCCL error")
    assert again.action == "fail" and again.reason.startswith("transient: never retried: the attempt before ended "
                                                              "with the same exception, RuntimeError: NCCL error")
    assert failures.decide("transient", 1, 3).action == "requeue"
    for klass in ("killed", "stopped", "host_oom", "vanished", "stalled"):
        assert failures.decide(klass, 1, 3, repeated="RuntimeError: x").action == "requeue", klass


NCCL_CRASH = ("[rank0]: Traceback (most recent call last):\n"
              '[rank0]:   File "train.py", line 40, in <module>\n'
              "[rank0]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled "
              "system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5, pid {pid}\n")


def test_a_transient_crash_repeated_in_the_next_attempt_is_not_retried_again(tmp_path: Path) -> None:
    """Through the tick's reconcile: attempt 1's NCCL crash is retried; attempt 2 ends with the same
    exception line (another pid): FAILED, and the history says why."""
    ledger = Ledger(tmp_path / "ledger.db")
    try:
        job = _one_job(ledger)
        assert _run_attempt(ledger, job, tmp_path, NCCL_CRASH.format(pid=101)) == "transient"
        assert ledger.job(job).state == JobState.QUEUED.value
        assert _run_attempt(ledger, job, tmp_path, NCCL_CRASH.format(pid=202)) == "transient"
        assert ledger.job(job).state == JobState.FAILED.value and ledger.job(job).attempt_count == 2
        told = [e.message for e in ledger.events(subject=job)]
        assert any(m.startswith("transient: never retried: the attempt before ended with the same exception, "
                                "torch.distributed.DistBackendError: NCCL error in:") for m in told), told
    finally:
        ledger.close()


def test_a_different_exception_in_the_next_attempt_is_retried(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.db")
    try:
        job = _one_job(ledger)
        _run_attempt(ledger, job, tmp_path, NCCL_CRASH.format(pid=101))
        other = NCCL_CRASH.replace("unhandled system error", "remote process exited or there was a network error")
        assert _run_attempt(ledger, job, tmp_path, other.format(pid=202)) == "transient"
        assert ledger.job(job).state == JobState.QUEUED.value
    finally:
        ledger.close()


# --- the table, the hints and the doc agree -------------------------------------------------------


@pytest.mark.parametrize("klass", failures.NAMES)
def test_each_class_is_retried_as_its_table_says_and_has_a_hint(klass: str) -> None:
    retry = failures.BY_NAME[klass].retry
    expected = {"with_resume": "requeue", "once": "requeue", "never": "fail", "not_automatic": "none"}[retry]
    assert failures.decide(klass, 1, 2).action == expected
    if retry == "once":
        assert failures.decide(klass, 2, 5).action == "fail"
    assert hints.HINTS.get(klass), f"orchestrator/health/hints.py has no fix for {klass}"


def test_docs_health_lists_every_class_with_its_evidence_and_fix() -> None:
    doc = (ROOT / "docs" / "health.md").read_text(encoding="utf-8")
    section = doc[doc.index("## Failure classes and retries"):]
    section = section[:section.index("\n## ", 5)]
    rows = {m.group(1): line for line in section.splitlines()
            if (m := re.match(r"^\| `([a-z_]+)` \|", line))}
    assert set(failures.NAMES) <= set(rows), set(failures.NAMES) - set(rows)
    for klass in failures.NAMES:
        cells = [c.strip() for c in rows[klass].strip("|").split("|")]
        assert len(cells) == 4 and all(cells), rows[klass]  # class, evidence, policy, fix
        policy, retry = cells[2].lower(), failures.BY_NAME[klass].retry
        assert ("retried" in policy and "never" not in policy) == (retry in ("with_resume", "once")), rows[klass]
        assert ("once" in policy) == (retry == "once"), rows[klass]


# --- helpers --------------------------------------------------------------------------------------


def _log(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.log"
    path.write_text(text + "\n")
    return path


def _scan_text(text: str) -> Scan:
    with tempfile.TemporaryDirectory() as where:
        return _scan(_log(Path(where), text))


def _one_job(ledger: Ledger) -> str:
    ledger.add_host(HostRow(name="h", kind="ssh", target="u@h", root="/r", slots_kind="cpu", slots_total=2,
                            created_at=0))
    (row,) = ledger.add_sweep(sweep_id="qaaaaaa", queue_path="q.txt", workdir="/w", queue_text="",
                              jobs=[JobSpec(name="grid-a", config="c.yaml", task="t")], default_retries=3)
    return row.id


def _run_attempt(ledger: Ledger, job: str, tmp_path: Path, log_text: str) -> str:
    """Start the next attempt, record the crash finding the patrol makes of its log, then reconcile its
    exit as the tick does; returns the class reconcile gave it."""
    ledger.start_attempt(job, host="h", bundle_sha="s")
    number = ledger.job(job).attempt_count
    scan = gpuq_scan.scan_log(str(_log(tmp_path, log_text)), 0)
    seen = {"job_id": job, "attempt": number, "state": "exited", "scan": scan,
            "exit": {"wrapper_code": 1, "trainer_code": 1, "code": 1}}
    view = JobView(job, "grid-a", number)
    for found in patrol.job_findings("h", view, entry(seen), NOW, Thresholds()):
        ledger.record_finding("job", found.subject, severity=found.severity.value, rule=found.rule,
                              message=found.message, action=found.action, reason=found.reason,
                              signatures=found.signatures)
    host: Any = SimpleNamespace(name="h")
    done = reconcile(ledger, host, Settings(), Probe("h", True, status({"jobs": [seen]})))
    (settled,) = done.settled
    assert settled.attempt == number
    return settled.klass


def test_docs_checkpoints_says_who_retries_what() -> None:
    doc = (ROOT / "docs" / "checkpoints.md").read_text(encoding="utf-8")
    section = doc[doc.index("## Who retries what"):]
    section = section[:section.index("\n## ", 5)]
    header, _rule, row = [line for line in section.splitlines() if line.startswith("|")][:3]
    columns = [set(re.findall(r"`([a-z_]+)`", cell)) for cell in row.strip("|").split("|")]
    by_retry = {retry: {c.name for c in failures.CLASSES if c.retry == retry}
                for retry in ("with_resume", "once", "never", "not_automatic")}
    assert columns == list(by_retry.values()), (header, columns)
