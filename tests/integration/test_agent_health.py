"""The host agent's GPU preflight (`health`), kernel-log Xids in `status --json`, and the VRAM reaper
(`reap`), run over SSH on a test-farm "GPU host": fake nvidia-smi state, a fake dmesg over a kernel-log
fixture, fake /dev/nvidia* nodes that real processes hold open (tests/support/testhosts/).

One module-scoped host; every test puts back the GPU state and kernel log it changed and kills every
process it started (by pid inside the host, or by recorded process group).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.host_documents import unframe
from tests.support.testhosts import FarmFactory, HostFarm

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
AGENT_SRC = REPO / "payload" / "agent"
AGENT_LOCAL = str(AGENT_SRC / "gpuq_agent.py")  # runs on this machine
# a host's mount namespace covers /tmp and /root with its own dirs, and a checkout may live under
# either (CI clones into /tmp): hosts run a copy of the agent placed in their own /root
AGENT = "/root/gpuq-agent/gpuq_agent.py"
AGENT_PY = os.environ.get("GPUQ_TEST_AGENT_PYTHON") or sys.executable
ROOT = "/root/gpuq"  # in-host root of the health/status/reap runs
SHA = "e" * 64
ALL_CHECKS = ["tooling", "identity", "visibility", "driver", "kernel", "throttle", "heat", "ecc", "busy", "disk",
              "inodes", "shm"]


@pytest.fixture(scope="module")
def farm(host_farm_module: FarmFactory) -> HostFarm:
    made = host_farm_module(n=1, gpus=2)
    shutil.copytree(AGENT_SRC, made.hosts[0].root_dir / "root" / "gpuq-agent",
                    ignore=shutil.ignore_patterns("__pycache__", ".mypy_cache"))
    return made


@pytest.fixture
def host(farm: HostFarm) -> Iterator[HostFarm]:
    """The shared host, put back as it was after each test (GPU state, kernel log)."""
    state = farm.read_gpu_state(0)
    farm.clear_kernel_log(0)
    yield farm
    farm.write_gpu_state(0, state)
    farm.clear_kernel_log(0)


def agent(farm: HostFarm, *args: str, root: str = ROOT, timeout: float = 120) -> tuple[int, dict[str, Any], str]:
    """Run an agent verb on host 0 over SSH: (exit code, the one JSON document on stdout, stderr)."""
    res = farm.ssh(0, "python3", AGENT, "--root", root, *args, timeout=timeout)
    text, noise = unframe(res.stdout)
    assert text and not noise, f"rc={res.returncode} stdout={res.stdout!r} stderr={res.stderr}"
    return res.returncode, json.loads(text), res.stderr


def health(farm: HostFarm, *args: str, root: str = ROOT) -> tuple[int, dict[str, Any], dict[str, dict[str, str]]]:
    rc, doc, _err = agent(farm, "health", "--samples", "1", *args, root=root)
    return rc, doc, {c["check"]: c for c in doc["checks"]}


# --- the farm's GPU-host props --------------------------------------------------------------------


def test_farm_host_has_private_dev_gpu_nodes_and_dmesg(host: HostFarm) -> None:
    out = host.ssh(0, "sh", "-c", "ls /dev; stat -c '%n %F %t:%T' /dev/null /dev/nvidia0 /dev/nvidia1 "
                   "/dev/nvidiactl /dev/nvidia-uvm; df -P /dev/shm | tail -1; echo x > /dev/nvidia0 && echo ok")
    assert out.returncode == 0, out.stderr
    names = set(out.stdout.split())
    assert {"null", "zero", "urandom", "tty", "ptmx", "pts", "shm", "fd", "stdin"} <= names
    assert "kvm" not in names and "loop0" not in names  # private: only what a container gets
    for node in ("/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm"):
        assert f"{node} character special file 1:3" in out.stdout
    assert "/dev/nvidia2 " not in out.stdout and out.stdout.strip().endswith("ok")
    # a holder shows in fuser on its node only, and dies on release
    pid = host.hold_gpu_device(0, 1)
    try:
        res = host.ssh(0, "sh", "-c", "fuser /dev/nvidia1 2>/dev/null; echo; fuser /dev/nvidia0 2>/dev/null; true")
        first, second = [*res.stdout.split("\n"), "", ""][:2]
        assert first.split() == [str(pid)] and second.split() == []
    finally:
        host.release_gpu_device(0, pid)
    # the kernel log: boot lines, appended lines in rising time, unreadable on demand
    a = host.append_kernel_log(0, "first")
    b = host.append_kernel_log(0, "second")
    res = host.ssh(0, "dmesg")
    assert res.returncode == 0 and res.stdout.splitlines()[-2:] == [a, b]
    assert float(a[1:a.index("]")]) < float(b[1:b.index("]")])
    assert "Linux version" in res.stdout.splitlines()[0]
    host.set_kernel_log_readable(0, False)
    res = host.ssh(0, "dmesg")
    assert res.returncode == 1 and res.stderr.strip() == "dmesg: read kernel buffer failed: Operation not permitted"
    host.set_kernel_log_readable(0, True)
    assert host.ssh(0, "dmesg", "-t").stdout.splitlines()[-1] == "second"


# --- health ---------------------------------------------------------------------------------------


def test_healthy_host_passes(host: HostFarm) -> None:
    rc, doc, checks = health(host)
    assert rc == 0 and doc["verdict"] == "pass", doc
    assert doc["schema"] == "gpuq.health/1" and doc["host"] == host.hosts[0].name and doc["time"].endswith("Z")
    assert [c["check"] for c in doc["checks"]] == ALL_CHECKS
    assert all(c["status"] == "pass" and c["detail"] for c in doc["checks"])
    assert "1 dmon samples" in checks["tooling"]["detail"]
    assert checks["identity"]["detail"] == "2 x NVIDIA H100 80GB HBM3 (81559 MiB)"
    assert [g["index"] for g in doc["gpus"]] == [0, 1] and doc["gpus"][0]["samples"] == 1
    assert doc["gpus"][0]["temp_c"] == 31 and doc["gpus"][0]["sm_clock_max_mhz"] == 1980
    assert doc["kernel"]["readable"] is True and doc["kernel"]["xids"] == [] and doc["kernel"]["cursor"]
    # only the requested GPUs; a requested index the host lacks fails
    rc, doc, _checks = health(host, "--gpus", "1")
    assert rc == 0 and [g["index"] for g in doc["gpus"]] == [1]
    rc, doc, checks = health(host, "--gpus", "0,5")
    assert rc == 2 and doc["verdict"] == "fail"
    assert checks["tooling"]["status"] == "fail" and "requested GPU 5 absent" in checks["tooling"]["detail"]
    # usage errors
    res = host.ssh(0, "python3", AGENT, "--root", ROOT, "health", "--gpus", "zero")
    assert res.returncode == 64 and res.stdout == "" and "--gpus" in res.stderr
    # the disk gate
    rc, doc, checks = health(host, "--min-free-gb", "1e9")
    assert rc == 2 and checks["disk"]["status"] == "fail" and "below the 1e+09 GB gate" in checks["disk"]["detail"]


def test_kernel_xids_79_fails_13_warns_and_the_cursor_forgets_them(host: HostFarm) -> None:
    host.inject_xid(0, 1, 13)
    rc, doc, checks = health(host)
    assert rc == 0 and doc["verdict"] == "warn"
    assert checks["kernel"]["status"] == "warn" and "Xid 13 on 0000:19:00" in checks["kernel"]["detail"]
    line = host.inject_xid(0, 0, 79)
    rc, doc, checks = health(host)
    assert rc == 2 and doc["verdict"] == "fail"
    assert checks["kernel"]["status"] == "fail"
    assert checks["kernel"]["detail"].startswith("host unhealthy: Xid 79 on 0000:18:00")
    assert [x["code"] for x in doc["kernel"]["xids"]] == [13, 79]
    assert doc["kernel"]["xids"][1]["line"] == line and doc["kernel"]["cursor"] == line[1:line.index("]")].strip()
    # once the controller holds the cursor, the old Xids are no longer new
    rc, doc, checks = health(host, "--kernel-since", doc["kernel"]["cursor"])
    assert rc == 0 and doc["verdict"] == "pass" and checks["kernel"]["status"] == "pass"
    # findings go to stderr too
    _rc, _doc, err = agent(host, "health", "--samples", "0")
    assert "gpuq health: FAIL kernel: host unhealthy: Xid 79" in err and "verdict FAIL" in err


def test_unreadable_kernel_log_warns(host: HostFarm) -> None:
    host.inject_xid(0, 0, 79)
    host.set_kernel_log_readable(0, False)
    rc, doc, checks = health(host)
    assert rc == 0 and doc["verdict"] == "warn"  # unknown, not clean and not proven unhealthy
    assert checks["kernel"]["status"] == "warn"
    assert checks["kernel"]["detail"].startswith(
        "non-authoritative: kernel log unreadable; a human must confirm no Xid")
    assert "Operation not permitted" in checks["kernel"]["detail"]
    assert doc["kernel"] == {"readable": False, "error": "dmesg: read kernel buffer failed: Operation not permitted",
                             "cursor": "", "xids": []}


@pytest.mark.parametrize("reason", ["hw_slowdown", "sw_thermal_slowdown"])
def test_active_throttling_fails(host: HostFarm, reason: str) -> None:
    host.set_gpu_throttle(0, 1, reason)
    rc, doc, checks = health(host)
    assert rc == 2 and doc["verdict"] == "fail"
    assert checks["throttle"]["status"] == "fail" and f"GPU 1: {reason} Active" in checks["throttle"]["detail"]
    assert doc["gpus"][1]["throttle"] == [reason] and doc["gpus"][0]["throttle"] == []


def test_heat_with_crushed_clock_fails_heat_alone_warns(host: HostFarm) -> None:
    host.set_gpu_heat(0, 0, 87, sm_clock_mhz=1100)  # 56 % of the 1980 MHz maximum
    rc, doc, checks = health(host)
    assert rc == 2 and checks["heat"]["status"] == "fail"
    assert "GPU 0: 87 C with SM clock 1100 of max 1980 MHz" in checks["heat"]["detail"]
    host.set_gpu_heat(0, 0, 85, sm_clock_mhz=1980)
    rc, doc, checks = health(host)
    assert rc == 0 and doc["verdict"] == "warn" and checks["heat"]["status"] == "warn"


def test_ecc_errors_fail(host: HostFarm) -> None:
    host.set_gpu_ecc(0, 1, uncorrected=3)
    rc, _doc, checks = health(host)
    assert rc == 2 and checks["ecc"]["status"] == "fail"
    assert "GPU 1: 3 volatile uncorrectable ECC errors" in checks["ecc"]["detail"]
    host.set_gpu_ecc(0, 1, retired_pending=True, remap_failure=True)
    rc, _doc, checks = health(host)
    assert rc == 2 and "page retirement pending" in checks["ecc"]["detail"] and "row-remap" in checks["ecc"]["detail"]


def test_cpu_only_torch_on_a_gpu_host_fails(host: HostFarm) -> None:
    """The farm's interpreter has a CPU build of torch: on a GPU host that is a FAIL, said plainly."""
    rc, _doc, checks = health(host, "--python", "python3", "--samples", "0")
    assert rc == 2 and checks["visibility"]["status"] == "fail"
    assert "CPU-only build (torch.version.cuda is None) on a GPU host" in checks["visibility"]["detail"]
    rc, _doc, checks = health(host, "--python", "/nonexistent/python", "--samples", "0")
    assert rc == 2 and "interpreter /nonexistent/python not found" in checks["visibility"]["detail"]


def test_broken_driver_fails_tooling(host: HostFarm) -> None:
    host.set_driver_broken(0)
    rc, doc, checks = health(host)
    assert rc == 2 and checks["tooling"]["status"] == "fail" and "NVIDIA-SMI has failed" in checks["tooling"]["detail"]
    assert checks["throttle"]["status"] == "warn" and checks["throttle"]["detail"].startswith("not checked")
    assert doc["gpus"] == []


def test_cpu_host_passes_gpu_checks_and_reap_refuses(tmp_path: Path) -> None:
    """This machine has no GPU and no nvidia-smi: a CPU host, run with the agent interpreter (3.8 in CI)."""
    if shutil.which("nvidia-smi") or list(Path("/dev").glob("nvidia*")):
        pytest.skip("this machine has NVIDIA tooling: not a CPU host")
    res = subprocess.run([AGENT_PY, AGENT_LOCAL, "--root", str(tmp_path / "r"), "health", "--samples", "0"],
                         capture_output=True, text=True, timeout=60, check=False)
    doc = json.loads(unframe(res.stdout)[0])
    checks = {c["check"]: c for c in doc["checks"]}
    for name in ("tooling", "identity", "visibility", "driver", "kernel", "throttle", "heat", "ecc", "busy"):
        assert checks[name] == {"check": name, "status": "pass", "detail": "no GPUs (cpu slots)"}
    assert res.returncode in (0, 2) and (res.returncode == 2) == (doc["verdict"] == "fail")
    assert not (tmp_path / "r").exists()  # read-only: nothing created
    # with GPUs requested, a missing nvidia-smi is a FAIL
    res = subprocess.run([AGENT_PY, AGENT_LOCAL, "--root", str(tmp_path / "r"), "health", "--gpus", "0",
                          "--samples", "0"], capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 2 and "nvidia-smi is not installed but GPUs are expected" in res.stdout
    res = subprocess.run([AGENT_PY, AGENT_LOCAL, "--root", str(tmp_path / "r"), "reap"], capture_output=True, text=True,
                         timeout=60, check=False)
    assert res.returncode == 1 and "no /dev/nvidia* device nodes" in res.stderr
    assert json.loads(unframe(res.stdout)[0])["schema"] == "gpuq.reap/1"


# --- status: kernel -------------------------------------------------------------------------------


def test_status_reports_a_new_xid_once(host: HostFarm) -> None:
    rc, st, _err = agent(host, "status", "--json")
    assert rc == 0 and set(st["kernel"]) - {"oom_kills"} == {"readable", "error", "cursor", "xids"}
    assert st["kernel"]["readable"] and st["kernel"]["xids"] == []
    cursor = st["kernel"]["cursor"]
    line = host.inject_xid(0, 0, 79)
    host.append_kernel_log(0, "eth0: link up")
    rc, st, _err = agent(host, "status", "--json", "--kernel-since", cursor)
    xids = st["kernel"]["xids"]
    assert rc == 0 and len(xids) == 1 and xids[0]["code"] == 79 and xids[0]["pci"] == "0000:18:00"
    assert xids[0]["line"] == line and xids[0]["ts"] > float(cursor)
    new_cursor = st["kernel"]["cursor"]
    assert float(new_cursor) > xids[0]["ts"]  # the last line seen, not the last Xid
    rc, st, _err = agent(host, "status", "--json", "--kernel-since", new_cursor)
    assert st["kernel"]["xids"] == [] and st["kernel"]["cursor"] == new_cursor
    # the controller's "boot_id:ts" form: same boot honours it, another boot means every line is new
    rc, st, _err = agent(host, "status", "--json", "--kernel-since", f"{st['boot_id']}:{new_cursor}")
    assert st["kernel"]["xids"] == []
    rc, st, _err = agent(host, "status", "--json", "--kernel-since", f"00000000-old-boot:{new_cursor}")
    assert [x["code"] for x in st["kernel"]["xids"]] == [79]
    # unreadable: no Xids claimed, the cursor kept
    host.set_kernel_log_readable(0, False)
    rc, st, _err = agent(host, "status", "--json", "--kernel-since", new_cursor)
    assert rc == 0 and st["kernel"]["readable"] is False and st["kernel"]["cursor"] == new_cursor
    assert "Operation not permitted" in st["kernel"]["error"]


# --- reap -----------------------------------------------------------------------------------------

HOLD_TRAINER = '''\
"""Holds the GPU it was given open (like a CUDA context) until result/../release exists."""
import os, sys, time
dev = "/dev/nvidia" + os.environ["CUDA_VISIBLE_DEVICES"].split(",")[0]
fd = os.open(dev, os.O_RDWR)
result = os.environ["GPUQ_RESULT_DIR"]
os.makedirs(result, exist_ok=True)
with open(os.path.join(result, "trainer.pid.tmp"), "w") as f:
    f.write(str(os.getpid()))
os.replace(os.path.join(result, "trainer.pid.tmp"), os.path.join(result, "trainer.pid"))
deadline = time.monotonic() + 120
while not os.path.exists(os.path.join(result, "..", "release")) and time.monotonic() < deadline:
    time.sleep(0.05)
sys.exit(0)
'''


class HostJob:
    """A gpuq job on host 0 whose trainer holds /dev/nvidia0, run by a detached agent of its own root."""

    def __init__(self, farm: HostFarm, name: str) -> None:
        self.farm = farm
        self.root = f"/root/{name}"
        self.local = farm.hosts[0].root / name
        bundle = self.local / "bundles" / SHA
        shutil.copytree(AGENT_SRC, bundle / "payload" / "agent", ignore=shutil.ignore_patterns("__pycache__"))
        (bundle / "payload" / "hold_train.py").write_text(HOLD_TRAINER)
        (bundle / "workdir").mkdir()
        (bundle / "workdir" / "cfg.json").write_text("{}")
        for d in ("inbox", "claimed", "withdrawn", "jobs"):
            (self.local / d).mkdir(parents=True, exist_ok=True)
        self.job_id = "c00000000beef"
        self.agent = f"{self.root}/bundles/{SHA}/payload/agent/gpuq_agent.py"

    def start(self) -> int:
        spec = {"schema": "gpuq.job/1", "job_id": self.job_id, "name": "holder", "queue_id": "qhealth",
                "attempt": 1, "task": "t", "epochs": 1, "gpus": 1, "nodes": 1, "seed": None, "config": "cfg.json",
                "bundle_sha": SHA, "entry": "payload/hold_train.py", "launcher": "python", "python": "",
                "verify": [], "heartbeat_s": 1, "ckpt_interval_s": 600, "kill_grace_s": 1, "min_free_gb": 0,
                "scratch_gb": 0, "durable_dir": "", "resume_from": None, "spec_hash": "h", "env": {},
                "created_at": time.time()}
        tmp = self.local / "inbox" / f".{self.job_id}.tmp"
        tmp.write_text(json.dumps(spec))
        os.rename(tmp, self.local / "inbox" / f"{self.job_id}.json")
        res = self.farm.ssh(0, "python3", self.agent, "--root", self.root, "serve", "--detach", "--idle-exit-s", "2",
                            "--train-device", "cpu")
        assert res.returncode == 0, res.stdout + res.stderr
        pid_file = self.local / "jobs" / self.job_id / "result" / "trainer.pid"
        deadline = time.monotonic() + 30
        while not pid_file.exists():
            assert time.monotonic() < deadline, (self.local / "agent.log").read_text()
            time.sleep(0.05)
        return int(pid_file.read_text())

    def stop(self) -> None:
        """Release the trainer, then kill whatever of the agent and the attempt is left, by recorded group."""
        (self.local / "jobs" / self.job_id / "release").touch()
        exit_file = self.local / "jobs" / self.job_id / "attempts" / "1" / "exit.json"
        deadline = time.monotonic() + 15
        while not exit_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        groups = []
        for rec_file in (self.local / "agent.pid", self.local / "jobs" / self.job_id / "attempts" / "1" / "pgid"):
            with contextlib.suppress(OSError, ValueError, KeyError):
                groups.append(int(json.loads(rec_file.read_text())["pgid"]))
        if groups:
            self.farm.ssh(0, "sh", "-c", 'for g in "$@"; do kill -9 -- "-$g" 2>/dev/null; done; true', "sh",
                          *map(str, groups))


def alive(farm: HostFarm, pid: int) -> bool:
    res = farm.ssh(0, "sh", "-c", f"test -d /proc/{pid} && ! grep -q '^State:.*Z' /proc/{pid}/status")
    return res.returncode == 0


def test_reap_finds_the_zombie_only_and_force_kills_it(host: HostFarm) -> None:
    job = HostJob(host, "gpuq-reap")
    zombie = listed = 0
    try:
        trainer = job.start()
        zombie = host.hold_gpu_device(0, 0, "--api-key=hunter2", "--wandb-token", "s3cret")
        listed = host.hold_gpu_device(0, 1)
        host.set_gpu(0, 1, memory_used=30000, processes=[{"pid": listed, "used_memory": 30000}])
        # while the job runs, its GPU's memory is ours: busy passes for GPU 0 and fails for GPU 1
        host.set_gpu(0, 0, memory_used=40000)
        rc, doc, checks = health(host, "--samples", "0", root=job.root)
        assert rc == 2 and checks["busy"]["status"] == "fail", checks["busy"]
        assert f"GPU 1: 30000 MiB used and no gpuq attempt runs on it (nvidia-smi lists pid {listed})" \
            in checks["busy"]["detail"]
        assert "GPU 0" not in checks["busy"]["detail"] and doc["gpus"][0]["gpuq_job"] == job.job_id
        time.sleep(1.0)  # every holder is now older than --min-age-s 1
        t0 = time.monotonic()
        rc, doc, err = agent(host, "reap", "--min-age-s", "1", "--resample-s", "1", root=job.root)
        assert time.monotonic() - t0 >= 1.0  # two samples, a second apart
        assert rc == 0 and doc["schema"] == "gpuq.reap/1" and doc["dry_run"] is True and doc["clean"] is False
        assert doc["tool"] == "fuser" and "/dev/nvidia0" in doc["devices"] and "/dev/nvidiactl" in doc["devices"]
        assert [c["pid"] for c in doc["candidates"]] == [zombie], doc
        cand = doc["candidates"][0]
        assert cand["devices"] == ["/dev/nvidia0"] and cand["user"] == "root" and cand["comm"].startswith("python")
        assert cand["age_s"] >= 1.0
        assert "--api-key=<redacted>" in cand["cmdline"] and "--wandb-token <redacted>" in cand["cmdline"]
        assert "hunter2" not in json.dumps(doc) and "s3cret" not in err
        assert doc["excluded"].get("listed by nvidia-smi") == 1 and doc["excluded"].get("gpuq job tree", 0) >= 1
        assert doc["killed"] == [] and alive(host, zombie)
        # a holder younger than --min-age-s is left alone
        rc, doc, _err = agent(host, "reap", "--min-age-s", "3600", "--resample-s", "0", root=job.root)
        assert rc == 0 and doc["clean"] is True and doc["excluded"].get("younger than 3600s") == 1
        # --force: SIGTERM, and the outcome per pid; nothing else is touched
        rc, doc, err = agent(host, "reap", "--force", "--min-age-s", "1", "--resample-s", "0.2", root=job.root)
        assert rc == 0 and doc["dry_run"] is False
        assert doc["killed"] == [{"pid": zombie, "outcome": "terminated"}], doc
        assert f"gpuq reap: pid {zombie} terminated" in err
        assert set(doc["memory_used_mib"]) == {"before", "after"}
        assert not alive(host, zombie) and alive(host, listed) and alive(host, trainer)
        rc, doc, _err = agent(host, "reap", "--min-age-s", "0", "--resample-s", "0", root=job.root)
        assert rc == 0 and doc["clean"] is True and doc["candidates"] == []
    finally:
        for pid in (zombie, listed):
            if pid:
                host.release_gpu_device(0, pid)
        job.stop()
