#!/usr/bin/env python3
"""CPU of a serving host agent whose jobs all wait: ``--waiting`` specs in its inbox, every slot held.

Builds a throw-away agent root with two CPU slots held by a live ``sleep`` (a claimed attempt the
agent adopts on start-up, as after a restart) and N one-slot specs in ``inbox/``, starts
``gpuq_agent.py serve`` (poll 0.1 s, the default), lets it settle, and reads its user+system CPU time
from ``/proc/<pid>/stat`` over ``--seconds``.  The baseline is the same agent with ``--floor``
waiting jobs, measured in the same run; the ratio and each share of a core are printed.

    python scripts/bench_agent_idle.py [--waiting 100 1000] [--floor 10] [--seconds 10]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

AGENT = Path(__file__).resolve().parents[1] / "payload" / "agent" / "gpuq_agent.py"
TICK = os.sysconf("SC_CLK_TCK")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_agent_status import spec  # noqa: E402


def _spec(job_id: str, created: float) -> dict[str, object]:
    return {**spec(job_id, job_id), "created_at": created}


def _stat(pid: int) -> list[str]:
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2:].split()


def build(root: Path, waiting: int, holder: int) -> None:
    for d in ("inbox", "claimed", "withdrawn", "jobs"):
        (root / d).mkdir(parents=True, exist_ok=True)
    held = "c0000000000ff"
    (root / "claimed" / f"{held}.json").write_text(json.dumps({**_spec(held, 1.0), "gpus": 2}))
    adir = root / "jobs" / held / "attempts" / "1"
    adir.mkdir(parents=True)
    (adir / "launch.json").write_text(json.dumps({"time": "2024-01-01T00:00:00.000Z", "slots": [0, 1]}))
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    (adir / "pgid").write_text(json.dumps({"pgid": holder, "start_ticks": int(_stat(holder)[19]),
                                           "boot_id": boot}))
    for i in range(waiting):
        job_id = f"c{0x100 + i:012x}"
        (root / "inbox" / f"{job_id}.json").write_text(json.dumps(_spec(job_id, 1000.0 + i)))


def measure(waiting: int, seconds: float) -> float:
    """Share of one core the serving agent used over ``seconds``."""
    holder = subprocess.Popen(["sleep", "3600"], start_new_session=True)
    try:
        with tempfile.TemporaryDirectory(prefix="gpuq-bench-idle-") as tmp:
            root = Path(tmp) / "root"
            build(root, waiting, holder.pid)
            agent = subprocess.Popen([sys.executable, str(AGENT), "--root", str(root), "serve", "--cpu-slots", "2",
                                      "--idle-exit-s", "3600"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                time.sleep(3.0)  # start-up, adoption, the first reads of the inbox
                if agent.poll() is not None:
                    raise SystemExit(f"the agent exited with {agent.returncode}")
                before, t0 = _stat(agent.pid), time.monotonic()
                time.sleep(seconds)
                after, t1 = _stat(agent.pid), time.monotonic()
                left = len(list((root / "inbox").glob("*.json")))
                if left != waiting:
                    raise SystemExit(f"{waiting - left} jobs left the inbox: the slots were not held")
            finally:
                agent.send_signal(signal.SIGTERM)
                agent.wait(timeout=30)
    finally:
        holder.kill()
        holder.wait()
    used = sum(int(after[i]) - int(before[i]) for i in (11, 12)) / TICK  # utime, stime
    return used / (t1 - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--waiting", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--floor", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    floor = measure(args.floor, args.seconds)
    print(f"agent serving, {args.floor} jobs waiting (baseline): {floor * 100:.2f} % of a core")
    for n in args.waiting:
        share = measure(n, args.seconds)
        print(f"agent serving, {n} jobs waiting: {share * 100:.2f} % of a core, "
              f"{share / floor if floor else float('inf'):.2f}x the baseline (target: at most 2 % of a core)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
