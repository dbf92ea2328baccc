"""The host agent against what a real nvidia-smi printed (tests/fixtures/nvidia-smi/, captured on a lent
H200 by the agent's own commands): the status probe and the health preflight read it, and the test hosts'
fake nvidia-smi answers those commands in the same forms, so the SSH tests exercise the parsing a real
GPU host needs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.agentmodule import load_agent_module
from tests.support.testhosts import default_gpus

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "nvidia-smi" / "h200-driver-580.txt"
FAKE = REPO / "tests" / "support" / "fake_nvidia_smi.py"
G = load_agent_module("gpuq_verbs.gpuq_health_gpus")
V = load_agent_module("gpuq_verbs.gpuq_health_checks")
UUID = "GPU-1ba1d126-0991-0273-6d6a-73f4d5a4ca8b"


def _sections() -> dict[str, str]:
    """The fixture's sections by title, without the comment header and the recorded exit codes."""
    found: dict[str, str] = {}
    title = None
    for line in FIXTURE.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            title = line[3:]
            found[title] = ""
        elif title is not None and not re.fullmatch(r"rc=\d+", line):
            found[title] += line + "\n"
    return found


REAL = _sections()


def test_the_fixture_holds_every_command_the_agent_runs() -> None:
    assert sorted(REAL) == ["compute apps", "dmon", "health query", "health query, event names", "nvidia-smi",
                            "status query"]
    assert "NVIDIA H200" in REAL["nvidia-smi"] and "Driver Version: 580.159.04" in REAL["nvidia-smi"]


def test_the_status_probe_reads_a_real_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (tmp_path / "answer").write_text(REAL["status query"])
    stub = bindir / "nvidia-smi"
    stub.write_text(f"#!/bin/sh\ncat {tmp_path / 'answer'}\n")
    stub.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    facts = load_agent_module("gpuq_base.gpuq_hostfacts")
    assert facts.query_gpus() == [{"index": 0, "name": "NVIDIA H200", "uuid": UUID, "util_pct": 0.0,
                                   "mem_used_mib": 0.0, "mem_total_mib": 143771.0, "temp_c": 41.0}]


@pytest.mark.parametrize("section", ["health query", "health query, event names"])
def test_the_health_preflight_reads_a_real_gpu_and_passes_it(section: str) -> None:
    [row] = G.parse_csv(REAL[section], list(G.QUERY_FIELDS))
    dmon = G.parse_dmon(REAL["dmon"])
    assert sorted(dmon) == [0] and len(dmon[0]) == 2
    gpu = G.gpu_record(row, dmon[0])
    assert gpu == {
        "index": 0, "name": "NVIDIA H200", "uuid": UUID, "pci_bus_id": "00000000:00:06.0",
        "memory_total_mib": 143771.0, "memory_used_mib": 0.0, "temp_c": 41.0, "temp_max_c": 41.0,
        "sm_clock_mhz": 345.0, "sm_clock_max_mhz": 1980.0, "throttle": [], "ecc_mode": "Enabled",
        "ecc_corrected": 0.0, "ecc_uncorrected": 0.0, "ecc_corrected_rising": False,
        "retired_pages_pending": None,  # "[N/A]": Hopper remaps rows instead of retiring pages
        "remapped_rows_failure": False, "samples": 2, "gpuq_job": None,
    }
    # an idle card's low SM clock at 41 C is no heat problem; ECC on, nothing pending
    assert V.check_throttle([gpu])[0] == "pass"
    assert V.check_heat([gpu]) == ("pass", f"below {V.TEMP_LIMIT_C:g} C on 1 GPUs (max 41 C)")
    assert V.check_ecc([gpu])[0] == "pass"
    assert V.check_identity([gpu], "H200", 80000.0) == ("pass", "1 x NVIDIA H200 (143771 MiB)")
    assert V.check_busy([gpu], {})[0] == "pass"


def test_an_empty_compute_apps_answer_lists_no_pids() -> None:
    assert REAL["compute apps"] == ""
    assert G.parse_csv(REAL["compute apps"], ["pid", "gpu_uuid"]) == []


def _form(cell: str) -> str:
    """What kind of cell nvidia-smi printed: a number, or the exact word (Enabled, Not Active, [N/A], No)."""
    if re.fullmatch(r"-?\d+(\.\d+)?", cell):
        return "number"
    if re.fullmatch(r"GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", cell):
        return "uuid"
    if re.fullmatch(r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-9A-F]", cell):
        return "bus id"
    if cell.startswith("NVIDIA "):
        return "name"
    return cell


def _fake(tmp_path: Path, *args: str) -> str:
    state = tmp_path / "gpus.json"
    state.write_text(json.dumps({"gpus": default_gpus("t", 1)}))
    done = subprocess.run([sys.executable, "-I", "-S", str(FAKE), "--state", str(state), *args],
                          capture_output=True, text=True, timeout=30, check=True)
    return done.stdout


@pytest.mark.parametrize(("section", "fields"), [
    ("status query", "index,name,uuid,utilization.gpu,memory.used,memory.total,temperature.gpu"),
    ("health query", ",".join(G.QUERY_FIELDS)),
])
def test_the_fake_answers_each_query_in_the_real_tools_forms(tmp_path: Path, section: str, fields: str) -> None:
    real = [_form(c.strip()) for c in REAL[section].strip().split(",")]
    fake = [_form(c.strip()) for c in _fake(tmp_path, "--query-gpu=" + fields,
                                            "--format=csv,noheader,nounits").strip().split(",")]
    assert list(zip(fields.split(","), fake, strict=True)) == list(zip(fields.split(","), real, strict=True))


def test_the_fakes_dmon_has_the_real_columns_and_units(tmp_path: Path) -> None:
    def header(text: str) -> list[list[str]]:
        return [line.split() for line in text.splitlines() if line.startswith("#")]

    assert header(_fake(tmp_path, "dmon", "-s", "pucvmet", "-c", "1")) == header(REAL["dmon"])
    assert _fake(tmp_path, "--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader,nounits") == ""


def test_the_real_cells_read_as_the_agent_means_them() -> None:
    cells: dict[str, Any] = dict(zip(G.QUERY_FIELDS, (c.strip() for c in REAL["health query"].split(",")),
                                     strict=True))
    assert [G.flag(cells["clocks_throttle_reasons." + r]) for r in G.THROTTLE_REASONS] == [False] * 4
    assert (G.flag(cells["retired_pages.pending"]), G.flag(cells["remapped_rows.failure"])) == (None, False)
    assert G.num(cells["clocks.current.sm"]) == 345.0
