"""A peer's death is not the survivor's fault (docs/health.md, issue 29 item 7): real logs of a 2-rank gloo
job whose rank 1 was kill -9'd, scanned as the agent scans them and classed as the patrol classes them.

- torchrun: rank 0 fails on the lost peer, torchrun SIGTERMs it and reports both ranks (the root cause
  "Signal 9 (SIGKILL)", the survivor "Signal 15 (SIGTERM)"): `killed`, never `stopped`.
- launcher = "python" with the framework's own ranks (Lightning DDP): rank 0 dies of gloo's "Connection
  closed by peer" and exits 1; the wrapper, the ranks' subreaper, finds rank 1's signal death and says so
  in the log; `killed`.  Without that line it would be `unknown` (FAILED, never retried).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from orchestrator.core.agent_modules import payload_dir
from orchestrator.health import verdicts
from orchestrator.host_documents import Scan

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TORCHRUN_LOG = FIXTURES / "torchrun" / "rank1-sigkill-gloo-cpu-torch-2.13.log"
LIGHTNING_LOG = FIXTURES / "lightning" / "ddp-python-launcher-rank1-sigkill-gloo.log"
AGENT = payload_dir() / "agent"
sys.path.insert(0, str(AGENT))
from gpuq_base import gpuq_procs  # noqa: E402
from gpuq_watch import gpuq_scan  # noqa: E402


def _classify(log: Path, exit_code: int = 1, trainer_code: int = 1, **kw: bool) -> str:
    scan = Scan.model_validate(gpuq_scan.scan_log(str(log), 0))  # typed at the edge, as the controller reads it
    return verdicts.classify(exit_code, trainer_code, scan.hits, scan.traceback, **kw)


def test_torchrun_reporting_a_ranks_sigkill_is_killed_not_stopped() -> None:
    text = TORCHRUN_LOG.read_text()
    assert "Signal 9 (SIGKILL) received by PID" in text and "Signal 15 (SIGTERM) received by PID" in text
    assert "Connection reset by peer" in text
    assert _classify(TORCHRUN_LOG) == "killed"
    assert _classify(TORCHRUN_LOG, oom_kill_rose=True) == "host_oom"
    assert verdicts.decide("killed", 1, 2).action == "requeue"


def test_torchrun_reporting_only_sigterms_is_still_a_stop(tmp_path: Path) -> None:
    stopped = tmp_path / "job.log"
    stopped.write_text("\n".join(line for line in TORCHRUN_LOG.read_text().splitlines()
                                 if "SIGKILL" not in line and "exitcode: -9" not in line) + "\n")
    assert _classify(stopped) == "stopped"


def test_a_collective_error_after_a_ranks_signal_death_is_the_death(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text("[rank0]: RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1970, remote process exited "
                   "or there was a network error, NCCL version 2.21.5\n"
                   + gpuq_procs.dead_rank_line(4242, 9) + "\n")
    assert _classify(log) == "killed"
    log.write_text("[rank0]: RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error\n")
    assert _classify(log) == "transient"  # no death: NCCL alone stays transient


def test_lightning_ddp_under_the_python_launcher_is_killed_with_the_wrappers_word(tmp_path: Path) -> None:
    assert "Connection closed by peer" in LIGHTNING_LOG.read_text()
    assert _classify(LIGHTNING_LOG) == "unknown"  # the log alone: no death to blame
    log = tmp_path / "job.log"
    log.write_text(LIGHTNING_LOG.read_text() + gpuq_procs.dead_rank_line(29232, 9) + "\n")
    assert _classify(log) == "killed"
    log.write_text(LIGHTNING_LOG.read_text() + gpuq_procs.dead_rank_line(29232, 15) + "\n")
    assert _classify(log) == "stopped"


@pytest.mark.parametrize("sig", [9, 6])
def test_a_subreaper_sees_an_orphaned_ranks_signal_death(tmp_path: Path, sig: int) -> None:
    """Real processes: a subreaper starts a 'rank 0' that starts a 'rank 1'; rank 1 is killed, rank 0 exits 1
    without reaping it; the subreaper then finds rank 1's death (peeked, still unreaped)."""
    script = tmp_path / "reaper.py"
    script.write_text(textwrap.dedent(f"""
        import os, signal, subprocess, sys, time
        sys.path.insert(0, {str(AGENT)!r})
        from gpuq_base import gpuq_procs
        assert gpuq_procs.become_subreaper()
        rank0 = subprocess.Popen([sys.executable, "-c", (
            "import subprocess, sys, os, signal, time\\n"
            "r1 = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\\n"
            "print(r1.pid, flush=True)\\n"
            "os.kill(r1.pid, {sig})\\n"
            "time.sleep(0.3)\\n"
            "os._exit(1)\\n")], stdout=subprocess.PIPE, text=True)  # exits without reaping rank 1
        rank1 = int(rank0.stdout.readline())
        assert rank0.wait() == 1
        seen = gpuq_procs.signaled_children({{rank0.pid}})
        again = gpuq_procs.signaled_children({{rank0.pid}})  # WNOWAIT: still there for the reaper
        pid, status = os.waitpid(rank1, 0)
        print(seen == again == [(rank1, {sig})], os.WTERMSIG(status) == {sig}, gpuq_procs.signaled_children())
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True", "[]"], done.stdout
