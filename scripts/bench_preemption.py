#!/usr/bin/env python3
"""What a spot preemption costs: time until the job runs again, and training steps lost, measured
against the checkpoint interval.

Starts a farm of namespace SSH hosts (tests/support/testhosts/; needs root) behind the fake vast.ai,
gpuq's spot market (tests/support/fakecloud, NetnsBackend: an instance is a real SSH host; an outbid pauses it
at once, no warning, its disk kept; RunPod rents no spot pods since its API v2), rents ``--pods`` interruptible
instances with ``gpuq up`` (api.up), submits one deterministic torchrun job per GPU (checkpoint every
``--ckpt-every`` steps), then for each of ``--preemptions`` rounds preempts one machine at a random step and
measures:

- **detect**: preemption -> the tick that classifies it (``api.run_tick`` polled every ``--tick`` s);
- **provision**: the re-bid (once the higher bid has gone) until the instance answers SSH again (reported, and
  excluded from the total);
- **relaunch**: pod ready -> the resumed attempt is RUNNING with a heartbeat (bundle, checkpoint
  check, agent start, torch start-up, checkpoint load);
- **preemption to running again, excluding provisioning** = detect + relaunch;
- **steps lost** = the last step the job reached (its heartbeat on the pod's volume) minus the step
  it resumed from (``GPUQ_RESUMED``), next to the checkpoint interval.

    sudo python scripts/bench_preemption.py [--pods 2] [--preemptions 4] [--ckpt-every 8] [--seed 3]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.bench_project import TINY_CONFIG  # noqa: E402

KEY = "bench-vast-key-0123456789"


def write_project(base: Path, jobs: int, ckpt_every: int) -> Path:
    work = base / "project"
    (work / "configs").mkdir(parents=True)
    lines = []
    for i in range(jobs):
        cfg = (TINY_CONFIG.replace("seed: 3", f"seed: {20 + i}").replace("n_train: 256", "n_train: 4096")
               .replace("ckpt_every_steps: 0", f"ckpt_every_steps: {ckpt_every}"))
        (work / "configs" / f"p{i}.yaml").write_text(cfg)
        lines.append(f"configs/p{i}.yaml classify 8 name=p{i} gpus=1")
    (work / "queue.txt").write_text("\n".join(lines) + "\n")
    return work / "queue.txt"


def step_of(path: Path, key: str = "step") -> int:
    try:
        return int(json.loads(path.read_text())[key])
    except (OSError, ValueError, KeyError):
        return -1


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=2)
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--preemptions", type=int, default=4)
    parser.add_argument("--ckpt-every", type=int, default=8)
    parser.add_argument("--tick", type=float, default=1.0, help="seconds between patrol ticks")
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--keep", action="store_true")
    return parser.parse_args()


def start_cloud(tmp: Path, args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """The farm behind the fake vast.ai (one spot offer per pod), and gpuq's environment pointed at it:
    (farm, backend, fake)."""
    from tests.support.testhosts import HostFarm

    farm = HostFarm(tmp / "farm", args.pods, args.gpus)
    farm.start()
    from tests.support.fakecloud.netns_backend import NetnsBackend
    from tests.support.fakecloud.vastai import FakeVastAI
    from tests.support.fakecloud.vastai_market import FakeOffer

    backend = NetnsBackend(farm)
    market = tuple(FakeOffer(7001 + i, "RTX 4090", args.gpus, 24564, 0.40, 0.20) for i in range(args.pods))
    fake = FakeVastAI(api_key=KEY, backend=backend, offers=market).start()
    os.environ.update({"GPUQ_HOME": str(tmp / "home"), "GPUQ_HEARTBEAT_S": "1", "GPUQ_SSH_KEY": str(farm.client_key),
                       "GPUQ_PROVIDER_POLL_S": "0.2", "GPUQ_PREFLIGHT_SAMPLES": "1", "VAST_API_KEY": KEY,
                       "GPUQ_VASTAI_API_URL": fake.url, "GPUQ_CKPT_INTERVAL_S": "3600",
                       "GPUQ_AGENT_IDLE_EXIT_S": "300"})
    return farm, backend, fake


def rent_and_submit(ctx: Any, tmp: Path, args: argparse.Namespace) -> str:
    """``gpuq up`` of the spot pods, then one job per GPU submitted: the sweep's id."""
    from orchestrator import api

    made = api.up(ctx, provider="vastai", gpu_type="RTX 4090", count=args.pods, gpus=args.gpus,
                  spot=True, profile="rehearsal")
    if not made.ok or len(made.hosts) != args.pods:
        raise RuntimeError(f"up: {'; '.join(made.problems())}")
    queue = write_project(tmp, args.pods * args.gpus, args.ckpt_every)
    return api.submit(ctx, queue).sweep_id


class Preempter:
    """One benchmark's pods and sweep: each round preempts one running job's machine and times its return."""

    def __init__(self, ctx: Any, farm: Any, backend: Any, fake: Any, args: argparse.Namespace, sweep: str) -> None:
        self.ctx, self.farm, self.backend, self.fake, self.args, self.sweep = ctx, farm, backend, fake, args, sweep

    def root_of(self, host: str) -> Path:
        row = self.ctx.ledger.host(host)
        assert row is not None
        index = self.backend.host_index(row.instance_id)
        assert index is not None
        return self.farm.hosts[index].root_dir / "root" / "gpuq"

    def running(self) -> list[Any]:
        from orchestrator.core.states import JobState

        return [j for j in self.ctx.ledger.jobs(sweep_id=self.sweep, states=[JobState.RUNNING])]

    def wait_all_running(self) -> None:
        from orchestrator import api

        deadline = time.monotonic() + 300
        while len(self.running()) < self.args.pods * self.args.gpus:
            if time.monotonic() > deadline:
                raise RuntimeError("the jobs did not all start within 300 s")
            api.run_tick(self.ctx)
            time.sleep(self.args.tick)

    def reach_random_step(self, job: Any, rng: random.Random) -> tuple[str, Path, Path] | None:
        """Wait (up to 60 s) for ``job`` to reach a random step past its checkpoint: (host, its gpuq root,
        the attempt's heartbeat), or None when it ended or stalled before it."""
        host = job.host or ""
        root = self.root_of(host)
        start_step = step_of(root / "jobs" / job.id / "ckpt" / "LATEST")
        target = start_step + rng.randrange(self.args.ckpt_every, 4 * self.args.ckpt_every)
        beat = root / "jobs" / job.id / "attempts" / str(job.attempt_count) / "heartbeat"
        deadline = time.monotonic() + 60
        while step_of(beat) < target and time.monotonic() < deadline:
            time.sleep(0.05)
        return None if step_of(beat) < target else (host, root, beat)

    def wait_preempted(self, job: Any, host: str) -> None:
        from orchestrator import api
        from orchestrator.core.states import JobState

        deadline = time.monotonic() + 120
        while True:
            api.run_tick(self.ctx)
            if self.ctx.ledger.job(job.id).state == JobState.PREEMPTED.value:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the preemption of {host} was not detected within 120 s")
            time.sleep(self.args.tick)

    def wait_running_again(self, job: Any, before: int) -> None:
        """Until a later attempt than ``before`` is RUNNING with a heartbeat (300 s at most)."""
        from orchestrator import api
        from orchestrator.core.states import JobState

        deadline = time.monotonic() + 300
        while True:
            current = self.ctx.ledger.job(job.id)
            att = self.ctx.ledger.attempt(job.id, current.attempt_count)
            if current.attempt_count > before and att is not None and att.heartbeat_at is not None \
                    and current.state == JobState.RUNNING.value:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{job.name} did not run again within 300 s of the re-bid")
            time.sleep(self.args.tick)
            api.run_tick(self.ctx)

    def preempt_and_resume(self, job: Any, host: str, root: Path, beat: Path) -> dict[str, Any]:
        """Preempt ``host`` now, detect it, re-bid, and time until ``job`` runs again: the round's numbers."""
        from orchestrator import api

        ctx = self.ctx
        row = ctx.ledger.host(host)
        assert row is not None
        t_preempt = time.monotonic()
        self.fake.preempt(row.instance_id)
        self.wait_preempted(job, host)
        t_detect = time.monotonic()
        self.fake.outbid_ends(row.instance_id)  # the higher bid is gone: a re-bid gets the same machine back
        self.backend.wait_idle()
        reached = step_of(beat)
        before = ctx.ledger.job(job.id).attempt_count
        result = api.resume(ctx, tick=False)  # re-bid (provisioning), then place and relaunch
        t_resumed = time.monotonic()
        self.wait_running_again(job, before)
        t_running = time.monotonic()
        log = root / "jobs" / job.id / "attempts" / str(ctx.ledger.job(job.id).attempt_count) / "job.log"
        resumed_step = next(int(line.split("step=")[1].split()[0]) for line in log.read_text().splitlines()
                            if "GPUQ_RESUMED" in line)
        ready_at = _ready_time(ctx, host)
        provision_s = max(0.0, (ready_at - t_detect)) if ready_at else t_resumed - t_detect
        return {"job": job.name, "host": host, "revived": result.revived.get(host, ""),
                "detect_s": t_detect - t_preempt, "provision_s": provision_s,
                "relaunch_s": t_running - t_detect - provision_s, "total_s": t_running - t_preempt,
                "reached_step": reached, "resumed_step": resumed_step,
                "steps_lost": reached - resumed_step, "ckpt_every": self.args.ckpt_every}

    def rounds(self, rng: random.Random) -> list[dict[str, Any]]:
        """Up to ``--preemptions`` rounds (three tries each), a random running job each time."""
        from orchestrator import api

        rounds: list[dict[str, Any]] = []
        for _ in range(self.args.preemptions * 3):
            if len(rounds) >= self.args.preemptions:
                break
            api.run_tick(self.ctx)  # the ledger's RUNNING must be true now, not as of the last round
            running = self.running()
            if not running:
                break
            job = rng.choice(running)
            reached = self.reach_random_step(job, rng)
            if reached is None:
                continue  # the job ended or stalled before the chosen step: pick again
            rounds.append(self.preempt_and_resume(job, *reached))
        return rounds


def print_rounds(args: argparse.Namespace, rounds: list[dict[str, Any]]) -> None:
    print(f"{len(rounds)} spot preemptions (vast.ai: no warning, checkpoint every {args.ckpt_every} steps, "
          f"tick {args.tick:g} s):")
    print(f"  {'job':6} {'detect':>7} {'re-bid':>7} {'relaunch':>9} {'excl.prov':>10} {'reached':>8} {'resumed':>8} "
          f"{'lost':>5}")
    for r in rounds:
        print(f"  {r['job']:6} {r['detect_s']:6.1f}s {r['provision_s']:6.1f}s {r['relaunch_s']:8.1f}s "
              f"{r['detect_s'] + r['relaunch_s']:9.1f}s {r['reached_step']:8d} {r['resumed_step']:8d} "
              f"{r['steps_lost']:5d}")
    excl = [r["detect_s"] + r["relaunch_s"] for r in rounds]
    lost = [r["steps_lost"] for r in rounds]
    print(f"  preemption -> running again, excluding provisioning: median {statistics.median(excl):.1f} s, "
          f"max {max(excl):.1f} s")
    print(f"  steps lost: median {statistics.median(lost):g}, max {max(lost)} "
          f"(checkpoint interval {args.ckpt_every}; ratio max/interval {max(lost) / args.ckpt_every:.2f})")
    print(json.dumps({"rounds": rounds}, sort_keys=True))


def main() -> int:
    args = parse_args()
    from tests.support.testhosts import requirements_problem

    problem = requirements_problem()
    if problem:
        print(f"bench_preemption: {problem}", file=sys.stderr)
        return 2
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped benchmark still tears its farm down
    tmp = Path(tempfile.mkdtemp(prefix="gpuq-bench-preempt-"))
    farm, backend, fake = start_cloud(tmp, args)
    rng = random.Random(args.seed)
    rounds: list[dict[str, Any]] = []
    ctx = None
    try:
        from orchestrator import api

        ctx = api.open_context()
        sweep = rent_and_submit(ctx, tmp, args)
        bench = Preempter(ctx, farm, backend, fake, args, sweep)
        bench.wait_all_running()
        rounds = bench.rounds(rng)
        api.cancel(ctx, sweep=sweep)
    finally:
        if ctx is not None:
            ctx.close()
        fake.stop()
        backend.close()
        farm.teardown()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)

    if not rounds:
        print("no preemption measured", file=sys.stderr)
        return 1
    print_rounds(args, rounds)
    return 0


def _ready_time(ctx: Any, host: str) -> float | None:
    """When the re-bid pod answered again (the ledger event of the new endpoint), on the monotonic clock."""
    events = [e for e in ctx.ledger.events(subject=host, limit=20) if e.message.startswith("now at ")]
    if not events:
        return None
    return time.monotonic() - (time.time() - events[-1].time)


if __name__ == "__main__":
    sys.exit(main())
