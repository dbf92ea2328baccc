"""Nothing gpuq rents bills unseen (docs/providers.md): every machine is in the ledger before its create
call, what `gpuq up` will not use it ends, and `gpuq down` ends what a killed gpuq left behind.

The CLI runs against the fake RunPod and Lambda (tests/support/fakecloud).  Most machines stand on the
fake's AddressBackend (no machine at all: a test that needs none waits for readiness that never comes,
or meets a port that refuses SSH); the one test that registers a host rents a real namespace SSH host.
After every scenario, each instance the fake lists as billing is held by a live ledger row.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core.states import AttemptState, HoldKind, JobState
from orchestrator.ledger import HostRow, Ledger
from orchestrator.providers.credentials import ApiKey
from orchestrator.providers.models import ProvisionRequest
from orchestrator.providers.runpod import RunPodProvider
from orchestrator.queue.queuefile import parse_queue
from tests.conftest import run_gpuq, wait_for
from tests.support.fakecloud import AddressBackend, FakeLambda, FakeRunPod, HostBackend, NetnsBackend
from tests.support.rented import add_rented
from tests.support.testhosts import HostFarm

pytestmark = pytest.mark.integration

KEYS = {"runpod": "rp-billing-key-0123456789", "lambda": "secret_lambda-billing-key-0123456789"}
GPU = {"runpod": "NVIDIA RTX A6000", "lambda": "gpu_1x_a10"}


class RefusingBackend(AddressBackend):
    """Every machine answers at a loopback port that refuses connections: up in the API, never usable."""

    def __init__(self) -> None:
        super().__init__()
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))  # bound, never listening: a connect is refused at once
        self.port = int(self._sock.getsockname()[1])

    def provision(self, instance_id: str, gpu_count: int) -> tuple[str, int]:
        super().provision(instance_id, gpu_count)
        return "127.0.0.1", self.port

    def close(self) -> None:
        self._sock.close()


class Rig:
    """One user of one fake provider, with a gpuq home of their own."""

    def __init__(self, tmp: Path, provider: str, backend: HostBackend, key: Path) -> None:
        self.provider = provider
        self.backend = backend
        fake: Any = FakeRunPod if provider == "runpod" else FakeLambda
        self.fake = fake(api_key=KEYS[provider], backend=backend).start()
        self.home = tmp / "gpuq-home"
        self.home.mkdir(parents=True)
        upper = provider.upper()
        self.env = {"GPUQ_HOME": str(self.home), "GPUQ_SSH_KEY": str(key), "GPUQ_PROVIDER_POLL_S": "0.1",
                    "GPUQ_PREFLIGHT_SAMPLES": "1", f"{upper}_API_KEY": KEYS[provider],
                    f"GPUQ_{upper}_URL": self.fake.url}

    def gpuq(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return run_gpuq(*args, env=self.env, timeout=timeout)

    def up_args(self, *extra: str) -> list[str]:
        return ["up", "--provider", self.provider, "--gpu", GPU[self.provider], *extra]

    def spawn(self, *args: str) -> subprocess.Popen[str]:
        """The CLI as a real process of its own, for signals.  SIGINT as at a terminal: a suite started in
        the background by a shell without job control (CI's may be) inherits it ignored, and Python then
        keeps it ignored, so Ctrl-C would never reach gpuq."""
        return subprocess.Popen([sys.executable, "-m", "orchestrator", *args], env={**os.environ, **self.env},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))

    def rows(self) -> dict[str, HostRow]:
        ledger = Ledger(self.home / "ledger.db")
        try:
            return {h.name: h for h in ledger.hosts() if h.provider}
        finally:
            ledger.close()

    def billing(self) -> dict[str, str]:
        """instance id -> name of every instance the fake still lists as billing."""
        with self.fake.lock:
            if self.provider == "runpod":
                return {p.id: p.name for p in self.fake.pods.values() if p.status != "TERMINATED"}
            return {i.id: i.name or "" for i in self.fake.instances.values()
                    if i.status not in ("terminating", "terminated")}

    def unseen(self) -> dict[str, str]:
        """Billing instances no live ledger row holds (by id, or by name while its create never answered)."""
        live = [r for r in self.rows().values() if r.lease_state != "terminated"]
        ids = {r.instance_id for r in live if r.instance_id}
        names = {r.instance_name for r in live if not r.instance_id and r.instance_name}
        return {i: n for i, n in self.billing().items() if i not in ids and n not in names}

    def close(self) -> None:
        self.fake.stop()
        close = getattr(self.backend, "close", None)
        if close is not None:
            close()


@pytest.fixture(scope="module")
def key(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("keys") / "id_billing"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


@pytest.fixture
def rig(tmp_path: Path, key: Path) -> Iterator[Callable[..., Rig]]:
    made: list[Rig] = []

    def make(provider: str = "runpod", backend: HostBackend | None = None, ssh_key: Path | None = None) -> Rig:
        r = Rig(tmp_path / f"rig{len(made)}", provider, backend or AddressBackend(), ssh_key or key)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


def test_partial_capacity_keeps_and_registers_what_was_created(rig: Callable[..., Rig], tmp_path: Path,
                                                               host_farm: Callable[..., HostFarm]) -> None:
    farm = host_farm(n=1, gpus=1)
    cloud = rig(backend=NetnsBackend(farm, moving_ports=True), ssh_key=farm.client_key)
    cloud.fake.set_stock(GPU["runpod"], 1)  # stock for one of the two
    up = cloud.gpuq(*cloud.up_args("--count", "2", "--profile", "rehearsal"))
    assert up.returncode == 1, up.stdout + up.stderr
    rows = cloud.rows()
    (host,) = rows.values()  # the one never created left no row
    assert host.lease_state == "running" and host.instance_id in cloud.billing() and host.instance_name
    assert f"{host.name}: runpod {host.instance_id}" in up.stdout and "preflight" in up.stdout, up.stdout
    assert "1 of 2 not created" in up.stderr and "no longer any instances available" in up.stderr, up.stderr
    assert f"`gpuq down {host.name}` ends them" in up.stderr, up.stderr
    assert cloud.unseen() == {}
    gone = cloud.gpuq("down", host.name, "--yes")
    assert gone.returncode == 0, gone.stdout + gone.stderr
    assert cloud.billing() == {} and cloud.rows()[host.name].lease_state == "terminated"


def test_a_machine_that_fails_its_audit_is_terminated_and_said(rig: Callable[..., Rig]) -> None:
    cloud = rig(backend=RefusingBackend())
    up = cloud.gpuq(*cloud.up_args())
    assert up.returncode == 1, up.stdout + up.stderr
    (row,) = cloud.rows().values()
    assert "not usable (" in up.stderr and "gpuq terminated it" in up.stderr, up.stderr
    assert row.lease_state == "terminated" and "not usable" in row.lease_reason and cloud.billing() == {}

    # the terminate fails too: the machine stays recorded, held, and named with the command that ends it
    cloud.fake.rest_error("Something went wrong. Please try again later.", operation="DELETE /pods")
    again = cloud.gpuq(*cloud.up_args())
    assert again.returncode == 1, again.stdout + again.stderr
    (kept,) = [r for r in cloud.rows().values() if r.name != row.name]
    assert kept.instance_id in cloud.billing() and cloud.unseen() == {}
    assert kept.lease_state == "provisioning" and kept.hold is HoldKind.UNUSABLE, kept
    assert kept.hold_detail.startswith("not usable") and kept.hold_text.startswith("unusable: not usable"), kept
    assert f"`gpuq down {kept.name}` ends it" in again.stderr, again.stderr
    listed = cloud.gpuq("hosts", "list")
    assert "PROVISIONING" in listed.stdout, listed.stdout
    gone = cloud.gpuq("down", kept.name, "--yes")
    assert gone.returncode == 0, gone.stdout + gone.stderr
    assert cloud.billing() == {} and cloud.rows()[kept.name].lease_state == "terminated"


def _wait_for_id(cloud: Rig) -> HostRow:
    assert wait_for(lambda: any(r.instance_id for r in cloud.rows().values()), timeout=60, interval=0.05)
    (row,) = cloud.rows().values()
    return row


@pytest.mark.parametrize("provider", ["runpod", "lambda"])
def test_ctrl_c_while_up_waits_for_readiness_ends_the_machine(rig: Callable[..., Rig], provider: str) -> None:
    cloud = rig(provider)
    if provider == "lambda":
        cloud.fake.slow_ready(10**6)
    else:
        cloud.fake.slow_ready(port_polls=10**6)
    proc = cloud.spawn(*cloud.up_args())
    try:
        row = _wait_for_id(cloud)  # created and recorded; now in the readiness wait
        assert row.lease_state == "provisioning" and row.instance_id in cloud.billing()
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, out + err
    assert f"{row.name}: {provider} {row.instance_id}" in err and "gpuq terminated it" in err, err
    assert cloud.billing() == {}
    assert cloud.rows()[row.name].lease_state == "terminated"


@pytest.mark.parametrize("when", ["after the create answered", "before the create answered",
                                  "before anything was created"])
def test_gpuq_killed_during_up_leaves_a_row_that_down_ends(rig: Callable[..., Rig], when: str) -> None:
    cloud = rig()
    cloud.fake.slow_ready(port_polls=10**6)
    if when != "after the create answered":
        cloud.fake.slow_create(60.0)  # the pod exists at once; its id would come back a minute later
    proc = cloud.spawn(*cloud.up_args())
    try:
        if when == "after the create answered":
            row = _wait_for_id(cloud)
        else:
            assert wait_for(lambda: cloud.billing() != {}, timeout=60, interval=0.05)
        proc.kill()  # SIGKILL: nothing of gpuq runs after this
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    (row,) = cloud.rows().values()
    assert row.lease_state == "provisioning" and row.instance_name
    (pod_id, pod_name), = cloud.billing().items()
    assert pod_name == row.instance_name and cloud.unseen() == {}
    assert row.instance_id == (pod_id if when == "after the create answered" else "")
    listed = cloud.gpuq("hosts", "list")
    assert "PROVISIONING" in listed.stdout, listed.stdout
    status = cloud.gpuq("status", "--json", "--no-probe")
    assert status.returncode == 0, status.stderr
    (shown,) = [h for h in json.loads(status.stdout)["hosts"] if h["name"] == row.name]
    assert shown["lease_state"] == "provisioning"
    if when == "before anything was created":
        cloud.fake.remove(pod_id)  # as if the kill had come before the create reached the provider
    gone = cloud.gpuq("down", row.name, "--yes")
    assert gone.returncode == 0, gone.stdout + gone.stderr
    assert cloud.billing() == {}
    if when == "before anything was created":
        assert "never created" in gone.stdout and row.name not in cloud.rows(), gone.stdout
    else:
        assert f"{row.name}: terminated" in gone.stdout, gone.stdout
        assert cloud.rows()[row.name].lease_state == "terminated"


def test_a_failed_replacement_in_resume_is_recorded_and_down_ends_it(rig: Callable[..., Rig], tmp_path: Path,
                                                                     key: Path) -> None:
    backend = RefusingBackend()
    cloud = rig(backend=backend)
    assert cloud.gpuq("hosts", "list").returncode == 0  # the ledger exists
    provider = RunPodProvider(ApiKey(KEYS["runpod"], "test"), url=cloud.fake.url, min_interval_s=0.0)
    try:
        (old,) = provider.provision(ProvisionRequest("gpuq-0000beef-aaaaaa", GPU["runpod"]))
    finally:
        provider.close()
    cloud.fake.host_failure(old.id)  # "Exited by Runpod": the job on it is lost
    sweep = _lost_job_on(cloud, tmp_path, key, old.id, backend.port)
    cloud.fake.rest_error("Something went wrong. Please try again later.", operation="DELETE /pods")
    resumed = cloud.gpuq("resume")
    assert resumed.returncode == 1, resumed.stdout + resumed.stderr  # the lost host is not back
    assert "runpod-old not brought back" in resumed.stderr and "`gpuq down" in resumed.stderr, resumed.stderr
    (new,) = [r for r in cloud.rows().values() if r.replaces == "runpod-old"]
    assert new.instance_id in cloud.billing() and cloud.unseen() == {}
    assert f"`gpuq down {new.name}` ends it" in resumed.stderr
    gone = cloud.gpuq("down", "--sweep", sweep, "--yes")  # the lost host and its failed replacement
    assert gone.returncode == 0, gone.stdout + gone.stderr
    assert cloud.billing() == {}


def _lost_job_on(cloud: Rig, tmp: Path, key: Path, instance_id: str, port: int) -> str:
    """A sweep whose one job was LOST on the rented host ``runpod-old`` (pod ``instance_id``)."""
    (tmp / "configs").mkdir()
    (tmp / "configs" / "a.yaml").write_text("seed: 1\n")
    queue = tmp / "queue.txt"
    queue.write_text("configs/a.yaml classify 1 name=one\n")
    ledger = Ledger(cloud.home / "ledger.db")
    try:
        add_rented(ledger, HostRow(name="runpod-old", kind="ssh", target="root@127.0.0.1", port=port,
                                   root="/root/gpuq", key_path=str(key), profile="runpod", provider="runpod",
                                   instance_id=instance_id, gpu_type=GPU["runpod"], gpu_count=1, lease_state="running",
                                   created_at=0.0))
        (job,) = ledger.add_sweep(sweep_id="qbilled", queue_path=str(queue), workdir=str(tmp),
                                  queue_text=queue.read_text(), jobs=parse_queue(queue).jobs, default_retries=0,
                                  bundle_sha="b" * 64)
        ledger.start_attempt(job.id, host="runpod-old", bundle_sha="b" * 64)
        ledger.transition(job.id, AttemptState.LOST, attempt=1)
        ledger.transition(job.id, JobState.LOST)
    finally:
        ledger.close()
    return "qbilled"


def test_down_orphans_ends_only_this_ledgers_unheld_instances(rig: Callable[..., Rig]) -> None:
    cloud = rig()
    first = cloud.gpuq("down", "--orphans", "--yes")
    assert first.returncode == 0 and "no orphaned instances" in first.stdout, first.stdout + first.stderr
    me = (cloud.home / "ledger-id").read_text().strip()
    provider = RunPodProvider(ApiKey(KEYS["runpod"], "test"), url=cloud.fake.url, min_interval_s=0.0)
    try:
        def rent(name: str) -> str:
            (made,) = provider.provision(ProvisionRequest(name, GPU["runpod"]))
            return made.id

        orphan = rent(f"gpuq-{me}-0a0a0a")  # created outside the ledger (a crash before any row, by hand)
        held = rent(f"gpuq-{me}-0b0b0b-0")  # a live row holds it
        ended = rent(f"gpuq-{me}-0c0c0c")  # its row says terminated, and it still bills
        mine = rent("my-notebook")  # not gpuq's name
        theirs = rent("gpuq-0badc0de-0d0d0d")  # another ledger's
        older = rent("gpuq-0e0e0e-1")  # named by a gpuq before ledger ids
    finally:
        provider.close()
    ledger = Ledger(cloud.home / "ledger.db")
    try:
        for name, instance_id, state in (("runpod-held", held, "running"), ("runpod-ended", ended, "terminated")):
            add_rented(ledger, HostRow(name=name, kind="ssh", target="root@203.0.113.77", root="/root/gpuq",
                                       provider="runpod", instance_id=instance_id, lease_state=state, created_at=0.0))
    finally:
        ledger.close()

    asked = cloud.gpuq("down", "--orphans")  # no terminal, no --yes: refused, nothing ends
    assert asked.returncode == 2 and "--yes" in asked.stderr, asked.stdout + asked.stderr
    assert set(cloud.billing()) == {orphan, held, ended, mine, theirs, older}
    assert f"runpod {orphan}" in asked.stdout and f"runpod {ended}" in asked.stdout and "$0.79/h" in asked.stdout
    assert "its row runpod-ended says terminated" in asked.stdout, asked.stdout
    assert held not in asked.stdout and mine not in asked.stdout and theirs not in asked.stdout, asked.stdout
    assert f"runpod {older}" in asked.stderr and "older gpuq" in asked.stderr, asked.stderr
    assert "1 gpuq instance(s) of other ledgers left alone" in asked.stdout

    done = cloud.gpuq("down", "--orphans", "--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    assert set(cloud.billing()) == {held, mine, theirs, older}
    assert f"runpod {orphan}: terminated" in done.stdout and f"runpod {ended}: terminated" in done.stdout
    again = cloud.gpuq("down", "--orphans", "--yes")
    assert again.returncode == 0 and "no orphaned instances" in again.stdout, again.stdout
    assert (cloud.home / "ledger-id").read_text().strip() == me
