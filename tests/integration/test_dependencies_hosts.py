"""``after=`` on two namespace SSH hosts (issue 41), driven by the CLI with a stdlib stub trainer (no torch):
train on g0 -> eval on g1.  Eval starts only after train SUCCEEDED, gets train's checkpoint placed on g1 and
verified (``{checkpoint.train}`` and ``GPUQ_CHECKPOINT_TRAIN`` name it), and starts exactly once although gpuq
is killed -9 twice between train's end and eval's start: once after the hand-over, before eval's attempt is
recorded; once after it is recorded, before its spec reaches g1.  A failed job ends the job that waits for it,
never started, with a reason that names it."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from orchestrator.core.specs import job_id_for
from tests.conftest import ROOT, wait_for
from tests.support.gpuquser import User
from tests.support.testhosts import HostFarm

pytestmark = pytest.mark.integration

TRAINER = textwrap.dedent("""
    import hashlib, json, os, socket, sys, time
    mode = sys.argv[1]
    if mode == "train":
        if "--fail" in sys.argv:
            sys.exit(4)  # a config error: never retried (FAILED)
        with open("model.ckpt", "wb") as f:
            f.write(b"weights of " + os.environ["GPUQ_JOB_ID"].encode() + b" " + os.urandom(64).hex().encode())
    else:
        data = open(sys.argv[2], "rb").read()
        with open("seen.json", "w") as f:
            json.dump({"arg": sys.argv[2], "env": os.environ.get("GPUQ_CHECKPOINT_TRAIN", ""),
                       "sha256": hashlib.sha256(data).hexdigest(), "host": socket.gethostname()}, f)
""")

TOML = """\
[run]
command = "train.py {args}"
launcher = "python"
checkpoint = ["model.ckpt"]
"""

QUEUE = """\
name=train host=g0 retries=0 -- train
name=eval after=train host=g1 retries=0 -- eval {checkpoint.train}
name=bad host=g0 retries=0 -- train --fail
name=late after=bad host=g1 retries=0 -- eval {checkpoint.bad}
"""

# a tick (`gpuq status --json`) killed -9 at one point of eval's dispatch (the same SIGKILL the crash tests send)
KILLED_TICK = textwrap.dedent("""
    import os, signal, sys
    from orchestrator.agent import launcher
    from orchestrator.tick import dispatch
    def die(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)
    if sys.argv[1] == "before-record":
        dispatch.deliver = die  # the checkpoint is handed over, the attempt not yet recorded
    else:
        launcher.enqueue = die  # the attempt is recorded, its spec not yet in the host's inbox
    from orchestrator.cli.main import main
    main(["status", "--json"])
""")


@pytest.fixture
def user(host_farm: Callable[..., HostFarm], tmp_path: Path) -> Iterator[User]:
    home = tmp_path / "gpuq-home"
    home.mkdir()
    u = User(host_farm(n=2, gpus=1), home, "/root/gpuq-after")
    # what is under test is the order and the hand-over, not the GPU preflight; `gpuq wait` ticks every 0.5 s
    u.env.update({"GPUQ_PREFLIGHT": "false", "GPUQ_KILL_GRACE_S": "1", "GPUQ_PATROL_INTERVAL_S": "0.5",
                  "GPUQ_PATROL_MIN_INTERVAL_S": "0.2"})
    yield u
    u.stop_everything()


def _killed_tick(user: User, where: str, job_id: str) -> None:
    env = dict(os.environ, **user.env, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", KILLED_TICK, where], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == -9, (done.stdout[-3000:], done.stderr[-3000:], _events(user, job_id))


def _rows(user: User, query: str, *args: str) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(str(user.home / "ledger.db"))
    try:
        return list(conn.execute(query, args))
    finally:
        conn.close()


def _events(user: User, job_id: str) -> list[str]:
    return [str(m) for (m,) in _rows(user, "SELECT message FROM event WHERE subject = ? ORDER BY id", job_id)]


def test_train_then_eval_on_the_other_host_hands_the_checkpoint_over_once(user: User, tmp_path: Path) -> None:
    user.add_hosts(2)
    work = tmp_path / "project"
    work.mkdir()
    (work / "train.py").write_text(TRAINER)
    (work / "gpuq.toml").write_text(TOML)
    (work / "queue.txt").write_text(QUEUE)
    dry = user.gpuq("submit", str(work / "queue.txt"), "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "train \u2192 eval" in dry.stdout and "bad \u2192 late" in dry.stdout and "after train" in dry.stdout
    submitted = user.gpuq("submit", str(work / "queue.txt"), "--json")
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    sweep = json.loads(submitted.stdout)["sweep"]
    ids = {name: job_id_for(sweep, name) for name in ("train", "eval", "bad", "late")}
    g0, g1 = user.host_dir(0), user.host_dir(1)
    assert not (g1 / "inbox" / f"{ids['eval']}.json").exists()  # it waits: nothing of it left this machine
    assert wait_for(lambda: (g0 / "jobs" / ids["train"] / "attempts" / "1" / "exit.json").is_file(), 30)

    # gpuq killed -9 between train's end and eval's start, twice
    _killed_tick(user, "before-record", ids["eval"])
    assert (g1 / "jobs" / ids["train"] / "run" / "model.ckpt").is_file()  # handed over before it died
    assert not (g1 / "jobs" / ids["eval"]).exists()
    _killed_tick(user, "after-record", ids["eval"])
    states: dict[str, str] = {}

    def ended() -> bool:  # ticks as `gpuq wait` runs them, back to back
        states.update({j["name"]: j["state"] for j in user.status_doc()["jobs"]})
        return all(state in ("SUCCEEDED", "FAILED", "CANCELLED") for state in states.values())

    assert wait_for(ended, 60, interval=0.1), (states, user.logs_of_unfinished())
    assert states == {"train": "SUCCEEDED", "eval": "SUCCEEDED", "bad": "FAILED", "late": "CANCELLED"}, \
        user.logs_of_unfinished()

    # eval ran once, on g1, from train's checkpoint placed there and verified
    assert user.launches()[ids["eval"]] == [1]
    assert sorted(p.name for p in (g1 / "jobs" / ids["eval"] / "attempts").iterdir()) == ["1"]
    seen = json.loads((g1 / "jobs" / ids["eval"] / "run" / "seen.json").read_text())
    want = hashlib.sha256((g0 / "jobs" / ids["train"] / "run" / "model.ckpt").read_bytes()).hexdigest()
    placed = f"{user.remote_root}/jobs/{ids['train']}/run/model.ckpt"
    assert seen == {"arg": placed, "env": placed, "sha256": want, "host": seen["host"]}
    eval_events = _events(user, ids["eval"])
    assert any(f"handed over on g1: {placed}" in e and want[:12] in e for e in eval_events), eval_events
    # ... and only after train SUCCEEDED
    (succeeded,) = _rows(user, "SELECT time FROM event WHERE subject = ? AND new = 'SUCCEEDED'", ids["train"])
    (created,) = _rows(user, "SELECT created_at FROM attempt WHERE job_id = ?", ids["eval"])
    assert float(str(created[0])) > float(str(succeeded[0]))

    # the failed job ended the one waiting for it, never started, naming it
    assert not (g1 / "jobs" / ids["late"] / "attempts").exists()
    reason = _events(user, ids["late"])[-1]
    assert f"bad {ids['bad']}" in reason and "ended FAILED" in reason, reason
