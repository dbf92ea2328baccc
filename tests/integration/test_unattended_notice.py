"""A Lambda machine cannot stop its own billing (docs/providers.md, "When no gpuq command runs: the host stops
itself"): `gpuq up` says so at rent time, gpuq writes the user's webhook into the host's `lease.json` (0600; the
one controller secret a host ever gets, and only such a host: docs/security.md), and once no gpuq command has
reached it for the lease and its work is done the host POSTs the user's notice itself, and bills on.

The webhook receiver listens on this machine's loopback (as `webhook_url` must, plain http); the host reaches
"the internet" through a relay in its network namespace to a second door of the same receiver on its gateway.
"""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.conftest import wait_for
from tests.integration.test_cloud import LAMBDA_KEY, Cloud
from tests.support.testhosts import HostFarm
from tests.support.webhook import receiver, receiver_at

pytestmark = pytest.mark.integration

LEASE_MIN = 0.12
RELAY = """\
import socket, sys, threading
port, target, target_port = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", port))
srv.listen(8)
def pump(a, b):
    try:
        while True:
            data = a.recv(65536)
            if not data:
                break
            b.sendall(data)
    except OSError:
        pass
    finally:
        b.close()
while True:
    c, _ = srv.accept()
    u = socket.create_connection((target, target_port))
    threading.Thread(target=pump, args=(c, u), daemon=True).start()
    threading.Thread(target=pump, args=(u, c), daemon=True).start()
"""


@pytest.fixture
def cloud(host_farm: Callable[..., HostFarm], tmp_path: Path) -> Iterator[Cloud]:
    made = Cloud(host_farm(n=1, gpus=1), tmp_path, "lambda")
    made.env.update({"GPUQ_LEASE_TIMEOUT_MIN": str(LEASE_MIN), "GPUQ_PATROL_IDLE_INTERVAL_S": "1"})
    try:
        yield made
    finally:
        made.close()


def test_a_lambda_machine_notifies_the_user_and_bills_on(cloud: Cloud, tmp_path: Path) -> None:
    h = cloud.farm.hosts[0]
    with receiver() as (url, got), receiver_at(h.gateway, got) as door:
        port = urlsplit(url).port
        door_port = urlsplit(door).port
        assert port is not None and door_port is not None
        (tmp_path / "relay.py").write_text(RELAY)
        relay = subprocess.Popen(["ip", "netns", "exec", h.netns, sys.executable, "-I", "-S",
                                  str(tmp_path / "relay.py"), str(port), h.gateway, str(door_port)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            cloud.env["GPUQ_WEBHOOK_URL"] = url
            up = cloud.gpuq("up", "--provider", "lambda", "--gpu", "gpu_1x_a10", "--count", "1",
                            "--profile", "rehearsal")
            assert up.returncode == 0, up.stdout + up.stderr
            assert "lambda machines cannot stop their own billing" in up.stderr, up.stderr
            assert "POSTs a notice to your webhook_url" in up.stderr, up.stderr
            (row,) = cloud.hosts().values()
            lease = cloud.host_root(row.instance_id) / "lease.json"
            assert json.loads(lease.read_text())["notify_url"] == url
            assert stat.S_IMODE(lease.stat().st_mode) == 0o600
            work = tmp_path / "project"
            work.mkdir()
            (work / "train.py").write_text("open('metrics.csv', 'w').write('step,val_acc\\n1,0.5\\n')\n")
            (work / "gpuq.toml").write_text('[run]\ncommand = "train.py"\nlauncher = "python"\n'
                                            'metrics = "metrics.csv"\nmetric = "val_acc"\n')
            (work / "queue.txt").write_text("name=one\n")
            submitted = cloud.gpuq("submit", str(work / "queue.txt"))
            assert submitted.returncode == 0, submitted.stdout + submitted.stderr
            # no gpuq command from here on
            notices = lambda: [d for d in got if d.path == "/hook" and b"cannot stop itself" in d.body]  # noqa: E731
            assert wait_for(lambda: notices(), timeout=LEASE_MIN * 60 + 5.0 + 15.0), [d.body for d in got]
            (notice,) = notices()
            body = notice.json()
            assert body["event"] == "self_stop_notice" and body["selfstop"]["action"] == "notify"
        finally:
            relay.kill()
            relay.wait()
    record = json.loads((cloud.host_root(row.instance_id) / "selfstop.json").read_text())
    assert record["action"] == "notify" and record["outcome"] == "notified: HTTP 204"
    contact = (cloud.host_root(row.instance_id) / "controller_contact").stat().st_mtime  # the last gpuq command
    assert LEASE_MIN * 60 <= record["at_epoch"] - contact <= LEASE_MIN * 60 + 5.0 + 2.0  # the lease, one look
    assert url not in json.dumps(record)  # the record keeps no secret
    instances = cloud.fake.state()["instances"]
    assert instances[row.instance_id]["status"] == "active"  # it bills on: only `gpuq down` ends it
    for sub in ("root", "tmp", "bin"):  # the controller's Lambda key is nowhere on the host
        for path in (h.root_dir / sub).rglob("*"):
            if path.is_file() and not path.is_symlink():
                assert LAMBDA_KEY.encode() not in path.read_bytes(), path
    assert LAMBDA_KEY not in h.init_env.values()
