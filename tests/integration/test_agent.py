"""Integration tests for the host agent (payload/agent/gpuq_agent.py), run as real subprocesses.

Each test builds a root with a fake bundle (a copy of the real agent files plus stub trainers from
agent_stubs/), writes inbox specs and runs `serve` with small --idle-exit-s and --cpu-slots.  Every
process group started here is killed in the fixture finalizer, by the pgid recorded in agent.pid
and in each attempt's pgid file (identity-checked against /proc).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core import protocol
from orchestrator.health import stops, verdicts
from orchestrator.host_documents import unframe
from tests.support.jobtree import fake_checkpoint
from tests.support.wire import exit_record

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
AGENT_SRC = REPO / "payload" / "agent"
STUBS = Path(__file__).resolve().parent / "agent_stubs"
SHA = "f" * 64
# the agent's interpreter; e.g. GPUQ_TEST_AGENT_PYTHON=~/.pyenv/versions/3.8.18/bin/python proves 3.8 works
AGENT_PY = os.environ.get("GPUQ_TEST_AGENT_PYTHON") or sys.executable
SPEC_KEYS = {"schema", "job_id", "name", "queue_id", "attempt", "task", "epochs", "gpus", "nodes", "seed",
             "config", "bundle_sha", "entry", "launcher", "python", "verify", "heartbeat_s",
             "ckpt_interval_s", "kill_grace_s", "min_free_gb", "scratch_gb", "durable_dir", "resume_from",
             "spec_hash", "env", "created_at"}


def iso(ts: str) -> float:
    return dt.datetime.strptime(ts, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.timezone.utc).timestamp()


def wait_for(pred: Any, timeout: float = 20.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def read_json(p: Path) -> Any:
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def start_ticks(pid: int) -> int | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(text[text.rfind(")") + 2:].split()[19])


class Host:
    """One GPUQ_ROOT with a fake bundle and helpers to drive the agent."""

    def __init__(self, root: Path, runs: Path) -> None:
        self.root = root
        self.runs = runs
        self.procs: list[subprocess.Popen[bytes]] = []
        self.n = 0
        bundle = root / "bundles" / SHA
        shutil.copytree(AGENT_SRC, bundle / "payload" / "agent",
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        shutil.copy(STUBS / "stub_train.py", bundle / "payload" / "stub_train.py")
        shutil.copy(STUBS / "stub_dist.py", bundle / "payload" / "stub_dist.py")
        (bundle / "workdir" / "configs").mkdir(parents=True)
        self.agent = str(bundle / "payload" / "agent" / "gpuq_agent.py")
        self.workdir = bundle / "workdir"
        for d in ("inbox", "claimed", "withdrawn", "jobs"):
            (root / d).mkdir(parents=True, exist_ok=True)

    # specs
    def config(self, name: str, **cfg: Any) -> str:
        cfg.setdefault("runs_file", str(self.runs))
        (self.workdir / "configs" / (name + ".json")).write_text(json.dumps(cfg))
        return f"configs/{name}.json"

    def spec(self, name: str, config: str, where: str = "inbox", **kw: Any) -> dict[str, Any]:
        self.n += 1
        job_id = "c%012x" % (0xABC000 + self.n)
        spec = {"schema": "gpuq.job/1", "job_id": job_id, "name": name, "queue_id": "q1", "attempt": 1,
                "task": "cls", "epochs": 2, "gpus": 1, "nodes": 1, "seed": None, "config": config,
                "bundle_sha": SHA, "entry": "payload/stub_train.py", "launcher": "python", "python": "",
                "verify": ["metrics"], "heartbeat_s": 1, "ckpt_interval_s": 600, "kill_grace_s": 2,
                "min_free_gb": 0, "scratch_gb": 0, "durable_dir": "", "resume_from": None,
                "spec_hash": "h" + job_id, "env": {}, "created_at": 1000.0 + self.n}
        spec.update(kw)
        tmp = self.root / where / (f".{job_id}.tmp")
        tmp.write_text(json.dumps(spec))
        os.rename(tmp, self.root / where / (job_id + ".json"))
        return spec

    def attempt(self, job_id: str, n: int = 1) -> Path:
        return self.root / "jobs" / job_id / "attempts" / str(n)

    def exit_of(self, job_id: str, n: int = 1) -> dict[str, Any] | None:
        return read_json(self.attempt(job_id, n) / "exit.json")

    def wait_exit(self, job_id: str, timeout: float = 30.0) -> dict[str, Any]:
        return wait_for(lambda: self.exit_of(job_id), timeout, "exit.json of " + job_id)

    def runs_of(self, job_id: str) -> list[dict[str, Any]]:
        if not self.runs.exists():
            return []
        recs = [json.loads(ln) for ln in self.runs.read_text().splitlines() if ln.strip()]
        return [r for r in recs if r["job"] == job_id]

    # the agent
    def cli_argv(self) -> list[str]:
        return [AGENT_PY, self.agent, "--root", str(self.root)]

    def cli(self, *args: str, env: dict[str, str] | None = None,
            timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run([AGENT_PY, self.agent, "--root", str(self.root), *args],
                              capture_output=True, text=True, timeout=timeout, env=env)

    def serve(self, slots: int = 2, idle: float = 30.0,
              env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        out = open(self.root / "serve.out", "ab")  # noqa: SIM115 (the child owns it)
        p = subprocess.Popen([AGENT_PY, self.agent, "--root", str(self.root), "serve",
                              "--idle-exit-s", str(idle), "--cpu-slots", str(slots)],
                             stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                             start_new_session=True, env=env)
        out.close()
        self.procs.append(p)
        return p

    def wait_agent(self, p: subprocess.Popen[bytes]) -> dict[str, Any]:
        return wait_for(lambda: (read_json(self.root / "agent.pid") or {}).get("pid") == p.pid
                        and read_json(self.root / "agent.pid"), 10, "agent.pid")

    def status(self) -> dict[str, Any]:
        r = self.cli("status", "--json")
        assert r.returncode == 0, r.stderr
        return json.loads(unframe(r.stdout)[0])

    def job_state(self, job_id: str) -> str:
        return next(j["state"] for j in self.status()["jobs"] if j["job_id"] == job_id)

    def cleanup(self) -> None:
        groups: set[int] = set()
        rec = read_json(self.root / "agent.pid")
        if isinstance(rec, dict) and start_ticks(rec["pid"]) == rec.get("start_ticks"):
            groups.add(rec["pgid"])
        for pg in self.root.glob("jobs/*/attempts/*/pgid"):
            r = read_json(pg)
            if isinstance(r, dict) and start_ticks(r["pgid"]) == r.get("start_ticks"):
                groups.add(r["pgid"])
        for p in self.procs:
            if p.poll() is None:
                groups.add(p.pid)  # started with start_new_session: pgid == pid
        for g in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(g, signal.SIGKILL)
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)


@pytest.fixture
def host(tmp_path: Path):
    h = Host(tmp_path / "root", tmp_path / "runs.jsonl")
    yield h
    h.cleanup()


def test_version_and_usage(host: Host) -> None:
    r = host.cli("version")
    assert r.returncode == 0 and r.stdout.strip() == protocol.PROTOCOL_VERSION
    assert host.cli("bogus").returncode == 64


def test_exactly_once_two_agents_gap_and_idle_exit(host: Host) -> None:
    gate = host.root / "gate"
    cfg = host.config("quick", sleep=0.3, wait_file=str(gate))
    a = host.serve(slots=1, idle=1.5)
    pid_rec = host.wait_agent(a)
    # the first job holds the agent's one slot until the gate opens: the agent is busy, never idle,
    # while a second agent and the detached form are turned away, however slowly they start
    specs = [host.spec(f"j{i}", cfg) for i in range(4)]
    wait_for(lambda: (host.attempt(specs[0]["job_id"]) / "launch.json").exists(), 10, "the first job launched")
    b = host.serve(slots=1, idle=1.5)
    assert b.wait(timeout=60) == 0
    assert f"agent already running (pid {a.pid})" in (host.root / "serve.out").read_text()
    r = host.cli("serve", "--detach")
    assert r.returncode == 0 and f"agent already running (pid {a.pid})" in r.stdout
    assert pid_rec["boot_id"] and pid_rec["start_ticks"]
    gate.touch()
    for s in specs:
        ex = host.wait_exit(s["job_id"])
        assert ex["wrapper_code"] == 0, ex
    for s in specs:
        assert len(host.runs_of(s["job_id"])) == 2  # one start + one end: ran exactly once
    # one slot: each job starts only after the previous wrapper wrote exit.json (how soon after is
    # measured by scripts/bench_idle_gap.py, not asserted here)
    for prev, nxt in itertools.pairwise(specs):
        ended = iso(host.exit_of(prev["job_id"])["ended_at"])
        launched = iso(read_json(host.attempt(nxt["job_id"]) / "launch.json")["time"])
        assert launched >= ended - 0.005
    # idle exit: the agent leaves on its own and releases pid + lock
    assert a.wait(timeout=60) == 0
    assert not (host.root / "agent.pid").exists()
    log = (host.root / "agent.log").read_text()
    assert "idle" in log and log.count("STARTING") == 4 and log.count("FINISHED") == 4
    assert "=== gpuq queue q1 done on" in log
    # the detached form starts a fresh agent, which finds nothing to do and idles out
    r = host.cli("serve", "--detach", "--idle-exit-s", "0.5", "--cpu-slots", "1")
    assert r.returncode == 0 and "agent started (pid" in r.stdout, r.stdout + r.stderr
    rec = read_json(host.root / "agent.pid")
    if rec:
        assert rec["pgid"] == rec["pid"]
    wait_for(lambda: not (host.root / "agent.pid").exists(), 10, "detached agent idle exit")


def test_idle_exit_picks_up_late_job(host: Host) -> None:
    """A job arriving while the agent is idle keeps it (or a successor) running."""
    cfg = host.config("late", sleep=0.1)
    a = host.serve(slots=1, idle=0.5)
    host.wait_agent(a)
    s = host.spec("late", cfg)
    assert host.wait_exit(s["job_id"])["wrapper_code"] == 0
    assert a.wait(timeout=10) == 0


def test_slot_packing_and_too_big(host: Host) -> None:
    cfg = host.config("pack", sleep=1.0)
    specs = [host.spec(f"g{g}", cfg, gpus=g) for g in (1, 2, 1, 3)]
    big = host.spec("big", cfg, gpus=5)
    t0 = time.time()
    a = host.serve(slots=4, idle=30)
    ex = host.wait_exit(big["job_id"], 5)
    assert ex["wrapper_code"] == 80 and ex["phase"] == "setup"
    assert "needs 5 slots and the host has 4" in ex["message"]
    assert time.time() - t0 < 3
    intervals = []
    for s in specs:
        e = host.wait_exit(s["job_id"])
        assert e["wrapper_code"] == 0, e
        launch = read_json(host.attempt(s["job_id"]) / "launch.json")
        assert len(launch["slots"]) == s["gpus"]
        assert launch["agent_pid"] == a.pid
        intervals.append((iso(launch["time"]), iso(e["ended_at"]), set(launch["slots"])))
    for t, _, _ in intervals:
        busy = [sl for (s0, s1, sl) in intervals if s0 <= t < s1]
        assert sum(len(sl) for sl in busy) <= 4
        for i, x in enumerate(busy):
            for y in busy[i + 1:]:
                assert not (x & y), "overlapping jobs share a slot"
    # 1+2+1 start together; the 3-slot job waits for the 2-slot one and one more (either 1-slot job: on a
    # loaded machine the second may end first)
    assert intervals[3][0] >= max(intervals[1][1], min(intervals[0][1], intervals[2][1])) - 0.05
    assert len(host.runs_of(big["job_id"])) == 0


def test_exit_codes_crash_kill9_passthrough_finalize(host: Host, tmp_path: Path) -> None:
    good, bad = tmp_path / "good.pt", tmp_path / "bad.pt"
    good.write_bytes(fake_checkpoint())
    bad.write_bytes(fake_checkpoint([1.0, 2.0]))  # a sound archive of a list: not a state dict
    jobs = {
        "crash": (host.spec("crash", host.config("crash", crash=True)), 1),
        "killed": (host.spec("killed", host.config("killed", sleep=0.2, kill_self=True)), 137),
        "seven": (host.spec("seven", host.config("seven", exit=7)), 7),
        "nometrics": (host.spec("nometrics", host.config("nometrics", no_metrics=True)), 82),
        "ok": (host.spec("ok", host.config("ok")), 0),
        "goodckpt": (host.spec("goodckpt", host.config("goodckpt", best_pt=str(good)), verify=["best_ckpt"]), 0),
        "badckpt": (host.spec("badckpt", host.config("badckpt", best_pt=str(bad)), verify=["best_ckpt"]), 82),
    }
    host.serve(slots=1, idle=30)
    for name, (s, code) in jobs.items():
        e = host.wait_exit(s["job_id"])
        assert e["wrapper_code"] == code, (name, e)
        assert e["job_id"] == s["job_id"] and e["attempt"] == 1 and e["durable"] == "disabled"
        assert set(e) >= {"trainer_code", "signal", "phase", "started_at", "ended_at", "last_step",
                          "last_epoch", "best_sha256", "message"}
    killed = host.exit_of(jobs["killed"][0]["job_id"])
    assert killed["signal"] == 9 and killed["wrapper_signal"] is None  # nobody signalled the wrapper
    assert verdicts.classify(killed["wrapper_code"], killed["trainer_code"], []) == "killed"  # retried
    assert host.exit_of(jobs["nometrics"][0]["job_id"])["phase"] == "finalize"
    badckpt = host.exit_of(jobs["badckpt"][0]["job_id"])
    assert badckpt["phase"] == "finalize" and badckpt["trainer_code"] == 0
    assert "best.pt: it does not hold a dict (a state dict) but EMPTY_LIST" in badckpt["message"], badckpt
    ok = host.exit_of(jobs["ok"][0]["job_id"])
    assert ok["phase"] == "finalize" and ok["trainer_code"] == 0 and ok["last_step"] is not None
    crash_log = (host.attempt(jobs["crash"][0]["job_id"]) / "job.log").read_text()
    assert crash_log.startswith("=== gpuq ") and "stub crash on purpose" in crash_log
    mem = (host.attempt(jobs["ok"][0]["job_id"]) / "mem.tsv").read_text().splitlines()
    assert mem[0].startswith("time\tcg_used_bytes") and len(mem) >= 2


def test_a_sigterm_to_the_wrapper_is_a_stop_whatever_the_trainer_exits(host: Host) -> None:
    """A preemption's SIGTERM reaches the wrapper; the rank exits 1 (its peer vanished), not 143: the
    exit record still says the wrapper got signal 15, and the controller calls it a stop."""
    s = host.spec("peer", host.config("peer", hang=True, term_exit=1), kill_grace_s=30)
    host.serve(slots=1, idle=30)
    wait_for(lambda: host.runs_of(s["job_id"]), 30, "the trainer started")  # its handler is installed
    wrapper = read_json(host.attempt(s["job_id"]) / "pgid")["pgid"]  # the wrapper leads its group
    os.kill(wrapper, signal.SIGTERM)
    e = host.wait_exit(s["job_id"])
    assert (e["wrapper_code"], e["trainer_code"], e["wrapper_signal"]) == (1, 1, 15), e
    assert "(wrapper got signal 15)" in e["message"]
    signalled = stops.wrapper_signal(exit_record(e))
    assert verdicts.classify(e["wrapper_code"], e["trainer_code"], [], wrapper_signal=signalled) == "stopped"
    assert verdicts.decide("stopped", 1, 2).action == "requeue"


def test_agent_kill9_restart_adopts_and_never_reruns(host: Host) -> None:
    rel_a = host.root.parent / "release_a"
    slow = host.spec("adopt", host.config("adopt", wait_file=str(rel_a)))
    doomed = host.spec("doomed", host.config("doomed", hang=True))
    a = host.serve(slots=2, idle=30)
    for s in (slow, doomed):
        wait_for(lambda s=s: (host.attempt(s["job_id"]) / "heartbeat").exists(), 15, "heartbeat")
    os.killpg(a.pid, signal.SIGKILL)
    a.wait(timeout=5)
    # while the agent is down: one job dies, one more is claimed but never launched, one queued
    rec = read_json(host.attempt(doomed["job_id"]) / "pgid")
    assert start_ticks(rec["pgid"]) == rec["start_ticks"]
    os.killpg(rec["pgid"], signal.SIGKILL)
    wait_for(lambda: host.job_state(doomed["job_id"]) == "dead", 10, "doomed job dead")
    assert host.job_state(slow["job_id"]) == "running"
    unlaunched = host.spec("unlaunched", host.config("unl", sleep=0.1), where="claimed")
    queued = host.spec("queued", host.config("queued", sleep=0.1))
    assert host.job_state(unlaunched["job_id"]) == "claimed"
    b = host.serve(slots=2, idle=30)
    host.wait_agent(b)
    assert host.wait_exit(unlaunched["job_id"])["wrapper_code"] == 0
    assert host.wait_exit(queued["job_id"])["wrapper_code"] == 0
    # the adopted job holds its slot until it finishes
    st = host.status()
    assert st["agent"] == {"alive": True, "pid": b.pid}
    assert st["slots"] == {"kind": "cpu", "total": 2, "free": 1}
    rel_a.touch()
    assert host.wait_exit(slow["job_id"])["wrapper_code"] == 0
    time.sleep(0.5)
    assert len(host.runs_of(slow["job_id"])) == 2  # started once, ended once
    assert len(host.runs_of(doomed["job_id"])) == 1  # started once, never re-run
    assert host.exit_of(doomed["job_id"]) is None
    st = host.status()
    states = {j["job_id"]: j["state"] for j in st["jobs"]}
    assert states == {slow["job_id"]: "exited", doomed["job_id"]: "dead", unlaunched["job_id"]: "exited",
                      queued["job_id"]: "exited"}
    assert st["slots"]["free"] == 2
    log = (host.root / "agent.log").read_text()
    assert "ADOPTED " + slow["job_id"] in log and "DEAD " + doomed["job_id"] in log


def test_a_trainer_that_ignores_sigterm_is_killed_after_the_grace_and_says_so(host: Host) -> None:
    """Only the wrapper is told to stop (as a preemption or Slurm's --signal tells it): after kill_grace_s
    it kills the trainer itself, and the exit record says so (signal 9), never "trained" (exit 82)."""
    stubborn = host.spec("stubborn", host.config("stubborn", hang=True, ignore_term=True), kill_grace_s=1)
    host.serve(slots=1, idle=30)
    wait_for(lambda: (host.attempt(stubborn["job_id"]) / "heartbeat").exists(), 15, "heartbeat")
    wrapper = json.loads((host.attempt(stubborn["job_id"]) / "pgid").read_text())["pgid"]  # the group's leader
    assert b"\x00wrap\x00" + stubborn["job_id"].encode() in Path(f"/proc/{wrapper}/cmdline").read_bytes()
    os.kill(wrapper, signal.SIGTERM)
    e = host.wait_exit(stubborn["job_id"], 15)
    assert (e["wrapper_code"], e["trainer_code"], e["signal"], e["wrapper_signal"]) == (137, -9, 9, 15), e
    assert e["message"] == "trainer killed by signal 9 (wrapper got signal 15)", e


def test_cancel_queued_and_running(host: Host) -> None:
    running = host.spec("hang", host.config("hang", hang=True))
    stubborn = host.spec("stubborn", host.config("stubborn", hang=True, ignore_term=True), kill_grace_s=1)
    queued = host.spec("queued", host.config("q", sleep=0.1), gpus=2)
    host.serve(slots=2, idle=30)
    for s in (running, stubborn):
        wait_for(lambda s=s: (host.attempt(s["job_id"]) / "heartbeat").exists(), 15, "heartbeat")
    assert host.job_state(queued["job_id"]) == "queued"
    r = host.cli("cancel", queued["job_id"])
    assert (r.returncode, r.stdout.strip()) == (0, "withdrawn")
    assert (host.root / "withdrawn" / (queued["job_id"] + ".json")).exists()
    r = host.cli("cancel", running["job_id"])
    assert (r.returncode, r.stdout.strip()) == (0, "killed"), r.stderr
    e = host.wait_exit(running["job_id"], 10)
    assert e["wrapper_code"] == 143 and e["signal"] == 15, e
    t0 = time.time()
    r = host.cli("cancel", stubborn["job_id"])
    assert (r.returncode, r.stdout.strip()) == (0, "killed"), r.stderr
    assert time.time() - t0 >= 0.9  # waited the grace before SIGKILL
    assert host.wait_exit(stubborn["job_id"], 10)["wrapper_code"] == 137
    r = host.cli("cancel", running["job_id"])
    assert (r.returncode, r.stdout.strip()) == (0, "not running")
    r = host.cli("cancel", "c000000000000")
    assert r.returncode == 1 and "unknown job" in r.stderr
    st = host.status()
    by_id = {j["job_id"]: j for j in st["jobs"]}
    assert by_id[queued["job_id"]]["state"] == "withdrawn"
    assert by_id[running["job_id"]]["cancel_requested"] is True
    assert by_id[running["job_id"]]["state"] == "exited"
    assert len(host.runs_of(queued["job_id"])) == 0


def test_status_shape_and_states(host: Host) -> None:
    queued = host.spec("q", host.config("q"))
    before = sorted(str(p) for p in host.root.rglob("*"))
    st = host.status()
    assert sorted(str(p) for p in host.root.rglob("*")) == before  # read-only: nothing written
    assert set(st) == {"schema", "protocol", "hostname", "root", "time", "boot_id", "uptime_s", "agent",
                       "slots", "gpus", "disk", "memory", "bundles", "jobs", "kernel"}
    assert set(st["kernel"]) - {"oom_kills"} == {"readable", "error", "cursor", "xids"}
    assert st["schema"] == "gpuq.status/1" and st["protocol"] == protocol.PROTOCOL_VERSION
    assert st["agent"] == {"alive": False, "pid": None} and st["bundles"] == [SHA]
    assert set(st["disk"]) == {"path", "total_bytes", "free_bytes", "used_pct", "inodes_total",
                               "inodes_free", "inodes_used_pct"}
    assert set(st["memory"]) == {"source", "used_bytes", "limit_bytes", "used_pct", "oom_kill"}
    assert st["memory"]["limit_bytes"] > 0 and st["disk"]["free_bytes"] > 0
    job = st["jobs"][0]
    assert set(job) == {"job_id", "name", "queue_id", "attempt", "state", "slots", "pgid", "group_alive",
                        "launched_at", "exit", "heartbeat", "heartbeat_age_s", "log_bytes", "log_mtime",
                        "ckpt", "cancel_requested", "progress", "run_ckpt_mtime", "run_metrics_mtime",
                        "gpu_util_pct"}
    assert (job["job_id"], job["state"], job["name"]) == (queued["job_id"], "queued", "q")
    # 100 exited jobs with checkpoints and heartbeats: every one reported with its state
    for i in range(100):
        s = host.spec(f"done{i}", "configs/x.json", where="claimed")
        adir = host.attempt(s["job_id"])
        adir.mkdir(parents=True)
        (adir / "launch.json").write_text(json.dumps({"time": "2024-01-01T00:00:00.000Z", "slots": [0]}))
        (adir / "pgid").write_text(json.dumps({"pgid": 999999, "start_ticks": 1, "boot_id": "x"}))
        (adir / "heartbeat").write_text(json.dumps({"step": 5, "epoch": 1}))
        (adir / "job.log").write_text("hello\n")
        (adir / "exit.json").write_text(json.dumps({"wrapper_code": 0}))
        ck = host.root / "jobs" / s["job_id"] / "ckpt"
        ck.mkdir()
        (ck / "LATEST").write_text(json.dumps({"file": "latest.pt", "step": 5}))
    st = host.status()  # how long this takes is measured by scripts/bench_agent_status.py
    done = [j for j in st["jobs"] if j["name"].startswith("done")]
    assert len(done) == 100 and all(j["state"] == "exited" for j in done)
    j = done[0]
    assert j["heartbeat"] == {"step": 5, "epoch": 1} and j["log_bytes"] == 6 and j["ckpt"]["step"] == 5
    assert j["exit"] == {"wrapper_code": 0} and j["group_alive"] is False and j["slots"] == [0]


def test_newer_spec_schema_refused(host: Host) -> None:
    s = host.spec("future", host.config("future"), schema="gpuq.job/2")
    ok = host.spec("present", host.config("present"))
    host.serve(slots=1, idle=30)
    e = host.wait_exit(s["job_id"], 10)
    assert e["wrapper_code"] == 80 and e["phase"] == "setup"
    assert e["message"] == ("job spec schema gpuq.job/2 is newer than this agent (gpuq.job/1); "
                            "upgrade the bundle")
    assert (host.root / "claimed" / (s["job_id"] + ".json")).exists()
    assert host.wait_exit(ok["job_id"])["wrapper_code"] == 0
    assert len(host.runs_of(s["job_id"])) == 0
    assert host.job_state(s["job_id"]) == "exited"


def test_trainer_environment_is_clean(host: Host) -> None:
    env = dict(os.environ, FOO="1", CUDA_DEVICE_ORDER="FASTEST_FIRST")
    no_seed = host.spec("noseed", host.config("env1", dump_env=True), env={"EXTRA": "a b'c"})
    seeded = host.spec("seeded", host.config("env2", dump_env=True), seed=7, epochs=3)
    host.serve(slots=2, idle=30, env=env)
    for s in (no_seed, seeded):
        assert host.wait_exit(s["job_id"])["wrapper_code"] == 0
    e1 = read_json(host.root / "jobs" / no_seed["job_id"] / "result" / "env.json")
    e2 = read_json(host.root / "jobs" / seeded["job_id"] / "result" / "env.json")
    assert "FOO" not in e1 and "CUDA_DEVICE_ORDER" not in e1
    assert "GPUQ_SEED" not in e1 and e2["GPUQ_SEED"] == "7"
    assert e1["CUDA_VISIBLE_DEVICES"] == "" and e1["GPUQ_DEVICE"] == "cpu"
    assert e1["PYTHONUNBUFFERED"] == "1" and int(e1["OMP_NUM_THREADS"]) >= 1
    assert e1["OMP_NUM_THREADS"] == e1["MKL_NUM_THREADS"]
    assert e1["EXTRA"] == "a b'c"
    assert e1["GPUQ_CONFIG"] == str(host.workdir / "configs" / "env1.json")
    assert e2["GPUQ_EPOCHS"] == "3" and e1["GPUQ_TASK"] == "cls" and e1["GPUQ_ATTEMPT"] == "1"
    assert e1["GPUQ_JOB_ID"] == no_seed["job_id"] and e1["GPUQ_JOB_NAME"] == "noseed"
    assert e1["GPUQ_RESUME_FROM"] == "" and e1["GPUQ_DURABLE_DIR"] == ""
    assert e1["GPUQ_HEARTBEAT"] == str(host.attempt(no_seed["job_id"]) / "heartbeat")
    assert e1["HF_HOME"].startswith(str(host.root / "cache"))
    allowed = {"PATH", "HOME", "LANG", "USER", "TMPDIR"}
    run_env = {}
    for line in (host.attempt(no_seed["job_id"]) / "run.env").read_text().splitlines():
        k, v = line.split("=", 1)
        run_env[k] = shlex.split(v)[0] if v else ""
    # PWD: set by the sh that bind-mounts the bundle read-only (as root), to the run dir
    assert set(e1) - set(run_env) <= allowed | {"LC_CTYPE", "PWD"}, set(e1) - set(run_env)
    assert run_env["EXTRA"] == "a b'c" and run_env["GPUQ_JOB_ID"] == no_seed["job_id"]
    start = host.runs_of(no_seed["job_id"])[0]
    run_dir = host.root / "jobs" / no_seed["job_id"] / "run"
    assert start["cwd"] == str(run_dir) and start["task"] == "cls" and start["epochs"] == 2
    assert e1["GPUQ_RUN_DIR"] == str(run_dir)
    assert e1["PYTHONPATH"].split(":")[0] == str(host.workdir)
    # libraries load their installed bytecode; nothing is compiled into the root or the read-only bundle
    assert e1["PYTHONDONTWRITEBYTECODE"] == "1" and "PYTHONPYCACHEPREFIX" not in e1
    assert not list((host.root / "bundles").rglob("*.pyc")) and not (host.root / "cache" / "pycache").exists()


def test_torchrun_two_processes_gloo(host: Host) -> None:
    s = host.spec("dist", host.config("dist"), launcher="torchrun", gpus=2, entry="payload/stub_dist.py",
                  python=sys.executable)
    host.serve(slots=2, idle=30)
    e = host.wait_exit(s["job_id"], 60)
    log = (host.attempt(s["job_id"]) / "job.log").read_text()
    assert e["wrapper_code"] == 0, log
    m = json.loads((host.root / "jobs" / s["job_id"] / "result" / "metrics.jsonl").read_text())
    assert m["sum"] == 3.0 and m["world"] == 2
    assert "torch.distributed.run --standalone --nnodes=1 --nproc-per-node=2" in log


def test_workers_in_other_sessions_do_not_outlive_the_attempt(host: Host, tmp_path: Path) -> None:
    """torchrun starts workers with start_new_session=True: killing the wrapper's group misses
    them.  The wrapper is a child subreaper and ends its whole descendant tree."""
    pid_file = tmp_path / "orphan.pid"
    spec = host.spec("orphan", host.config("orphan", orphan_pid_file=str(pid_file), sleep=0.3))
    host.serve(slots=1, idle=30)
    assert host.wait_exit(spec["job_id"], 30)["wrapper_code"] == 0
    orphan = int(pid_file.read_text())
    try:
        wait_for(lambda: not Path(f"/proc/{orphan}").exists() or
                 Path(f"/proc/{orphan}/stat").read_text().split(")")[1].split()[0] == "Z", 10, "orphan gone")
    finally:
        with contextlib.suppress(OSError):
            os.kill(orphan, signal.SIGKILL)  # only if the assertion failed: the sleeper is ours


LEFTOVER_TRAINER = """\
import json, os, subprocess, sys, time
cfg = json.load(open(sys.argv[sys.argv.index("--config") + 1]))
sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
# a child in the trainer's own process group (a data loader, a forgotten helper) ...
child = subprocess.Popen(sleeper, stdin=subprocess.DEVNULL)
# ... and an escapee: double-forked into a session of its own, orphaned at once
spawn = ("import subprocess as s; p = s.Popen(%r, start_new_session=True, stdin=s.DEVNULL, stdout=s.DEVNULL); "
         "print(p.pid)")
escapee = int(subprocess.run([sys.executable, "-c", spawn % (sleeper,)], stdout=subprocess.PIPE, check=True).stdout)
with open(cfg["pids_file"] + ".tmp", "w") as f:
    json.dump({"trainer": os.getpid(), "child": child.pid, "escapee": escapee}, f)
os.replace(cfg["pids_file"] + ".tmp", cfg["pids_file"])
while cfg.get("hang"):
    time.sleep(0.1)
sys.exit(0)
"""


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def _leftover_job(host: Host, tmp_path: Path, name: str, **cfg: Any) -> tuple[dict[str, Any], Path]:
    (host.root / "bundles" / SHA / "payload" / "leftover_train.py").write_text(LEFTOVER_TRAINER)
    pids_file = tmp_path / f"{name}.pids.json"
    spec = host.spec(name, host.config(name, pids_file=str(pids_file), **cfg), entry="payload/leftover_train.py",
                     verify=[])
    return spec, pids_file


def _kill_leftovers(pids: dict[str, int]) -> None:
    """Only when an assertion failed: the sleepers are ours (checked against nothing else alive)."""
    for pid in pids.values():
        if not _gone(pid):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def test_children_left_behind_by_a_finished_trainer_are_killed(host: Host, tmp_path: Path) -> None:
    """A trainer exits 0 leaving a child in its group and an escapee in another session: both hold
    (GPU) memory and must not outlive the job."""
    spec, pids_file = _leftover_job(host, tmp_path, "leaver")
    host.serve(slots=1, idle=30)
    assert host.wait_exit(spec["job_id"], 30)["wrapper_code"] == 0
    pids = json.loads(pids_file.read_text())
    try:
        wait_for(lambda: _gone(pids["child"]) and _gone(pids["escapee"]), 10, "leftovers gone")
    finally:
        _kill_leftovers(pids)


@pytest.mark.parametrize("adopted", [False, True], ids=["own-wrapper", "adopted-wrapper"])
def test_agent_kills_what_a_dead_wrapper_left_behind(host: Host, tmp_path: Path, adopted: bool) -> None:
    """The wrapper itself is SIGKILLed (OOM killer, a stray kill) while its trainer, the trainer's child
    and an escapee in another session run on.  The agent ends the attempt: it kills the rest of the
    recorded group (boot id and group identity checked) and every process carrying the attempt's own
    GPUQ_LOG, then frees the slot.  adopted: the agent that sees it is a restarted one."""
    spec, pids_file = _leftover_job(host, tmp_path, "orphaned", hang=True)
    other = host.spec("next", host.config("next", sleep=0.1))
    a = host.serve(slots=1, idle=30)
    wait_for(pids_file.exists, 20, "trainer pids")
    pids = json.loads(pids_file.read_text())
    try:
        rec = read_json(host.attempt(spec["job_id"]) / "pgid")
        assert start_ticks(rec["pgid"]) == rec["start_ticks"]
        if adopted:
            os.killpg(a.pid, signal.SIGKILL)  # the agent's own group: the attempt runs on
            a.wait(timeout=5)
            b = host.serve(slots=1, idle=30)
            host.wait_agent(b)
            wait_for(lambda: "ADOPTED " + spec["job_id"] in (host.root / "agent.log").read_text(), 10, "adoption")
        os.kill(rec["pgid"], signal.SIGKILL)  # the wrapper alone
        wait_for(lambda: all(_gone(p) for p in pids.values()), 15, "trainer, child and escapee gone")
        log = (host.root / "agent.log").read_text()
        assert f"LEFTOVERS {spec['job_id']} a1: killed" in log
        # the slot is free again: the next job runs
        assert host.wait_exit(other["job_id"], 20)["wrapper_code"] == 0
        if adopted:
            assert host.exit_of(spec["job_id"]) is None and host.job_state(spec["job_id"]) == "dead"
        else:
            assert host.exit_of(spec["job_id"])["wrapper_code"] == 137
    finally:
        _kill_leftovers(pids)
