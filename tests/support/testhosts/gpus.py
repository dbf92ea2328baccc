"""A host's fake GPUs: nvidia-smi's state, the kernel log ``dmesg`` prints, processes holding a GPU node."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.support import fake_dmesg, fake_nvidia_smi
from tests.support.testhosts.host import TestHost
from tests.support.testhosts.procs import _atomic_write


class GpuControls:
    """``HostFarm``'s GPU state, kernel log and GPU holders."""

    def read_gpu_state(self, i: int) -> dict[str, Any]:
        state: dict[str, Any] = json.loads(self.hosts[i].gpu_state.read_text())
        return state

    def write_gpu_state(self, i: int, state: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> None:
        """The whole state ({"gpus": [...], "broken": ...}) or just the list of GPUs."""
        full = dict(state) if isinstance(state, Mapping) else {**self.read_gpu_state(i), "gpus": list(state)}
        _atomic_write(self.hosts[i].gpu_state, json.dumps(full, indent=1))

    def set_gpu(self, i: int, gpu: int, fields: Mapping[str, Any] | None = None, **kw: Any) -> None:
        """Update fields of GPU ``gpu`` on host i: ``set_gpu(0, 1, {"memory.used": 4096})`` or
        ``set_gpu(0, 1, utilization_gpu=97, processes=[{"pid": 42, "used_memory": 1024}])``
        (a keyword's underscores read as dots unless the name is a field as it stands)."""
        state = self.read_gpu_state(i)
        g = state["gpus"][gpu]
        for k, v in {**(fields or {}), **kw}.items():
            known = {*fake_nvidia_smi.GPU_FIELDS, "processes"}
            key = k if k in known else k.replace("_", ".")
            if key not in known:
                raise ValueError(f"unknown GPU field {k!r}: pass fields={{'<nvidia-smi name>': value}}")
            g[key] = v
        self.write_gpu_state(i, state)

    def set_driver_broken(self, i: int, broken: bool | str = True) -> None:
        """Every nvidia-smi call on host i fails ("NVIDIA-SMI has failed ...", exit 9) until cleared."""
        self.write_gpu_state(i, {**self.read_gpu_state(i), "broken": broken})

    def set_gpu_throttle(self, i: int, gpu: int, *reasons: str) -> None:
        """Make exactly ``reasons`` (``hw_slowdown``, ``hw_thermal_slowdown``, ``hw_power_brake_slowdown``,
        ``sw_thermal_slowdown``, ``sw_power_cap``, ...) Active on GPU ``gpu``; none: no throttling."""
        known = [k.split(".", 1)[1] for k in fake_nvidia_smi.GPU_FIELDS if k.startswith("clocks_throttle_reasons.")
                 and k not in ("clocks_throttle_reasons.active", "clocks_throttle_reasons.supported")]
        unknown = set(reasons) - set(known)
        if unknown:
            raise ValueError(f"unknown throttle reasons {sorted(unknown)}; known: {known}")
        self.set_gpu(i, gpu, {f"clocks_throttle_reasons.{r}": r in reasons for r in known})

    def set_gpu_heat(self, i: int, gpu: int, temp_c: float, sm_clock_mhz: float | None = None) -> None:
        """GPU temperature (and, optionally, the current SM clock; clocks.max.sm stays)."""
        fields: dict[str, Any] = {"temperature.gpu": temp_c}
        if sm_clock_mhz is not None:
            fields["clocks.current.sm"] = sm_clock_mhz
        self.set_gpu(i, gpu, fields)

    def set_gpu_ecc(self, i: int, gpu: int, *, uncorrected: int = 0, corrected: int = 0,
                    retired_pending: bool = False, remap_failure: bool = False, ecc_enabled: bool = True) -> None:
        """ECC state as nvidia-smi reports it (volatile counts, pending retirement, row-remap failure)."""
        self.set_gpu(i, gpu, {"ecc.errors.uncorrected.volatile.total": uncorrected,
                              "ecc.errors.corrected.volatile.total": corrected,
                              "retired_pages.pending": "Yes" if retired_pending else "No",
                              "remapped_rows.failure": "Yes" if remap_failure else "No",
                              "ecc.mode.current": "Enabled" if ecc_enabled else "Disabled"})

    # ------------------------------------------------------------------------------------- kernel log

    def append_kernel_log(self, i: int, line: str) -> str:
        """Append one line to host i's kernel log (what its ``dmesg`` prints).  A line without a
        ``[ seconds]`` timestamp gets the current boot-clock time, after every earlier line.
        Returns the line as written."""
        path = self.hosts[i].kernel_log
        text = line.rstrip("\n")
        if not fake_dmesg.TS_RE.match(text):
            text = _kernel_line(text, _kernel_log_last(path))
        with open(path, "a") as f:
            f.write(text + "\n")
        return text

    def inject_xid(self, i: int, gpu: int, code: int, message: str = "") -> str:
        """An ``NVRM: Xid`` line for GPU ``gpu`` of host i (its PCI address as the driver prints it)."""
        bus = str(self.read_gpu_state(i)["gpus"][gpu].get("pci.bus_id", "00000000:18:00.0"))
        pci = bus[-12:-2] if len(bus) >= 12 else bus  # "00000000:18:00.0" -> "0000:18:00"
        text = message or {79: "GPU has fallen off the bus.", 48: "An uncorrectable double bit error (DBE) has "
                           "been detected on GPU in the framebuffer at partition 0, subpartition 0.",
                           13: "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address"
                           }.get(code, "Graphics Exception")
        return self.append_kernel_log(i, f"NVRM: Xid (PCI:{pci}): {code}, pid=4242, name=python3, {text}")

    def clear_kernel_log(self, i: int) -> None:
        """Host i's kernel log back to its boot lines (timestamps keep rising) and readable."""
        self._write_boot_kernel_log(self.hosts[i])

    def _write_boot_kernel_log(self, h: TestHost) -> None:
        boot = [f"Linux version (gpuq test host {h.name})", "Command line: console=ttyS0"]
        if self.gpus > 0:
            boot.append("nvidia: module license 'NVIDIA' taints kernel.")
        lines: list[str] = []
        last = _kernel_log_last(h.kernel_log)
        for msg in boot:
            lines.append(_kernel_line(msg, last))
            last = float(lines[-1][1:lines[-1].index("]")])
        _atomic_write(h.kernel_log, "".join(line + "\n" for line in lines))
        fake_dmesg_flag(h).unlink(missing_ok=True)

    def set_kernel_log_readable(self, i: int, readable: bool = True) -> None:
        """readable=False: host i's ``dmesg`` fails as under kernel.dmesg_restrict (exit 1)."""
        flag = fake_dmesg_flag(self.hosts[i])
        if readable:
            flag.unlink(missing_ok=True)
        else:
            flag.write_text("")

    # ------------------------------------------------------------------------------------- GPU holders

    def hold_gpu_device(self, i: int, gpu: int | None, *argv: str) -> int:
        """Start a process inside host i that holds ``/dev/nvidia<gpu>`` (``None``: /dev/nvidiactl) open
        and sleeps, in its own session, invisible to nvidia-smi: a VRAM zombie.  ``argv`` is appended
        to its command line.  Returns its pid as the host sees it; it dies with the host
        (``teardown``/``preempt``) or by ``release_gpu_device``."""
        node = "/dev/nvidiactl" if gpu is None else f"/dev/nvidia{gpu}"
        code = ("import os, sys, time\ntry:\n    os.setsid()\nexcept OSError:\n    pass\n"
                "fd = os.open(sys.argv[1], os.O_RDWR)\ntime.sleep(86400)\n")
        script = ('code=$1; node=$2; shift 2\n'
                  'python3 -c "$code" "$node" "$@" </dev/null >/dev/null 2>&1 &\n'
                  'pid=$!; n=0\n'
                  'while [ $n -lt 250 ]; do\n'
                  '  for f in /proc/$pid/fd/*; do\n'
                  '    [ "$(readlink "$f" 2>/dev/null)" = "$node" ] && { echo $pid; exit 0; }\n'
                  '  done\n'
                  '  n=$((n+1)); sleep 0.02\n'
                  'done\n'
                  'echo "holder $pid never opened $node" >&2; exit 1\n')
        res = self.ssh(i, "sh", "-c", script, "sh", code, node, *argv)
        if res.returncode != 0 or not res.stdout.strip().isdigit():
            raise RuntimeError(f"hold_gpu_device({i}, {gpu}) failed: {res.stdout}{res.stderr}")
        return int(res.stdout.strip())

    def release_gpu_device(self, i: int, pid: int) -> None:
        """SIGKILL a holder started by ``hold_gpu_device`` (by its in-host pid); gone already is fine."""
        self.ssh(i, "sh", "-c", f"kill -9 {int(pid)} 2>/dev/null; true")


def fake_dmesg_flag(h: TestHost) -> Path:
    return Path(fake_dmesg.unreadable_flag(str(h.kernel_log)))


def _kernel_log_last(path: Path) -> float:
    """The timestamp of the last line of a kernel-log fixture (0 when none)."""
    last = 0.0
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            m = fake_dmesg.TS_RE.match(line)
            if m:
                last = float(m.group(0).strip().strip("[]").strip())
    return last


def _kernel_line(message: str, after: float) -> str:
    """``[ seconds] message`` stamped with the boot clock (what /proc/uptime counts), after ``after``."""
    ts = max(time.clock_gettime(time.CLOCK_BOOTTIME), after + 1e-6)
    return f"[{ts:12.6f}] {message}"
