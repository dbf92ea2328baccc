"""Text from hosts is never rich markup (docs/security.md): a GPU named ``A100[/]`` must not crash
`gpuq status`, and ``[link=...]`` in alert text must not become a hyperlink."""

from __future__ import annotations

import io
from typing import Any

import pytest
from rich.console import Console

from orchestrator.api import Snapshot
from orchestrator.cli import dashboard, render
from orchestrator.cli.dashboard import LossHistory, View
from orchestrator.ledger import Event, HostRow
from orchestrator.tick.probe import Probe
from tests.support.wire import status

NOW = 1_800_000_000.0
GPU_NAME = "A100[/]"
LINK = "[link=http://x]click me[/link]"


def _snapshot() -> Snapshot:
    doc: dict[str, Any] = {
        "schema": "gpuq.status/1", "agent": {"alive": True}, "slots": {"kind": "gpu[/]", "total": 1, "free": 1},
        "gpus": [{"index": 0, "name": GPU_NAME, "util_pct": 5, "mem_used_mib": 1, "mem_total_mib": 80, "temp_c": 30}],
        "disk": {"used_pct": 10.0, "inodes_used_pct": 1.0}, "memory": {"used_pct": 5.0}, "jobs": [],
    }
    hosts = [HostRow(name="g1", kind="ssh", root="/r", slots_kind="gpu", slots_total=1, last_probe_at=NOW - 1,
                     created_at=NOW - 10, health="warn", health_detail=f"{LINK} [bold]x", hold_kind="other",
                     hold_detail="[/] held"),
             HostRow(name="g2", kind="ssh", root="/r", last_probe_at=NOW - 1, created_at=NOW - 10)]
    probes = {"g1": Probe("g1", True, status(doc), reachable=True),
              "g2": Probe("g2", False, error=f"protocol error: {LINK} [/]", reachable=True)}
    alerts = [Event(id=1, time=NOW - 5, kind="host", subject="g1[/]", severity="warn", rule="xid",
                    message=f"Xid in {LINK} [red]boom[/]", action=f"{LINK} [/]")]
    return Snapshot(NOW, hosts, probes, [], [], {}, alerts=alerts)


def _console() -> Console:
    return Console(width=200, height=40, file=io.StringIO(), record=True, color_system="truecolor",
                   force_terminal=True, highlight=False, legacy_windows=False)


def test_the_dashboard_shows_host_text_as_text() -> None:
    console = _console()
    layout, _ = dashboard.screen(View(_snapshot(), history=LossHistory(), interval_s=5, updated_at=NOW), NOW, 200, 40)
    console.print(layout)
    text = console.export_text()
    assert GPU_NAME in text
    assert "[link=http://x]click me[/link]" in text  # shown literally, not turned into a hyperlink
    assert "\x1b]8;" not in console.file.getvalue()  # type: ignore[attr-defined]  # no OSC 8 hyperlink
    assert "protocol error" in next(line for line in text.splitlines() if "│ g2 " in line)


def test_the_status_table_shows_host_text_as_text(monkeypatch: pytest.MonkeyPatch) -> None:
    console = _console()
    monkeypatch.setattr(render, "console", lambda *a, **k: console)
    render.status_table(_snapshot())
    text = console.export_text()
    assert "[link=http://x]click me[/link]" in text and "[red]boom[/]" in text and "g1[/]" in text
    assert "protocol error: [link=http://x]" in text  # the host's line names the protocol error
    assert "\x1b]8;" not in console.file.getvalue()  # type: ignore[attr-defined]


def test_a_sweep_whose_line_is_shown_is_not_counted_as_not_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    """`status --state RUNNING` over a finished sweep: no job rows, but its sweep line is printed, so
    "1 finished sweep(s) not listed" would be false (issue 39); a sixth, older sweep is not shown."""
    from orchestrator.ledger import Sweep

    def sweep(i: int) -> Sweep:
        return Sweep(id=f"q{i}", queue_path="q.txt", workdir="/w", queue_text="", job_count=1,
                     created_at=NOW - 100 + i)

    console = _console()
    monkeypatch.setattr(render, "console", lambda *a, **k: console)
    snap = _snapshot()
    render.status_table(Snapshot(NOW, snap.hosts, snap.probes, [sweep(0)], [], {}))
    assert "not listed" not in console.export_text()
    render.status_table(Snapshot(NOW, snap.hosts, snap.probes, [sweep(i) for i in range(6)], [], {}))
    assert "1 finished sweep(s) not listed" in console.export_text()
