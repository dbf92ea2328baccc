"""The status views: the live dashboard's frames rendered into a fixed-size console, the --once table,
and the --json document checked against its published schema (docs/schemas/status.schema.json)."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from rich.console import Console

from orchestrator import api
from orchestrator.api import Snapshot
from orchestrator.cli import dashboard, render, statusjson
from orchestrator.cli.dashboard import LossHistory, View
from orchestrator.core.errors import LedgerError
from orchestrator.core.specs import JobSpec
from orchestrator.ledger import Attempt, Event, HostRow, Job, Sweep
from orchestrator.tick.probe import Probe
from orchestrator.views import eta_seconds, job_views
from tests.support.wire import status

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "docs" / "schemas" / "status.schema.json").read_text())
NOW = 1_800_000_000.0


# --- a snapshot of three hosts: a rented GPU box, an unreachable one, an unhealthy local host -------


def _job(job_id: str, name: str, state: str, host: str | None, *, gpus: int = 1, attempts: int = 1,
         epochs: int = 10) -> Job:
    return Job(id=job_id, sweep_id="qsweep1", name=name, line=1, raw="", config="c.yaml", config_sha256="0" * 64,
               task="classify", epochs=epochs, gpus=gpus, nodes=1, retries=1, spec_hash="h", state=state, host=host,
               attempt_count=attempts, created_at=NOW - 7200, updated_at=NOW - 60)


def _attempt(job_id: str, host: str, *, number: int = 1, step: int | None = None, total: int | None = 1000,
             epoch: int | None = None, loss: float | None = None, started: float | None = NOW - 3600,
             ended: float | None = None, heartbeat: float | None = None, exit_code: int | None = None,
             state: str = "RUNNING") -> Attempt:
    price, share = PRICES.get(host, (None, 1.0))  # as the ledger fixes them when the attempt starts
    return Attempt(job_id=job_id, number=number, host=host, state=state, bundle_sha="b" * 64, created_at=NOW - 3700,
                   started_at=started, ended_at=ended, step=step, total_steps=total, epoch=epoch, loss=loss,
                   heartbeat_at=heartbeat, exit_code=exit_code, price_per_hour=price, gpu_share=share)


PRICES = {"g1": (2.4, 0.5)}  # g1: $2.40/h for its 2 GPUs; the jobs here take 1


def _gpu_doc() -> dict[str, Any]:
    return {
        "schema": "gpuq.status/1", "agent": {"alive": True, "pid": 4242},
        "slots": {"kind": "gpu", "total": 2, "free": 1},
        "gpus": [
            {"index": 0, "name": "NVIDIA A100-SXM4-80GB", "uuid": "GPU-0", "util_pct": 97, "mem_used_mib": 61440,
             "mem_total_mib": 81920, "temp_c": 71},
            {"index": 1, "name": "NVIDIA A100-SXM4-80GB", "uuid": "GPU-1", "util_pct": 0, "mem_used_mib": 3,
             "mem_total_mib": 81920, "temp_c": 34},
        ],
        "disk": {"path": "/data/gpuq", "total_bytes": 10**12, "free_bytes": 4 * 10**10, "used_pct": 96.0,
                 "inodes_total": 1000, "inodes_free": 880, "inodes_used_pct": 12.0},
        "memory": {"source": "cgroup2", "used_bytes": 64, "limit_bytes": 100, "used_pct": 64.0, "oom_kill": 0},
        "jobs": [{"job_id": "crunning00001", "name": "baseline", "attempt": 2, "state": "running", "slots": [0],
                  "heartbeat": {"step": 600, "total_steps": 1000, "epoch": 6, "epochs": 10, "loss": 0.4,
                                "steps_per_s": 2.0}},
                 {"job_id": "cqueued000001", "state": "queued", "slots": None, "heartbeat": None}],
    }


def _snapshot(n_extra_jobs: int = 0) -> Snapshot:
    hosts = [
        HostRow(name="g1", kind="ssh", root="/data/gpuq", slots_kind="gpu", slots_total=2, price_per_hour=2.4,
                last_probe_at=NOW - 2, created_at=NOW - 86400),
        HostRow(name="g2", kind="ssh", root="/data/gpuq", slots_total=8, unreachable_since=NOW - 600,
                probe_failures=3, next_probe_at=NOW + 120, last_probe_at=NOW - 900, created_at=NOW - 86400),
        HostRow(name="local", kind="local", root="/home/u/.gpuq/local", slots_kind="cpu", slots_total=2,
                health="fail", health_detail="xid 79 on\nGPU 0", hold_kind="unhealthy", hold_detail="xid 79",
                last_probe_at=NOW - 1, created_at=NOW - 86400),
    ]
    probes = {
        "g1": Probe("g1", True, status(_gpu_doc()), duration_s=0.8, reachable=True),
        "g2": Probe("g2", False, error="ssh: connect to g2 port 22:\nConnection refused", duration_s=0.1),
        "local": Probe("local", True, status({"slots": {"kind": "cpu", "total": 2, "free": 2}, "gpus": [],
                                              "disk": {"used_pct": 40.0, "inodes_used_pct": 5.0},
                                              "memory": {"used_pct": 10.0}, "agent": {"alive": True}, "jobs": []}),
                       duration_s=0.1, reachable=True),
    }
    jobs = [
        _job("crunning00001", "baseline", "RUNNING", "g1", attempts=2),
        _job("cqueued000001", "wider", "ASSIGNED", "g1", attempts=1),
        _job("cdone00000001", "deeper", "SUCCEEDED", "g1", attempts=1),
        _job("cfailed000001", "broken", "FAILED", "local", attempts=1),
    ] + [_job(f"cextra{i:07d}", f"extra{i}", "QUEUED", None, attempts=0) for i in range(n_extra_jobs)]
    attempts = {
        "crunning00001": _attempt("crunning00001", "g1", number=2, step=600, epoch=6, loss=0.4012,
                                  heartbeat=NOW - 4),
        "cqueued000001": _attempt("cqueued000001", "g1", started=None, total=None, state="STARTING"),
        "cdone00000001": _attempt("cdone00000001", "g1", step=1000, epoch=10, loss=0.05, started=NOW - 7200,
                                  ended=NOW - 5400, heartbeat=NOW - 5400, exit_code=0, state="EXITED"),
        "cfailed000001": _attempt("cfailed000001", "local", step=3, epoch=0, loss=None, heartbeat=NOW - 50,
                                  exit_code=4, state="EXITED"),
    }
    alerts = [
        Event(id=3, time=NOW - 30, kind="job", subject="crunning00001", severity="escalate", rule="stalled",
              message="no heartbeat, log or checkpoint for 16 min at step 600",
              action="look at `gpuq logs crunning00001`; nothing is killed automatically"),
        Event(id=2, time=NOW - 90, kind="host", subject="g1", severity="escalate", rule="disk",
              message="disk 96% used on /data/gpuq", action="host held; prune old checkpoints"),
        Event(id=1, time=NOW - 300, kind="host", subject="g2", severity="warn", rule="unreachable",
              message="unreachable since 12:00Z", action=""),
    ]
    sweeps = [Sweep(id="qsweep1", queue_path="q.txt", workdir="/w", queue_text="", job_count=len(jobs),
                    created_at=NOW - 7200)]
    return Snapshot(NOW, hosts, probes, sweeps, jobs, attempts, counts={"qsweep1": {"RUNNING": 1}}, alerts=alerts)


def _render(renderable: Any, width: int = 160, height: int = 48) -> str:
    console = Console(width=width, height=height, file=io.StringIO(), record=True, color_system=None,
                      highlight=False, legacy_windows=False)
    console.print(renderable)
    return console.export_text()


def _frame(view: View, width: int = 160, height: int = 48) -> tuple[str, int]:
    layout, rows = dashboard.screen(view, NOW, width, height)
    return _render(layout, width, height), rows


# --- small pure pieces --------------------------------------------------------------------------------


def test_sparkline_shapes() -> None:
    assert dashboard.sparkline([]) == ""
    assert dashboard.sparkline([1.0, 1.0, 1.0]) == "▄▄▄"
    falling = dashboard.sparkline([2.0, 1.0, 0.5, 0.25, 0.125])
    assert falling[0] == "█" and falling[-1] == "▁" and list(falling) == sorted(falling, reverse=True)
    rising = dashboard.sparkline([-3.0, -1.0, 0.0, 2.0])  # not all positive: a linear scale
    assert rising[0] == "▁" and rising[-1] == "█"
    assert dashboard.sparkline([1.0, math.nan, math.inf, 2.0]) == "▁█"
    assert len(dashboard.sparkline([float(i + 1) for i in range(100)], width=16)) == 16


def test_bars() -> None:
    assert dashboard.bar(0.0, 10).plain == "░" * 10
    assert dashboard.bar(0.5, 10).plain == "█" * 5 + "░" * 5
    assert dashboard.bar(1.7, 10).plain == "█" * 10
    assert dashboard.bar(None, 4).plain == "····"


def test_keys_from_a_cbreak_terminal() -> None:
    assert dashboard.parse_keys(b"\x1b[A\x1b[B\x1bOA\x1bOB") == ["up", "down", "up", "down"]
    assert dashboard.parse_keys(b"jk\x1b[5~\x1b[6~ b") == ["down", "up", "pgup", "pgdn", "pgdn", "pgup"]
    assert dashboard.parse_keys(b"\x1b[H\x1b[F\x1b[1~\x1b[4~gG") == ["home", "end", "home", "end", "home", "end"]
    assert dashboard.parse_keys(b"\x1b[1;5C\x1b[3~xq") == ["quit"]  # unknown sequences and keys are skipped
    assert dashboard.parse_keys(b"r") == ["refresh"]


def test_scroll_clamps_to_the_jobs_there_are() -> None:
    assert dashboard.scroll(0, "up", rows=10, total=30) == 0
    assert dashboard.scroll(0, "down", rows=10, total=30) == 1
    assert dashboard.scroll(5, "pgdn", rows=10, total=30) == 15
    assert dashboard.scroll(15, "pgdn", rows=10, total=30) == 20
    assert dashboard.scroll(20, "end", rows=10, total=30) == 20
    assert dashboard.scroll(20, "home", rows=10, total=30) == 0
    assert dashboard.scroll(0, "down", rows=10, total=4) == 0  # everything fits: nothing to scroll


def test_loss_history_keeps_distinct_points_of_listed_jobs() -> None:
    history = LossHistory(limit=3)
    snap = _snapshot()
    for step, loss in ((600, 0.4), (600, 0.4), (610, 0.35), (620, 0.3), (630, 0.2)):
        att = snap.attempts["crunning00001"]
        att.step, att.loss = step, loss
        history.add(snap)
    assert history.losses("crunning00001") == [0.35, 0.3, 0.2]
    assert history.losses("cqueued000001") == []  # no step yet
    snap.attempts.pop("crunning00001")
    history.add(snap)
    assert history.losses("crunning00001") == []  # a job no longer listed is forgotten


# --- the view model ------------------------------------------------------------------------------------


def test_job_views_derive_slots_eta_heartbeat_and_cost() -> None:
    views = {v.job.name: v for v in job_views(_snapshot())}
    running = views["baseline"]
    assert running.where == "g1:0" and running.host_gpus == [0]
    assert running.eta_s == pytest.approx(200.0)  # 400 steps left at 2 steps/s (the trainer's rate)
    assert running.heartbeat_age_s == pytest.approx(4.0)
    assert running.cost == pytest.approx(1.2)  # 1 h x $2.40/h x 1 of 2 GPUs
    assert running.fraction == pytest.approx(0.6)
    assert views["wider"].where == "g1" and views["wider"].eta_s is None and views["wider"].fraction is None
    done = views["deeper"]
    assert done.fraction == 1.0 and done.heartbeat_age_s is None and done.cost == pytest.approx(0.6)
    assert views["broken"].cost is None  # the local host has no price


def test_cost_is_the_price_each_attempt_fixed_when_it_started() -> None:
    """The one cost policy (orchestrator/money/cost.py): a host's price that changes later changes nothing."""
    snap = _snapshot()
    snap.hosts[0].price_per_hour = 100.0  # g1's price rises after the attempts started
    shown = {v.job.name: v for v in job_views(snap)}
    assert shown["baseline"].cost == pytest.approx(1.2) and shown["deeper"].cost == pytest.approx(0.6)
    first = _attempt("crunning00001", "g1", started=NOW - 7200, ended=NOW - 3600, state="LOST")
    first.price_per_hour, first.gpu_share = 4.0, 1.0  # attempt 1 ran whole on a $4/h machine
    snap.attempt_history = {"crunning00001": [first, snap.attempts["crunning00001"]]}
    baseline = next(v for v in job_views(snap) if v.job.name == "baseline")
    assert baseline.cost == pytest.approx(4.0 + 1.2)  # every attempt adds up


def test_eta_falls_back_to_the_mean_rate_of_a_fresh_attempt() -> None:
    att = _attempt("cj", "g1", step=100, total=400, started=NOW - 100, heartbeat=NOW)
    assert eta_seconds(att, None) == pytest.approx(300.0)
    att.resume_from = "ckpt/step_50.pt"  # a resumed attempt did not start at step 0: no mean rate
    assert eta_seconds(att, None) is None
    assert eta_seconds(att, 0.0) is None


# --- what a person sees --------------------------------------------------------------------------------


def test_the_frame_shows_hosts_jobs_and_alerts() -> None:
    snap = _snapshot()
    history = LossHistory()
    for step, loss in ((560, 0.9), (580, 0.6), (600, 0.4012)):
        snap.attempts["crunning00001"].step, snap.attempts["crunning00001"].loss = step, loss
        history.add(snap)
    view = View(snap, history=history, interval_s=5, updated_at=NOW - 3)
    text, _ = _frame(view)
    lines = text.splitlines()
    assert len(lines) == 48 and all(len(line) <= 160 for line in lines)
    for title in ("hosts", "jobs", "alerts"):
        assert any(line.startswith(f"╭─ {title}") for line in lines), title
    # hosts: GPU rows with bars, the job on each GPU, disk pressure, flags a person must not miss
    g1 = next(line for line in lines if "│ g1 " in line)
    assert "ok" in g1 and "1/2 gpu free" in g1 and "96%" in g1 and "0 A100-SXM4-80GB" in g1
    assert "97%" in g1 and "60.0/80.0G" in g1 and "71°C" in g1 and "baseline" in g1
    assert "█" in g1 and "░" in g1
    gpu1 = lines[lines.index(g1) + 1]
    assert "1 A100-SXM4-80GB" in gpu1 and "34°C" in gpu1 and "idle" in gpu1
    local = next(line for line in lines if "│ local " in line)
    assert "UNHEALTHY HELD" in local and "2/2 cpu free" in local and "40%" in local
    assert "unreachable since 07:50:00Z (3 failures, next try 08:02:00Z): ssh: connect to g2 port 22: Connection" \
        in text
    assert "UNHEALTHY: xid 79 on GPU 0" in text and "HELD: unhealthy: xid 79" in text
    assert "15m stale" in text  # g2's last good probe is 15 min old: never shown as fresh
    # jobs: state, host:gpu, progress bar, ETA, loss with sparkline, heartbeat age, attempt, cost
    row = next(line for line in lines if "crunning00001" in line)
    assert "baseline" in row and "RUNNING" in row and "g1:0" in row
    assert "█" * 8 + "░" * 6 in row and "60%" in row and "ep 6/10" in row
    assert "3m" in row and "0.4012" in row and "█▄▁" in row and "4s" in row and "$1.20" in row
    done = next(line for line in lines if "cdone00000001" in line)
    assert "SUCCEEDED" in done and "█" * 14 in done and "100%" in done and "$0.60" in done
    failed = next(line for line in lines if "cfailed000001" in line)
    assert "FAILED" in failed and failed.rstrip("│ ").endswith("-")  # no price on the local host: no cost
    # alerts, newest first, with what to do
    stalled = next(line for line in lines if "stalled" in line)
    assert "ESCALATE" in stalled and "crunning00001" in stalled and "→ look at `gpuq logs" in stalled
    assert lines.index(stalled) < next(i for i, line in enumerate(lines) if "unreachable since 12:00Z" in line)
    assert "updated 3s ago" in lines[-1] and "every 5s" in lines[-1] and "q quit" in lines[-1]


def test_the_footer_says_when_a_probe_is_in_flight_or_failed() -> None:
    text, _ = _frame(View(_snapshot(), ticking=True, error="ledger busy"))
    assert "not probed yet" in text and "probing…" in text and "last tick failed: ledger busy" in text


def test_the_jobs_table_scrolls() -> None:
    snap = _snapshot(n_extra_jobs=60)
    text, rows = _frame(View(snap), height=40)
    assert 5 < rows < 40 and f"jobs 1-{rows} of 64" in text and "↑↓ PgUp PgDn scroll" in text
    assert "│ crunning00001 " in text and f"extra{rows - 5}" in text and f"extra{rows - 4} " not in text
    offset = dashboard.scroll(0, "pgdn", rows=rows, total=64)
    text, _ = _frame(View(snap, offset=offset), height=40)
    assert f"jobs {rows + 1}-{2 * rows} of 64" in text and "│ crunning00001 " not in text
    text, _ = _frame(View(snap, offset=1000), height=40)  # past the end: the last page
    assert f"jobs {64 - rows + 1}-64 of 64" in text and "extra59" in text


def test_hosts_that_do_not_fit_are_said_to_be_cut() -> None:
    text, rows = _frame(View(_snapshot()), height=20)
    assert "hosts (3 lines cut: a taller terminal, or `gpuq status --once`, shows them)" in text
    assert rows >= 1 and "│ crunning00001 " in text


def test_a_failed_tick_keeps_the_last_snapshot_and_says_why() -> None:
    calls: list[int] = []

    def fetch() -> Snapshot:
        calls.append(1)
        ticker.stop()  # one tick only: the loop runs here, in the test's thread
        raise LedgerError("ledger.db: database is locked\n(details)")

    ticker = dashboard.Ticker(fetch, interval_s=5.0)
    ticker.thread.run()
    seq, snap, updated_at, ticking, error = ticker.state()
    assert calls == [1] and seq == 1 and snap is None and updated_at is None and not ticking
    assert error == "ledger.db: database is locked" and ticker.fatal is None


def test_a_bug_in_a_tick_is_handed_to_the_main_thread() -> None:
    def fetch() -> Snapshot:
        raise KeyError("bug")

    ticker = dashboard.Ticker(fetch, interval_s=5.0)
    ticker.thread.run()
    assert isinstance(ticker.fatal, KeyError) and not ticker.ticking


def test_an_empty_ledger_says_what_to_do() -> None:
    snap = Snapshot(NOW, [], {}, [], [], {})
    text, _ = _frame(View(snap))
    assert "no hosts yet" in text and "no jobs to show" in text and "no alerts" in text


def test_a_fresh_home_says_what_fills_the_once_table(gpuq_home: Path) -> None:
    from tests.conftest import run_gpuq

    for args in (("status",), ("status", "--no-probe")):  # the ledger's read path, and the Context's
        done = run_gpuq(*args)
        assert done.returncode == 0, done.stderr
        assert "no hosts yet: this machine (`local`) takes the first `gpuq submit`" in done.stdout, done.stdout
        assert "no sweeps yet; `gpuq submit QUEUE`" in done.stdout, done.stdout


def test_once_table_has_the_new_columns(capsys: pytest.CaptureFixture[str]) -> None:
    render.status_table(_snapshot())
    out = capsys.readouterr().out
    for needle in ("host:gpu", "g1:0", "eta", "cost", "$1.20", "$2.40/h", "UNHEALTHY: xid 79 on GPU 0",
                   "HELD: unhealthy", "unreachable since", "alerts (newest first)", "stalled", "escalate",
                   "prune old checkpoints", "ep 6/10 step 600/1000 (60%)", "sweep qsweep1"):
        assert needle in out, needle


# --- the --json document and its schema ---------------------------------------------------------------


def _validator() -> jsonschema.Draft202012Validator:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    return jsonschema.Draft202012Validator(SCHEMA)


def test_json_document_matches_the_schema() -> None:
    doc = json.loads(json.dumps(statusjson.status_doc(_snapshot())))
    _validator().validate(doc)
    jobs = {j["name"]: j for j in doc["jobs"]}
    assert jobs["baseline"]["host_gpus"] == [0] and jobs["baseline"]["eta_s"] == pytest.approx(200.0)
    assert jobs["baseline"]["cost"] == pytest.approx(1.2) and jobs["baseline"]["attempt"] == 2
    assert jobs["broken"]["cost"] is None and jobs["wider"]["host_gpus"] == []
    hosts = {h["name"]: h for h in doc["hosts"]}
    assert hosts["local"]["health"] == "fail" and hosts["local"]["hold_reason"] == "unhealthy: xid 79"
    assert hosts["g1"]["price_per_hour"] == 2.4 and hosts["g2"]["reachable"] is False
    assert [a["rule"] for a in doc["alerts"]] == ["stalled", "disk", "unreachable"]
    assert doc["alerts"][0]["action"].startswith("look at")


def test_json_from_a_real_ledger_matches_the_schema(gpuq_home: Path) -> None:
    ctx = api.open_context()
    try:
        ctx.ledger.ensure_host("local", kind="local", root=str(gpuq_home / "local"))
        rows = ctx.ledger.add_sweep(sweep_id="qreal01", queue_path="q.txt", workdir="/w", queue_text="...",
                                    jobs=[JobSpec(name="a", config="c.yaml", task="classify", config_sha256="0" * 64,
                                                  line=1)], default_retries=1)
        ctx.ledger.record_finding("job", rows[0].id, severity="warn", rule="early_finish",
                                  message="finished in 20% of the expected time", action="rerun it")
        snap = api.status(ctx, probe=False)
    finally:
        ctx.close()
    snap.probes["local"] = Probe("local", True, status(_gpu_doc()), duration_s=0.2, reachable=True)
    doc = json.loads(json.dumps(statusjson.status_doc(snap)))
    _validator().validate(doc)
    assert doc["jobs"][0]["state"] == "QUEUED" and doc["alerts"][0]["rule"] == "early_finish"


@pytest.mark.parametrize("breakage", [
    lambda d: d.pop("alerts"),
    lambda d: d.update(schema="gpuq.cli.status/2"),
    lambda d: d["jobs"][0].update(state="DONE"),
    lambda d: d["jobs"][0].update(host_gpus="g1:0"),
    lambda d: d["jobs"][0].pop("eta_s"),
    lambda d: d["jobs"][0].update(cost=-1.0),
    lambda d: d["hosts"][0].update(health="sick"),
    lambda d: d["hosts"][0].update(surprise=True),
    lambda d: d["alerts"][0].update(severity="fatal"),
])
def test_schema_rejects_a_wrong_document(breakage: Any) -> None:
    doc = json.loads(json.dumps(statusjson.status_doc(_snapshot())))
    breakage(doc)
    assert list(_validator().iter_errors(doc)), "the schema accepted a wrong document"


def test_columns_are_as_wide_as_their_content_on_a_wide_terminal() -> None:
    text, _ = _frame(View(_snapshot()), width=200)
    row = next(line for line in text.splitlines() if "│ crunning00001 " in line)
    name_at = row.index("baseline")
    state_at = row.index("RUNNING")
    # the name column is as wide as the longest name shown, not most of the 200 columns
    assert state_at - name_at <= 12, row
    assert "ep " in row and "%" in row  # progress keeps its bar and percentage


# --- a project's own trainer: no heartbeat, what its log says -----------------------------------------


def _project_snapshot(progress: dict[str, Any]) -> Snapshot:
    snap = _snapshot()
    doc = _gpu_doc()
    doc["jobs"][0].update(heartbeat=None, progress=progress)
    snap.probes["g1"] = Probe("g1", True, status(doc), duration_s=0.8, reachable=True)
    snap.attempts["crunning00001"] = _attempt("crunning00001", "g1", number=2, total=None, started=NOW - 125)
    return snap


def test_a_trainer_without_heartbeat_shows_elapsed_time_and_its_escaped_last_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    snap = _project_snapshot({"line": "[bold]Epoch 3[/bold] | loss 0.2", "pct": None, "source": "pattern"})
    view = next(v for v in job_views(snap) if v.job.name == "baseline")
    assert view.fraction is None and view.note == "2m [bold]Epoch 3[/bold] | loss 0.2"
    render.status_table(snap)
    out = capsys.readouterr().out
    assert "[bold]Epoch 3[/bold] | loss 0.2" in out  # shown literally: a log line is never rich markup
    frame, _ = _frame(View(snap))
    assert "[bold]Epoch 3[/bold]" in frame


def test_a_trainer_without_heartbeat_shows_the_percentage_its_log_gives(capsys: pytest.CaptureFixture[str]) -> None:
    snap = _project_snapshot({"step": 12, "total": 100, "pct": 12.0, "line": "12/100 [00:01<00:09]",
                              "source": "tqdm"})
    view = next(v for v in job_views(snap) if v.job.name == "baseline")
    assert view.fraction == pytest.approx(0.12)
    render.status_table(snap)
    assert "12% 2m 12/100" in capsys.readouterr().out


def test_key_c_switches_to_the_per_cell_view(gpuq_home: Path, tmp_path: Path) -> None:
    from orchestrator import api
    from tests.unit.test_report_build import QUEUE, VALUES, _sweep

    assert dashboard.parse_keys(b"c") == ["cells"]
    ctx = api.open_context()
    _sweep(ctx, tmp_path, "qcells1", QUEUE, {k: v for k, v in VALUES.items() if k != "wide-seed2"},
           running=("wide-seed2",))
    snap = api.status(ctx, probe=False)
    view = View(snap, show_cells=True)
    text, _ = _frame(view, width=200)
    assert "computing the cells" in text  # toggled before the next tick built them
    dashboard.with_cells(ctx, snap)
    text, _ = _frame(view, width=200)
    assert "cells · val_acc (higher is better) · 10/12 jobs finished" in text
    words = [line.strip("│ ").split() for line in text.splitlines()]
    lines = {w[0]: " ".join(w) for w in words if w and w[0] in ("baseline", "wide", "lr_high", "no_aug", "flat")}
    assert "3/4" in lines["baseline"] and "0.82 ± 0.05" in lines["baseline"]
    # wide so far: two seeds 0.90, 0.92 vs the baseline's three
    assert "2/3" in lines["wide"] and "0.91 ± 0.13" in lines["wide"] and "better" in lines["wide"]
    assert "worse" in lines["lr_high"] and "diverged" in lines["lr_high"]
    assert "n too small" in lines["no_aug"]
    view.show_cells = False
    assert "cells ·" not in _frame(view, width=200)[0]


# --- narrow terminals: columns drop by priority, names are never cut before ids ---------------------


def _three_sweeps() -> Snapshot:
    """`gpuq status --all` over three sweeps of the same queue: each has baseline-seed0 and baseline-seed1."""
    snap = _snapshot()
    snap.jobs = [_job(f"{s}{k}a2b3c4d5e6"[:12], f"baseline-seed{k}", "RUNNING" if s == "f" else "SUCCEEDED",
                      "g1", attempts=1) for s in "abf" for k in (0, 1)]
    for job, sweep in zip(snap.jobs, ["qsweepaa"] * 2 + ["qsweepbb"] * 2 + ["qsweepff"] * 2, strict=True):
        job.sweep_id = sweep
    snap.attempts = {j.id: _attempt(j.id, "g1", step=600, epoch=6, loss=0.4012, heartbeat=NOW - 4)
                     for j in snap.jobs}
    return snap


@pytest.mark.parametrize(("width", "height"), [(80, 24), (120, 40)])
def test_at_80_and_120_columns_names_and_sweeps_stay_whole_and_the_footer_fits(width: int, height: int) -> None:
    text, _ = _frame(View(_three_sweeps(), interval_s=5, updated_at=NOW - 3), width, height)
    lines = text.splitlines()
    assert len(lines) == height and all(len(line) <= width for line in lines)
    rows = [line for line in lines if "baseline-seed" in line and "│" in line and "idle" not in line
            and "A100" not in line]
    assert len(rows) == 6, lines
    for row in rows:  # every name whole, with the sweep it belongs to
        assert "baseline-seed0 " in row or "baseline-seed1 " in row, row
        assert any(f"qsweep{s}" in row for s in ("aa", "bb", "ff")), row
        assert "RUNNING" in row or "SUCCEEDED" in row, row
        assert "…" not in row, row  # nothing in a job's row is cut mid-word: columns went whole
    # the footer: the left part whole, the key hint beside it, no overlap
    assert lines[-1].startswith("gpuq status · updated 3s ago · every 5s  "), lines[-1]
    assert lines[-1].rstrip().endswith(("c cells", "c cells/jobs")), lines[-1]
    # the host's name is never what a narrow terminal gives up
    assert any(line.startswith("│ g1 ") for line in lines) and any(line.startswith("│ local ") for line in lines)
    if width >= 120:  # room for the id (at least its first 8 characters: still a job reference) and where it runs
        assert all(r.split("│")[1].split()[0][:8] in {j.id[:8] for j in _three_sweeps().jobs} for r in rows)
        assert all("g1:" in r or " g1 " in r for r in rows)


def test_a_name_is_never_cut_while_its_id_is_shown() -> None:
    from orchestrator.cli.jobstable import plan

    snap = _three_sweeps()
    snap.jobs[0].name = "a-rather-long-name-for-a-job-lr0.003-wd0.1-seed0"
    views = job_views(snap, NOW)
    for width in range(30, 220, 7):
        chosen = plan(views, LossHistory().losses, width)
        assert chosen.width() <= width or width < 40, width
        name = chosen.columns["name"]
        if "job" in chosen.columns:
            assert name.width == min(len(snap.jobs[0].name), 48), width
        assert "state" in chosen.columns  # the state is never dropped
        assert "sweep" in chosen.columns, width  # three sweeps on screen: each job's sweep is named
    single = [v for v in views if v.job.sweep_id == "qsweepaa"]
    assert "sweep" not in plan(single, LossHistory().losses, 200).columns  # one sweep: nothing to tell apart


def test_submit_wait_prints_a_line_per_state_change_and_one_summary() -> None:
    from orchestrator.cli.statelines import StateLines, summary

    said: list[str] = []
    lines = StateLines(said.append)
    jobs = [_job("c1a2b3c4d5e6", "baseline-seed0", "ASSIGNED", "local"), _job("c9f8e7d6c5b4", "wide", "QUEUED", None)]
    lines(Snapshot(NOW, [], {}, [], jobs, {}))
    lines(Snapshot(NOW, [], {}, [], jobs, {}))  # nothing changed: nothing said
    jobs[0].state, jobs[1].state, jobs[1].host = "RUNNING", "ASSIGNED", "g1"
    lines(Snapshot(NOW, [], {}, [], jobs, {}))
    jobs[0].state = "SUCCEEDED"
    lines(Snapshot(NOW, [], {}, [], jobs, {}))
    assert [line.split(" ", 1)[1] for line in said] == [
        "baseline-seed0 (c1a2b3c4) ASSIGNED on local", "wide (c9f8e7d6) QUEUED",
        "baseline-seed0 (c1a2b3c4) RUNNING on local", "wide (c9f8e7d6) ASSIGNED on g1",
        "baseline-seed0 (c1a2b3c4) SUCCEEDED on local"]
    assert all(line[:9].endswith("Z") for line in said)  # each with its time
    jobs[1].state = "FAILED"
    assert summary(Snapshot(NOW, [], {}, [], jobs, {}), "qsweep1") == (
        "sweep qsweep1 ended: 1 FAILED, 1 SUCCEEDED; `gpuq results --sweep qsweep1` shows the numbers, "
        "`gpuq status --sweep qsweep1` the table")
