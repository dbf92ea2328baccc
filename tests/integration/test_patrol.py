"""The health patrol on real namespace SSH hosts: each rule driven by a real condition.

A job that sleeps without heartbeats (stalled), a job whose group is killed -9 (dead), a data dir
on a small tmpfs filled past 95 %, an Xid 79 in the host's kernel log, a metrics file with NaN, a
job that finishes far under its estimate, a host whose sshd stops; and a healthy 10-job sweep that
must raise no alarm.  Findings are read back from the ledger (events with a severity), actions
from the jobs' states and attempts.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from orchestrator.core.states import HoldKind
from orchestrator.ledger import Ledger
from scripts.bench_project import TINY_CONFIG
from tests.conftest import wait_for
from tests.support.gpuquser import User
from tests.support.testhosts import HostFarm
from tests.support.webhook import webhook

pytestmark = pytest.mark.integration

# A stand-in trainer (stdlib only) honouring the payload contract; its config says what to do:
#   mode: ok | hang1 (attempt 1 beats once, then sleeps forever) | nan (logs a NaN loss, then trains on: billing)
#   duration_s: how long "ok" trains, beating every 0.5 s
SCRIPTED = '''\
import argparse, json, math, os, sys, time
ap = argparse.ArgumentParser()
ap.add_argument("--config"); ap.add_argument("--task"); ap.add_argument("--epochs", type=int)
args = ap.parse_args()
cfg = dict(line.split(":", 1) for line in open(args.config).read().splitlines() if ":" in line)
mode, duration = cfg["mode"].strip(), float(cfg.get("duration_s", "1"))
result = os.environ["GPUQ_RESULT_DIR"]
os.makedirs(result, exist_ok=True)
attempt = int(os.environ.get("GPUQ_ATTEMPT", "1"))

def beat(step, loss=0.5, phase="train"):
    tmp = os.environ["GPUQ_HEARTBEAT"] + ".tmp"
    with open(tmp, "w") as fh:
        json.dump({"time": time.time(), "step": step, "total_steps": 10, "epoch": 1, "epochs": 1,
                   "loss": loss, "lr": 0.1, "phase": phase, "steps_per_s": 2.0}, fh)
    os.replace(tmp, os.environ["GPUQ_HEARTBEAT"])

def metric(line):
    with open(os.path.join(result, "metrics.jsonl"), "a") as fh:
        fh.write(json.dumps(line) + "\\n")

print("attempt", attempt, "mode", mode, flush=True)
if mode == "hang1" and attempt == 1:
    beat(1)
    time.sleep(3600)
if mode == "nan":
    beat(1)
    metric({"kind": "train", "step": 1, "epoch": 1, "loss": 0.9, "lr": 0.1, "time": time.time()})
    metric({"kind": "train", "step": 2, "epoch": 1, "loss": float("nan"), "lr": 0.1, "time": time.time()})
    print("step 2 loss=nan", flush=True)
    time.sleep(3600)  # a trainer that does not stop itself: gpuq ends it
    sys.exit(1)
t0 = time.time()
step = 0
while time.time() - t0 < duration:
    step += 1
    beat(step)
    time.sleep(0.5)
metric({"kind": "eval", "step": step, "epoch": 1, "val_loss": 0.1, "val_acc": 0.9, "time": time.time()})
beat(step, phase="done")
'''


@pytest.fixture(scope="module")
def farm(host_farm_module: Callable[..., HostFarm]) -> HostFarm:
    return host_farm_module(n=2, gpus=2)


@pytest.fixture
def user(farm: HostFarm, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[User]:
    home = tmp_path / "gpuq-home"
    home.mkdir()
    u = User(farm, home, f"/root/gpuq-{request.node.name[:40]}")
    # generous stall thresholds (a loaded 2-core CI box starts torch slowly); the stall test lowers them
    u.env.update({"GPUQ_STALL_AFTER_S": "60", "GPUQ_STARTUP_GRACE_S": "60", "GPUQ_PATROL_MIN_INTERVAL_S": "0.5",
                  "GPUQ_PREFLIGHT_SAMPLES": "1", "GPUQ_KILL_GRACE_S": "2", "GPUQ_PATROL_INTERVAL_S": "1"})
    yield u
    u.stop_everything()


def _scripted_project(tmp_path: Path, cells: dict[str, str], lines: list[str]) -> Path:
    work = tmp_path / "project"
    (work / "configs").mkdir(parents=True, exist_ok=True)
    (work / "train_stub.py").write_text(SCRIPTED)
    (work / "gpuq.toml").write_text('entry = "train_stub.py"\nlauncher = "python"\nverify = ["metrics"]\n')
    for name, body in cells.items():
        (work / "configs" / f"{name}.yaml").write_text(body)
    (work / "queue.txt").write_text("\n".join(lines) + "\n")
    return work / "queue.txt"


def _ledger(user: User) -> Ledger:
    return Ledger(user.home / "ledger.db")


def _findings(user: User, *, rule: str | None = None) -> list[tuple[str, str, str, str]]:
    """(severity, rule, subject, message) of every finding, oldest first."""
    ledger = _ledger(user)
    try:
        rows = ledger.alerts(limit=1000)
    finally:
        ledger.close()
    out = [(e.severity, e.rule, e.subject, e.message) for e in reversed(rows)]
    return [f for f in out if rule is None or f[1] == rule]


def _alarms(user: User) -> list[tuple[str, str, str, str]]:
    return [f for f in _findings(user) if f[0] in ("warn", "escalate")]


def _watch(user: User, timeout: float = 240) -> str:
    out = user.gpuq("watch", "--interval", "1", timeout=timeout)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_a_healthy_ten_job_sweep_raises_no_alarm(user: User, tmp_path: Path) -> None:
    user.add_hosts()
    queue = _scripted_project(tmp_path, {"ok": "mode: ok\nduration_s: 2\n"},
                              [f"configs/ok.yaml classify 1 name=ok{i}" for i in range(10)])
    submitted = user.gpuq("submit", str(queue))
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    watched = _watch(user)
    assert "done" in watched and watched.count("PATROL g0") >= 2 and watched.count("PATROL g1") >= 2
    doc = user.status_doc()
    assert {j["state"] for j in doc["jobs"]} == {"SUCCEEDED"}
    # no retry, no failure: an attempt before the last is only ever an unstarted job that work stealing
    # moved to a host that fell idle first (docs/architecture.md: a move is attempt n+1)
    ledger = _ledger(user)
    try:
        earlier = [a for j in ledger.jobs() for a in ledger.attempts(j.id) if a.number < j.attempt_count]
    finally:
        ledger.close()
    assert all(a.state == "KILLED" and a.started_at is None and "(work stealing)" in a.message
               for a in earlier), [(a.job_id, a.number, a.state, a.message) for a in earlier]
    assert _alarms(user) == []
    preflights = _findings(user, rule="preflight")
    assert {(f[0], f[2]) for f in preflights} == {("info", "g0"), ("info", "g1")}, preflights
    assert any(f[1] == "sweep_done" for f in _findings(user))


def test_a_stalled_job_is_killed_and_resumed_as_attempt_two(user: User, tmp_path: Path) -> None:
    user.env.update({"GPUQ_STALL_AFTER_S": "4", "GPUQ_STARTUP_GRACE_S": "3"})
    user.add_hosts(1)
    queue = _scripted_project(tmp_path, {"hang": "mode: hang1\nduration_s: 1\n"},
                              ["configs/hang.yaml classify 1 name=hangs"])
    assert user.gpuq("submit", str(queue)).returncode == 0
    watched = _watch(user)
    assert "stalled" in watched and "requeued with resume (retry 1 of 2)" in watched, watched
    ledger = _ledger(user)
    try:
        (job,) = ledger.jobs()
        first, second = ledger.attempts(job.id)
    finally:
        ledger.close()
    assert job.state == "SUCCEEDED" and job.attempt_count == 2
    assert first.state == "LOST" and second.exit_code == 0
    assert [f[0] for f in _findings(user, rule="stalled")] == ["escalate", "info"]  # opened, then cleared
    # where it hung was saved before the kill (py-spy beside the hosts' interpreter, else /proc)
    stacks = (user.host_dir(0) / f"jobs/{job.id}/attempts/1/stacks.txt").read_text()
    # the hung trainer's stack, the wrapper left out (a short-lived helper the wrapper started may be caught too)
    assert re.search(r"and its descendants: \d+ process\(es\)", stacks) and "train_stub.py --config" in stacks, stacks
    assert "gpuq_wrap" not in stacks.split("left out", 1)[1], stacks
    assert first.message == "stalled: killed group of attempt 1 (killed); where it hung: attempts/1/stacks.txt"
    # the hung attempt's group is gone: nothing of attempt 1 still runs on the host
    pgid = json.loads((user.host_dir(0) / f"jobs/{job.id}/attempts/1/pgid").read_text())["pgid"]
    assert str(pgid) not in user.farm.ssh(0, "sh", "-c", "ps -eo pgid= | sort -u").stdout.split()


def test_a_job_killed_minus_nine_resumes_from_its_checkpoint(user: User, tmp_path: Path) -> None:
    user.add_hosts(1)
    work = tmp_path / "project"
    (work / "configs").mkdir(parents=True)
    slow = TINY_CONFIG.replace("n_train: 256", "n_train: 2048").replace("ckpt_every_steps: 0", "ckpt_every_steps: 8")
    (work / "configs" / "tiny.yaml").write_text(slow)
    (work / "queue.txt").write_text("configs/tiny.yaml classify 4 name=victim gpus=1\n")
    assert user.gpuq("submit", str(work / "queue.txt")).returncode == 0
    root = user.host_dir(0)

    def checkpointed() -> bool:
        pointers = list(root.glob("jobs/*/ckpt/LATEST"))
        return bool(pointers) and json.loads(pointers[0].read_text()).get("step", 0) >= 8

    assert wait_for(checkpointed, timeout=180, interval=0.5), user.logs_of_unfinished()
    (pgid_file,) = root.glob("jobs/*/attempts/1/pgid")
    pgid = json.loads(pgid_file.read_text())["pgid"]
    user.farm.ssh(0, "kill", "-9", f"-{pgid}")
    watched = _watch(user, timeout=400)
    assert "requeued with resume" in watched, watched
    ledger = _ledger(user)
    try:
        (job,) = ledger.jobs()
        first, second = ledger.attempts(job.id)
    finally:
        ledger.close()
    assert job.state == "SUCCEEDED" and first.state == "LOST" and second.exit_code == 0
    log = (root / f"jobs/{job.id}/attempts/2/job.log").read_text()
    resumed = [line for line in log.splitlines() if "GPUQ_RESUMED" in line]
    assert resumed and int(resumed[0].split("step=")[1].split()[0]) >= 8, log[-2000:]
    assert any(f[1] in ("dead", "rebooted") or "vanished" in f[3] for f in _findings(user)) or "vanished" in watched


def test_nan_loss_ends_the_attempt_never_retried_and_reaches_the_webhook(user: User, tmp_path: Path) -> None:
    with webhook() as (url, received):
        user.env["GPUQ_WEBHOOK_URL"] = url
        user.add_hosts(1)
        queue = _scripted_project(tmp_path, {"nan": "mode: nan\n"}, ["configs/nan.yaml classify 1 name=diverges"])
        assert user.gpuq("submit", str(queue)).returncode == 0
        watched = _watch(user)
    ledger = _ledger(user)
    try:
        (job,) = ledger.jobs()
        (attempt,) = ledger.attempts(job.id)
    finally:
        ledger.close()
    assert job.state == "FAILED" and job.attempt_count == 1, watched
    assert attempt.message.startswith("divergence: non-finite loss=nan at step 2; gpuq ended attempt 1 (killed)")
    nan = _findings(user, rule="nan")
    assert len(nan) == 1 and nan[0][0] == "escalate" and "loss=nan" in nan[0][3]
    assert "divergence" in watched
    events = [m.get("event") for m in received]
    assert "escalation" in events and "sweep_done" in events, received
    assert all("hook" not in json.dumps(m) for m in received)  # the URL never travels in a message


def test_a_full_data_disk_holds_the_host_until_space_is_freed(user: User, tmp_path: Path) -> None:
    user.env["GPUQ_MIN_FREE_GB"] = "0"  # an 8 MB data dir: no gate in GB, only the patrol's percentages
    user.add_hosts()
    small = user.remote_root
    user.farm.ssh(0, "sh", "-c", f"mkdir -p {small} && mount -t tmpfs -o size=8m tmpfs {small}")
    try:
        assert user.gpuq("doctor", "g0").returncode == 0  # places the agent (the bare payload) there
        user.farm.ssh(0, "sh", "-c", f"dd if=/dev/zero of={small}/filler bs=1k count=$(( $(df -k --output=avail "
                                     f"{small} | tail -1) - 100 )) 2>/dev/null; sync")
        patrolled = user.gpuq("patrol")
        assert patrolled.returncode == 0, patrolled.stderr
        assert "ESCALATE disk" in patrolled.stdout, patrolled.stdout
        hosts = {h.name: h for h in _hosts(user)}
        assert hosts["g0"].hold is HoldKind.DISK and hosts["g0"].hold_text.startswith("disk: ")
        queue = _scripted_project(tmp_path, {"ok": "mode: ok\nduration_s: 1\n"},
                                  ["configs/ok.yaml classify 1 name=one"])
        assert user.gpuq("submit", str(queue)).returncode == 0
        assert {j["host"] for j in user.status_doc()["jobs"]} == {"g1"}  # the held host got nothing
        user.farm.ssh(0, "rm", "-f", f"{small}/filler")
        again = user.gpuq("patrol")
        assert "ESCALATE disk" not in again.stdout
        assert not {h.name: h for h in _hosts(user)}["g0"].held
        assert [f[0] for f in _findings(user, rule="disk")] == ["escalate", "info"]
    finally:
        user.stop_everything()
        user.farm.ssh(0, "sh", "-c", f"umount {small} || umount -l {small}; true")


def _hosts(user: User) -> list:  # type: ignore[type-arg]
    ledger = _ledger(user)
    try:
        return ledger.hosts()
    finally:
        ledger.close()


def test_an_unreachable_host_is_reported_backed_off_and_cleared(user: User, farm: HostFarm) -> None:
    user.add_hosts()
    assert user.gpuq("doctor").returncode == 0
    farm.stop_sshd(1)
    try:
        first = user.gpuq("patrol")
        assert "PATROL g1 unreachable since" in first.stdout and "WARN" in first.stdout, first.stdout
        assert "PATROL g0 idle" in first.stdout
        row = {h.name: h for h in _hosts(user)}["g1"]
        assert row.probe_failures == 1 and row.next_probe_at is not None and row.unreachable_since is not None
    finally:
        farm.start_sshd(1)
    again = user.gpuq("patrol")
    assert "PATROL g1 idle" in again.stdout, again.stdout
    assert [f[0] for f in _findings(user, rule="unreachable")] == ["warn", "info"]


def test_early_finish_is_a_warning(user: User, tmp_path: Path) -> None:
    user.add_hosts(1)
    queue = _scripted_project(tmp_path, {"ok": "mode: ok\nduration_s: 1\n"},
                              ["configs/ok.yaml classify 1 name=quick est_min=2"])
    assert user.gpuq("submit", str(queue)).returncode == 0
    _watch(user)
    early = _findings(user, rule="early_finish")
    assert len(early) == 1 and early[0][0] == "warn" and "quick" in early[0][3]


def test_xid_79_in_the_kernel_log_marks_the_host_unhealthy(user: User, farm: HostFarm) -> None:
    user.add_hosts()
    assert user.gpuq("doctor").returncode == 0
    farm.append_kernel_log(0, "NVRM: Xid (PCI:0000:3b:00): 79, pid=0, name=python, GPU has fallen off the bus.")
    try:
        patrolled = user.gpuq("patrol")
        assert "ESCALATE xid" in patrolled.stdout, patrolled.stdout
        row = {h.name: h for h in _hosts(user)}["g0"]
        assert row.health == "fail" and row.hold is HoldKind.UNHEALTHY
        again = user.gpuq("patrol")
        assert "xid" not in again.stdout  # the cursor: the same kernel line is reported once
        doctor = user.gpuq("doctor", "g0")
        assert doctor.returncode == 3 and "FAIL" in doctor.stdout
    finally:
        farm.clear_kernel_log(0)


def test_reap_lists_a_vram_zombie_and_force_kills_it(user: User, farm: HostFarm) -> None:
    user.env.update({"GPUQ_REAP_MIN_AGE_S": "0", "GPUQ_REAP_RESAMPLE_S": "1"})
    user.add_hosts(1)
    zombie = farm.hold_gpu_device(0, 0)  # holds /dev/nvidia0 open; the fake nvidia-smi does not list it

    def alive() -> bool:  # the pid as host 0 sees it
        return farm.ssh(0, "sh", "-c", f"kill -0 {zombie} 2>/dev/null").returncode == 0

    try:
        dry = user.gpuq("reap", "g0")
        assert dry.returncode == 0, dry.stdout + dry.stderr
        assert "1 VRAM zombie candidate" in dry.stdout and str(zombie) in dry.stdout, dry.stdout
        assert "dry run: nothing killed" in dry.stdout and alive()
        refused = user.gpuq("reap", "g0", "--force")  # no terminal to confirm on: refused, nothing killed
        assert refused.returncode == 2 and "--yes" in refused.stderr and alive()
        forced = user.gpuq("reap", "g0", "--force", "--yes")
        assert forced.returncode == 0, forced.stdout + forced.stderr
        assert f"{zombie}:" in forced.stdout
        assert wait_for(lambda: not alive(), timeout=20)
        assert "clean" in user.gpuq("reap", "g0").stdout
    finally:
        farm.release_gpu_device(0, zombie)
