"""scripts/bench_stopping.py stays runnable and honest: a short seeded run, the baseline never stopped."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_stopping.py"


def test_a_short_simulation_keeps_the_bound_and_never_stops_the_baseline() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--sweeps", "400", "--worse-sweeps", "60"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert any(line.startswith("null sweeps: 400; any wrong stop in ") for line in lines)
    assert "baseline stopped: 0 times" in done.stdout and "GPU-hours saved" in done.stdout
