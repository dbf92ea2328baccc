"""Terminal control sequences a host writes never act on the user's terminal (docs/security.md):
``\\x1b]0;`` (window title), ``\\x1b]52;`` (clipboard write) and ``\\x1b[8m`` (hidden text) in a host's
error, health detail, GPU name, log line or an alert quoting it are stripped by ``gpuq status --once``,
the live view and the error printer, and shown escaped by ``gpuq logs`` (as written with ``--raw``)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from orchestrator.api import Snapshot
from orchestrator.cli import dashboard, render
from orchestrator.cli.dashboard import LossHistory, View
from orchestrator.core import protocol
from orchestrator.core.specs import JobSpec
from orchestrator.core.states import HoldChange, HoldKind
from orchestrator.ledger import Attempt, Event, HostRow, Job, Ledger
from orchestrator.tick.probe import Probe
from orchestrator.views.text import one_line, printable, shown_escaped
from tests.conftest import run_gpuq
from tests.support.wire import status

NOW = 1_800_000_000.0
TITLE, CLIP, HIDE = "\x1b]0;", "\x1b]52;", "\x1b[8m"
SEQUENCES = (TITLE, CLIP, HIDE)
EVIL = f"{TITLE}pwned\x07 {CLIP}c;cm0gLXJmIH4=\x07 {HIDE}secret\x1b[0m \x9b31m \u202eevil"


def _assert_clean(output: str) -> None:
    for seq in (*SEQUENCES, "\x07", "\x9b", "\u202e"):
        assert seq not in output, repr(seq)


def test_printable_drops_controls_and_keeps_the_words() -> None:
    assert printable("ok as it is") == "ok as it is"
    assert printable(f"a\tb\nc{TITLE}t\x07d") == "a b c]0;td"
    assert one_line(EVIL) == one_line(printable(EVIL)) and "\x1b" not in one_line(EVIL)
    assert shown_escaped("line 1\r\nline\t2\n\x1b[8mx\r") == "line 1\nline\t2\n\\x1b[8mx\\r"
    assert shown_escaped("\u202e\x9b") == "\\u202e\\x9b"


def _snapshot() -> Snapshot:
    doc: dict[str, Any] = {
        "schema": "gpuq.status/1", "agent": {"alive": True}, "slots": {"kind": f"gpu{HIDE}", "total": 1, "free": 1},
        "gpus": [{"index": 0, "name": f"A100{TITLE}x\x07", "util_pct": 5, "mem_used_mib": 1, "mem_total_mib": 80,
                  "temp_c": 30}],
        "disk": {"used_pct": 10.0, "inodes_used_pct": 1.0}, "memory": {"used_pct": 5.0},
        "jobs": [{"job_id": "cjob00000001", "state": "running", "slots": [0], "heartbeat": None,
                  "slurm": {"nodes": f"n{CLIP}x\x07"}, "progress": {"line": f"epoch {HIDE}1", "source": "pattern"}}],
    }
    hosts = [HostRow(name="g1", kind="ssh", root="/r", slots_kind="gpu", slots_total=1, last_probe_at=NOW - 1,
                     created_at=NOW - 10, health="warn", health_detail=EVIL, hold_kind="other",
                     hold_detail=f"held {CLIP}x\x07", provider="runpod", lease_state="stopped", lease_reason=EVIL,
                     price_per_hour=1.0),
             HostRow(name="g2", kind="ssh", root="/r", last_probe_at=NOW - 1, created_at=NOW - 10,
                     unreachable_since=NOW - 60)]
    probes = {"g1": Probe("g1", True, status(doc), reachable=True),
              "g2": Probe("g2", False, error=f"ssh: {EVIL}", reachable=False)}
    job = Job(id="cjob00000001", sweep_id="qs1", name="j", line=1, raw="", config="c.yaml", config_sha256="0" * 64,
              task="classify", epochs=1, gpus=1, nodes=1, retries=0, spec_hash="h", state="RUNNING", host="g1",
              attempt_count=1, created_at=NOW - 100, updated_at=NOW - 10)
    att = Attempt(job_id=job.id, number=1, host="g1", state="RUNNING", bundle_sha="b", created_at=NOW - 100,
                  started_at=NOW - 90, message=EVIL)
    alerts = [Event(id=1, time=NOW - 5, kind="host", subject=f"g1{TITLE}", severity="warn", rule="xid",
                    message=f"Xid: {EVIL}", action=f"look {CLIP}x\x07")]
    return Snapshot(NOW, hosts, probes, [], [job], {job.id: att}, alerts=alerts)


def _console() -> Console:
    return Console(width=250, height=50, file=io.StringIO(), color_system="truecolor", force_terminal=True,
                   highlight=False, legacy_windows=False)


def test_status_once_strips_host_control_sequences(monkeypatch: pytest.MonkeyPatch) -> None:
    console = _console()
    monkeypatch.setattr(render, "console", lambda *a, **k: console)
    render.status_table(_snapshot())
    out = console.file.getvalue()  # type: ignore[attr-defined]
    _assert_clean(out)
    assert "pwned" in out and "Xid" in out  # the words stay; only the controls go


def test_the_live_view_strips_host_control_sequences() -> None:
    console = _console()
    layout, _ = dashboard.screen(View(_snapshot(), history=LossHistory(), interval_s=5, updated_at=NOW), NOW, 250, 50)
    console.print(layout)
    out = console.file.getvalue()  # type: ignore[attr-defined]
    _assert_clean(out)
    assert "pwned" in out


@pytest.fixture
def ledger_home(gpuq_home: Path) -> tuple[Path, str]:
    """A ledger with the local host (its hold reason and an alert quote a host) and a started job whose
    name carries the sequences too."""
    ledger = Ledger(gpuq_home / "ledger.db")
    try:
        ledger.ensure_host("local", kind="local", root=str(gpuq_home / "local"))
        ledger.change_hold("local", HoldChange(HoldKind.OTHER, f"held: {EVIL}"), health="warn", health_detail=EVIL)
        rows = ledger.add_sweep(sweep_id="qesc0001", queue_path="q.txt", workdir="/w", queue_text="",
                                jobs=[JobSpec(name=f"job{TITLE}x", config="c.yaml", task="classify",
                                              config_sha256="0" * 64, line=1)], default_retries=0)
        ledger.start_attempt(rows[0].id, host="local", bundle_sha="b" * 64)
        ledger.record_finding("host", "local", severity="warn", rule="xid", message=f"Xid: {EVIL}",
                              action=f"look {CLIP}x\x07")
        return gpuq_home, rows[0].id
    finally:
        ledger.close()


def test_gpuq_status_once_prints_no_host_control_sequence(ledger_home: tuple[Path, str]) -> None:
    done = run_gpuq("status", "--once", "--no-probe")
    assert done.returncode == 0, done.stderr
    _assert_clean(done.stdout)
    assert "pwned" in done.stdout and "HELD" in done.stdout


def test_the_error_printer_prints_no_control_sequence(ledger_home: tuple[Path, str]) -> None:
    _, job_id = ledger_home
    done = run_gpuq("logs", job_id)  # no log yet: the error names the job (its name carries the sequences)
    assert done.returncode != 0 and "has no log yet" in done.stderr, done.stderr
    _assert_clean(done.stderr)
    assert "]0;x" in done.stderr  # the rest of the name is still there


def test_gpuq_logs_drops_csi_shows_other_controls_escaped_unless_raw(ledger_home: tuple[Path, str]) -> None:
    home, job_id = ledger_home
    log = Path(home / "local", protocol.JOBS_DIR, job_id, protocol.ATTEMPTS_DIR, "1", protocol.JOB_LOG)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(f"step 1\n{EVIL}\nstep\t2\n")
    shown = run_gpuq("logs", job_id)
    assert shown.returncode == 0, shown.stderr
    _assert_clean(shown.stdout)
    assert "step 1\n" in shown.stdout and "step\t2\n" in shown.stdout
    assert "\\x1b]0;pwned\\x07" in shown.stdout and "\\u202eevil" in shown.stdout
    # colours and cursor moves (CSI) are dropped, not escaped: the hidden text is shown plainly
    assert " secret " in shown.stdout and "[8m" not in shown.stdout and "31m" not in shown.stdout
    raw = run_gpuq("logs", "--raw", job_id)
    assert raw.returncode == 0 and raw.stdout == f"step 1\n{EVIL}\nstep\t2\n"


def test_hosts_show_prints_no_host_control_sequence(ledger_home: tuple[Path, str]) -> None:
    done = run_gpuq("hosts", "show", "local")
    assert done.returncode == 0, done.stderr
    _assert_clean(done.stdout)
    assert "pwned" in done.stdout


def test_a_rich_progress_log_reads_as_its_terminal_showed_it() -> None:
    from orchestrator.cli.attempts import whole_lines
    from orchestrator.views.text import readable_log

    rich = ("\x1b[35m━━━━\x1b[0m\x1b[2K epoch 1  10%\r\x1b[35m━━━━━━━━\x1b[0m epoch 1 100%\r\n"
            "\x1b[1A\x1b[2Kval_acc \x1b[1;32m0.98\x1b[0m\n")
    assert readable_log(rich) == "━━━━━━━━ epoch 1 100%\nval_acc 0.98\n"
    assert readable_log("tqdm 50%\rtqdm 100%\r\nnext\n") == "tqdm 100%\nnext\n"  # a trailing \r keeps the line
    # what is not a colour or a cursor move still acts on nothing: shown escaped, as before
    out = readable_log(EVIL)
    _assert_clean(out)
    assert "\\x1b]0;" in out and "\\x07" in out and "\\u202e" in out
    # a line split across two reads of a followed log is read whole
    parts = ["step 1\rst", "ep 2\n\x1b[3", "1mred\x1b[0m", "\n", "tail"]
    assert [readable_log(t) for t in whole_lines(iter(parts))] == ["step 2\n", "red\n", "tail"]
