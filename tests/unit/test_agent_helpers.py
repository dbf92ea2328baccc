"""The wrapper's helpers (payload/agent/gpuq_attempt/gpuq_helpers.py): the provenance probe and the memory
sampler start once the trainer is up (its first heartbeat), never beside its start-up, and still leave
their whole records: provenance.json and mem.tsv's first row, a trainer that ended before them too.

The trainers are real processes (``python -c``), the probe runs this interpreter; no torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.agentmodule import load_agent_module

helpers_mod = load_agent_module("gpuq_attempt.gpuq_helpers")
P = load_agent_module("gpuq_base.gpuq_protocol")
memwatch = load_agent_module("gpuq_attempt.gpuq_memwatch")


def start(adir: Path, code: str) -> tuple[subprocess.Popen[bytes], Any, threading.Event]:
    trainer = subprocess.Popen([sys.executable, "-c", code], cwd=adir)
    done = threading.Event()
    launch = {"kind": "cpu", "slots": []}
    helpers = helpers_mod.Helpers(str(adir), sys.executable, dict(os.environ), launch, False, trainer.pid,
                                  done).start()
    return trainer, helpers, done


def records_complete(adir: Path) -> None:
    doc = json.loads((adir / P.PROVENANCE_FILE).read_text())
    assert doc["schema"] == "gpuq.provenance/1" and doc["slot_kind"] == "cpu"
    assert doc["python"] == sys.version.split()[0], doc
    rows = (adir / P.MEM_FILE).read_text().splitlines()
    assert rows[0].split("\t") == list(memwatch.COLUMNS) and len(rows) >= 2, rows
    assert len(rows[1].split("\t")) == len(memwatch.COLUMNS)


def test_the_helpers_wait_for_the_first_heartbeat_and_record_everything(tmp_path: Path) -> None:
    beat = tmp_path / P.HEARTBEAT_FILE
    code = f"import time; time.sleep(0.8); open({str(beat)!r}, 'w').write('{{}}'); time.sleep(0.6)"
    trainer, helpers, done = start(tmp_path, code)
    time.sleep(0.4)  # the trainer is starting: nothing of the helpers yet
    assert not (tmp_path / P.PROVENANCE_FILE).exists() and not (tmp_path / P.MEM_FILE).exists()
    assert trainer.wait(timeout=20) == 0
    helpers.finish()
    done.set()
    assert helpers.up_at is not None and helpers.up_at >= beat.stat().st_mtime - 0.01
    assert helpers.up_at - helpers.started < helpers_mod.HELPERS_AFTER_S  # the heartbeat, not the fallback
    records_complete(tmp_path)


def test_a_trainer_that_ends_before_them_still_gets_both_records_at_once(tmp_path: Path) -> None:
    trainer, helpers, done = start(tmp_path, "pass")
    assert trainer.wait(timeout=20) == 0
    t0 = time.time()
    helpers.finish()
    done.set()
    assert helpers.up_at is not None and helpers.up_at - t0 < 0.5  # on the end, not HELPERS_AFTER_S later
    records_complete(tmp_path)


def test_without_a_heartbeat_they_start_after_the_fallback_delay(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(helpers_mod, "HELPERS_AFTER_S", 0.5)
    trainer, helpers, done = start(tmp_path, "import time; time.sleep(1.5)")
    time.sleep(1.2)
    assert helpers.up_at is not None and 0.45 <= helpers.up_at - helpers.started < 1.2
    assert trainer.poll() is None  # they started while the trainer still ran
    assert trainer.wait(timeout=20) == 0
    helpers.finish()
    done.set()
    records_complete(tmp_path)
