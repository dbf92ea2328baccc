"""Spot preemption and resume end to end: the CLI against the fake vast.ai (gpuq's spot market: RunPod rents no
spot pods since its API v2), fake Lambda and fake RunPod, whose instances and pods are real OpenSSH hosts in
network namespaces (tests/support/fakecloud/netns_backend.py).

Jobs are deterministic torchrun trainers (tiny MLP, gloo on CPU, one process each) that checkpoint
every few steps.  A vast.ai outbid pauses the machine at once, no signal; a host failure or a stop sends
SIGTERM and SIGKILL after the grace; the machine's /root (its disk) survives.  Every resumed job must continue
from its last checkpoint (its step never goes back more than one checkpoint interval) and end with weights
identical to the same job run without interruption (run once per module on the local host).
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.ledger import Ledger
from scripts.bench_project import TINY_CONFIG
from tests.conftest import kill_recorded_groups, run_gpuq, wait_for
from tests.support.fakecloud import FakeLambda, FakeRunPod
from tests.support.fakecloud.netns_backend import NetnsBackend
from tests.support.fakecloud.vastai import FakeVastAI
from tests.support.fakecloud.vastai_market import FakeOffer
from tests.support.once import once
from tests.support.sweepproject import THREADS
from tests.support.testhosts import HostFarm

pytestmark = pytest.mark.integration

CKPT_EVERY = 4
RUNPOD_KEY = "rp-test-key-0123456789"
LAMBDA_KEY = "secret_lambda-test-key-0123456789"
VAST_KEY = "vast-e2e-test-key-0123456789"
# two hosts of one model in one region (a replacement is rented where the lost machine was), a dearer one
VAST_MARKET = (FakeOffer(7001, "RTX 4090", 1, 24564, 0.35, 0.20), FakeOffer(7002, "RTX 4090", 1, 24564, 0.40, 0.22),
               FakeOffer(7003, "A100 SXM4", 1, 81920, 1.20, 0.70))
# the spot tests' machines: three 1-GPU hosts, and one of 2 GPUs
SPOT_MARKET = (*(FakeOffer(7101 + i, "RTX 4090", 1, 24564, 0.35, 0.20) for i in range(3)),
               FakeOffer(7201, "RTX A6000", 2, 49140, 0.98, 0.56))
JOBS = 3  # the spot test's one job per pod; the others take the first two


def _config(seed: int, step_sleep_s: float = 0.0) -> str:
    text = (TINY_CONFIG.replace("seed: 3", f"seed: {seed}").replace("n_train: 256", "n_train: 3072")
            .replace("ckpt_every_steps: 0", f"ckpt_every_steps: {CKPT_EVERY}")) + THREADS  # 1-GPU hosts
    # TEST HOOK: slow steps (no effect on the weights) so an interruption lands mid-run on any machine
    return text + (f"test_hook_step_sleep_s: {step_sleep_s}\n" if step_sleep_s else "")


def _project(base: Path, jobs: int = JOBS, step_sleep_s: float = 0.0) -> Path:
    work = base / "project"
    (work / "configs").mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(jobs):
        (work / "configs" / f"c{i}.yaml").write_text(_config(10 + i, step_sleep_s))
        lines.append(f"configs/c{i}.yaml classify 2 name=j{i} gpus=1")
    (work / "queue.txt").write_text("\n".join(lines) + "\n")
    return work / "queue.txt"


def _weights(summary: Path) -> str:
    return str(json.loads(summary.read_text())["weights_sha256"])


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """job name -> weights sha256 of the same jobs run without interruption (the local host); one
    sweep for the whole run, whichever workers this module's tests land on (tests/support/once.py)."""
    return dict(once(tmp_path_factory, "test_cloud-reference", _reference))


def _reference(base: Path) -> dict[str, str]:
    queue = _project(base)
    env = {"GPUQ_HOME": str(base / "home"), "GPUQ_LOCAL_CPU_SLOTS": "2", "GPUQ_HEARTBEAT_S": "1"}
    try:
        done = run_gpuq("submit", str(queue), "--host", "local", "--wait", env=env, timeout=900)
    finally:
        kill_recorded_groups(base / "home" / "local")  # the local agent would idle on for minutes
    assert done.returncode == 0, done.stdout + done.stderr
    out = {}
    for spec in (base / "home" / "local" / "jobs").glob("*/spec.json"):
        out[json.loads(spec.read_text())["name"]] = _weights(spec.parent / "result" / "summary.json")
    assert len(out) == JOBS
    return out


class Cloud:
    """One user, a fake provider backed by real namespace hosts, and the gpuq CLI."""

    def __init__(self, farm: HostFarm, tmp: Path, provider: str,
                 offers: tuple[FakeOffer, ...] = VAST_MARKET) -> None:
        self.farm = farm
        self.provider = provider
        self.backend = NetnsBackend(farm, moving_ports=provider == "runpod")  # RunPod: a new port per start
        if provider == "runpod":
            self.fake: Any = FakeRunPod(api_key=RUNPOD_KEY, backend=self.backend).start()
        elif provider == "lambda":
            self.fake = FakeLambda(api_key=LAMBDA_KEY, backend=self.backend).start()
        else:
            self.fake = FakeVastAI(api_key=VAST_KEY, backend=self.backend, offers=offers).start()
        self.home = tmp / "gpuq-home"
        self.home.mkdir()
        self.env = {
            "GPUQ_HOME": str(self.home), "GPUQ_HEARTBEAT_S": "1", "GPUQ_AGENT_IDLE_EXIT_S": "120",
            "GPUQ_SSH_KEY": str(farm.client_key), "GPUQ_PROVIDER_POLL_S": "0.2", "GPUQ_PREFLIGHT_SAMPLES": "1",
            "GPUQ_PATROL_MIN_INTERVAL_S": "0.5", "GPUQ_PATROL_INTERVAL_S": "1", "GPUQ_CKPT_INTERVAL_S": "3600",
            "RUNPOD_API_KEY": RUNPOD_KEY, "GPUQ_RUNPOD_URL": self.fake.url if provider == "runpod" else "",
            "LAMBDA_API_KEY": LAMBDA_KEY, "GPUQ_LAMBDA_URL": self.fake.url if provider == "lambda" else "",
            "VAST_API_KEY": VAST_KEY, "GPUQ_VASTAI_API_URL": self.fake.url if provider == "vastai" else "",
        }
        self.env = {k: v for k, v in self.env.items() if v}

    def gpuq(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return run_gpuq(*args, env=self.env, timeout=timeout)

    def ledger(self) -> Ledger:
        return Ledger(self.home / "ledger.db")

    def hosts(self) -> dict[str, Any]:
        ledger = self.ledger()
        try:
            return {h.name: h for h in ledger.hosts()}
        finally:
            ledger.close()

    def jobs(self) -> list[Any]:
        ledger = self.ledger()
        try:
            return ledger.jobs()
        finally:
            ledger.close()

    def attempts(self, job_id: str) -> list[Any]:
        ledger = self.ledger()
        try:
            return ledger.attempts(job_id)
        finally:
            ledger.close()

    def host_root(self, instance_id: str) -> Path:
        """The gpuq data dir on the pod behind ``instance_id`` ($HOME/gpuq), controller side."""
        index = self.backend.host_index(instance_id)
        assert index is not None
        return self.farm.hosts[index].root_dir / "root" / "gpuq"

    def close(self) -> None:
        for h in self.hosts().values():  # stop agents and jobs on the pods, by their recorded groups
            if h.instance_id and self.backend.host_index(h.instance_id) is not None:
                index = self.backend.host_index(h.instance_id)
                assert index is not None
                if self.farm.hosts[index].init_alive():
                    self.farm.ssh(index, "sh", "-c", 'for f in /root/gpuq/agent.pid /root/gpuq/jobs/*/attempts/*/pgid; '
                                  'do g=$(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); '
                                  'print(d.get(\'pgid\') or d.get(\'pid\'))" "$f" 2>/dev/null) && kill -9 -- "-$g" '
                                  '2>/dev/null; done; true')
        self.fake.stop()
        self.backend.close()


@pytest.fixture
def cloud_factory(host_farm: Callable[..., HostFarm], tmp_path: Path) -> Iterator[Callable[..., Cloud]]:
    made: list[Cloud] = []

    def make(provider: str, hosts: int, gpus: int, offers: tuple[FakeOffer, ...] = VAST_MARKET) -> Cloud:
        cloud = Cloud(host_farm(n=hosts, gpus=gpus), tmp_path, provider, offers)
        made.append(cloud)
        return cloud

    yield make
    for cloud in made:
        cloud.close()


def _latest_step(root: Path, job_id: str) -> int:
    try:
        return int(json.loads((root / "jobs" / job_id / "ckpt" / "LATEST").read_text())["step"])
    except (OSError, ValueError, KeyError):
        return -1


def _last_heartbeat_step(root: Path, job_id: str, attempt: int) -> int:
    beat = json.loads((root / "jobs" / job_id / "attempts" / str(attempt) / "heartbeat").read_text())
    return int(beat["step"])


def _reached_step(root: Path, job_id: str, attempt: int) -> int:
    """How far training got on a host: its last heartbeat, or its newest checkpoint when that came
    after the last heartbeat (heartbeats are timed, checkpoints counted in steps: a fast trainer can
    save step 60 while its last heartbeat still says 45)."""
    return max(_last_heartbeat_step(root, job_id, attempt), _latest_step(root, job_id))


def _saved_steps(root: Path, job_id: str, attempt: int) -> list[int]:
    """The steps of the checkpoints an attempt logged writing (its periodic ones and a final one at SIGTERM)."""
    log = (root / "jobs" / job_id / "attempts" / str(attempt) / "job.log").read_text()
    return [int(m.group(1)) for m in re.finditer(r"checkpoint \([^)]*\) step=(\d+) ", log)]


def _attempt_reached(root: Path, job_id: str, attempt: int) -> int:
    """How far attempt n got, read after the job ended: its last heartbeat, or its last checkpoint when that
    came later (a stop's SIGTERM saves a final one after the last timed heartbeat)."""
    return max([_last_heartbeat_step(root, job_id, attempt), *_saved_steps(root, job_id, attempt)])


def _resumed_step(root: Path, job_id: str, attempt: int) -> int:
    for line in (root / "jobs" / job_id / "attempts" / str(attempt) / "job.log").read_text().splitlines():
        if "GPUQ_RESUMED" in line:
            return int(line.split("step=")[1].split()[0])
    raise AssertionError(f"attempt {attempt} of {job_id} did not resume")


def _check_resumed(cloud: Cloud, job: Any, first_root: Path, second_root: Path, saved: int = -1) -> None:
    """The resumed attempt continued from the last checkpoint: at most one interval went back.  ``saved``: the
    step of the checkpoint the first attempt left on disk, read before the resume (a kill without warning can
    land after the save and before its log line reaches job.log, so the log alone may say less)."""
    attempts = cloud.attempts(job.id)
    assert [a.state for a in attempts][-1] == "EXITED" and attempts[-1].exit_code == 0
    assert attempts[0].state in ("PREEMPTED", "LOST"), [a.state for a in attempts]
    reached = max(_attempt_reached(first_root, job.id, 1), saved)
    resumed = _resumed_step(second_root, job.id, attempts[-1].number)
    assert 0 < resumed <= reached and reached - resumed <= CKPT_EVERY, (job.name, reached, resumed)


def _pull_and_compare(cloud: Cloud, reference: dict[str, str]) -> None:
    pulled = cloud.gpuq("pull")
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr
    sweep = cloud.jobs()[0].sweep_id
    for job in cloud.jobs():
        summary = cloud.home / "results" / sweep / job.id / "result" / "summary.json"
        assert _weights(summary) == reference[job.name], job.name


def test_vastai_spot_preemptions_resume_to_identical_weights(cloud_factory: Callable[..., Cloud], tmp_path: Path,
                                                             reference: dict[str, str]) -> None:
    """Two of three interruptible instances outbid at random points after their jobs checkpointed (one job per
    machine: the watch test below preempts one running two); once the higher bids are over, `gpuq resume`
    re-bids the same machines."""
    cloud = cloud_factory("vastai", hosts=3, gpus=1, offers=SPOT_MARKET)
    up = cloud.gpuq("up", "--provider", "vastai", "--gpu", "RTX 4090", "--count", "3", "--gpus", "1",
                    "--spot", "--bid", "0.3", "--profile", "rehearsal")
    assert up.returncode == 0, up.stdout + up.stderr
    assert up.stdout.count("preflight PASS") == 3 and up.stdout.count("/h ") == 3, up.stdout
    submitted = cloud.gpuq("submit", str(_project(tmp_path)))
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    hosts = cloud.hosts()
    rng = random.Random(7)
    victims = rng.sample(sorted(hosts), 2)
    roots = {name: cloud.host_root(hosts[name].instance_id) for name in hosts}

    def on(name: str) -> list[Any]:
        return [j for j in cloud.jobs() if j.host == name]

    assert all(len(on(name)) == 1 for name in hosts), {n: [j.name for j in on(n)] for n in hosts}
    for name in victims:  # preempt each victim at a random point after its jobs checkpointed
        threshold = rng.randrange(CKPT_EVERY, 6 * CKPT_EVERY)
        assert wait_for(lambda n=name, t=threshold: all(_latest_step(roots[n], j.id) >= t for j in on(n)),
                        timeout=300, interval=0.2), (name, threshold)
        cloud.fake.preempt(hosts[name].instance_id)  # paused at once: no SIGTERM, the disk kept
    cloud.backend.wait_idle()
    patrolled = cloud.gpuq("patrol")
    assert patrolled.returncode == 0 and patrolled.stdout.count("spot preemption") == 2, patrolled.stdout
    preempted = [j for j in cloud.jobs() if j.state == "PREEMPTED"]
    assert sorted(j.host for j in preempted) == sorted(victims)
    saved = {j.id: _latest_step(roots[j.host], j.id) for j in preempted}  # the paused disks, before any resume
    ledger = cloud.ledger()
    try:
        assert all("Outbid" in ledger.attempt(j.id, 1).message for j in preempted)  # type: ignore[union-attr]
    finally:
        ledger.close()

    for name in victims:
        cloud.fake.outbid_ends(hosts[name].instance_id)  # the higher bids are over
    resumed = cloud.gpuq("resume")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert resumed.stdout.count("re-bid the same pod") == 2 and "resumed 2 job(s)" in resumed.stdout
    moved = cloud.hosts()
    # the re-bid machines answer again at their direct endpoint, with their pinned host keys
    assert all(moved[v].host_key == hosts[v].host_key and moved[v].instance_id == hosts[v].instance_id
               for v in victims)
    again = cloud.gpuq("resume")  # idempotent: nothing is started twice
    assert again.returncode == 0 and "nothing to resume" in again.stdout, again.stdout
    waited = cloud.gpuq("wait", "--timeout", "600", timeout=700)
    assert waited.returncode == 0, waited.stdout + waited.stderr
    jobs = cloud.jobs()
    assert {j.state for j in jobs} == {"SUCCEEDED"}
    for job in jobs:
        if job.host in victims:
            assert job.attempt_count == 2
            _check_resumed(cloud, job, roots[job.host], roots[job.host], saved[job.id])
        else:
            assert job.attempt_count == 1
    _pull_and_compare(cloud, reference)
    results = cloud.gpuq("results")
    assert "lost GPU-h" in results.stdout and "$" in results.stdout, results.stdout


def test_watch_auto_resume_brings_a_preempted_machine_back(cloud_factory: Callable[..., Cloud], tmp_path: Path,
                                                           reference: dict[str, str]) -> None:
    cloud = cloud_factory("vastai", hosts=1, gpus=2, offers=SPOT_MARKET)
    up = cloud.gpuq("up", "--provider", "vastai", "--gpu", "RTX A6000", "--gpus", "2", "--spot",
                    "--profile", "rehearsal")
    assert up.returncode == 0, up.stdout + up.stderr
    # 192 slow steps: the preemption below always lands mid-run, whatever the machine's load
    queue = _project(tmp_path, jobs=2, step_sleep_s=0.1)
    assert cloud.gpuq("submit", str(queue)).returncode == 0
    (host,) = cloud.hosts().values()
    root = cloud.host_root(host.instance_id)
    watcher = subprocess.Popen([sys.executable, "-m", "orchestrator", "watch", "--auto-resume", "--interval", "1"],
                               env={**os.environ, **cloud.env}, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    try:
        assert wait_for(lambda: all(_latest_step(root, j.id) >= 2 * CKPT_EVERY for j in cloud.jobs()),
                        timeout=300, interval=0.2)
        assert not any((root / "jobs" / j.id / "attempts" / "1" / "exit.json").exists() for j in cloud.jobs())
        cloud.fake.preempt(host.instance_id, until_rebid=True)  # outbid; the higher bid is over by the re-bid
        out, _ = watcher.communicate(timeout=600)
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait()
    assert watcher.returncode == 0, out
    assert "spot preemption" in out and "re-bid the same pod" in out and "auto-resume" in out, out
    for job in cloud.jobs():
        assert job.state == "SUCCEEDED" and job.attempt_count == 2, (job.name, job.state)
        _check_resumed(cloud, job, root, root)
    _pull_and_compare(cloud, reference)


def test_lambda_host_failure_resumes_on_a_replacement_from_the_shipped_checkpoint(
        cloud_factory: Callable[..., Cloud], tmp_path: Path, reference: dict[str, str]) -> None:
    cloud = cloud_factory("lambda", hosts=3, gpus=1)
    up = cloud.gpuq("up", "--provider", "lambda", "--gpu", "gpu_1x_a10", "--count", "2", "--profile", "rehearsal")
    assert up.returncode == 0, up.stdout + up.stderr
    queue = _project(tmp_path, jobs=2)
    assert cloud.gpuq("submit", str(queue)).returncode == 0
    hosts = cloud.hosts()
    victim = sorted(hosts)[0]
    (job,) = [j for j in cloud.jobs() if j.host == victim]
    root = cloud.host_root(hosts[victim].instance_id)
    shipped = cloud.home / "checkpoints" / job.id / "LATEST"

    def shipped_step() -> int:
        try:
            return int(json.loads(shipped.read_text())["step"])
        except (OSError, ValueError):
            return -1

    assert wait_for(lambda: _latest_step(root, job.id) >= 2 * CKPT_EVERY, timeout=300, interval=0.2)
    assert cloud.gpuq("patrol").returncode == 0  # a tick ships the newest checkpoint of every job on a rented host
    assert shipped_step() >= 2 * CKPT_EVERY
    assert (shipped.parent / "metrics.jsonl").is_file()  # the metrics so far travel with it
    home_step = shipped_step()  # no tick runs until the resume: this is the copy the replacement gets
    cloud.fake.host_failure(hosts[victim].instance_id)  # the API says unhealthy ...
    cloud.backend.crash(hosts[victim].instance_id)  # ... and the machine is dead
    cloud.backend.wait_idle()
    reached = _reached_step(root, job.id, 1)
    resumed = cloud.gpuq("resume")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"{victim}: replaced by" in resumed.stdout and "resumed 1 job(s)" in resumed.stdout, resumed.stdout
    waited = cloud.gpuq("wait", "--timeout", "600", timeout=700)
    assert waited.returncode == 0, waited.stdout + waited.stderr
    after = {j.id: j for j in cloud.jobs()}
    assert {j.state for j in after.values()} == {"SUCCEEDED"}
    new_host = after[job.id].host
    assert new_host != victim
    new_root = cloud.host_root(cloud.hosts()[new_host].instance_id)
    resumed_at = _resumed_step(new_root, job.id, after[job.id].attempt_count)
    # the replacement had an empty disk: it resumed from exactly the controller's shipped copy (what
    # was trained after the last tick's copy is the loss; `gpuq watch` ticks keep that short)
    assert resumed_at == home_step and reached >= resumed_at, (reached, resumed_at, home_step)

    # the teardown gate: nothing is terminated while results are not pulled and verified
    refused = cloud.gpuq("down", new_host, "--yes")
    assert refused.returncode == 1 and "not pulled and verified" in refused.stderr, refused.stderr
    assert cloud.hosts()[new_host].lease_state == "running"
    _pull_and_compare(cloud, reference)
    gone = cloud.gpuq("down", "--sweep", after[job.id].sweep_id, "--yes")
    assert gone.returncode == 0, gone.stdout + gone.stderr
    # the failed instance (it may still bill), its replacement and the surviving one
    assert gone.stdout.count(": terminated") == 3, (gone.stdout, gone.stderr, {
        n: (h.lease_state, h.instance_id) for n, h in cloud.hosts().items()}, [(j.name, j.host, j.state)
                                                                               for j in cloud.jobs()])
    assert all(h.lease_state == "terminated" for h in cloud.hosts().values())
    assert RUNPOD_KEY not in (cloud.home / "ledger.db").read_bytes().decode("latin-1")
    assert LAMBDA_KEY not in (cloud.home / "ledger.db").read_bytes().decode("latin-1")


def test_vastai_outbid_resumes_on_a_replacement_rented_by_up_for(
        cloud_factory: Callable[..., Cloud], tmp_path: Path, reference: dict[str, str]) -> None:
    """`gpuq up --for` rents the queue's one machine from the cheapest vast.ai interruptible offer; the
    instance is outbid (paused with no signal: the disk stays, and bills); `gpuq resume` re-bids it, the
    higher bid still wins, so a replacement is rented and the job continues there from the shipped
    checkpoint to the same weights."""
    cloud = cloud_factory("vastai", hosts=2, gpus=1)
    queue = _project(tmp_path, jobs=1)
    dear = cloud.gpuq("up", "--for", str(queue), "--max-price", "0.1", "--spot")  # every spot offer costs more
    assert dear.returncode == 1 and "over --max-price" in dear.stderr and not cloud.fake.instances, dear.stderr
    up = cloud.gpuq("up", "--for", str(queue), "--max-price", "1", "--spot", "--profile", "rehearsal")
    assert up.returncode == 0, up.stdout + up.stderr
    assert '"RTX 4090"' in up.stdout and up.stdout.count("preflight PASS") == 1, up.stdout
    assert cloud.gpuq("submit", str(queue)).returncode == 0
    (host,) = cloud.hosts().values()
    (job,) = cloud.jobs()
    root = cloud.host_root(host.instance_id)
    assert wait_for(lambda: _latest_step(root, job.id) >= 2 * CKPT_EVERY, timeout=300, interval=0.2)
    assert cloud.gpuq("patrol").returncode == 0  # ships the newest checkpoint home
    cloud.fake.preempt(host.instance_id)  # outbid: paused at once, no SIGTERM
    cloud.backend.wait_idle()
    patrolled = cloud.gpuq("patrol")
    assert patrolled.returncode == 0 and "spot preemption" in patrolled.stdout, patrolled.stdout
    listed = cloud.gpuq("hosts", "list")
    assert "still bills its disk" in " ".join(listed.stdout.split()), listed.stdout  # stopped is not free on vast.ai
    resumed = cloud.gpuq("resume")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"{host.name}: replaced by" in resumed.stdout and "resumed 1 job(s)" in resumed.stdout, resumed.stdout
    waited = cloud.gpuq("wait", "--timeout", "600", timeout=700)
    assert waited.returncode == 0, waited.stdout + waited.stderr
    (done,) = cloud.jobs()
    assert done.state == "SUCCEEDED" and done.host != host.name and done.attempt_count == 2
    new_root = cloud.host_root(cloud.hosts()[done.host].instance_id)
    assert 0 < _resumed_step(new_root, done.id, 2) <= _reached_step(root, done.id, 1)
    _pull_and_compare(cloud, reference)
    gone = cloud.gpuq("down", "--sweep", done.sweep_id, "--yes")  # the paused instance too: its disk bills
    assert gone.returncode == 0 and gone.stdout.count(": terminated") == 2, gone.stdout + gone.stderr
    assert not [i for i in cloud.fake.instances.values() if i.destroyed_polls is None]


def test_down_forgets_the_terminated_machines_key(cloud_factory: Callable[..., Cloud]) -> None:
    """RunPod hands a terminated pod's IP:port to the next pod: `gpuq down` must not leave the old key
    pinned there (the next `gpuq up` would meet a "changed key" refusal while the new pod bills)."""
    cloud = cloud_factory("runpod", hosts=1, gpus=1)
    up = cloud.gpuq("up", "--provider", "runpod", "--gpu", "NVIDIA RTX A6000", "--count", "1", "--gpus", "1",
                    "--profile", "rehearsal")
    assert up.returncode == 0, up.stdout + up.stderr
    (name,) = cloud.hosts()
    known = cloud.home / "known_hosts"
    assert [line for line in known.read_text().splitlines() if line.strip()]  # pinned at `up`
    gone = cloud.gpuq("down", name, "--yes")
    assert gone.returncode == 0, gone.stdout + gone.stderr
    assert not [line for line in known.read_text().splitlines() if line.strip()]
