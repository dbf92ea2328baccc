"""Who holds a GPU device, for ``reap`` (gpuq_reap.py): the real ``/dev/nvidia*`` character-device
nodes, their holders (``fuser`` with its mode letters stripped, else ``lsof -t``), the pids nvidia-smi
lists as compute apps, and each GPU's used memory.  The parsers are pure (unit-tested).

stdlib only, Python >= 3.8, Linux.
"""

# ruff: noqa: UP031  (%-formatting on purpose: one style for every Python >= 3.8 the agent meets)
from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
import stat
import subprocess

TOOL_TIMEOUT_S = 20.0


def parse_fuser(text: str) -> list[int]:
    """Pids from ``fuser`` stdout (" 1234 5678m 910e"): mode letters stripped."""
    pids = []
    for tok in text.split():
        m = re.match(r"^(\d+)[A-Za-z]*$", tok)
        if m and int(m.group(1)) not in pids:
            pids.append(int(m.group(1)))
    return pids


def parse_pids(text: str) -> list[int]:
    """Pids, one per line (``lsof -t``, ``--query-compute-apps=pid --format=csv,noheader``)."""
    out = []
    for line in text.splitlines():
        s = line.strip()
        if s.isdigit() and int(s) not in out:
            out.append(int(s))
    return out


def _run(argv: list[str], timeout: float = TOOL_TIMEOUT_S) -> tuple[int | None, str, str]:
    try:
        out = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return None, "", "%s timed out after %gs" % (argv[0], timeout)
    except OSError as e:
        return None, "", "%s: %s" % (argv[0], e)
    return out.returncode, out.stdout.decode("utf-8", "replace"), out.stderr.decode("utf-8", "replace")


def device_nodes() -> list[str]:
    """The real /dev/nvidia* character devices (nvidia0.., nvidiactl, nvidia-uvm, nvidia-caps/*)."""
    out = []
    for path in sorted(glob.glob("/dev/nvidia*")) + sorted(glob.glob("/dev/nvidia-caps/*")):
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISCHR(st.st_mode):
            out.append(path)
    return out


def holder_tool() -> str:
    if shutil.which("fuser"):
        return "fuser"
    if shutil.which("lsof"):
        return "lsof"
    return ""


def holders(nodes: list[str], tool: str) -> dict[int, list[str]]:
    """pid -> the device nodes it holds (open or mapped)."""
    found: dict[int, list[str]] = {}
    for node in nodes:
        if tool == "fuser":
            _rc, out, _err = _run(["fuser", node])  # pids on stdout, names and noise on stderr
            pids = parse_fuser(out)
        else:
            _rc, out, _err = _run(["lsof", "-t", node])
            pids = parse_pids(out)
        for pid in pids:
            found.setdefault(pid, []).append(node)
    return found


def smi_pids() -> tuple[set[int], str]:
    """Pids nvidia-smi lists as compute apps, and a note when it could not say."""
    if shutil.which("nvidia-smi") is None:
        return set(), "nvidia-smi not installed: its compute apps could not be excluded"
    rc, out, err = _run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"])
    if rc != 0:
        return set(), "nvidia-smi --query-compute-apps failed (%s): its compute apps could not be excluded" % (
            (err or out).strip().splitlines()[-1][:200] if (err or out).strip() else "exit %s" % rc)
    return set(parse_pids(out)), ""


def gpu_memory() -> dict[int, float]:
    """GPU index -> memory.used MiB ({} when nvidia-smi cannot say)."""
    rc, out, _err = _run(["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"])
    mem: dict[int, float] = {}
    if rc != 0:
        return mem
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            with contextlib.suppress(ValueError):
                mem[int(parts[0])] = float(parts[1])
    return mem
