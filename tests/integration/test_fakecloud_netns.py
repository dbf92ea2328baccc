"""The fake clouds backed by real SSH hosts (fakecloud.NetnsBackend over a HostFarm), driven by the real
adapters: provision -> ready -> SSH -> workload -> stop (SIGTERM, grace, SIGKILL) -> start on the same machine
-> terminate (disk wiped), and the Lambda shapes of the same story.  RunPod rents no spot pods since its API v2:
the outbid of an interruptible machine, on vast.ai, is test_vastai_netns.py's."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator.core.errors import ProvisioningFailed
from orchestrator.providers import lambda_cloud, runpod
from orchestrator.providers.base import classify
from orchestrator.providers.credentials import ApiKey
from orchestrator.providers.models import Instance, ProvisionRequest
from orchestrator.providers.polling import PollPolicy
from tests.support.fakecloud import FakeLambda, FakeRunPod, NetnsBackend, PoolExhausted
from tests.support.testhosts import FarmFactory, HostFarm

pytestmark = pytest.mark.integration

RUNPOD_KEY = "rp-netns-key"
LAMBDA_KEY = "lam-netns-key"
GRACE_S = 1.5
READY = PollPolicy(timeout_s=20.0, first_s=0.02, max_s=0.1)
GONE = PollPolicy(timeout_s=10.0, first_s=0.02, max_s=0.1)
DETACH = "setsid nohup {cmd} >/dev/null 2>&1 </dev/null &"
# A workload that cleans up on SIGTERM (the marker lands on the volume disk), and one that ignores it.
TRAP = """\
import os, signal, sys, time
def stop(signum, frame):
    with open("/root/sigterm-marker", "w") as f:
        f.write("SIGTERM %d\\n" % os.getpid())
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
open("/tmp/trap-ready", "w").close()
time.sleep(600)
"""
STUBBORN = """\
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
open("/tmp/stubborn-ready", "w").close()
time.sleep(600)
"""

Backends = Callable[..., tuple[HostFarm, NetnsBackend]]


@pytest.fixture
def netns(host_farm: FarmFactory) -> Iterator[Backends]:
    """``farm, backend = netns(n=2, gpus=2)``: a started farm and a NetnsBackend over it; the backend is
    closed (its workers stopped) before the farm is torn down."""
    made: list[NetnsBackend] = []

    def make(n: int = 1, gpus: int = 2, **kw: Any) -> tuple[HostFarm, NetnsBackend]:
        farm = host_farm(n=n, gpus=gpus)
        backend = NetnsBackend(farm, **kw)
        made.append(backend)
        return farm, backend

    yield make
    for backend in made:
        backend.close()


def runpod_adapter(cloud: FakeRunPod) -> runpod.RunPodProvider:
    return runpod.RunPodProvider(ApiKey(cloud.api_key, "RUNPOD_API_KEY"), url=cloud.url,
                                 transport=httpx.HTTPTransport(verify=False),
                                 policy=dataclasses.replace(runpod.RETRY, jitter=0.0, first_delay_s=0.05),
                                 min_interval_s=0.0, ready=READY, gone=GONE)


def lambda_adapter(cloud: FakeLambda) -> lambda_cloud.LambdaProvider:
    return lambda_cloud.LambdaProvider(ApiKey(cloud.api_key, "LAMBDA_API_KEY"), url=cloud.url,
                                       transport=httpx.HTTPTransport(verify=False), launch_interval_s=0.0,
                                       policy=dataclasses.replace(lambda_cloud.RETRY, jitter=0.0, first_delay_s=0.05),
                                       min_interval_s=0.0, ready=READY, gone=GONE)


def ok(res: Any) -> str:
    assert res.returncode == 0, f"rc={res.returncode}\nstdout={res.stdout}\nstderr={res.stderr}"
    return str(res.stdout)


def on(farm: HostFarm, inst: Instance, *argv: str, **kw: Any) -> Any:
    """Run argv over SSH on the endpoint the provider API reported (as root: the farm's hosts have no
    other account)."""
    assert inst.ssh_host and inst.ssh_port
    return farm.ssh_endpoint(inst.ssh_host, inst.ssh_port, *argv, **kw)


def wait_for(pred: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def start_workload(farm: HostFarm, inst: Instance, host_tmp: Path) -> dict[str, int]:
    """A detached sleep, a SIGTERM-trapping python and a SIGTERM-ignoring python; their root-namespace pids."""
    ok(on(farm, inst, "sh", "-c", "cat > /root/trap.py", input=TRAP))
    ok(on(farm, inst, "sh", "-c", "cat > /root/stubborn.py", input=STUBBORN))
    script = "\n".join(DETACH.format(cmd=c) for c in ("sleep 3021", "python3 /root/trap.py",
                                                       "python3 /root/stubborn.py"))
    ok(on(farm, inst, "sh", "-c", script))
    wait_for(lambda: (host_tmp / "trap-ready").exists() and (host_tmp / "stubborn-ready").exists(), 10,
             "the workload to start")
    index = next(h.index for h in farm.hosts if h.tmp == host_tmp)
    found: dict[str, int] = {}
    for pid, cmd in farm.host_processes(index).items():
        for name, needle in (("sleep", "sleep 3021"), ("trap", "/root/trap.py"), ("stubborn", "/root/stubborn.py")):
            if cmd.endswith(needle):
                found[name] = pid
    assert set(found) == {"sleep", "trap", "stubborn"}, farm.host_processes(index)
    return found


def gpu_lines(farm: HostFarm, inst: Instance) -> list[str]:
    return ok(on(farm, inst, "nvidia-smi", "-L")).splitlines()


# -- RunPod ---------------------------------------------------------------------------------------------


def test_runpod_pod_stopped_then_started_on_the_same_machine(netns: Backends) -> None:
    farm, backend = netns(n=2, gpus=2)
    with FakeRunPod(api_key=RUNPOD_KEY, backend=backend) as cloud:
        provider = runpod_adapter(cloud)
        try:
            cloud.stop_grace_s = GRACE_S
            [pod] = provider.provision(ProvisionRequest("gpuq-netns", "NVIDIA RTX A6000", gpu_count=2))
            assert not pod.ready
            ready = provider.wait_ready(pod.id)
            host = backend.host(pod.id)
            i = host.index
            assert (ready.ssh_host, ready.ssh_port, ready.ssh_user) == (host.address, 22, "root")
            gpus = gpu_lines(farm, ready)
            assert len(gpus) == 2 and gpus[0].startswith("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-")
            key = host.host_key_line
            ok(on(farm, ready, "sh", "-c", "echo kept > /root/kept; echo scratch > /tmp/scratch"))
            work = start_workload(farm, ready, host.tmp)

            # Stopped (the v2 stop action): the API says EXITED at once; the workload gets SIGTERM now and
            # SIGKILL after the grace.
            t0 = time.monotonic()
            provider.stop(pod.id)
            gone = provider.get(pod.id)
            assert gone is not None and gone.raw_status == "EXITED" and gone.state == "stopped"
            assert classify(gone) == "manual_stop" and not gone.ready
            wait_for(lambda: not {work["trap"], work["sleep"]} & set(farm.host_pids(i)), GRACE_S,
                     "the sleep and the trapping process to exit on SIGTERM")
            assert time.monotonic() - t0 < GRACE_S
            alive = farm.host_pids(i)
            assert work["stubborn"] in alive and host.init_pid in alive  # still in the grace
            assert (host.root / "sigterm-marker").read_text().startswith("SIGTERM ")  # it cleaned up
            backend.wait_idle()
            assert time.monotonic() - t0 >= GRACE_S * 0.9, "SIGKILL came before the grace ran out"
            assert farm.host_pids(i) == [] and not farm.is_up(i)
            assert (host.root / "kept").read_text() == "kept\n"
            assert on(farm, ready, "true").returncode == 255  # nobody home until the resume

            # the start action: the same machine (address, key, volume disk), a fresh container disk.
            provider.resume(pod.id, gpu_count=2)
            back = provider.wait_ready(pod.id)
            assert backend.host_index(pod.id) == i and host.host_key_line == key
            assert (back.ssh_host, back.ssh_port) == (host.address, 22)
            out = ok(on(farm, back, "sh", "-c", "cat /root/kept /root/sigterm-marker; ls -A /tmp")).split()
            assert out[0] == "kept" and out[1] == "SIGTERM" and "scratch" not in out and "trap-ready" not in out
            assert gpu_lines(farm, back) == gpus
            assert farm.workload_pids(i) == []

            # terminate: gone from the API, the machine killed and its disk wiped, back in the pool.
            provider.terminate(pod.id)
            provider.wait_gone(pod.id)
            backend.wait_idle()
            assert provider.get(pod.id) is None
            assert farm.host_pids(i) == [] and not farm.is_up(i)
            assert sorted(p.name for p in host.root.iterdir()) == [".ssh"]
            assert list(host.tmp.iterdir()) == []
            assert backend.owner(i) is None and backend.host_index(pod.id) is None
            assert farm.is_up(1 - i), "the other host of the pool is untouched"
        finally:
            provider.close()
    assert [e[0] for e in backend.events] == ["provision", "preempt", "provision", "destroy"]
    assert ("grace", pod.id, i, "full") in backend.actions
    assert backend.errors == []


def test_runpod_a_new_rental_of_a_used_host_is_a_new_machine(netns: Backends) -> None:
    farm, backend = netns(n=1, gpus=1)
    with FakeRunPod(api_key=RUNPOD_KEY, backend=backend) as cloud:
        provider = runpod_adapter(cloud)
        try:
            [first] = provider.provision(ProvisionRequest("gpuq-first", "NVIDIA RTX A6000"))
            first = provider.wait_ready(first.id)
            fresh_root = ok(on(farm, first, "ls", "-A", "/root"))  # .ssh (and the interpreter, if it lives there)
            ok(on(farm, first, "sh", "-c", "echo mine > /root/mine"))
            old_key, [old_gpu] = farm.hosts[0].host_key_line, gpu_lines(farm, first)
            with pytest.raises(PoolExhausted):
                backend.provision("not-a-pod", 1)  # the only host is rented
            provider.terminate(first.id)
            provider.wait_gone(first.id)

            [second] = provider.provision(ProvisionRequest("gpuq-second", "NVIDIA RTX A6000"))
            second = provider.wait_ready(second.id)
            assert backend.host_index(second.id) == 0 and second.ssh_host == first.ssh_host
            assert farm.hosts[0].host_key_line != old_key
            refused = on(farm, second, "true")  # the pin of the old machine no longer matches: fail closed
            assert refused.returncode == 255 and "Host key verification failed" in refused.stderr
            farm.write_known_hosts()
            assert ok(on(farm, second, "ls", "-A", "/root")) == fresh_root
            [new_gpu] = gpu_lines(farm, second)
            assert new_gpu != old_gpu  # other GPUs (UUIDs), same model
            assert new_gpu.split(" (UUID")[0] == old_gpu.split(" (UUID")[0]
        finally:
            provider.close()
    backend.wait_idle()
    assert [a[0] for a in backend.actions if a[1] == second.id] == ["wipe", "new_host_key", "boot"]


def test_runpod_user_stop_then_a_zero_gpu_resume(netns: Backends) -> None:
    farm, backend = netns(n=1, gpus=2)
    with FakeRunPod(api_key=RUNPOD_KEY, backend=backend) as cloud:
        provider = runpod_adapter(cloud)
        try:
            [pod] = provider.provision(ProvisionRequest("gpuq-stop", "NVIDIA RTX A6000", gpu_count=2))
            ready = provider.wait_ready(pod.id)
            assert len(gpu_lines(farm, ready)) == 2
            t0 = time.monotonic()
            provider.stop(pod.id)  # a 5 s grace, over as soon as no workload is left
            stopped = provider.get(pod.id)
            assert stopped is not None and classify(stopped) == "manual_stop"
            backend.wait_idle()
            assert time.monotonic() - t0 < 3 and not farm.is_up(0)
            cloud.zero_gpus_on_resume(pod.id)
            provider.resume(pod.id, gpu_count=2)
            with pytest.raises(ProvisioningFailed) as failed:
                provider.wait_ready(pod.id)
            assert failed.value.code == "host_failure"  # running with 0 GPUs
            backend.wait_idle()
            res = farm.ssh(0, "nvidia-smi", "-L")
            assert "No devices were found" in res.stdout
            assert farm.ssh(0, "sh", "-c", "ls /dev | grep -c nvidia || true").stdout.strip() == "0"
        finally:
            provider.close()
    assert ("grace", pod.id, 0, "idle") in backend.actions


# -- Lambda ---------------------------------------------------------------------------------------------


def test_lambda_instance_restart_host_failure_and_terminate(netns: Backends) -> None:
    farm, backend = netns(n=1, gpus=1)
    public = farm.client_key.with_suffix(".pub").read_text().strip()
    with FakeLambda(api_key=LAMBDA_KEY, backend=backend) as cloud:
        provider = lambda_adapter(cloud)
        try:
            [inst] = provider.provision(ProvisionRequest("gpuq-lam", "gpu_1x_a10", ssh_public_key=public))
            assert inst.raw_status == "booting" and not inst.ready
            ready = provider.wait_ready(inst.id)
            host = farm.hosts[0]
            assert (ready.ssh_host, ready.ssh_port, ready.ssh_user) == (host.address, 22, "ubuntu")
            assert len(gpu_lines(farm, ready)) == 1
            key = host.host_key_line
            ok(on(farm, ready, "sh", "-c", "echo kept > /root/kept; echo scratch > /tmp/scratch"))
            work = start_workload(farm, ready, host.tmp)

            # restart (the adapter has none): processes and /tmp lost, /root and the key kept
            with httpx.Client(transport=httpx.HTTPTransport(verify=False), timeout=10) as client:
                answer = client.post(f"{cloud.url}/instance-operations/restart", json={"instance_ids": [inst.id]},
                                     headers={"Authorization": f"Bearer {cloud.api_key}"})
            assert answer.status_code == 200
            booting = provider.get(inst.id)
            assert booting is not None and booting.raw_status == "booting" and not booting.ready
            back = provider.wait_ready(inst.id)
            assert back.ssh_host == host.address and host.host_key_line == key
            assert not set(work.values()) & set(farm.host_pids(0))
            out = ok(on(farm, back, "sh", "-c", "cat /root/kept; ls -A /tmp")).split()
            # /tmp is fresh: the scratch file is gone (an interpreter the farm binds under /tmp may show)
            assert out[0] == "kept" and "scratch" not in out
            assert [a[0] for a in backend.actions if a[1] == inst.id][-4:] == ["sigterm", "grace", "kill", "boot"]

            # host failure: the API says unhealthy and leaves the machine's fate open; here it dies
            start_workload(farm, back, host.tmp)
            cloud.host_failure(inst.id)
            sick = provider.get(inst.id)
            assert sick is not None and sick.state == "unhealthy" and classify(sick) == "host_failure"
            assert farm.workload_pids(0), "the fake alone does not touch the machine"
            backend.crash(inst.id)
            backend.wait_idle()
            assert farm.host_pids(0) == [] and on(farm, back, "true").returncode == 255

            provider.terminate(inst.id)
            provider.wait_gone(inst.id)
            backend.wait_idle()
            assert provider.get(inst.id) is None
            assert sorted(p.name for p in host.root.iterdir()) == [".ssh"] and backend.owner(0) is None
        finally:
            provider.close()
    assert [e[0] for e in backend.events] == ["provision", "preempt", "provision", "crash", "destroy"]
    assert backend.errors == []
