"""The test hosts' fake nvidia-smi (tests/support/fake_nvidia_smi.py) speaks what the host agent parses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.testhosts import default_gpus

REPO = Path(__file__).resolve().parents[2]
FAKE = REPO / "tests" / "support" / "fake_nvidia_smi.py"


@pytest.fixture
def state(tmp_path: Path) -> Path:
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps({"driver_version": "550.54.15", "broken": False, "gpus": default_gpus("t", 2)}))
    return path


def edit(path: Path, **top: Any) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    data.update(top)
    path.write_text(json.dumps(data))
    return data


def smi(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-I", "-S", str(FAKE), "--state", str(state), *args],
                          capture_output=True, text=True, timeout=30, check=False)


@pytest.fixture
def hostfacts(state: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """payload/agent/gpuq_hostfacts with `nvidia-smi` on PATH being the fake over ``state``."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    wrapper = bindir / "nvidia-smi"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -I -S {FAKE} --state {state} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    monkeypatch.syspath_prepend(str(REPO / "payload" / "agent"))
    from gpuq_base import gpuq_hostfacts

    return gpuq_hostfacts


def test_agent_parses_the_gpu_query(state: Path, hostfacts: Any) -> None:
    gpus = hostfacts.query_gpus()
    expected = json.loads(state.read_text())["gpus"]
    assert [g["index"] for g in gpus] == [0, 1]
    for got, want in zip(gpus, expected, strict=True):
        assert got == {"index": want["index"], "name": "NVIDIA H100 80GB HBM3", "uuid": want["uuid"],
                       "util_pct": 0.0, "mem_used_mib": 0.0, "mem_total_mib": 81559.0, "temp_c": 31.0}
    assert hostfacts.detect_slots(None) == {"kind": "gpu", "ids": [0, 1]}


def test_agent_sees_state_changes_and_unknown_values(state: Path, hostfacts: Any) -> None:
    data = json.loads(state.read_text())
    data["gpus"][1].update({"utilization.gpu": 97, "memory.used": 40000.5, "temperature.gpu": None})
    state.write_text(json.dumps(data))
    g = hostfacts.query_gpus()[1]
    assert (g["util_pct"], g["mem_used_mib"], g["temp_c"]) == (97.0, 40000.5, None)


def test_broken_driver_and_no_gpus(state: Path, hostfacts: Any) -> None:
    edit(state, broken=True)
    res = smi(state, "--query-gpu=index", "--format=csv,noheader,nounits")
    assert res.returncode == 9 and res.stdout.startswith("NVIDIA-SMI has failed because it couldn't communicate")
    assert hostfacts.query_gpus() == []
    assert hostfacts.detect_slots(3) == {"kind": "cpu", "ids": [0, 1, 2]}
    edit(state, broken=False, gpus=[])
    res = smi(state, "-L")
    assert res.returncode == 6 and "No devices were found" in res.stdout
    assert hostfacts.query_gpus() == []


def test_fields_in_any_order_with_header_and_units(state: Path) -> None:
    res = smi(state, "--query-gpu=memory.used,index,power.draw,clocks.sm,name", "--format=csv")
    assert res.returncode == 0, res.stdout
    lines = res.stdout.splitlines()
    assert lines[0] == "memory.used [MiB], index, power.draw [W], clocks.sm [MHz], name"
    assert lines[1] == "0 MiB, 0, 69.50 W, 1980 MHz, NVIDIA H100 80GB HBM3"
    assert len(lines) == 3
    res = smi(state, "--query-gpu=temperature.gpu,clocks.current.sm,clocks.max.sm", "--format=csv,noheader,nounits",
              "-i", "1")
    assert res.stdout == "31, 1980, 1980\n"


def test_unknown_field_and_bad_usage_exit_2(state: Path) -> None:
    res = smi(state, "--query-gpu=index,bogus.field", "--format=csv,noheader,nounits")
    assert res.returncode == 2 and res.stdout.startswith('Field "bogus.field" is not a valid field to query.')
    assert smi(state, "--query-gpu=index", "--format=json").returncode == 2
    assert smi(state, "--no-such-flag").returncode == 2
    assert smi(state, "--query-gpu=index").returncode == 2  # --format is mandatory


def test_compute_apps_and_list(state: Path) -> None:
    data = json.loads(state.read_text())
    data["gpus"][1]["processes"] = [{"pid": 4242, "used_memory": 1024, "process_name": "python3"}]
    state.write_text(json.dumps(data))
    res = smi(state, "--query-compute-apps=pid,used_memory,gpu_uuid", "--format=csv,noheader,nounits")
    assert res.returncode == 0 and res.stdout == f"4242, 1024, {data['gpus'][1]['uuid']}\n"
    res = smi(state, "--query-compute-apps=pid,process_name,used_memory", "--format=csv")
    assert res.stdout.splitlines() == ["pid, process_name, used_gpu_memory [MiB]", "4242, python3, 1024 MiB"]
    res = smi(state, "-L")
    assert res.stdout.splitlines() == [f"GPU {g['index']}: NVIDIA H100 80GB HBM3 (UUID: {g['uuid']})"
                                       for g in data["gpus"]]


def test_throttle_reasons_and_dmon(state: Path) -> None:
    data = json.loads(state.read_text())
    data["gpus"][0]["clocks_throttle_reasons.hw_thermal_slowdown"] = True
    state.write_text(json.dumps(data))
    res = smi(state, "--query-gpu=clocks_throttle_reasons.active,clocks_throttle_reasons.hw_thermal_slowdown,"
                     "clocks_event_reasons.hw_slowdown", "--format=csv,noheader")
    assert res.stdout.splitlines() == ["0x0000000000000040, Active, Not Active",
                                       "0x0000000000000000, Not Active, Not Active"]
    res = smi(state, "dmon", "-s", "pucvmet", "-c", "1")
    lines = res.stdout.splitlines()
    assert res.returncode == 0 and lines[0].startswith("# gpu") and len(lines) == 4
    assert lines[2].split()[:3] == ["0", "69", "31"]
