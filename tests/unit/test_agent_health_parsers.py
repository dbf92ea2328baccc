"""Parsers and verdict rules of the host agent's GPU preflight (gpuq_health.py, gpuq_health_gpus.py,
gpuq_health_checks.py), kernel-log reader (gpuq_kernel.py) and VRAM reaper (gpuq_reap.py, gpuq_reap_find.py,
gpuq_reap_judge.py, gpuq_reap_kill.py, gpuq_reap_redact.py): pure functions, no network, no GPU."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support import fake_nvidia_smi
from tests.support.agentmodule import load_agent_module

K = load_agent_module("gpuq_watch.gpuq_kernel")
H = load_agent_module("gpuq_verbs.gpuq_health")
G = load_agent_module("gpuq_verbs.gpuq_health_gpus")
V = load_agent_module("gpuq_verbs.gpuq_health_checks")
R = load_agent_module("gpuq_verbs.gpuq_reap")
RF = load_agent_module("gpuq_verbs.gpuq_reap_find")
RJ = load_agent_module("gpuq_verbs.gpuq_reap_judge")
RK = load_agent_module("gpuq_verbs.gpuq_reap_kill")
RR = load_agent_module("gpuq_verbs.gpuq_reap_redact")
PROTO = load_agent_module("gpuq_base.gpuq_protocol")

XID79 = "[ 1234.567890] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."


# --- kernel log -----------------------------------------------------------------------------------


def test_parse_xid_forms() -> None:
    assert K.parse_xid(XID79) == {"ts": 1234.56789, "code": 79, "pci": "0000:3b:00", "line": XID79}
    old = "[   12.5] NVRM: Xid (0000:03:00): 13, Graphics Exception: ESR 0x405840=0x1"
    assert K.parse_xid(old)["pci"] == "0000:03:00" and K.parse_xid(old)["code"] == 13
    journal = "[ 4711.000001] box kernel: NVRM: Xid (PCI:0000:18:00.0): 48, pid='<unknown>', DBE"
    rec = K.parse_xid(journal)
    assert (rec["ts"], rec["code"], rec["pci"]) == (4711.000001, 48, "0000:18:00.0")
    assert K.parse_xid("NVRM: Xid (PCI:0000:3b:00): 31, no timestamp")["ts"] is None
    assert K.parse_xid("[ 1.0] NVRM: loading NVIDIA UNIX x86_64 Kernel Module") is None
    assert K.parse_xid("[ 1.0] usb 1-1: Xid-like text but not the driver's") is None
    assert K.line_ts("[    0.000000] Linux version") == ("0.000000", 0.0)
    assert K.line_ts("no timestamp") is None


def test_cursor_forms() -> None:
    assert K.parse_cursor(None) is None and K.parse_cursor("") is None and K.parse_cursor("  ") is None
    assert K.parse_cursor("12.5", "b1", 100.0) == 12.5
    assert K.parse_cursor("b1:12.5", "b1", 100.0) == 12.5
    assert K.parse_cursor("b0:12.5", "b1", 100.0) is None  # another boot: everything is new
    assert K.parse_cursor("5000.0", "b1", 100.0) is None  # past this boot's uptime: the clock restarted
    assert K.parse_cursor("nonsense", "b1", 100.0) is None
    assert K.parse_cursor("nan", "b1", 100.0) is None


def test_scan_lines_only_after_the_cursor() -> None:
    lines = ["[ 1.000000] Linux version", "[ 2.000000] NVRM: Xid (PCI:0000:3b:00): 13, app fault",
             "[ 3.000000] eth0: link up", XID79.replace("1234.567890", "4.000000"), "[ 5.000000] last line"]
    cursor, xids = K.scan_lines(lines, None)
    assert cursor == "5.000000" and [x["code"] for x in xids] == [13, 79]
    cursor, xids = K.scan_lines(lines, 2.0)
    assert cursor == "5.000000" and [x["code"] for x in xids] == [79]
    assert K.scan_lines(lines, 5.0) == ("5.000000", [])
    assert K.scan_lines([], 5.0) == ("", [])


def test_kernel_section_readable_unreadable_and_limit() -> None:
    sec = K.kernel_section("b:1.5", lines=["[ 1.000000] a", "[ 2.000000] NVRM: Xid (PCI:0:1:2): 43, x"])
    assert sec["readable"] and sec["error"] == "" and sec["cursor"] == "2.000000"
    assert [x["code"] for x in sec["xids"]] == [43]  # "b" is not this boot's id: every line is new
    sec = K.kernel_section("1.5", lines=["[ 1.000000] a"])
    assert sec == {"readable": True, "error": "", "cursor": "1.000000", "xids": []}
    sec = K.kernel_section("1.5", lines=[])
    assert sec["cursor"] == "1.5"  # nothing newer: the cursor given comes back
    bad = K.kernel_section("1.5", lines=None, error="dmesg: read kernel buffer failed: Operation not permitted")
    assert bad == {"readable": False, "error": "dmesg: read kernel buffer failed: Operation not permitted",
                   "cursor": "1.5", "xids": []}
    many = [f"[ {i + 1}.000000] NVRM: Xid (PCI:0000:3b:00): {79 if i == 3 else 13}, x" for i in range(120)]
    sec = K.kernel_section(None, lines=many)
    assert len(sec["xids"]) == PROTO.KERNEL_MAX_XIDS == 50
    assert sec["xids"][0]["code"] == 79 and sec["xids"][-1]["ts"] == 120.0  # fatal kept, then the newest


# --- health: parsers ------------------------------------------------------------------------------


def test_cells_and_ids() -> None:
    assert G.num("81559") == 81559.0 and G.num("81559 MiB") == 81559.0
    assert G.num("[N/A]") is None and G.num("[Not Supported]") is None and G.num("") is None
    assert G.flag("Active") is True and G.flag("Not Active") is False and G.flag("Yes") is True
    assert G.flag("No") is False and G.flag("Disabled") is False and G.flag("2") is True
    assert G.flag("0") is False and G.flag("[N/A]") is None and G.flag(None) is None
    assert H.parse_gpu_ids("0,1") == [0, 1] and H.parse_gpu_ids("") == [] and H.parse_gpu_ids("1, 1,3") == [1, 3]
    with pytest.raises(ValueError):
        H.parse_gpu_ids("0,a")
    with pytest.raises(ValueError):
        H.parse_gpu_ids("-1")
    rows = G.parse_csv("0, NVIDIA A100-SXM4-80GB, 81920\n1, Weird, Name, Inc, 40960\n\n",
                       ["index", "name", "memory.total"])
    assert rows == [{"index": "0", "name": "NVIDIA A100-SXM4-80GB", "memory.total": "81920"},
                    {"index": "1", "name": "Weird,Name,Inc", "memory.total": "40960"}]
    assert G.cuda_tuple("12.4") == (12, 4) and G.cuda_tuple(None) is None


REAL_DMON = """\
# gpu    pwr  gtemp  mtemp     sm    mem    enc    dec    jpg    ofa   mclk   pclk  pviol  tviol     fb   bar1   ccpm  sbecc  dbecc    pci  rxpci  txpci
# Idx      W      C      C      %      %      %      %      %      %    MHz    MHz      %   bool     MB     MB     MB   errs   errs   errs   MB/s   MB/s
    0     69     31     35      0      0      0      0      0      0   2619   1980      0      0      0      1      0      3      0      0      0      0
    1     71     84      -      0      0      0      0      0      0   2619    900      0      0      0      1      0      0      0      0      0      0
    0     70     32     35      0      0      0      0      0      0   2619   1980      0      0      0      1      0      5      0      0      0      0
"""  # noqa: E501


def test_parse_dmon_real_and_fake(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = G.parse_dmon(REAL_DMON)
    assert sorted(data) == [0, 1] and len(data[0]) == 2 and len(data[1]) == 1
    assert data[1][0]["gtemp"] == 84.0 and data[1][0]["pclk"] == 900.0 and data[1][0]["mtemp"] is None
    assert [s["sbecc"] for s in data[0]] == [3.0, 5.0]
    assert G.parse_dmon("") == {} and G.parse_dmon("Failed to initialize NVML\n") == {}
    # the fake nvidia-smi's dmon speaks the same format
    state = tmp_path / "gpus.json"
    import json

    from tests.support.testhosts import default_gpus

    state.write_text(json.dumps({"gpus": default_gpus("x", 2)}))
    assert fake_nvidia_smi.main(["--state", str(state), "dmon", "-s", "pucvmet", "-c", "1"]) == 0
    fake = G.parse_dmon(capsys.readouterr().out)
    assert sorted(fake) == [0, 1] and fake[0][0]["gtemp"] == 31.0 and fake[0][0]["pclk"] == 1980.0


def _row(**kw: Any) -> dict[str, str]:
    row = {"index": "0", "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-0", "pci.bus_id": "00000000:18:00.0",
           "memory.total": "81559", "memory.used": "0", "temperature.gpu": "40", "clocks.current.sm": "1980",
           "clocks.max.sm": "1980", "ecc.mode.current": "Enabled", "ecc.errors.corrected.volatile.total": "0",
           "ecc.errors.uncorrected.volatile.total": "0", "retired_pages.pending": "No",
           "remapped_rows.failure": "No"}
    for r in G.THROTTLE_REASONS:
        row["clocks_throttle_reasons." + r] = "Not Active"
    row.update({k.replace("__", "."): str(v) for k, v in kw.items()})
    return row


def _gpu(dmon: list[dict[str, float | None]] | None = None, **kw: Any) -> dict[str, Any]:
    return G.gpu_record(_row(**kw), dmon or [])


# --- health: rules --------------------------------------------------------------------------------


def test_throttle_rule() -> None:
    assert V.check_throttle([_gpu()])[0] == "pass"
    for reason in G.THROTTLE_REASONS:
        st, detail = V.check_throttle([_gpu(), _gpu(index=1, **{"clocks_throttle_reasons__" + reason: "Active"})])
        assert st == "fail" and f"GPU 1: {reason} Active" in detail
    # power capping and idle are not faults
    g = _gpu()
    g["throttle"] = []
    assert V.check_throttle([g])[0] == "pass"


def test_heat_rule_compares_with_the_maximum_clock() -> None:
    assert V.check_heat([_gpu(temperature__gpu=82, clocks__current__sm=500)])[0] == "pass"
    st, detail = V.check_heat([_gpu(temperature__gpu=83, clocks__current__sm=1300)])  # 66 % of max
    assert st == "fail" and "83 C with SM clock 1300 of max 1980 MHz" in detail
    st, detail = V.check_heat([_gpu(temperature__gpu=88, clocks__current__sm=1400)])  # 71 %: still normal
    assert st == "warn" and "not yet throttled" in detail
    peak = [{"gtemp": 85.0, "pclk": 1980.0}, {"gtemp": 70.0, "pclk": 1980.0}]
    st, detail = V.check_heat([_gpu(peak, temperature__gpu=70)])
    assert st == "warn" and "reached 85 C" in detail
    assert V.check_heat([_gpu(temperature__gpu="[N/A]")])[0] == "pass"


def test_ecc_rule() -> None:
    assert V.check_ecc([_gpu()])[0] == "pass"
    assert V.check_ecc([_gpu(ecc__errors__uncorrected__volatile__total=2)]) == (
        "fail", "GPU 0: 2 volatile uncorrectable ECC errors")
    assert V.check_ecc([_gpu(retired_pages__pending="Yes")])[0] == "fail"
    assert V.check_ecc([_gpu(remapped_rows__failure="Yes")])[0] == "fail"
    assert V.check_ecc([_gpu(ecc__errors__uncorrected__volatile__total="[N/A]")])[0] == "pass"  # consumer card
    rising = [{"sbecc": 3.0}, {"sbecc": 5.0}]
    assert V.check_ecc([_gpu(rising)])[0] == "warn"
    st, detail = V.check_ecc([_gpu(ecc__mode__current="Disabled")])
    assert st == "warn" and "ECC is off on a data-centre card" in detail
    assert V.check_ecc([_gpu(name="NVIDIA GeForce RTX 4090", ecc__mode__current="Disabled")])[0] == "pass"


def test_busy_rule() -> None:
    free, used = _gpu(memory__used=900), _gpu(index=1, uuid="GPU-1", memory__used=40000)
    assert V.check_busy([free], {})[0] == "pass"
    st, detail = V.check_busy([free, used], {"GPU-1": [4242]})
    assert st == "fail" and "GPU 1: 40000 MiB used and no gpuq attempt runs on it (nvidia-smi lists pid 4242)" in detail
    used["gpuq_job"] = "c000000000001"
    st, detail = V.check_busy([free, used], {})
    assert st == "pass" and "GPU 1: c000000000001" in detail


def test_identity_rule() -> None:
    assert V.check_identity([_gpu(), _gpu(index=1)], "", None) == ("pass", "2 x NVIDIA H100 80GB HBM3 (81559 MiB)")
    assert V.check_identity([_gpu()], "H100", 80000)[0] == "pass"
    st, detail = V.check_identity([_gpu(memory__total=40960, name="NVIDIA A100-SXM4-40GB")], "A100", 80000)
    assert st == "fail" and "below the 80000 MiB requested" in detail
    assert V.check_identity([_gpu()], "A100", None)[0] == "warn"


def test_kernel_rule() -> None:
    ok = {"readable": True, "cursor": "5.0", "xids": []}
    assert V.check_kernel(ok)[0] == "pass"
    rec13 = {"ts": 1.0, "code": 13, "pci": "0000:3b:00", "line": "..."}
    rec79 = {"ts": 2.0, "code": 79, "pci": "0000:3b:00", "line": "..."}
    assert V.check_kernel({**ok, "xids": [rec13]})[0] == "warn"
    st, detail = V.check_kernel({**ok, "xids": [rec13, rec79]})
    assert st == "fail" and detail.startswith("host unhealthy: Xid 79 on 0000:3b:00") and "also Xid 13" in detail
    assert V.check_kernel({**ok, "xids": [{**rec79, "code": 48}]})[0] == "fail"
    st, detail = V.check_kernel({"readable": False, "error": "dmesg: read kernel buffer failed", "xids": []})
    assert st == "warn"
    assert detail.startswith("non-authoritative: kernel log unreadable; a human must confirm no Xid")


def test_torch_rule() -> None:
    good = {"torch": "2.4.0", "cuda": "12.4", "available": True, "count": 2}
    assert [c[1] for c in V.check_torch(good, True, 2, (12, 4), "py")] == ["pass", "pass"]
    cpu = {"torch": "2.4.0+cpu", "cuda": None, "available": False, "count": 0}
    (name, st, detail), _drv = V.check_torch(cpu, True, 2, (12, 4), "py")
    assert (name, st) == ("visibility", "fail") and "CPU-only build" in detail
    assert V.check_torch({**good, "available": False}, True, 2, (12, 4), "py")[0][1] == "fail"
    assert "torch sees 1 GPUs, expected 2" in V.check_torch({**good, "count": 1}, True, 2, (12, 4), "py")[0][2]
    # driver older than the toolkit: a newer major fails, a newer minor that works warns
    assert V.check_torch({**good, "cuda": "13.0"}, True, 2, (12, 4), "py")[1][1] == "fail"
    assert V.check_torch({**good, "cuda": "12.6"}, True, 2, (12, 4), "py")[1][1] == "warn"
    assert V.check_torch({**good, "cuda": "12.6", "available": False}, True, 2, (12, 4), "py")[1][1] == "fail"
    assert V.check_torch({"error": "import torch failed: ModuleNotFoundError"}, True, 2, None, "py")[0][1] == "fail"
    # a CPU host: GPU checks pass with "no GPUs (cpu slots)"; a missing torch only warns
    assert V.check_torch(cpu, False, 0, None, "py")[0][1] == "pass"
    assert V.check_torch({"error": "x"}, False, 0, None, "py")[0][1] == "warn"
    assert [c[1] for c in V.check_torch(None, True, 2, None, "")] == ["pass", "pass"]


def test_disk_and_shm_rules() -> None:
    disk = {"path": "/r", "free_bytes": 50e9, "used_pct": 50.0, "inodes_used_pct": 10.0}
    assert [c[1] for c in V.check_disk(disk, 10.0)] == ["pass", "pass"]
    assert V.check_disk(disk, 60.0)[0][1] == "fail"
    assert V.check_disk({**disk, "used_pct": 92.0}, 10.0)[0][1] == "warn"
    assert V.check_disk({**disk, "inodes_used_pct": 95.0}, 0.0)[1][1] == "fail"
    assert V.check_disk({**disk, "inodes_used_pct": 91.0}, 0.0)[1][1] == "warn"
    assert V.check_shm(64 << 20)[0] == "warn" and V.check_shm(None)[0] == "warn"
    assert V.check_shm(2 << 30)[0] == "pass"
    assert V.worst(["pass", "warn", "pass"]) == "warn" and V.worst(["warn", "fail"]) == "fail"
    assert V.worst([]) == "pass"


# --- reap -----------------------------------------------------------------------------------------


def test_redact_and_parsers() -> None:
    argv = ["python", "train.py", "--api-key=abc123", "--token", "t0ps3cret", "WANDB_API_KEY=k",
            "--lr", "0.1", "https://user:pw@example.com/repo", "hf_abcdefghijklmnop", "-c", "a\nb",
            "--password", "--next-flag"]
    assert RR.redact(argv) == ("python train.py --api-key=<redacted> --token <redacted> WANDB_API_KEY=<redacted> "
                               "--lr 0.1 https://<redacted>@example.com/repo <redacted> -c a\\nb "
                               "--password --next-flag")
    assert len(RR.redact(["x" * 5000])) == RR.MAX_CMDLINE + 3
    assert RF.parse_fuser(" 1234 5678m 910e  1234c\n") == [1234, 5678, 910]
    assert RF.parse_fuser("") == [] and RF.parse_pids("12\n\n34\nx\n12\n") == [12, 34]
    assert RJ.is_daemon("nvidia-persiste", ["/usr/bin/nvidia-persistenced"])
    assert RJ.is_daemon("Xorg", ["/usr/lib/xorg/Xorg"]) and RJ.is_daemon("x", ["/usr/sbin/gdm3"])
    assert not RJ.is_daemon("python3", ["python3", "train.py"])


def test_reap_keeps_only_candidates_seen_twice_with_the_same_start(monkeypatch: pytest.MonkeyPatch,
                                                                    tmp_path: Path) -> None:
    def sample(cands: dict[int, int]) -> Any:
        s = RJ.Sample()
        for pid, ticks in cands.items():
            s.cands[pid] = {"pid": pid, "user": "root", "comm": "python3", "age_s": 300.0,
                            "devices": ["/dev/nvidia0"], "cmdline": "python3 x"}
            s.ticks[pid] = ticks
        return s

    samples = [sample({10: 1, 11: 1, 12: 1}), sample({10: 1, 11: 2, 13: 1})]  # 11 reused, 12 gone, 13 new
    monkeypatch.setattr(RF, "device_nodes", lambda: ["/dev/nvidia0"])
    monkeypatch.setattr(RF, "holder_tool", lambda: "fuser")
    monkeypatch.setattr(RJ, "take_sample", lambda *a: samples.pop(0))
    monkeypatch.setattr(RF, "gpu_memory", lambda: {})
    slept: list[float] = []
    lay = R.Layout(str(tmp_path))
    code, doc = R.run_reap(lay, False, 120.0, 60.0, False, sleep=slept.append)
    assert code == 0 and slept == [60.0]
    assert [c["pid"] for c in doc["candidates"]] == [10]  # 13 was not in the first sample
    assert doc["dry_run"] is True and doc["clean"] is False and doc["killed"] == []
    # nothing held in the first sample: clean at once, no second sample
    samples[:] = [sample({})]
    code, doc = R.run_reap(lay, False, 120.0, 60.0, False, sleep=slept.append)
    assert code == 0 and doc["clean"] is True and slept == [60.0]
    monkeypatch.setattr(RF, "device_nodes", lambda: [])
    code, doc = R.run_reap(lay, False, 120.0, 60.0, False)
    assert code == 1 and "no /dev/nvidia* device nodes" in doc["error"]
    monkeypatch.setattr(RF, "device_nodes", lambda: ["/dev/nvidia0"])
    monkeypatch.setattr(RF, "holder_tool", lambda: "")
    code, doc = R.run_reap(lay, False, 120.0, 60.0, False)
    assert code == 1 and "neither fuser nor lsof" in doc["error"]


def test_kill_all_terms_then_kills(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(RK, "TERM_WAIT_S", 0.5)
    polite = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stubborn = subprocess.Popen([sys.executable, "-c", "import signal, sys, time; "
                                 "signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
                                 "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert stubborn.stdout is not None and stubborn.stdout.readline().strip() == "ready"
        time.sleep(0.2)
        ticks = {p.pid: RK.proc_stat(p.pid)[2] for p in (polite, stubborn)}
        ticks[999999999] = 1  # vanished
        out = {k["pid"]: k["outcome"] for k in RK.kill_all(ticks)}
        assert out == {polite.pid: "terminated", stubborn.pid: "killed", 999999999: "gone"}
        assert polite.wait(5) == -signal.SIGTERM and stubborn.wait(5) == -signal.SIGKILL
    finally:
        for p in (polite, stubborn):
            if p.poll() is None:
                p.kill()
            p.wait(5)


def test_oom_killer_lines_after_the_cursor() -> None:
    lines = ["[ 1.000000] Out of memory: Killed process 11 (python) total-vm:1kB",
             "[ 2.000000] Memory cgroup out of memory: Killed process 22 (python) total-vm:1kB",
             "[ 3.000000] oom-kill:constraint=CONSTRAINT_MEMCG,task=python,pid=33,uid=0",
             "[ 4.000000] python invoked oom-killer: gfp_mask=0xcc0",  # the prelude names no victim
             "[ 5.000000] Killed process in a story about nothing"]
    assert [k["pid"] for k in K.scan_oom_kills(lines, None)] == [11, 22, 33]
    assert [k["pid"] for k in K.scan_oom_kills(lines, 1.5)] == [22, 33]
    sec = K.kernel_section("1.5", lines=lines)
    assert [k["pid"] for k in sec["oom_kills"]] == [22, 33] and sec["oom_kills"][0]["ts"] == 2.0
    assert "oom_kills" not in K.kernel_section("3.5", lines=lines)  # nothing new: the key is absent
    many = [f"[ {i + 1}.000000] Out of memory: Killed process {i} (x)" for i in range(30)]
    assert len(K.kernel_section(None, lines=many)["oom_kills"]) == PROTO.KERNEL_MAX_OOM_KILLS == 20


@pytest.mark.parametrize(("argv", "shown"), [
    (["curl", "-H", "Authorization: Bearer eyJhbGciOi.abc", "https://api.x"],
     "curl -H Authorization: <redacted> https://api.x"),
    (["curl", "-H", "Authorization:", "Bearer", "eyJhbGciOi.abc", "https://api.x"],
     "curl -H Authorization: <redacted> <redacted> https://api.x"),
    (["curl", "-H", "X-Api-Key: k-123", "-H", "Accept: json"], "curl -H X-Api-Key: <redacted> -H Accept: json"),
    (["wget", "--header=Authorization: Basic dXNlcjpwdw=="], "wget --header=Authorization: <redacted>"),
    (["mysql", "-uroot", "-pHUNTER2", "db"], "mysql -uroot -p<redacted> db"),
    (["sshpass", "-ps3cret", "ssh", "host"], "sshpass -p<redacted> ssh host"),
    (["sh", "-c", 'API_KEY="abc def" python train.py --lr 1'],
     "sh -c API_KEY=<redacted> python train.py --lr 1"),
    (["bash", "-c", "export HF_TOKEN='x y'; DB_PASS=pw mysql -pHUNTER2 -e 'select 1'"],
     "bash -c export HF_TOKEN=<redacted>; DB_PASS=<redacted> mysql -p<redacted> -e 'select 1'"),
    (["sh", "-c", 'curl -H "Authorization: Bearer tok" https://x && echo ok'],
     'sh -c curl -H "Authorization: <redacted>" https://x && echo ok'),
    (["python", "train.py", "--lr=0.1", "--config", "a:b", "MODE=fast"],
     "python train.py --lr=0.1 --config a:b MODE=fast"),  # nothing secret-named: unchanged
])
def test_reap_redacts_headers_attached_passwords_and_inline_assignments(argv: list[str], shown: str) -> None:
    assert RR.redact(argv) == shown
    for secret in ("eyJhbGciOi", "k-123", "dXNlcjpwdw", "HUNTER2", "s3cret", "abc def", "x y", "pw mysql", "tok"):
        assert secret not in RR.redact(argv)
