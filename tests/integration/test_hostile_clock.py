"""A host sets the times it is billed by no more (docs/cost.md, "The billed interval"; issue 38 item 4): a rented
machine on the fake RunPod (a real namespace SSH host, priced) whose agent is replaced after dispatch by a
stand-in that answers every `status` with the real agent's document, except that each attempt's exit record
claims a start ten days before and an end five days after what happened (the party paid by the hour would make
a capped sweep look free, or bill for days).

gpuq keeps the host's claims as claims and bills by its own clock: the attempt's billed interval lies inside
what gpuq saw (from the dispatch it recorded to the first probe that saw the attempt ended), its cost is that
interval at the machine's price, and one `host_clock` finding says so for each claim.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from orchestrator.core import protocol
from orchestrator.money.cost import attempt_hours
from tests.conftest import wait_for
from tests.integration.test_cloud import Cloud
from tests.support.testhosts import HostFarm

pytestmark = pytest.mark.integration

DAY = 86400.0
# The stand-in beside the real agent: `status` answers carry forged exit times; every other verb is the real one.
STAND_IN = r'''
import json, os, subprocess, sys, time
here = os.path.dirname(os.path.abspath(__file__))
real = subprocess.run([sys.executable, os.path.join(here, "gpuq_agent_real.py")] + sys.argv[1:],
                      stdout=subprocess.PIPE, check=False)
if "status" not in sys.argv[1:]:
    sys.stdout.buffer.write(real.stdout)
    sys.exit(real.returncode)
def iso(t):
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(t))
text = real.stdout.decode()
begin = text.index("{", text.index("-----BEGIN GPUQ DOCUMENT-----"))  # the framed document (host-protocol.md)
doc, end = json.JSONDecoder().raw_decode(text, begin)
for job in doc.get("jobs") or []:
    if isinstance(job.get("exit"), dict):
        job["exit"]["started_at"] = iso(time.time() - 10 * 86400)
        job["exit"]["ended_at"] = iso(time.time() + 5 * 86400)
        job["launched_at"] = iso(time.time() - 10 * 86400)
sys.stdout.write(text[:begin] + json.dumps(doc) + text[end:])
sys.exit(real.returncode)
'''
TRAIN = "import time\ntime.sleep(2)\nopen('metrics.csv', 'w').write('step,val_acc\\n1,0.5\\n')\n"
TOML = '[run]\ncommand = "train.py"\nlauncher = "python"\nmetrics = "metrics.csv"\nmetric = "val_acc"\n'


@pytest.fixture
def cloud(host_farm: Callable[..., HostFarm], tmp_path: Path) -> Iterator[Cloud]:
    made = Cloud(host_farm(n=1, gpus=1), tmp_path, "runpod")
    try:
        yield made
    finally:
        made.close()


def test_a_host_claiming_days_is_billed_only_what_gpuq_saw(cloud: Cloud, tmp_path: Path) -> None:
    up = cloud.gpuq("up", "--provider", "runpod", "--gpu", "NVIDIA RTX A6000", "--count", "1", "--gpus", "1",
                    "--profile", "rehearsal")
    assert up.returncode == 0, up.stdout + up.stderr
    (row,) = cloud.hosts().values()
    assert row.price_per_hour
    work = tmp_path / "project"
    work.mkdir()
    (work / "train.py").write_text(TRAIN)
    (work / "gpuq.toml").write_text(TOML)
    (work / "queue.txt").write_text("name=one\n")
    submitted = cloud.gpuq("submit", str(work / "queue.txt"))
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    root = cloud.host_root(row.instance_id)
    for bundle in [p for p in (root / protocol.BUNDLES_DIR).iterdir() if not p.name.startswith(".")]:
        agent_dir = (bundle / protocol.AGENT_ENTRY).parent  # whichever bundle gpuq probes it with
        (agent_dir / "gpuq_agent.py").rename(agent_dir / "gpuq_agent_real.py")
        (agent_dir / "gpuq_agent.py").write_text(STAND_IN)
    (job,) = cloud.jobs()
    assert job.state in ("ASSIGNED", "RUNNING")  # gpuq has not seen it end: the host's word will come first
    assert wait_for(lambda: (root / "jobs" / job.id / "attempts" / "1" / "exit.json").exists(), timeout=30)

    status = cloud.gpuq("status", "--once")
    assert status.returncode in (0, 1), status.stdout + status.stderr
    (job,) = cloud.jobs()
    assert job.state == "SUCCEEDED", (status.stdout + status.stderr)[-3000:]
    (att,) = cloud.attempts(job.id)
    assert att.host_started_at is not None and att.host_ended_at is not None
    assert att.seen_ended_at is not None and att.started_at is not None and att.ended_at is not None
    window = (att.dispatched_at or att.created_at, att.seen_ended_at)
    assert att.host_ended_at - att.host_started_at > 14 * DAY  # the claim is kept as the host's
    assert window[0] <= att.started_at <= att.ended_at <= window[1]  # billed inside what gpuq saw
    hours = attempt_hours(att, att.ended_at)
    assert hours <= (window[1] - window[0]) / 3600 < 0.05
    ledger = cloud.ledger()
    try:
        clock = [e for e in ledger.events(job.id) if e.rule == "host_clock"]
    finally:
        ledger.close()
    assert len(clock) == 2 and all(e.severity == "warn" for e in clock), [e.message for e in clock]
    assert sorted(w for e in clock for w in ("started", "ended") if f" {w} " in e.message) == ["ended", "started"]
    results = cloud.gpuq("results", "--json")
    assert results.returncode == 0, results.stderr
    (entry,) = json.loads(results.stdout)["jobs"]
    most = row.price_per_hour * (window[1] - window[0]) / 3600  # the machine's price over what gpuq saw
    assert entry["cost"] is not None and 0 < entry["cost"] <= most + 1e-6, (entry["cost"], most)
