"""A rented host is untrusted (docs/security.md): a real namespace SSH host whose agent is replaced
by a hostile stand-in, beside a healthy host.  Whatever the stand-in prints, `gpuq status` marks that
host "protocol error: ...", finishes the tick for the healthy host, changes nothing outside
$GPUQ_HOME, and stays within bounded memory and disk.  Shell start-up noise around a real document
is ignored and said once."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.core import protocol
from scripts.bench_project import TINY_CONFIG
from tests.conftest import ROOT, wait_for
from tests.support.gpuquser import User
from tests.support.lightproject import light_config, light_project
from tests.support.testhosts import HostFarm

pytestmark = pytest.mark.integration

MAX_RSS_KIB = 1024 * 1024  # the controller's peak memory while reading hostile answers
FLOOD_BYTES = 8 * 1024 * 1024

# The stand-in: reads its mode from a file beside it and answers every verb with a crafted document;
# mode "noise" wraps the real agent's answer in shell start-up chatter.
STAND_IN = r'''
import os, subprocess, sys
here = os.path.dirname(os.path.abspath(__file__))
mode = open(os.path.join(here, "hostile_mode")).read().strip()
docs = {
    "traversal": '{"schema": "gpuq.status/1", "slots": {"kind": "gpu", "total": 2, "free": 2}, "jobs": ['
                 '{"job_id": "../../decoy", "attempt": 1, "state": "exited", "exit": {"wrapper_code": 0},'
                 ' "ckpt": {"file": "authorized_keys", "step": 9, "sha256": "' + "0" * 64 + '"}},'
                 ' {"job_id": "cf0reign00001", "attempt": 1, "state": "queued"}]}',
    "list": "[]",
    "no_job_id": '{"schema": "gpuq.status/1", "jobs": [{"state": "running", "attempt": 1}]}',
    "types": '{"schema": "gpuq.status/1", "slots": {"total": "lots"}, "jobs": "x"}',
    "deep": "[" * 200000 + "]" * 200000,
    "huge_slots": '{"schema": "gpuq.status/1", "slots": {"kind": "gpu", "total": 1000000000000, '
                  '"free": 1000000000000}, "jobs": []}',
    # a job its agent says it retried 2,000 times by itself (the real agent reports at most 20)
    "retry_chain": '{"schema": "gpuq.status/1", "jobs": [{"job_id": "cf0reign00001", "attempt": 2001, '
                   '"state": "running", "host_retried": [' + ", ".join(
                       '{"attempt": %d, "class": "killed", "exit": {"wrapper_code": 137}}' % k
                       for k in range(1, 2001)) + ']}]}',
}
if mode == "flood":
    chunk = "A" * 65536
    for _ in range(FLOOD_BYTES // 65536):
        sys.stdout.write(chunk)
    sys.exit(0)
if mode == "endless":  # past the transport's bound on command output (docs/security.md)
    chunk = "B" * 65536
    while True:
        sys.stdout.write(chunk)
if mode == "noise":
    real = subprocess.run([sys.executable, os.path.join(here, "gpuq_agent_real.py")] + sys.argv[1:],
                          stdout=subprocess.PIPE, check=False)
    sys.stdout.write("hi from ~/.bashrc\n(base) conda initialised\n")
    sys.stdout.flush()
    sys.stdout.buffer.write(real.stdout)
    sys.stdout.write("logout banner\n")
    sys.exit(real.returncode)
print(docs[mode])
'''.replace("FLOOD_BYTES", str(FLOOD_BYTES))

HOSTILE_MODES = ("traversal", "list", "no_job_id", "types", "deep", "huge_slots", "retry_chain", "flood")


@pytest.fixture(scope="module")
def farm(host_farm_module: Callable[..., HostFarm]) -> HostFarm:
    return host_farm_module(n=2, gpus=2)



def _tree(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(path.rglob("*"))}


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _status(user: User) -> tuple[subprocess.CompletedProcess[str], int]:
    """`gpuq status --json` as a user runs it, and its peak resident memory (KiB)."""
    code = ("import atexit, resource, runpy, sys\n"
            "atexit.register(lambda: print('MAXRSS', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,"
            " file=sys.stderr))\n"
            "sys.argv = ['gpuq', 'status', '--json']\n"
            "runpy.run_module('orchestrator', run_name='__main__')\n")
    env = {**os.environ, **user.env}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env,
                          cwd=ROOT, check=False)
    rss = [int(line.split()[1]) for line in done.stderr.splitlines() if line.startswith("MAXRSS ")]
    return done, rss[-1] if rss else 0


def test_a_hostile_agent_is_a_protocol_error_of_its_host_only(user: User, farm: HostFarm, tmp_path: Path) -> None:
    decoy = tmp_path / "decoy"  # where "../../decoy" from $GPUQ_HOME/checkpoints would land
    (decoy / ".ssh").mkdir(parents=True)
    (decoy / ".ssh" / "id_ed25519").write_text("secret key\n")
    (decoy / "config").write_text("Host *\n")
    before = _tree(decoy)
    user.add_hosts(2)
    # the light stdlib trainer (tests/support/lightproject.py): what is under test is the controller
    queue = light_project(tmp_path, {"tiny": light_config(steps=12, step_s=0.5)},
                          [f"configs/tiny.yaml classify 1 name=j{i} gpus=2" for i in range(2)])
    submitted = user.gpuq("submit", str(queue))
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    jobs = user.status_doc()["jobs"]
    on_g1 = [j["id"] for j in jobs if j["host"] == "g1"]
    assert on_g1 and any(j["host"] == "g0" for j in jobs), jobs

    bundles = [p for p in (user.host_dir(0) / protocol.BUNDLES_DIR).iterdir() if not p.name.startswith(".")]
    agent_dir = (bundles[0] / protocol.AGENT_ENTRY).parent
    (agent_dir / "gpuq_agent.py").rename(agent_dir / "gpuq_agent_real.py")
    (agent_dir / "gpuq_agent.py").write_text(STAND_IN)
    mode_file = agent_dir / "hostile_mode"

    for mode in HOSTILE_MODES:
        mode_file.write_text(mode)
        home_before = _du(user.home)
        done, rss = _status(user)
        assert done.returncode == 0, f"{mode}: {done.stderr[-2000:]}"
        assert "Traceback" not in done.stderr, f"{mode}: {done.stderr[-2000:]}"
        doc = json.loads(done.stdout)
        hosts = {h["name"]: h for h in doc["hosts"]}
        if mode == "traversal":  # a well-formed document: its forged and foreign jobs are ignored
            # (no alert of its own: a job id the ledger never placed there may be another controller's;
            # a "protocol" alert shows here only when this tick also collected g0's finished jobs, which
            # the stand-in answers with garbage, and whether they finished before now is timing)
            assert hosts["g0"]["reachable"], hosts["g0"]
        else:
            assert hosts["g0"]["error"].startswith("protocol error: "), (mode, hosts["g0"])
            assert any(a["rule"] == "protocol" and a["subject"] == "g0" for a in doc["alerts"]), (mode, doc["alerts"])
        assert hosts["g1"]["reachable"] and hosts["g1"]["error"] == "", (mode, hosts["g1"])  # its tick went on
        assert not any(j["id"] in ("../../decoy", "cf0reign00001") for j in doc["jobs"])
        assert _tree(decoy) == before, mode  # nothing outside $GPUQ_HOME changed
        assert rss < MAX_RSS_KIB, (mode, rss)
        assert _du(user.home) - home_before < 4 * 1024 * 1024, mode  # the answer was not stored
    # a host that claimed 10**12 slots left nothing behind that a later plan sizes a list by
    planned = user.gpuq("submit", "--dry-run", str(queue))
    assert planned.returncode == 0 and "Traceback" not in planned.stderr, planned.stdout + planned.stderr

    # an answer without end: the transport stops reading at its bound, the host is unreachable this tick
    mode_file.write_text("endless")
    done, rss = _status(user)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    hosts = {h["name"]: h for h in json.loads(done.stdout)["hosts"]}
    assert "printed more than" in hosts["g0"]["error"], hosts["g0"]
    assert hosts["g1"]["reachable"] and hosts["g1"]["error"] == "", hosts["g1"]
    assert rss < MAX_RSS_KIB, rss
    assert _tree(decoy) == before

    # the healthy host's job went on to the end while host 0 answered garbage
    assert wait_for(lambda: all(j["state"] == "SUCCEEDED" for j in user.status_doc()["jobs"] if j["id"] in on_g1),
                    timeout=300, interval=1.0), user.status_doc()

    # shell start-up chatter around a real document: ignored, said once, the host is fine again
    mode_file.write_text("noise")
    done, _ = _status(user)
    assert done.returncode == 0, done.stderr[-2000:]
    hosts = {h["name"]: h for h in json.loads(done.stdout)["hosts"]}
    assert hosts["g0"]["reachable"] and hosts["g0"]["error"] == "", hosts["g0"]
    warnings = [line for line in done.stderr.splitlines() if "shell start-up" in line]
    assert len(warnings) == 1 and "g0" in warnings[0], done.stderr[-2000:]
    assert _tree(decoy) == before

    # the real thing: the real agent again, and a login shell that talks (~/.bashrc on host 0)
    (agent_dir / "gpuq_agent_real.py").replace(agent_dir / "gpuq_agent.py")
    bashrc = farm.hosts[0].root_dir / "root" / ".bashrc"
    saved = bashrc.read_bytes() if bashrc.exists() else None
    bashrc.write_text("echo hi\necho '(base) conda initialised'\n")
    try:
        done, _ = _status(user)
    finally:
        if saved is None:
            bashrc.unlink()
        else:
            bashrc.write_bytes(saved)
    assert done.returncode == 0, done.stderr[-2000:]
    hosts = {h["name"]: h for h in json.loads(done.stdout)["hosts"]}
    assert hosts["g0"]["reachable"] and hosts["g0"]["error"] == "", hosts["g0"]
    assert [line for line in done.stderr.splitlines() if "shell start-up" in line and "g0" in line], done.stderr


BOOM_MARKER = "gpuq-pwned-by-a-checkpoint"


def _hostile_archive(marker: Path) -> bytes:
    """A torch-format checkpoint archive whose pickle runs `touch MARKER` when unpickled."""
    import io
    import pickle
    import zipfile

    class Boom:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, (f"touch {marker}",))

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("archive/data.pkl", pickle.dumps({"model": Boom(), "step": 999}, protocol=2))
        zf.writestr("archive/version", "3\n")
    return buf.getvalue()


def test_a_hostile_checkpoint_is_refused_and_never_kept_for_another_host(user: User, farm: HostFarm,
                                                                          tmp_path: Path) -> None:
    """Issue: a checkpoint shipped home from host A is pushed to host B on resume.  Host A turns hostile
    mid-run and offers a checkpoint whose pickle would run a command: the controller reads its opcodes
    only, refuses it with a finding naming the host, keeps the last sound copy (the one a resume would
    push), and nothing runs or changes outside $GPUQ_HOME."""
    marker = Path("/tmp") / BOOM_MARKER
    marker.unlink(missing_ok=True)
    decoy = tmp_path / "decoy"
    (decoy / ".ssh").mkdir(parents=True)
    (decoy / ".ssh" / "id_ed25519").write_text("secret key\n")
    before = _tree(decoy)
    user.env["GPUQ_SHIP_CHECKPOINTS"] = "always"  # the namespace hosts stand in for rented ones
    user.add_hosts(2)
    work = tmp_path / "project"
    (work / "configs").mkdir(parents=True)
    # slow steps: the run is still going when A turns hostile
    config = (TINY_CONFIG.replace("n_train: 256", "n_train: 3072")
              .replace("ckpt_every_steps: 0", "ckpt_every_steps: 4") + "test_hook_step_sleep_s: 0.2\n")
    (work / "configs" / "long.yaml").write_text(config)
    (work / "queue.txt").write_text("configs/long.yaml classify 3 name=long gpus=1 host=g0\n")
    assert user.gpuq("submit", str(work / "queue.txt")).returncode == 0
    (job,) = user.status_doc()["jobs"]
    home_ckpt = user.home / "checkpoints" / job["id"]
    host_ckpt = user.host_dir(0) / "jobs" / job["id"] / "ckpt"

    def shipped_step() -> int:
        try:
            return int(json.loads((home_ckpt / "LATEST").read_text())["step"])
        except (OSError, ValueError, KeyError):
            return -1

    def tick_ships() -> bool:
        user.gpuq("patrol")
        return shipped_step() > 0

    assert wait_for(tick_ships, timeout=300, interval=1.0), user.logs_of_unfinished()
    sound = json.loads((home_ckpt / "LATEST").read_text())

    # host A turns hostile: its processes frozen (the trainer writes no more), a crafted checkpoint and pointer
    assert farm.signal_workload(0, signal.SIGSTOP)
    try:
        evil = _hostile_archive(marker)
        name = "latest-000099999.pt"
        (host_ckpt / name).write_bytes(evil)
        (host_ckpt / "LATEST").write_text(json.dumps({
            "file": name, "step": 99999, "epoch": 2, "bytes": len(evil), "written_at": 1.0,
            "sha256": hashlib.sha256(evil).hexdigest()}))
        patrol = user.gpuq("patrol")
        assert patrol.returncode in (0, 1), patrol.stderr
        import sqlite3

        with sqlite3.connect(user.home / "ledger.db") as db:
            messages = [m for (m,) in db.execute("SELECT message FROM event WHERE subject = ?", (job["id"],))]
        refused = [m for m in messages if f"checkpoint {name} from g0 refused" in m]
        assert refused and "references posix.system" in refused[0], (messages[-5:], patrol.stdout)
        # the controller kept the sound copy: a resume on host B gets that one, never the crafted one
        assert json.loads((home_ckpt / "LATEST").read_text())["sha256"] == sound["sha256"]
        assert not (home_ckpt / name).exists() and not list(home_ckpt.glob(".checkpoint.part"))
    finally:
        farm.signal_workload(0, signal.SIGCONT)
    assert not marker.exists() and not (farm.hosts[1].tmp / BOOM_MARKER).exists()
    assert _tree(decoy) == before
    user.gpuq("cancel", "--all", "-y")
