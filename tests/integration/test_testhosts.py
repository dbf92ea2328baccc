"""The test host farm itself (tests/support/testhosts/): real sshd in real namespaces."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.testhosts import FarmFactory, HostFarm, list_netns, pid_ns

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
NVSMI_QUERY = ["nvidia-smi", "--query-gpu=index,name,uuid,utilization.gpu,memory.used,memory.total,temperature.gpu",
               "--format=csv,noheader,nounits"]
DETACH = "setsid nohup sleep {secs} >/dev/null 2>&1 </dev/null &"


@pytest.fixture(scope="module")
def farm(host_farm_module: FarmFactory) -> HostFarm:
    """Two hosts shared by the read-only tests below (each test leaves them as it found them)."""
    return host_farm_module(n=2, gpus=2)


def _ok(res: subprocess.CompletedProcess[str]) -> str:
    assert res.returncode == 0, f"rc={res.returncode}\nstdout={res.stdout}\nstderr={res.stderr}"
    return res.stdout


def _pids_running(farm: HostFarm, i: int, needle: str) -> list[int]:
    return [p for p, cmd in farm.host_processes(i).items() if cmd == needle]


def _detach_sleep(farm: HostFarm, i: int, secs: int) -> int:
    _ok(farm.ssh(i, "sh", "-c", DETACH.format(secs=secs)))
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        pids = _pids_running(farm, i, f"sleep {secs}")
        if pids:
            return pids[0]
        time.sleep(0.05)
    raise AssertionError(f"detached sleep {secs} not found on host {i}: {farm.host_processes(i)}")


def test_hosts_reachable_with_pinned_host_keys(farm: HostFarm) -> None:
    lines = farm.known_hosts.read_text().splitlines()
    assert lines == [f"{h.address} {h.host_key_line}" for h in farm.hosts]
    for i, h in enumerate(farm.hosts):
        assert _ok(farm.ssh(i, "hostname")).strip() == h.name
        assert h.host_key_line.startswith("ssh-ed25519 AAAA")
    assert len({h.address for h in farm.hosts}) == len(farm.hosts)
    # strict checking is really on: an empty known_hosts refuses the same host
    empty = farm.base_dir / "empty_known_hosts"
    empty.write_text("")
    res = farm.ssh(0, "true", options=["-o", f"UserKnownHostsFile={empty}"])
    assert res.returncode == 255 and "Host key verification failed" in res.stderr
    # every sshd of the farm lives in its host's network namespace, none in ours
    own_net = os.readlink("/proc/self/ns/net")
    for i in range(len(farm.hosts)):
        for pid, cmd in farm.host_processes(i).items():
            if cmd.startswith("sshd"):
                assert os.readlink(f"/proc/{pid}/ns/net") != own_net


def test_pid_namespaces_are_separate(farm: HostFarm) -> None:
    pid = _detach_sleep(farm, 1, 3011)
    try:
        assert "sleep 3011" in _ok(farm.ssh(1, "ps", "-eo", "args"))
        seen0 = _ok(farm.ssh(0, "ps", "-eo", "pid,args"))
        assert "sleep 3011" not in seen0
        assert pid in farm.host_pids(1) and pid not in farm.host_pids(0)
        assert seen0.splitlines()[1].split()[0] == "1"  # PID 1: the host's init
        assert pid_ns(pid) == farm.hosts[1].pidns != pid_ns(os.getpid())
    finally:
        os.kill(pid, 9)


def test_root_and_tmp_are_per_host(farm: HostFarm) -> None:
    marker = f"gpuq-testhosts-marker-{os.getpid()}"
    _ok(farm.ssh(0, "sh", "-c", f"echo r > /root/{marker} && echo t > /tmp/{marker}"))
    try:
        assert (farm.hosts[0].root / marker).read_text() == "r\n"
        assert (farm.hosts[0].tmp / marker).read_text() == "t\n"
        res = farm.ssh(1, "sh", "-c", f"ls /root/{marker} /tmp/{marker}")
        assert res.returncode != 0
        assert not Path(f"/root/{marker}").exists() and not Path(f"/tmp/{marker}").exists()
        assert not (farm.hosts[1].root / marker).exists() and not (farm.hosts[1].tmp / marker).exists()
    finally:
        (farm.hosts[0].root / marker).unlink(missing_ok=True)
        (farm.hosts[0].tmp / marker).unlink(missing_ok=True)


def test_python_with_torch_like_a_rental_image(farm: HostFarm) -> None:
    out = _ok(farm.ssh(0, "sh", "-c", "command -v python3; command -v python; command -v nvidia-smi; "
                                      "python3 -c 'import sys, torch; print(sys.executable); print(torch.__version__)'",
                       timeout=120)).split()
    assert out[:3] == ["/usr/local/bin/python3", "/usr/local/bin/python", "/usr/local/bin/nvidia-smi"]
    assert out[3] == sys.executable
    assert out[4] == importlib.metadata.version("torch")  # the controller's own torch, without importing it


def test_fake_nvidia_smi_over_ssh(farm: HostFarm) -> None:
    lines = _ok(farm.ssh(0, *NVSMI_QUERY)).splitlines()
    assert len(lines) == 2
    state = farm.read_gpu_state(0)
    for line, gpu in zip(lines, state["gpus"], strict=True):
        f = [x.strip() for x in line.split(",")]
        assert f == [str(gpu["index"]), "NVIDIA H100 80GB HBM3", gpu["uuid"], "0", "0", "81559", "31"]
    assert _ok(farm.ssh(0, "nvidia-smi", "-L")).splitlines()[1].startswith("GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-")
    # hosts have distinct GPUs, and state changes show at once
    assert farm.read_gpu_state(1)["gpus"][0]["uuid"] != state["gpus"][0]["uuid"]
    farm.set_gpu(0, 1, utilization_gpu=97, memory_used=40000, processes=[{"pid": 4242, "used_memory": 40000}])
    try:
        assert _ok(farm.ssh(0, *NVSMI_QUERY)).splitlines()[1].split(", ")[3:5] == ["97", "40000"]
        apps = _ok(farm.ssh(0, "nvidia-smi", "--query-compute-apps=pid,used_memory,gpu_uuid",
                            "--format=csv,noheader,nounits"))
        assert apps.strip() == f"4242, 40000, {state['gpus'][1]['uuid']}"
        farm.set_driver_broken(0)
        res = farm.ssh(0, *NVSMI_QUERY)
        assert res.returncode == 9 and "NVIDIA-SMI has failed" in res.stdout
    finally:
        farm.write_gpu_state(0, state)


def test_stop_and_start_sshd_keeps_the_host_up(farm: HostFarm) -> None:
    pid = _detach_sleep(farm, 0, 3012)
    try:
        farm.stop_sshd(0)
        res = farm.ssh(0, "true")
        assert res.returncode == 255 and "refused" in res.stderr
        assert pid in farm.host_pids(0) and farm.hosts[0].init_alive()
        assert not any(c.startswith("sshd") for c in farm.host_processes(0).values())
        farm.start_sshd(0)
        _ok(farm.ssh(0, "true"))
        assert pid in farm.host_pids(0)
    finally:
        os.kill(pid, 9)


def test_cut_connections_drops_sessions_not_processes(farm: HostFarm) -> None:
    detached = _detach_sleep(farm, 0, 3013)
    client = subprocess.Popen([*farm.ssh_argv(0), "--", "sleep 3014"], stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 10
        while not _pids_running(farm, 0, "sleep 3014") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _pids_running(farm, 0, "sleep 3014"), "remote sleep never started"
        t0 = time.monotonic()
        assert farm.cut_connections(0) >= 1
        rc = client.wait(timeout=10)
        assert rc == 255 and time.monotonic() - t0 < 5
        assert detached in farm.host_pids(0)
        _ok(farm.ssh(0, "true"))  # sshd still listening
    finally:
        if client.poll() is None:
            client.kill()
        client.communicate()
        for p in [detached, *_pids_running(farm, 0, "sleep 3014")]:
            os.kill(p, 9)


def test_link_down_is_a_partition_with_timeouts(farm: HostFarm) -> None:
    farm.set_link(1, False)
    try:
        t0 = time.monotonic()
        res = farm.ssh(1, "true", options=["-o", "ConnectTimeout=2"])
        assert res.returncode == 255 and "timed out" in res.stderr, res.stderr
        assert time.monotonic() - t0 >= 1.5
    finally:
        farm.set_link(1, True)
    _ok(farm.ssh(1, "true"))


def test_preempt_kills_every_process_and_boot_restarts(host_farm: FarmFactory) -> None:
    farm = host_farm(n=2, gpus=1)
    detached = _detach_sleep(farm, 0, 3015)
    _ok(farm.ssh(0, "sh", "-c", "echo keep > /root/kept; echo gone > /tmp/gone"))
    before = farm.host_pids(0)
    assert detached in before and farm.hosts[0].init_pid in before
    ns = farm.hosts[0].pidns
    held = os.open(f"/proc/{farm.hosts[0].init_pid}/ns/pid", os.O_RDONLY)  # its inode number stays its own
    try:
        farm.preempt(0)
        assert farm.host_pids(0) == [] and farm.hosts[0].pidns == ""
        assert not [p for p in os.listdir("/proc") if p.isdigit() and pid_ns(int(p)) == ns]
    finally:
        os.close(held)
    assert not [p for p in before if Path(f"/proc/{p}").exists() and pid_ns(p) == ns]
    assert farm.ssh(0, "true").returncode == 255
    _ok(farm.ssh(1, "true"))  # the neighbour is untouched
    farm.boot(0)
    out = _ok(farm.ssh(0, "sh", "-c", "cat /root/kept; ls /tmp")).split()
    assert out[0] == "keep" and "gone" not in out  # /root persists, /tmp is fresh


def test_regenerated_host_key_fails_strict_checking(host_farm: FarmFactory) -> None:
    farm = host_farm(n=1, gpus=0)
    old = farm.hosts[0].host_key_line
    new = farm.regenerate_host_key(0)
    assert new != old and new.startswith("ssh-ed25519 ")
    res = farm.ssh(0, "true")
    assert res.returncode == 255 and "Host key verification failed" in res.stderr
    farm.write_known_hosts()
    _ok(farm.ssh(0, "true"))
    # gpus=0: a CPU host, no nvidia-smi at all
    assert farm.ssh(0, "nvidia-smi", "-L").returncode == 127


def test_teardown_leaves_nothing(host_farm: FarmFactory) -> None:
    a, b = host_farm(n=3, gpus=1), host_farm(n=1, gpus=1)  # two farms side by side never collide
    assert a.farm_id != b.farm_id
    assert not {h.address for h in a.hosts} & {h.address for h in b.hosts}
    assert a.start_seconds > 0  # how long a farm takes to start: `scripts/testhosts.py up` reports it
    _detach_sleep(a, 2, 3016)
    names = [h.netns for h in a.hosts]
    nss = [h.pidns for h in a.hosts]
    launchers = [h.launcher_pid for h in a.hosts]
    veths = [h.veth for h in a.hosts]
    # hold the hosts' PID namespaces: a freed namespace's inode number goes to the next new one (another
    # worker's host), and its processes must not be taken for survivors of this farm
    held = [os.open(f"/proc/{h.init_pid}/ns/pid", os.O_RDONLY) for h in a.hosts]
    try:
        a.teardown()
        a.teardown()  # idempotent
        assert not [p for p in os.listdir("/proc") if p.isdigit() and pid_ns(int(p)) in nss]
    finally:
        for fd in held:
            os.close(fd)
    assert not set(names) & set(list_netns())
    assert not [p for p in launchers if Path(f"/proc/{p}").exists()]
    assert not [v for v in veths if Path(f"/sys/class/net/{v}").exists()]
    assert json.loads(a.state_file.read_text())["status"] == "down"
    _ok(b.ssh(0, "true"))  # the other farm is untouched


def test_cli_up_and_down(tmp_path: Path) -> None:
    d = tmp_path / "cli-farm"
    script = str(REPO / "scripts" / "testhosts.py")
    up = subprocess.run([sys.executable, script, "up", "--n", "1", "--gpus", "1", "--dir", str(d)],
                        capture_output=True, text=True, timeout=120, check=False)
    farm = HostFarm.from_state(d) if (d / "farm.json").exists() else None
    try:
        assert up.returncode == 0, up.stderr
        info = json.loads(up.stdout)
        assert farm is not None and farm.hosts[0].init_alive()  # outlived the `up` process
        assert info["hosts"][0]["address"] == farm.hosts[0].address
        _ok(farm.ssh(0, "nvidia-smi", "-L"))
        down = subprocess.run([sys.executable, script, "down", "--dir", str(d)], capture_output=True, text=True,
                              timeout=120, check=False)
        assert down.returncode == 0, down.stderr
        assert farm.hosts[0].netns not in list_netns()
        assert not farm.hosts[0].init_alive()
    finally:
        if farm is not None:
            farm.teardown()
