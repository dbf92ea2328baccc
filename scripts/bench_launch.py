# ruff: noqa: UP031  (%-formatting for the table, as in the other benchmarks)
"""Benchmark: the time from the host agent claiming a job (launch.json "time") to the user's process
starting (the trainer writes its own start time), on a local root, for launcher python and torchrun,
beside the time of starting the same command directly.  gpuq's overhead is the difference.

    python scripts/bench_launch.py [--runs 5]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHA = "b" * 64
USER_SCRIPT = ("import os, time\n"
               "if int(os.environ.get('RANK', '0')) == 0:\n"
               "    open(os.environ['BENCH_OUT'], 'w').write(repr(time.time()))\n")


def iso(ts: str) -> float:
    return dt.datetime.strptime(ts, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.timezone.utc).timestamp()


def direct(argv: list[str], cwd: Path, out: Path) -> float:
    env = dict(os.environ, BENCH_OUT=str(out))
    t0 = time.time()
    subprocess.run(argv, cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return float(out.read_text()) - t0


def via_gpuq(root: Path, launcher: str, n: int, out: Path) -> float:
    job_id = "cbench%07d" % n
    spec = {"schema": "gpuq.job/1", "job_id": job_id, "name": "bench%d" % n, "queue_id": "qb", "attempt": 1,
            "task": "t", "epochs": 1, "gpus": 1, "nodes": 1, "seed": None, "config": "x", "bundle_sha": SHA,
            "entry": "payload/x.py", "launcher": launcher, "python": "", "verify": [], "heartbeat_s": 30,
            "kill_grace_s": 2, "env": {"BENCH_OUT": str(out)}, "created_at": time.time(), "args": [],
            "run": {"command": ["user.py"], "launcher": launcher}}
    (root / "inbox" / (job_id + ".json")).write_text(json.dumps(spec))
    exit_path = root / "jobs" / job_id / "attempts" / "1" / "exit.json"
    deadline = time.time() + 120
    while not exit_path.exists() and time.time() < deadline:
        time.sleep(0.05)
    launch = json.loads((root / "jobs" / job_id / "attempts" / "1" / "launch.json").read_text())
    return float(out.read_text()) - iso(launch["time"])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    opts = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gpuq-bench-launch-"))
    root = tmp / "root"
    bundle = root / "bundles" / SHA
    shutil.copytree(REPO / "payload" / "agent", bundle / "payload" / "agent",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (bundle / "workdir").mkdir(parents=True)
    (bundle / "workdir" / "user.py").write_text(USER_SCRIPT)
    for d in ("inbox", "claimed", "withdrawn", "jobs"):
        (root / d).mkdir(parents=True, exist_ok=True)
    agent = subprocess.Popen([sys.executable, str(bundle / "payload" / "agent" / "gpuq_agent.py"), "--root",
                              str(root), "serve", "--idle-exit-s", "600", "--cpu-slots", "1", "--poll-s", "0.05"],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    try:
        n = 0
        print("launcher   direct_median_s   gpuq_median_s   overhead_s   (runs=%d)" % opts.runs)
        for launcher in ("python", "torchrun"):
            prefix = [sys.executable] if launcher == "python" else [
                sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1", "--nproc-per-node=1"]
            d = [direct([*prefix, "user.py"], bundle / "workdir", tmp / "direct.txt") for _ in range(opts.runs)]
            g = []
            for _ in range(opts.runs):
                n += 1
                g.append(via_gpuq(root, launcher, n, tmp / ("gpuq%d.txt" % n)))
            dm, gm = statistics.median(d), statistics.median(g)
            print("%-10s %15.3f %15.3f %12.3f" % (launcher, dm, gm, gm - dm))
    finally:
        os.killpg(agent.pid, signal.SIGKILL)
        agent.wait()
        subprocess.run(["chmod", "-R", "u+w", str(tmp)], check=False)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
