"""orchestrator/health/observed.py: what the controller takes from the agent's "progress" and
"run_ckpt_mtime" of a trainer without a heartbeat, and the headline metric of a sweep's run config."""

from __future__ import annotations

import json

from orchestrator.ledger.sweeprun import parse_run
from tests.support.wire import observed


def test_progress_fills_attempt_fields_only_without_a_heartbeat() -> None:
    seen = {"heartbeat": None, "progress": {"step": 12, "total": 100, "epoch": 2, "loss": 0.5, "pct": 12.0}}
    assert observed.attempt_progress(seen) == {"step": 12, "total_steps": 100, "epoch": 2, "loss": 0.5}
    assert observed.attempt_progress(dict(seen, heartbeat={"step": 3})) == {}
    assert observed.attempt_progress({"progress": None}) == {}
    # a regex total that counts epochs (no step) is not a step total; junk is ignored
    assert observed.attempt_progress({"progress": {"epoch": 3, "total": 10, "loss": "nan"}}) == {"epoch": 3}
    assert observed.attempt_progress({"progress": {"step": True, "loss": float("inf")}}) == {}


def test_fraction_line_and_liveness() -> None:
    entry = {"state": "running", "progress": {"pct": 150.0, "line": "x\x1b" + "y" * 200}, "run_ckpt_mtime": 90.0}
    assert observed.progress_fraction(entry) == 1.0
    assert observed.progress_fraction({"progress": {"pct": None}}) is None
    line = observed.last_line(entry)
    assert len(line) == observed.LINE_CHARS and line.endswith("…") and "\x1b" not in line
    assert observed.liveness_ages(entry, 100.0) == [10.0]
    assert observed.liveness_ages({"run_ckpt_mtime": None}, 100.0) == []
    assert observed.elapsed_s(entry, 40.0, now=100.0) == 60.0
    assert observed.elapsed_s(dict(entry, state="exited"), 40.0, now=100.0) is None


def test_headline_reads_the_sweep_run_config_defensively() -> None:
    assert observed.headline(parse_run(json.dumps({"metric": "val_loss", "mode": "min"}))) == ("val_loss", "min")
    assert observed.headline(parse_run(json.dumps({"metric": "f1"}))) == ("f1", "max")
    for junk in ("", "{not json", "[]", json.dumps({"metric": "", "mode": "sideways"}), json.dumps({"metric": 3})):
        assert observed.headline(parse_run(junk)) == ("val_acc", "max")
