"""Racing gpuq commands never start one job twice (issue: "A job can start twice").

For STORM_S seconds (30 by default; GPUQ_TEST_STORM_S), six processes loop `gpuq status --once`,
`gpuq patrol` and a bounded `gpuq watch` against sweeps on two namespace SSH hosts plus the local
host, while more jobs are submitted, some cancelled and some requeued (their attempt's whole
process group killed on the host: the patrol finds it gone and requeues it), and the first sweep grows
by two racing `submit --into` of one queue at a time (its old lines and new ones).  Afterwards every
job has exactly one launched attempt per attempt number (the launch.json records on the hosts),
each where the ledger says, no "database is locked" (or traceback) reached the user, the ledger's
events tell each job's and attempt's whole story, and the grown sweep has every line of every
`--into` queue once: each racing pair added its new lines once, the other of the pair nothing.
"""

from __future__ import annotations

import json
import os
import random
import re
import threading
import time
from pathlib import Path

import pytest

from orchestrator.core.states import AttemptState, JobState
from orchestrator.ledger import Ledger
from tests.conftest import ROOT, kill_recorded_groups, wait_for
from tests.support import warmcli
from tests.support.gpuquser import User

STORM_S = float(os.environ.get("GPUQ_TEST_STORM_S", "30"))
# the storm, plus a farm start and the last jobs draining (about 65 s in all with the default storm);
# pytest-timeout ends a hung run
pytestmark = [pytest.mark.integration, pytest.mark.timeout(int(STORM_S) + 90)]

TRAIN = """\
import argparse, time
p = argparse.ArgumentParser()
p.add_argument("--config"); p.add_argument("--task"); p.add_argument("--epochs", type=int, default=1)
args, _ = p.parse_known_args()
time.sleep(3 * args.epochs)
"""
TOML = 'entry = "train.py"\nlauncher = "python"\nverify = []\n'
HOSTS = ("--host", "g0", "--host", "g1", "--host", "local")
TROUBLE = ("database is locked", "Traceback")


def _queue(work: Path, name: str, prefix: str, count: int, *, keep: str = "") -> Path:
    lines = [f"configs/c.yaml cls {2 + i % 3} name={prefix}{i} retries=3" for i in range(count)]
    path = work / name
    path.write_text(keep + "\n".join(lines) + "\n")
    return path


def _race_into(user: User, queue: Path, sweep: str, cwd: Path) -> list[str]:
    """Two `submit --into` of one queue at once: what each said (exit code first)."""
    said: list[str] = ["", ""]

    def one(i: int) -> None:
        out = user.gpuq("submit", str(queue), "--into", sweep, *HOSTS, cwd=cwd)
        said[i] = f"exit {out.returncode}: {out.stdout}{out.stderr}"

    pair = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for thread in pair:
        thread.start()
    for thread in pair:
        thread.join(timeout=240)
    return said


class Loop(threading.Thread):
    """One process slot running a gpuq command again and again; keeps what reached the user."""

    def __init__(self, user: User, args: list[str], stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.user, self.args, self.stop = user, args, stop
        self.runs = 0
        self.trouble: list[str] = []

    def run(self) -> None:
        env = {**os.environ, **self.user.env}
        while not self.stop.is_set():
            # a process of its own each time, forked warm (tests/support/warmcli.py): a cold start spent
            # most of this test's CPU importing the controller, not racing
            out = warmcli.run(self.args, env, ROOT, 240)
            self.runs += 1
            text = out.stdout + out.stderr
            if any(t in text for t in TROUBLE):
                self.trouble.append(f"$ gpuq {' '.join(self.args)} (exit {out.returncode})\n{text[-3000:]}")


def test_racing_commands_launch_each_attempt_once(host_farm, tmp_path: Path) -> None:
    farm = host_farm(n=2, gpus=2)
    home = tmp_path / "gpuq-home"
    home.mkdir()
    user = User(farm, home, "/root/gpuq-race")
    user.env.update({"GPUQ_LOCAL_CPU_SLOTS": "2", "GPUQ_PATROL_MIN_INTERVAL_S": "1",
                     "GPUQ_PATROL_INTERVAL_S": "1", "GPUQ_PATROL_IDLE_INTERVAL_S": "1", "GPUQ_PREFLIGHT": "false"})
    work = tmp_path / "project"
    (work / "configs").mkdir(parents=True)
    (work / "configs" / "c.yaml").write_text("x: 1\n")
    (work / "train.py").write_text(TRAIN)
    (work / "gpuq.toml").write_text(TOML)
    stop = threading.Event()
    loops: list[Loop] = []
    rng = random.Random(13)
    try:
        user.add_hosts()
        q0 = _queue(work, "q0.txt", "a", 8)
        for n in range(1, int(STORM_S) + 30):  # every queue of the storm written now: the project's files stay
            _queue(work, f"q{n}.txt", f"b{n}x", 4)  # as the first sweep's bundle had them (its baseline's code)
            _queue(work, f"i{n}.txt", f"i{n}x", 3, keep=q0.read_text())
        first = user.gpuq("submit", str(q0), *HOSTS, cwd=work)
        assert first.returncode == 0, first.stdout + first.stderr
        grown = _sweep_ids(home)[0]
        joined: list[str] = []  # the new names of every --into queue
        watch = ["watch", "--interval", "1", "--max-hours", "0.004"]
        for args in (["status", "--once"], ["status", "--once"], ["patrol"], ["patrol"], watch, watch):
            loops.append(Loop(user, args, stop))
        for loop in loops:
            loop.start()
        actions: list[str] = []
        touched: set[str] = set()  # each job is cancelled or killed at most once
        cancels: dict[str, str] = {}  # job id -> the state its cancel says it has
        end = time.monotonic() + STORM_S
        n = 0
        while time.monotonic() < end:
            time.sleep(1)
            n += 1
            action = ("submit", "kill", "cancel", "into")[n % 4]
            if action == "into":
                into = _queue(work, f"i{n}.txt", f"i{n}x", 3, keep=q0.read_text())
                said = _race_into(user, into, grown, work)
                actions.append(f"into {into.name}: " + " | ".join(x.splitlines()[-1] for x in said if x))
                assert all(x.startswith("exit 0: ") and not any(t in x for t in TROUBLE) for x in said), said
                # each line once: one of the pair added the three new lines, the other found nothing new
                assert sorted("joined: 3 jobs" in x for x in said) == [False, True], said
                assert sum(f"sweep {grown}: nothing joined" in x for x in said) == 1, said
                joined += [f"i{n}x{i}" for i in range(3)]
                continue
            if action == "submit":
                sub = user.gpuq("submit", str(_queue(work, f"q{n}.txt", f"b{n}x", 4)), *HOSTS, cwd=work)
                actions.append(f"submit: exit {sub.returncode}")
                assert not any(t in sub.stdout + sub.stderr for t in TROUBLE), sub.stdout + sub.stderr
                continue
            jobs = _jobs(home)
            live = [j for j in jobs if j["state"] in ("QUEUED", "ASSIGNED", "RUNNING") and j["id"] not in touched]
            placed = [j for j in live if j["state"] in ("ASSIGNED", "RUNNING") and j["host"]]
            if action == "cancel" and live:
                # one not started yet when there is one (a cancel that races the job's end proves little)
                waiting = [j for j in live if not _launched(user, home, j)]
                victim = rng.choice(waiting or live)
                touched.add(victim["id"])
                out = user.gpuq("cancel", "-y", victim["id"])
                actions.append(f"cancel {victim['name']} ({victim['state']}): exit {out.returncode}: "
                               f"{out.stdout.strip()} {out.stderr.strip()}")
                assert out.returncode == 0, actions[-1]  # a cancel that races the job's end says so
                # a job that ended between the pick and the cancel is "already <STATE>" (a loaded machine
                # runs out of unstarted jobs); every other answer is a cancellation the ledger must show
                ended = re.search(r" already ([A-Z]+)$", out.stdout.strip())
                cancels[victim["id"]] = ended.group(1) if ended else JobState.CANCELLED.value
                assert not any(t in out.stdout + out.stderr for t in TROUBLE), out.stdout + out.stderr
            elif action == "kill":
                alive = [(j, a) for j in placed if (a := _alive_attempt(user, home, j)) is not None]
                if alive:
                    victim, adir = rng.choice(alive)
                    touched.add(victim["id"])
                    actions.append(f"kill {victim['name']} on {victim['host']}: "
                                   f"{_kill_attempt(user, home, victim, adir)}")
        stop.set()
        for loop in loops:
            loop.join(timeout=240)

        # the last jobs drain: plain status ticks until nothing is queued, assigned or running
        def drained() -> bool:
            tick = user.gpuq("status", "--once")
            assert not any(t in tick.stdout + tick.stderr for t in TROUBLE), tick.stdout + tick.stderr
            return not any(j["state"] in ("QUEUED", "ASSIGNED", "RUNNING") for j in _jobs(home))

        assert wait_for(drained, timeout=120, interval=0.5), user.status_doc()
        trouble = [t for loop in loops for t in loop.trouble]
        assert not trouble, "\n\n".join(trouble[:3])
        assert all(loop.runs >= 2 for loop in loops), [(loop.args, loop.runs) for loop in loops]

        launched = _launch_records(user, home)
        ledger = Ledger(home / "ledger.db")
        try:
            _check_ledger(ledger, launched, actions, cancels)
            names = sorted(j.name for j in ledger.jobs(sweep_id=grown))  # no lost line, none twice, none renamed
            assert joined and names == sorted([f"a{i}" for i in range(8)] + joined), (names, actions)
            parts = ledger.parts_of(grown)
            assert [p.number for p in parts] == list(range(1, len(joined) // 3 + 2)), parts
        finally:
            ledger.close()
    finally:
        stop.set()
        for loop in loops:
            loop.join(timeout=240)
        user.stop_everything()
        kill_recorded_groups(home / "local")


def _sweep_ids(home: Path) -> list[str]:
    ledger = Ledger(home / "ledger.db")
    try:
        return [s.id for s in ledger.sweeps()]
    finally:
        ledger.close()


def _jobs(home: Path) -> list[dict[str, str]]:
    """The ledger's jobs, read directly (a read-only snapshot: it never waits for the racing commands)."""
    ledger = Ledger(home / "ledger.db")
    try:
        return [{"id": j.id, "name": j.name, "state": j.state, "host": j.host or ""} for j in ledger.jobs()]
    finally:
        ledger.close()


def _launched(user: User, home: Path, job: dict[str, str]) -> bool:
    if not job["host"]:
        return False
    base = home / "local" if job["host"] == "local" else user.host_dir(int(job["host"][1:]))
    return any(base.glob(f"jobs/{job['id']}/attempts/*/launch.json"))


def _alive_attempt(user: User, home: Path, job: dict[str, str]) -> Path | None:
    """The attempt dir of the job's newest attempt on its host while it runs there (pgid, no exit.json)."""
    host = job["host"]
    base = home / "local" if host == "local" else user.host_dir(int(host[1:]))
    dirs = sorted(base.glob(f"jobs/{job['id']}/attempts/*"), key=lambda p: int(p.name))
    if dirs and (dirs[-1] / "pgid").is_file() and not (dirs[-1] / "exit.json").exists():
        return dirs[-1]
    return None


def _kill_attempt(user: User, home: Path, job: dict[str, str], adir: Path) -> str:
    """Kill an attempt's whole process group on its host (as a kill -9 or an OOM of the group would)."""
    pgid = int(json.loads((adir / "pgid").read_text())["pgid"])
    if job["host"] == "local":
        try:
            os.killpg(pgid, 9)
        except ProcessLookupError:
            return "already gone"
        return f"killed group {pgid} of a{adir.name}"
    out = user.farm.ssh(int(job["host"][1:]), "sh", "-c", f"kill -9 -{pgid} && echo killed")
    return f"{out.stdout.strip() or 'not killed'}: group {pgid} of a{adir.name}"


def _launch_records(user: User, home: Path) -> dict[tuple[str, int], list[str]]:
    """(job id, attempt number) -> the hosts whose agent launched it (launch.json on disk)."""
    roots = {"local": home / "local", **{f"g{i}": user.host_dir(i) for i in range(len(user.farm.hosts))}}
    seen: dict[tuple[str, int], list[str]] = {}
    for name, root in roots.items():
        for launch in root.glob("jobs/*/attempts/*/launch.json"):
            seen.setdefault((launch.parents[2].name, int(launch.parent.name)), []).append(name)
    return seen


def _check_ledger(ledger: Ledger, launched: dict[tuple[str, int], list[str]], actions: list[str],
                  cancels: dict[str, str]) -> None:
    jobs = {j.id: j for j in ledger.jobs()}
    attempts = {(a.job_id, a.number): a for a in ledger.attempts()}
    story = "\n".join(actions + [f"{j.name}: {j.state}, attempts " + "; ".join(
        f"a{a.number} {a.host} {a.state} {a.message}" for (jid, _), a in sorted(attempts.items()) if jid == j.id)
        for j in jobs.values()])
    twice = {k: v for k, v in launched.items() if len(v) != 1}
    assert not twice, f"launched more than once: {twice}\n{story}"
    for (job_id, number), (host,) in launched.items():
        att = attempts.get((job_id, number))
        assert att is not None, f"{job_id} a{number} ran on {host} but the ledger has no such attempt"
        assert att.host == host, f"{job_id} a{number} ran on {host}, the ledger says {att.host}"
    assert len(jobs) > 8 and any(n > 1 for (_, n) in attempts), story  # submits and requeues happened
    assert cancels, story  # cancels happened
    assert {jid: jobs[jid].state for jid in cancels} == cancels, story  # each as its cancel said
    for job in jobs.values():
        numbers = sorted(n for (jid, n) in attempts if jid == job.id)
        assert numbers == list(range(1, job.attempt_count + 1)), (job.id, numbers, job.attempt_count)
        assert JobState(job.state).terminal or job.state == JobState.LOST.value, (job.id, job.state)
        events = ledger.events(subject=job.id, limit=100_000)
        # the job's state events chain from QUEUED to the state it is in, with no gap
        chain = [e for e in events if e.kind == "job" and e.subject == job.id and e.old != e.new and e.new
                 and e.new in JobState.__members__]
        state = JobState.QUEUED.value
        for e in chain:
            assert e.old == state, f"{job.id}: event {e.old}->{e.new} after {state}"
            state = e.new
        assert state == job.state, f"{job.id}: events end at {state}, the job is {job.state}"
        for number in numbers:
            att = attempts[(job.id, number)]
            mine = [e for e in events if e.kind == "attempt" and e.subject == f"{job.id}/a{number}"
                    and e.new in AttemptState.__members__]
            assert mine and mine[0].new == AttemptState.STARTING.value, (job.id, number, mine)
            assert mine[-1].new == att.state, (job.id, number, [e.new for e in mine], att.state)
