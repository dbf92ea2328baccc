"""Other jobs on a host (issue 43 items 3 and 4; docs/security.md's threat table): on a namespace SSH host
whose agent is root, a job reads no other sweep's forwarded secrets and plants nothing in the interpreter
that the agent or another job would run, while its run dir, its caches and /tmp stay writable."""

from __future__ import annotations

import json
import sysconfig
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.support.gpuquser import User
from tests.support.testhosts import HostFarm

pytestmark = pytest.mark.integration

VICTIM_TOKEN = "victim-sweep-token-3f9a1c"
SNOOP_TOKEN = "snoop-sweep-token-77d2e0"

# sweep A's job: holds its token while sweep B's job looks around, then ends
VICTIM = """import os, time
open("/tmp/gpuq-victim-started", "w").close()
deadline = time.time() + 120
while not os.path.exists("/tmp/gpuq-snooped") and time.time() < deadline:
    time.sleep(0.2)
with open("metrics.csv", "w") as f:
    f.write("step,own\\n1,%d\\n" % (os.environ.get("VICTIM_TOKEN") == "@TOKEN@"))
""".replace("@TOKEN@", VICTIM_TOKEN)

# sweep B's job: reads whatever the agent keeps under secrets/ (root: mode bits do not stop it)
SNOOP = """import json, os, time
open("/tmp/gpuq-snoop-started", "w").close()
deadline = time.time() + 120
while not os.path.exists("/tmp/gpuq-victim-started") and time.time() < deadline:
    time.sleep(0.2)
root = os.path.dirname(os.path.dirname(os.path.dirname(os.environ["GPUQ_RUN_DIR"])))
sdir = os.path.join(root, "secrets")
found = {"names": [], "text": "", "own": os.environ.get("SNOOP_TOKEN")}
try:
    found["names"] = sorted(os.listdir(sdir))
except OSError as e:
    found["error"] = e.strerror
for name in found["names"]:
    with open(os.path.join(sdir, name)) as f:
        found["text"] += f.read()
with open("found.json", "w") as f:
    json.dump(found, f)
with open("metrics.csv", "w") as f:
    f.write("step,files\\n1,%d\\n" % len(found["names"]))
open("/tmp/gpuq-snooped", "w").close()
"""

# a job that plants a .pth in its interpreter's site-packages and a sitecustomize.py beside the stdlib,
# and writes where real trainers write (harmless contents: a comment)
PLANT = """import errno, json, os, sys, sysconfig
paths = json.loads(@PATHS@)
seen = {}
for name, path in sorted(paths.items()):
    try:
        if os.path.dirname(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write("# gpuq jail test: harmless\\n")
        seen[name] = 0
    except OSError as e:
        seen[name] = errno.errorcode.get(e.errno, str(e.errno))
with open("seen.json", "w") as f:
    json.dump(seen, f)
with open("metrics.csv", "w") as f:
    f.write("step,planted\\n1,%d\\n" % sum(1 for v in seen.values() if v == 0))
"""


def _project(dest: Path, name: str, code: str, toml_extra: str = "") -> Path:
    work = dest / name
    work.mkdir(parents=True)
    (work / "train.py").write_text(code)
    (work / "queue.txt").write_text(f"name={name} -- x\n")
    (work / "gpuq.toml").write_text('[run]\ncommand = "train.py {args}"\nlauncher = "python"\n'
                                    'metrics = "metrics.csv"\nmetric = "step"\nmode = "max"\n' + toml_extra)
    return work / "queue.txt"


@pytest.fixture
def user(host_farm: Callable[..., HostFarm], tmp_path: Path) -> Iterator[User]:
    home = tmp_path / "gpuq-home"
    home.mkdir()
    u = User(host_farm(n=1, gpus=2), home, "/root/gpuq-jail")
    u.env.update({"GPUQ_STALL_AFTER_S": "60", "GPUQ_STARTUP_GRACE_S": "60", "GPUQ_PATROL_MIN_INTERVAL_S": "0.5",
                  "GPUQ_PREFLIGHT_SAMPLES": "1", "GPUQ_KILL_GRACE_S": "2", "GPUQ_PATROL_INTERVAL_S": "1",
                  "VICTIM_TOKEN": VICTIM_TOKEN, "SNOOP_TOKEN": SNOOP_TOKEN,
                  "GPUQ_FORWARD_ENV_ALLOW": "VICTIM_TOKEN,SNOOP_TOKEN"})
    yield u
    u.stop_everything()


def _done(user: User) -> None:
    watched = user.gpuq("watch", "--interval", "1", timeout=300)
    assert watched.returncode == 0, watched.stdout + watched.stderr
    jobs = user.status_doc()["jobs"]
    assert {j["state"] for j in jobs} == {"SUCCEEDED"}, user.logs_of_unfinished()


@pytest.mark.parametrize("snoop_first", [False, True], ids=["victim-first", "snoop-first"])
def test_a_job_reads_no_other_sweeps_forwarded_secrets(user: User, tmp_path: Path, snoop_first: bool) -> None:
    """Sweep A's job holds its token while sweep B's job looks under secrets/; snoop-first: B starts on a
    host with no secrets/ yet and forwards nothing, A's values arrive while B runs."""
    user.add_hosts(1)
    victim = _project(tmp_path, "victim", VICTIM, 'forward_env = ["VICTIM_TOKEN"]\n')
    snoop = _project(tmp_path, "snoop", SNOOP, "" if snoop_first else 'forward_env = ["SNOOP_TOKEN"]\n')
    host_tmp = user.farm.hosts[0].root_dir / "tmp"
    first, second = (snoop, victim) if snoop_first else (victim, snoop)
    submitted = {}
    for queue in (first, second):
        out = user.gpuq("submit", str(queue), "--json")
        assert out.returncode == 0, out.stdout + out.stderr
        ((submitted[queue.parent.name]),) = json.loads(out.stdout)["jobs"]
        if queue is first:
            started = host_tmp / f"gpuq-{queue.parent.name}-started"
            assert wait_for(started.exists, timeout=120, interval=0.5), user.logs_of_unfinished()
            if not snoop_first:  # sweep A's values are on the host while B runs
                assert len(list((user.host_dir(0) / "secrets").glob("*.json"))) == 1
    _done(user)
    run = user.host_dir(0) / "jobs" / submitted["snoop"]["id"] / "run"
    found = json.loads((run / "found.json").read_text())
    assert VICTIM_TOKEN not in found["text"] and found["names"] == [], found  # nor its own sweep's file
    assert found["own"] == (None if snoop_first else SNOOP_TOKEN)  # its own value comes in its environment


def test_a_job_plants_nothing_the_agent_or_another_job_runs_and_writes_where_trainers_write(
        user: User, tmp_path: Path) -> None:
    user.add_hosts(1)
    purelib = Path(sysconfig.get_paths()["purelib"])  # the hosts run this interpreter (tests/support/testhosts/)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    planted = {"pth": purelib / "gpuq-jail-test.pth", "sitecustomize": stdlib / "gpuq_jail_test_sitecustomize.py"}
    root = user.remote_root
    writable = {"run_dir": "still-mine.txt", "hf_cache": f"{root}/cache/huggingface/probe.txt",
                "tmp": "/tmp/gpuq-jail-probe.txt"}
    paths = {**{k: str(v) for k, v in planted.items()}, **writable}
    queue = _project(tmp_path, "plant", PLANT.replace("@PATHS@", repr(json.dumps(paths))))
    try:
        submitted = user.gpuq("submit", str(queue), "--json")
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        (job,) = json.loads(submitted.stdout)["jobs"]
        _done(user)
        leftover = [str(p) for p in planted.values() if p.exists()]
    finally:
        for p in planted.values():
            p.unlink(missing_ok=True)
    seen = json.loads((user.host_dir(0) / "jobs" / job["id"] / "run" / "seen.json").read_text())
    assert leftover == [] and seen["pth"] == "EROFS" and seen["sitecustomize"] == "EROFS", (seen, leftover)
    assert seen["run_dir"] == seen["hf_cache"] == seen["tmp"] == 0, seen
