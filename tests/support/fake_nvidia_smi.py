#!/usr/bin/env python3
"""A fake ``nvidia-smi`` for test hosts: answers from a JSON state file.  stdlib only.

The state file (``$GPUQ_FAKE_NVSMI_STATE``, or ``--state PATH`` as the first argument) holds::

    {"driver_version": "550.54.15", "cuda_version": "12.4",
     "broken": false,                       # true (or a message): every call fails like a dead driver
     "gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-...", "pci.bus_id": "...",
               "utilization.gpu": 0, "memory.used": 0, "memory.total": 81559, "temperature.gpu": 31,
               "clocks.current.sm": 1980, "clocks.max.sm": 1980, "clocks_throttle_reasons.hw_slowdown": false, ...,
               "processes": [{"pid": 1234, "used_memory": 1024, "process_name": "python3"}]}]}

Any field of ``--query-gpu`` is looked up by its (canonical) name in the GPU's dict; ``null`` reads
"[N/A]"; a few are derived (memory.free, count, driver_version).  Forms answered, like the real tool:

    nvidia-smi -L
    nvidia-smi [-i IDS] --query-gpu=F1,F2,... --format=csv[,noheader][,nounits]
    nvidia-smi [-i IDS] --query-compute-apps=pid,used_memory,gpu_uuid,... --format=csv[,noheader][,nounits]
    nvidia-smi dmon [-s pucvmet] [-c COUNT] [-d SECONDS] [-i IDS]
    nvidia-smi                                  (the summary table, approximately)

Unknown query field: ``Field "x" is not a valid field to query.``, exit 2.  Broken driver: the
"NVIDIA-SMI has failed ..." message, exit 9.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass

STATE_ENV = "GPUQ_FAKE_NVSMI_STATE"
FAILED = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
          "Make sure that the latest NVIDIA driver is installed and running.")
INVALID_ARGS = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help."

# canonical query-gpu field -> unit shown in csv headers and values (None: no unit)
GPU_FIELDS: dict[str, str | None] = {
    "index": None, "name": None, "uuid": None, "serial": None, "pci.bus_id": None, "count": None,
    "driver_version": None, "vbios_version": None, "persistence_mode": None, "pstate": None, "compute_mode": None,
    "utilization.gpu": "%", "utilization.memory": "%",
    "memory.total": "MiB", "memory.used": "MiB", "memory.free": "MiB", "memory.reserved": "MiB",
    "temperature.gpu": None, "temperature.memory": None, "fan.speed": "%",
    "power.draw": "W", "power.limit": "W", "power.max_limit": "W",
    "clocks.current.sm": "MHz", "clocks.current.memory": "MHz", "clocks.current.graphics": "MHz",
    "clocks.max.sm": "MHz", "clocks.max.memory": "MHz", "clocks.max.graphics": "MHz",
    "clocks_throttle_reasons.active": None, "clocks_throttle_reasons.supported": None,
    "clocks_throttle_reasons.gpu_idle": None, "clocks_throttle_reasons.applications_clocks_setting": None,
    "clocks_throttle_reasons.sw_power_cap": None, "clocks_throttle_reasons.hw_slowdown": None,
    "clocks_throttle_reasons.hw_thermal_slowdown": None, "clocks_throttle_reasons.hw_power_brake_slowdown": None,
    "clocks_throttle_reasons.sw_thermal_slowdown": None, "clocks_throttle_reasons.sync_boost": None,
    "ecc.mode.current": None, "ecc.mode.pending": None,
    "ecc.errors.corrected.volatile.total": None, "ecc.errors.uncorrected.volatile.total": None,
    "ecc.errors.corrected.aggregate.total": None, "ecc.errors.uncorrected.aggregate.total": None,
    "retired_pages.pending": None, "remapped_rows.failure": None, "remapped_rows.pending": None,
    "mig.mode.current": None,
}
ALIASES = {
    "gpu_name": "name", "gpu_uuid": "uuid", "gpu_serial": "serial", "gpu_bus_id": "pci.bus_id",
    "pci.bus": "pci.bus_id", "driver.version": "driver_version",
    "clocks.sm": "clocks.current.sm", "clocks.mem": "clocks.current.memory", "clocks.gr": "clocks.current.graphics",
    "clocks.max.mem": "clocks.max.memory", "clocks.max.gr": "clocks.max.graphics",
    "clocks.applications.graphics": "clocks.max.graphics",
}
for _k in [k for k in GPU_FIELDS if k.startswith("clocks_throttle_reasons.")]:
    ALIASES["clocks_event_reasons." + _k.split(".", 1)[1]] = _k
# throttle-reason bits (nvmlClocksThrottleReasons)
REASON_BITS = {"gpu_idle": 0x1, "applications_clocks_setting": 0x2, "sw_power_cap": 0x4, "hw_slowdown": 0x8,
               "sync_boost": 0x10, "sw_thermal_slowdown": 0x20, "hw_thermal_slowdown": 0x40,
               "hw_power_brake_slowdown": 0x80}

# query-compute-apps field -> (header name, unit)
APP_FIELDS: dict[str, tuple[str, str | None]] = {
    "pid": ("pid", None), "process_name": ("process_name", None), "name": ("process_name", None),
    "used_memory": ("used_gpu_memory", "MiB"), "used_gpu_memory": ("used_gpu_memory", "MiB"),
    "gpu_uuid": ("gpu_uuid", None), "gpu_name": ("gpu_name", None), "gpu_bus_id": ("gpu_bus_id", None),
    "gpu_serial": ("gpu_serial", None), "timestamp": ("timestamp", None),
}


class Usage(Exception):
    """Bad arguments: message to stdout, exit 2 (6: no such device), as nvidia-smi does."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def load_state(path: str) -> dict:
    with open(path) as f:
        state = json.load(f)
    state.setdefault("gpus", [])
    return state


def fmt(value: object, unit: str | None, units: bool) -> str:
    if value is None:
        return "[N/A]"
    if isinstance(value, bool):
        return "Active" if value else "Not Active"
    if isinstance(value, float):
        value = (f"{value:.2f}") if unit == "W" else (f"{value:g}")
    text = str(value)
    return text + " " + unit if units and unit and text not in ("[N/A]", "[Not Supported]") else text


def gpu_value(state: dict, gpu: dict, field: str) -> object:
    if field in gpu:
        return gpu[field]
    if field == "count":
        return len(state["gpus"])
    if field == "driver_version":
        return state.get("driver_version", "550.54.15")
    if field == "memory.free":
        total, used = gpu.get("memory.total"), gpu.get("memory.used")
        return total - used if isinstance(total, (int, float)) and isinstance(used, (int, float)) else None
    if field == "clocks_throttle_reasons.active":
        bits = sum(b for r, b in REASON_BITS.items() if gpu.get("clocks_throttle_reasons." + r))
        return f"0x{bits:016X}"
    if field == "clocks_throttle_reasons.supported":
        return f"0x{0x1FF:016X}"
    if field.startswith("clocks_throttle_reasons."):
        return False
    if field in ("ecc.mode.current", "ecc.mode.pending"):
        return "Enabled"
    if field == "retired_pages.pending":
        return None  # as a real Hopper prints it ([N/A]): these GPUs remap rows instead of retiring pages
    if field in ("remapped_rows.failure", "remapped_rows.pending"):
        return "No"
    if field.startswith(("ecc.errors.", "retired_pages.", "remapped_rows.")):
        return 0
    if field == "persistence_mode":
        return "Enabled"
    if field == "pstate":
        return "P0"
    if field == "compute_mode":
        return "Default"
    if field == "mig.mode.current":
        return "Disabled"
    return None


def canonical(field: str) -> str | None:
    f = field.strip()
    f = ALIASES.get(f, f)
    return f if f in GPU_FIELDS else None


def parse_format(fmt_arg: str | None) -> tuple[bool, bool]:
    """--format value -> (header, units)."""
    if fmt_arg is None:
        raise Usage(INVALID_ARGS)
    parts = [p.strip() for p in fmt_arg.split(",")]
    if not parts or parts[0] != "csv" or any(p not in ("csv", "noheader", "nounits") for p in parts):
        raise Usage(f'"{fmt_arg}" is not a valid format.')
    return "noheader" not in parts, "nounits" not in parts


def select_gpus(state: dict, ids: str | None) -> list[dict]:
    gpus = list(state["gpus"])
    if ids is None:
        return gpus
    chosen = []
    for tok in ids.split(","):
        tok = tok.strip()
        match = [g for g in gpus if str(g.get("index")) == tok or g.get("uuid") == tok or g.get("pci.bus_id") == tok]
        if not match:
            raise Usage("No devices were found", 6)
        chosen.extend(match)
    return chosen


def query_gpu(state: dict, gpus: list[dict], fields_arg: str, fmt_arg: str | None) -> list[str]:
    fields = [f.strip() for f in fields_arg.split(",") if f.strip()]
    if not fields:
        raise Usage(INVALID_ARGS)
    canon = []
    for f in fields:
        c = canonical(f)
        if c is None:
            raise Usage(f'Field "{f}" is not a valid field to query.\n')
        canon.append(c)
    header, units = parse_format(fmt_arg)
    lines = []
    if header:
        lines.append(", ".join(f + (f" [{GPU_FIELDS[c]}]" if GPU_FIELDS[c] else "")
                               for f, c in zip(fields, canon, strict=True)))
    for g in gpus:
        lines.append(", ".join(fmt(gpu_value(state, g, c), GPU_FIELDS[c], units) for c in canon))
    return lines


def query_apps(state: dict, gpus: list[dict], fields_arg: str, fmt_arg: str | None) -> list[str]:
    fields = [f.strip() for f in fields_arg.split(",") if f.strip()]
    for f in fields:
        if f not in APP_FIELDS:
            raise Usage(f'Field "{f}" is not a valid field to query.\n')
    header, units = parse_format(fmt_arg)
    lines = []
    if header:
        lines.append(", ".join(APP_FIELDS[f][0] + (f" [{APP_FIELDS[f][1]}]" if APP_FIELDS[f][1] else "")
                               for f in fields))
    for g in gpus:
        for p in g.get("processes", []):
            row = []
            for f in fields:
                key = APP_FIELDS[f][0]
                if key == "used_gpu_memory":
                    v = p.get("used_memory", p.get("used_gpu_memory"))
                elif key == "process_name":
                    v = p.get("process_name", p.get("name", "python3"))
                elif key.startswith("gpu_"):
                    v = g.get({"gpu_uuid": "uuid", "gpu_name": "name", "gpu_bus_id": "pci.bus_id",
                               "gpu_serial": "serial"}[key])
                elif key == "timestamp":
                    v = time.strftime("%Y/%m/%d %H:%M:%S.000")
                else:
                    v = p.get(key)
                row.append(fmt(v, APP_FIELDS[f][1], units))
            lines.append(", ".join(row))
    return lines


def list_gpus(gpus: list[dict]) -> list[str]:
    return ["GPU {}: {} (UUID: {})".format(g.get("index"), g.get("name"), g.get("uuid")) for g in gpus]


def dmon(state_path: str, args: list[str]) -> int:
    opts = {"-s": "pucvmet", "-c": "0", "-d": "1", "-i": None}
    i = 0
    while i < len(args):
        a = args[i]
        if a in opts and i + 1 < len(args):
            opts[a] = args[i + 1]
            i += 2
        else:
            raise Usage(INVALID_ARGS)
    cols: list[tuple[str, str, str]] = []  # (name, unit, field)
    groups = {
        "p": [("pwr", "W", "power.draw"), ("gtemp", "C", "temperature.gpu"), ("mtemp", "C", "temperature.memory")],
        "u": [("sm", "%", "utilization.gpu"), ("mem", "%", "utilization.memory"), ("enc", "%", ""), ("dec", "%", ""),
              ("jpg", "%", ""), ("ofa", "%", "")],
        "c": [("mclk", "MHz", "clocks.current.memory"), ("pclk", "MHz", "clocks.current.sm")],
        "v": [("pviol", "%", ""), ("tviol", "bool", "")],
        "m": [("fb", "MB", "memory.used"), ("bar1", "MB", ""), ("ccpm", "MB", "")],
        "e": [("sbecc", "errs", "ecc.errors.corrected.volatile.total"),
              ("dbecc", "errs", "ecc.errors.uncorrected.volatile.total"), ("pci", "errs", "")],
        "t": [("rxpci", "MB/s", ""), ("txpci", "MB/s", "")],
    }
    for ch in str(opts["-s"]):
        if ch not in groups:
            raise Usage(INVALID_ARGS)
        cols.extend(groups[ch])
    count, delay = int(str(opts["-c"])), float(str(opts["-d"]))
    print("# gpu " + " ".join(f"{c[0]:>6}" for c in cols))
    print("# Idx " + " ".join(f"{c[1]:>6}" for c in cols))
    n = 0
    while count <= 0 or n < count:
        if n:
            time.sleep(delay)
        state = load_state(state_path)
        if state.get("broken"):
            print(FAILED)
            return 9
        for g in select_gpus(state, opts["-i"]):
            vals = []
            for _name, _unit, field in cols:
                v = gpu_value(state, g, field) if field else 0
                shown = "-" if v is None else (int(v) if isinstance(v, (int, float)) else v)
                vals.append(f"{shown!s:>6}")
            print(f"{g.get('index')!s:>5} " + " ".join(vals), flush=True)
        n += 1
    return 0


def summary(state: dict) -> list[str]:
    drv, cuda = state.get("driver_version", "550.54.15"), state.get("cuda_version", "12.4")
    out = [time.strftime("%a %b %d %H:%M:%S %Y"),
           "+" + "-" * 89 + "+",
           f"| NVIDIA-SMI {drv:<12} Driver Version: {drv:<12} CUDA Version: {cuda:<8}|",
           "+" + "-" * 89 + "+"]
    for g in state["gpus"]:
        out.append(f"| {g.get('index')!s:>3}  {g.get('name')!s:<30} | {g.get('temperature.gpu')!s:>5}C | "
                   f"{g.get('memory.used')!s:>6}MiB / {g.get('memory.total')!s:>6}MiB | "
                   f"{g.get('utilization.gpu')!s:>3}% |")
    out.append("+" + "-" * 89 + "+")
    out.append("| Processes:" + " " * 78 + "|")
    procs = [(g, p) for g in state["gpus"] for p in g.get("processes", [])]
    if not procs:
        out.append("|  No running processes found" + " " * 61 + "|")
    for g, p in procs:
        out.append(f"| {g.get('index')!s:>4}   {p.get('pid')!s:>8}  C   {p.get('process_name', 'python3')!s:<40} "
                   f"{p.get('used_memory')!s:>8}MiB |")
    out.append("+" + "-" * 89 + "+")
    return out


@dataclass
class Options:
    """nvidia-smi's options as the fake reads them; ``help``: ``-h`` was met (what follows it is not read)."""

    ids: str | None = None
    fmt: str | None = None
    query: str | None = None
    apps: str | None = None
    listing: bool = False
    help: bool = False


def parse_options(args: list[str]) -> Options:
    """The options, read left to right (``-i X`` or ``-i=X``); Usage on one nvidia-smi would refuse."""
    opts = Options()
    i = 0
    while i < len(args):
        a = args[i]
        key, eq, val = a.partition("=")
        if not eq and key in ("-i", "--id", "--format", "--query-gpu", "--query-compute-apps") \
                and i + 1 < len(args):
            val, i = args[i + 1], i + 1
        if key in ("-i", "--id"):
            opts.ids = val
        elif key == "--format":
            opts.fmt = val
        elif key == "--query-gpu":
            opts.query = val
        elif key == "--query-compute-apps":
            opts.apps = val
        elif a in ("-L", "--list-gpus"):
            opts.listing = True
        elif a in ("-h", "--help"):
            opts.help = True
            return opts
        else:
            raise Usage(INVALID_ARGS)
        i += 1
    return opts


def answer(state: dict, opts: Options) -> tuple[list[str], int]:
    """The lines the options ask for and the exit code (6: no GPU matched a listing or a query)."""
    gpus = select_gpus(state, opts.ids)
    if opts.listing:
        lines = list_gpus(gpus)
    elif opts.query is not None:
        lines = query_gpu(state, gpus, opts.query, opts.fmt)
    elif opts.apps is not None:
        lines = query_apps(state, gpus, opts.apps, opts.fmt)
    elif opts.fmt is not None:
        raise Usage(INVALID_ARGS)
    else:
        lines = summary(state)
    if not gpus and (opts.listing or opts.query is not None):
        return ["No devices were found"], 6
    return lines, 0


def main(argv: list[str]) -> int:
    args = list(argv)
    state_path = os.environ.get(STATE_ENV, "")
    if len(args) >= 2 and args[0] == "--state":
        state_path, args = args[1], args[2:]
    try:
        state = load_state(state_path)
    except (OSError, ValueError):
        print(FAILED)
        return 9
    if state.get("broken"):
        print(state["broken"] if isinstance(state["broken"], str) else FAILED)
        return 9
    try:
        if args and args[0] == "dmon":
            return dmon(state_path, args[1:])
        opts = parse_options(args)
        if opts.help:
            print("NVIDIA System Management Interface -- fake for gpuq tests\n\n" + __doc__)
            return 0
        lines, code = answer(state, opts)
    except Usage as e:
        print(str(e))
        return e.code
    for line in lines:
        print(line)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
