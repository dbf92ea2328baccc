#!/usr/bin/env python3
"""Billed idle time of a rented host after its last job ended, with and without `--down-when-done`.

Starts a farm of namespace SSH hosts (tests/support/testhosts/; needs root) behind the fake RunPod
(tests/support/fakecloud, NetnsBackend: a pod is a real SSH host), and runs the same sweep twice, each
time on ``--pods`` freshly rented pods: two jobs of a project's own trainer (stdlib, sleeping 1 s on the
first pod up to ``--max-job-s`` on the last) pinned to each pod, so that the pods finish one after another.

- **down when done**: ``gpuq up --down-when-done``, then ``gpuq watch --interval P``: the tick that sees
  a pod's last job end pulls its results, verifies them and terminates it (tick/billing.py);
- **baseline**, the best a person did before: ``gpuq watch``, then at once ``gpuq pull`` and
  ``gpuq down --sweep --yes``: a pod that finished early bills until the whole sweep is done;
- **unattended** (the laptop closed): ``gpuq up --down-when-done`` and ``gpuq submit`` with
  ``lease_timeout_min = --lease-min``, then no gpuq command at all: each pod stops itself (its agent,
  ``runpodctl pod stop`` with the pod's own key: payload/agent/gpuq_serving/gpuq_selfstop.py).  Billed idle per
  pod = the pod's own stop call at the fake minus the end of its last job (the exit record on its disk); the
  bound is the lease plus one agent look (5 s) after the later of that end and the last gpuq command.

Per pod, billed idle = the time its lease was terminated (the provider said gone) minus the end of its
last job (the exit record).  Down when done splits it into **detect** (last job ended -> the tick that
recorded it; at most one patrol interval plus a tick) and **teardown** (that tick's pull, verification
and terminate).  The target is idle <= P + teardown; the script prints the medians and the ratios.

    sudo python scripts/bench_idle_billing.py [--pods 3] [--interval 2] [--max-job-s 6] [--seed 5] [--lease-min 0.15]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

KEY = "bench-runpod-key-0123456789"
TRAIN = """\
import sys, time
args = sys.argv[1:]
time.sleep(float(args[args.index("--sleep") + 1]))
with open("metrics.csv", "w") as fh:
    fh.write("step,val_acc\\n1,0.50\\n")
"""
TOML = '[run]\ncommand = "train.py {args}"\nlauncher = "python"\nmetrics = "metrics.csv"\nmetric = "val_acc"\n'


def write_project(base: Path, hosts: list[str], rng: random.Random, max_job_s: float) -> Path:
    work = base / "project"
    work.mkdir(parents=True)
    (work / "train.py").write_text(TRAIN)
    (work / "gpuq.toml").write_text(TOML)
    # pod i's jobs last about 1 + i/(pods-1) * (max_job_s - 1) seconds: the pods finish one after another
    step = (max_job_s - 1.0) / max(1, len(hosts) - 1)
    lines = [f"name=j{i}_{k} host={h} -- --sleep {max(0.5, 1.0 + i * step + rng.uniform(-0.3, 0.3)):.2f}"
             for i, h in enumerate(hosts) for k in range(2)]
    (work / "queue.txt").write_text("\n".join(lines) + "\n")
    return work / "queue.txt"


def one_round(base: Path, *, pods: int, interval: float, max_job_s: float, seed: int,
              down_when_done: bool) -> list[dict[str, float]]:
    from orchestrator import api
    from orchestrator.core.states import JobState, LeaseState

    os.environ["GPUQ_HOME"] = str(base / "home")
    ctx = api.open_context()
    try:
        made = api.up(ctx, provider="runpod", gpu_type="NVIDIA RTX A6000", count=pods, gpus=1, profile="rehearsal",
                      down_when_done=down_when_done)
        if not made.ok or len(made.hosts) != pods:
            raise RuntimeError(f"up: {'; '.join(made.problems())}")
        hosts = sorted(h.name for h in made.hosts)
        sweep = api.submit(ctx, write_project(base, hosts, random.Random(seed), max_job_s)).sweep_id
        api.watch(ctx, sweep=sweep, interval_s=interval, max_hours=0.2)
        if not down_when_done:
            api.pull(ctx, sweep=sweep)
            api.down(ctx, api.down_plan(ctx, sweep=sweep))
        out = []
        for name in hosts:
            row = ctx.ledger.host(name)
            assert row is not None
            if row.lease is not LeaseState.TERMINATED or row.lease_changed_at is None:
                raise RuntimeError(f"{name} was not terminated: {row.lease_state} {row.lease_reason}")
            jobs = [j for j in ctx.ledger.jobs(sweep_id=sweep) if j.host == name]
            ends = [a.ended_at for a in ctx.ledger.attempts_of(j.id for j in jobs) if a.ended_at is not None]
            seen = [e.time for j in jobs for e in ctx.ledger.events(j.id, exact=True)
                    if e.new in (JobState.SUCCEEDED.value, JobState.FAILED.value)]
            last_end, stopped = max(ends), row.lease_changed_at
            out.append({"idle": stopped - last_end, "detect": max(seen) - last_end, "teardown": stopped - max(seen)})
        return out
    finally:
        ctx.close()


def unattended_round(base: Path, fake: Any, backend: Any, *, pods: int, max_job_s: float, seed: int,
                     lease_min: float) -> list[dict[str, float]]:
    """Rent, submit, then no gpuq command: per pod, billed idle after its last job until it stopped itself."""
    import json
    from datetime import datetime, timezone

    from orchestrator import api

    os.environ.update({"GPUQ_HOME": str(base / "home"), "GPUQ_LEASE_TIMEOUT_MIN": f"{lease_min:g}"})
    ctx = api.open_context()
    try:
        made = api.up(ctx, provider="runpod", gpu_type="NVIDIA RTX A6000", count=pods, gpus=1, profile="rehearsal",
                      down_when_done=True)
        if not made.ok or len(made.hosts) != pods:
            raise RuntimeError(f"up: {'; '.join(made.problems())}")
        rows = {h.name: h for h in made.hosts}
        sweep = api.submit(ctx, write_project(base, sorted(rows), random.Random(seed), max_job_s)).sweep_id
        jobs = {j.id: j.host for j in ctx.ledger.jobs(sweep_id=sweep)}
    finally:
        ctx.close()  # the laptop closes: nothing of gpuq runs from here on
        del os.environ["GPUQ_LEASE_TIMEOUT_MIN"]

    def stop_of(instance_id: str) -> float | None:
        calls = [c["at"] for c in fake.instance_calls if c["instance"] == instance_id and c["method"] != "GET"]
        return min(calls) if calls else None

    deadline = time.monotonic() + max_job_s * 2 + lease_min * 60 + 60
    while time.monotonic() < deadline and any(stop_of(r.instance_id) is None for r in rows.values()):
        time.sleep(0.2)
    out = []
    for name, row in sorted(rows.items()):
        stopped = stop_of(row.instance_id)
        if stopped is None:
            raise RuntimeError(f"{name} did not stop itself")
        root = backend.host(row.instance_id).root / "gpuq"
        ends = [datetime.strptime(json.loads((root / "jobs" / j / "attempts" / "1" / "exit.json").read_text())[
            "ended_at"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp()
            for j, h in jobs.items() if h == name]
        contact = (root / "controller_contact").stat().st_mtime  # the last gpuq command that reached it
        out.append({"idle": stopped - max(ends), "silent": stopped - contact,
                    "after_both": stopped - max(max(ends), contact)})
    return out


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=3)
    parser.add_argument("--interval", type=float, default=2.0, help="the patrol interval P (gpuq watch --interval)")
    parser.add_argument("--max-job-s", type=float, default=6.0)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--lease-min", type=float, default=0.15, help="lease_timeout_min of the unattended round")
    parser.add_argument("--keep", action="store_true")
    return parser.parse_args()


def main() -> int:
    args = parse_args()

    from tests.support.testhosts import HostFarm, requirements_problem

    problem = requirements_problem()
    if problem:
        print(f"bench_idle_billing: {problem}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped benchmark still tears its farm down
    tmp = Path(tempfile.mkdtemp(prefix="gpuq-bench-idle-"))
    farm = HostFarm(tmp / "farm", args.pods, 1)
    farm.start()
    from tests.support.fakecloud import FakeRunPod
    from tests.support.fakecloud.netns_backend import NetnsBackend

    backend = NetnsBackend(farm)
    fake = FakeRunPod(api_key=KEY, backend=backend).start()
    os.environ.update({"GPUQ_HEARTBEAT_S": "1", "GPUQ_SSH_KEY": str(farm.client_key), "GPUQ_PROVIDER_POLL_S": "0.2",
                       "GPUQ_PREFLIGHT_SAMPLES": "1", "RUNPOD_API_KEY": KEY, "GPUQ_RUNPOD_URL": fake.url,
                       "GPUQ_PATROL_MIN_INTERVAL_S": "0.5", "GPUQ_AGENT_IDLE_EXIT_S": "60"})
    rounds: dict[str, list[dict[str, float]]] = {}
    started = time.monotonic()
    try:
        for label, down in (("down when done", True), ("baseline", False)):
            rounds[label] = one_round(tmp / label.replace(" ", "-"), pods=args.pods, interval=args.interval,
                                      max_job_s=args.max_job_s, seed=args.seed, down_when_done=down)
            backend.wait_idle(timeout=120)
        unattended = unattended_round(tmp / "unattended", fake, backend, pods=args.pods, max_job_s=args.max_job_s,
                                      seed=args.seed, lease_min=args.lease_min)
        backend.wait_idle(timeout=120)
    finally:
        fake.stop()
        backend.close()
        farm.teardown()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)

    def med(label: str, key: str) -> float:
        return statistics.median(r[key] for r in rounds[label])

    p = args.interval
    idle, detect, teardown = med("down when done", "idle"), med("down when done", "detect"), \
        med("down when done", "teardown")
    base = med("baseline", "idle")
    print(f"{args.pods} rented pods, 2 jobs each (1-{args.max_job_s:g} s), patrol interval P = {p:g} s "
          f"({time.monotonic() - started:.0f} s in all)")
    for label, rows in rounds.items():
        shown = "  ".join(f"{r['idle']:5.1f}" for r in rows)
        print(f"  {label:15} billed idle per pod (s): {shown}   median {med(label, 'idle'):5.1f}")
    print(f"  down when done: median detect {detect:.1f} s + teardown (pull, verify, terminate) {teardown:.1f} s")
    ratio: Any = idle / (p + teardown)
    worst = max(r["idle"] / (p + r["teardown"]) for r in rounds["down when done"])
    print(f"idle / (P + teardown) = {ratio:.2f} (target <= 1; the worst pod {worst:.2f})   idle / P = {idle / p:.2f}   "
          f"baseline / down-when-done = {base / idle:.1f}x")
    return 0 if ratio <= 1.0 and unattended_report(unattended, args.lease_min * 60) else 1


def unattended_report(unattended: list[dict[str, float]], lease_s: float, look: float = 5.0) -> bool:
    """Print the unattended round; whether every pod stopped within its bound and never before the lease."""
    shown = "  ".join(f"{r['idle']:5.1f}" for r in unattended)
    bound = max(r["after_both"] for r in unattended)
    silent = min(r["silent"] for r in unattended)
    print(f"  unattended      billed idle per pod (s): {shown}   median "
          f"{statistics.median(r['idle'] for r in unattended):5.1f}   (no gpuq command after the submit)")
    print(f"  unattended: each pod stopped itself at most {bound:.1f} s after the later of its last job's end and "
          f"the last gpuq command (lease_timeout_min {lease_s:g} s + one agent look {look:g} s = {lease_s + look:g} s),"
          f" and none sooner than {silent:.1f} s after that command")
    return bound <= lease_s + look + 1.0 and silent >= lease_s


if __name__ == "__main__":
    sys.exit(main())
