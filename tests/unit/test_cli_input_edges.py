"""Hostile or odd CLI input is one clear line, exit 2, and nothing changes (issue 23 item 15): a symlink
loop or an unreadable directory in the project, a non-UTF-8 gpuq.toml, a queue that is a FIFO, a device
or huge, `%`/`_` in a sweep reference, outputs/checkpoint globs leaving the run directory, and settings
out of bounds."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from orchestrator.core import exitcodes
from orchestrator.core.errors import JobNotFound
from orchestrator.core.specs import JobSpec
from orchestrator.ledger import Ledger
from orchestrator.queue.queuefile import MAX_QUEUE_BYTES
from tests.conftest import run_gpuq
from tests.support.ownproject import copy_example


def _refused(out: subprocess.CompletedProcess[str], *words: str) -> None:
    assert out.returncode == exitcodes.USAGE, (out.returncode, out.stdout, out.stderr)
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) >= 1, out.stderr
    for word in words:
        assert word in out.stderr, out.stderr


def _nothing_recorded() -> None:
    doc = run_gpuq("status", "--json")
    assert doc.returncode == 0 and json.loads(doc.stdout)["jobs"] == [], doc.stdout + doc.stderr


@pytest.fixture
def queue(gpuq_home: Path, tmp_path: Path) -> Path:
    return copy_example("ddp_snapshot", tmp_path, queue="name=a gpus=1 -- 2 1\n")


def test_a_symlink_loop_in_the_project(queue: Path) -> None:
    os.symlink("loop-b", queue.parent / "loop-a")
    os.symlink("loop-a", queue.parent / "loop-b")
    _refused(run_gpuq("submit", str(queue), "--dry-run"), "symlink loop", "loop-")
    _refused(run_gpuq("submit", str(queue), "--host", "local"), "symlink loop")
    _nothing_recorded()


@pytest.mark.skipif(shutil.which("setpriv") is None or os.geteuid() != 0, reason="needs root and setpriv")
def test_a_directory_of_the_project_that_cannot_be_read(queue: Path, tmp_path: Path) -> None:
    """Root ignores permissions: setpriv drops CAP_DAC_OVERRIDE/READ_SEARCH so they apply again."""
    import sys

    locked = queue.parent / "locked"
    (locked / "sub").mkdir(parents=True)
    locked.chmod(0)
    try:
        def gpuq(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--",
                                   sys.executable, "-m", "orchestrator", *args], capture_output=True, text=True,
                                  timeout=120, env=dict(os.environ), check=False)

        _refused(gpuq("submit", str(queue), "--dry-run"), "locked", "cannot read this directory")
        toml = queue.parent / "gpuq.toml"
        toml.write_text(toml.read_text().replace("[run]\n", '[run]\nproject = "locked/sub"\n'))
        _refused(gpuq("submit", str(queue), "--dry-run"), "locked/sub", "permission denied")
    finally:
        locked.chmod(0o755)
    _nothing_recorded()


def test_a_gpuq_toml_that_is_not_utf8(queue: Path) -> None:
    toml = queue.parent / "gpuq.toml"
    toml.write_bytes(b"# caf\xe9\n" + toml.read_bytes())
    _refused(run_gpuq("submit", str(queue), "--dry-run"), "gpuq.toml", "UTF-8")
    _nothing_recorded()


def test_a_queue_that_is_a_fifo_a_device_or_huge(queue: Path) -> None:
    fifo = queue.parent / "fifo.txt"
    os.mkfifo(fifo)
    _refused(run_gpuq("submit", str(fifo), "--dry-run", timeout=60), "FIFO")
    _refused(run_gpuq("submit", "/dev/zero", "--dry-run", timeout=60), "device")
    huge = queue.parent / "huge.txt"
    with huge.open("wb") as handle:
        handle.truncate(MAX_QUEUE_BYTES + 1)  # sparse: nothing to write
    _refused(run_gpuq("submit", str(huge), "--dry-run", timeout=60), "larger than")
    _nothing_recorded()


@pytest.mark.parametrize(("key", "value", "why"), [("outputs", '["../../elsewhere/*"]', "leaves the run directory"),
                                                   ("checkpoint", '"/home/me/ckpt.pt"', "is absolute")])
def test_globs_that_leave_the_run_directory_are_refused_at_their_line(queue: Path, key: str, value: str,
                                                                      why: str) -> None:
    toml = queue.parent / "gpuq.toml"
    lines = [ln for ln in toml.read_text().splitlines() if not ln.startswith(f"{key} =")]
    at = lines.index("[run]") + 1
    lines.insert(at, f"{key} = {value}")
    toml.write_text("\n".join(lines) + "\n")
    column = lines[at].index(value.strip('["').split('"')[0][:1]) + 1
    _refused(run_gpuq("submit", str(queue), "--dry-run"), f"gpuq.toml:{at + 1}:{column}:", key, why)
    _nothing_recorded()


@pytest.mark.parametrize("setting", ["patrol_interval_s = 1e-9", "status_timeout_s = 1e308", "heartbeat_s = 10000000"])
def test_project_settings_out_of_bounds(queue: Path, setting: str) -> None:
    toml = queue.parent / "gpuq.toml"
    toml.write_text(setting + "\n" + toml.read_text())
    _refused(run_gpuq("submit", str(queue), "--dry-run"), setting.split()[0])
    _nothing_recorded()


def test_percent_and_underscore_are_not_wildcards(gpuq_home: Path) -> None:
    ledger = Ledger(gpuq_home / "ledger.db")
    spec = JobSpec(name="a", config="c.yaml", task="classify", config_sha256="0" * 64, line=1)
    ledger.add_sweep(sweep_id="qabc0001", queue_path="q", workdir="/w", queue_text="", jobs=[spec], default_retries=0)
    for ref in ("%", "_", "q%", "q_bc"):
        with pytest.raises(JobNotFound):
            ledger.resolve_sweep(ref)
    for ref in ("%:a", "q_bc:a", "%%%%", "____"):
        with pytest.raises(JobNotFound):
            ledger.resolve_job(ref)
    assert ledger.resolve_sweep("qabc").id == "qabc0001"
    ledger.close()
    _refused(run_gpuq("results", "--sweep", "%"), "no sweep matches")
    _refused(run_gpuq("cancel", "--sweep", "_", "-y"), "no sweep matches")
