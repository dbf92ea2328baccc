"""ETA a newcomer can trust (issue 39): never ``0s`` at 75 % (a step rate measured between two
heartbeats milliseconds apart, at a phase change) nor a number before the first step is done."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from orchestrator.ledger import Attempt
from orchestrator.views import eta_seconds
from orchestrator.views.text import duration

_SPEC = importlib.util.spec_from_file_location(
    "gpuq_payload_heartbeat", Path(__file__).resolve().parents[2] / "payload" / "gpuq_payload" / "heartbeat.py")
assert _SPEC is not None and _SPEC.loader is not None
HB = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(HB)  # stdlib only: no torch import

NOW = 1_800_000_000.0


def _attempt(step: int) -> Attempt:
    return Attempt(job_id="cj", number=1, host="local", state="RUNNING", bundle_sha="b" * 64, created_at=NOW - 70,
                   started_at=NOW - 60, step=step, total_steps=400, heartbeat_at=NOW)


def test_no_eta_before_the_first_step() -> None:
    assert eta_seconds(_attempt(0), 66.0) is None  # a rate before any step measured the startup
    assert duration(eta_seconds(_attempt(0), None)) == "-"
    assert eta_seconds(_attempt(100), None) == pytest.approx(180.0)  # 100 steps in 60 s, 300 to go


def _beats(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, beats: list[tuple[float, int, str, bool]]) -> float:
    clock = {"t": 0.0}
    monkeypatch.setattr(HB.time, "monotonic", lambda: clock["t"])
    hb = HB.Heartbeat(str(tmp_path / "heartbeat.json"), interval_s=1.0, enabled=True)
    for t, step, phase, force in beats:
        clock["t"] = t
        hb.beat(step=step, total_steps=400, epoch=1, epochs=4, loss=0.5, lr=0.1, phase=phase, force=force)
    return float(json.loads((tmp_path / "heartbeat.json").read_text())["steps_per_s"])


def test_a_forced_beat_right_after_another_measures_no_burst_rate(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    # 10 steps/s, an eval of 20 s at step 300 (75 %), then one step and a forced beat 5 ms later
    rate = _beats(monkeypatch, tmp_path, [(0.0, 0, "train", True), (10.0, 100, "train", False),
                                          (30.0, 300, "eval", False), (50.0, 300, "train", True),
                                          (50.1, 301, "train", False), (50.105, 302, "ckpt", True)])
    assert rate == pytest.approx(2 / 20.105, rel=1e-2)  # the eval counts: 2 steps over the 20.1 s window
    eta = 98 / rate
    assert duration(eta) not in ("0s", "1s")
