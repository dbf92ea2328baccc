"""Registering an SSH host (`gpuq hosts add`): the audit that decides it may serve, and its row.

Registering a host (`gpuq hosts add`, docs/cli.md) is one audit round trip after a strictly
verified SSH connection: the interpreter runs, the data dir is creatable and
writable, its disk has room, and nvidia-smi's GPUs are counted.  Nothing is
written to the ledger unless the audit passes; a key trusted on first use by a
failed registration is taken back out of known_hosts.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.core import documents
from orchestrator.core.config import LOCAL_HOST, Settings, load_profile
from orchestrator.core.errors import HostError, HostUnreachable, UsageError
from orchestrator.core.specs import clamp_slots
from orchestrator.core.states import LeaseState
from orchestrator.fleet.host_keys import forget_keys, known_key
from orchestrator.fleet.registry import ssh_options
from orchestrator.hosts.base import Host
from orchestrator.ledger import HostFields, HostRow, Ledger
from orchestrator.scheduling.gpumatch import facts_json

if TYPE_CHECKING:  # paramiko loads only when a command talks to an SSH host (fast `gpuq --help`), the host
    # documents' models only when one is read (`gpuq status --no-probe` reads none)
    from orchestrator.host_documents import HostFacts
    from orchestrator.hosts.sshconfig import Endpoint


HOST_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")


DEFAULT_SSH_PROFILE = "ssh"


# Runs on the host with its own interpreter (argv[1] = the data dir, "$HOME" allowed).
# Prints one JSON document; exit 0 even when a check fails, so the controller can explain.
AUDIT = r"""
import json, os, shutil, subprocess, sys
home = os.path.expanduser("~")
root = sys.argv[1].replace("$HOME", home)
root = os.path.abspath(os.path.expanduser(root))
doc = {"home": home, "root": root, "python": sys.executable,
       "version": list(sys.version_info[:3]), "writable": False, "error": ""}
try:
    os.makedirs(root, exist_ok=True)
    probe = os.path.join(root, ".gpuq-write-probe")
    with open(probe, "w") as fh:
        fh.write("ok")
    os.unlink(probe)
    doc["writable"] = True
    st = os.statvfs(root)
    doc["free_bytes"] = st.f_bavail * st.f_frsize
    doc["free_inodes"] = st.f_favail
    doc["total_inodes"] = st.f_files
except OSError as exc:
    doc["error"] = "%s: %s" % (root, exc.strerror)
gpus = []
smi = shutil.which("nvidia-smi")
if smi:
    try:
        out = subprocess.run([smi, "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"],
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             timeout=30)
        if out.returncode == 0:
            for line in out.stdout.decode("utf-8", "replace").splitlines():
                parts = [p.strip() for p in line.split(",")]
                if len(parts) == 3 and parts[0].isdigit():
                    mib = float(parts[2]) if parts[2].replace(".", "", 1).isdigit() else None
                    gpus.append({"index": int(parts[0]), "name": parts[1], "memory_total_mib": mib})
        else:
            doc["gpu_error"] = out.stderr.decode("utf-8", "replace").strip()[-300:]
    except (OSError, subprocess.SubprocessError) as exc:
        doc["gpu_error"] = str(exc)
doc["gpus"] = gpus
doc["cpus"] = os.cpu_count() or 1
print("\n@BEGIN@\n" + json.dumps(doc) + "\n@END@")
""".replace("@BEGIN@", documents.DOCUMENT_BEGIN).replace("@END@", documents.DOCUMENT_END)


@dataclass
class Registered:
    row: HostRow
    facts: HostFacts
    trusted_key: str = ""
    slurm: dict[str, Any] = field(default_factory=dict)  # a Slurm host: what its audit found (slurm_hosts)
    warnings: list[str] = field(default_factory=list)


def register(
    ledger: Ledger,
    settings: Settings,
    name: str,
    target: str,
    *,
    port: int | None = None,
    key: str = "",
    profile: str = DEFAULT_SSH_PROFILE,
    root: str = "",
    python: str = "",
    trust_new_host_key: bool = False,
    then: Callable[[Host, Registered], None] | None = None,
    rented: HostFields | None = None,
) -> Registered:
    """Audit the host over a verified connection, then record it.  All or nothing.

    ``then``: more checks on the same connection before anything is recorded (a Slurm login
    node's, orchestrator/fleet/slurm.py); it may change the row and add warnings, and raises to refuse.
    ``rented``: the name is held by the row `gpuq up` wrote before it rented the machine (lease state
    ``provisioning``, no address yet): the audit's facts and these fields (its instance and price) fill
    that row in and its lease goes RUNNING, in one transaction, so no row is ever half a host."""
    from orchestrator.hosts.ssh import SSHHost
    from orchestrator.hosts.sshconfig import resolve

    if not HOST_NAME.match(name) or name == LOCAL_HOST:
        raise UsageError(f'host name "{name}": use 1-32 of a-z 0-9 _ - (starting with a letter or digit), '
                         f'not "{LOCAL_HOST}"')
    held = ledger.host(name)
    if held is not None and not (rented is not None and held.lease is LeaseState.PROVISIONING):
        raise UsageError(f'host "{name}" is already registered; `gpuq hosts show {name}`, or '
                         f'`gpuq hosts rm {name}` first to register it again')
    if key and not Path(key).expanduser().is_file():
        raise UsageError(f"--key {key}: no such file")
    prof = load_profile(profile)
    endpoint = resolve(target, port=port, key_file=str(Path(key).expanduser()) if key else "")
    want_root = root or prof.paths.data_dir
    interpreter = python or prof.paths.python or "python3"
    host = SSHHost(name, endpoint, root=want_root, python=interpreter,
                   options=ssh_options(settings, trust_new=trust_new_host_key))
    try:
        facts = audit(host, interpreter, want_root)
        out = Registered(_row_for(name, target, endpoint, port, key, prof.name, facts, interpreter,
                                  prof.launch.train_device, prof.launch.min_free_gb), facts)
        out.trusted_key = host.trusted_keys[0] if host.trusted_keys else ""
        out.row.host_key = out.trusted_key or known_key(settings, endpoint)
        out.warnings += _audit_warnings(facts, prof.launch.min_free_gb)
        if then is not None:
            then(host, out)
        _record(ledger, out, target, held=held is not None, rented=rented)
        return out
    except BaseException:
        forget_keys(settings, endpoint, only=host.trusted_keys)
        for hop, hop_key in host.trusted_hop_keys:  # a failed registration leaves no trust behind
            forget_keys(settings, hop, only=[hop_key])
        raise
    finally:
        host.close()


def _audit_warnings(facts: HostFacts, min_free_gb: float) -> list[str]:
    """What the audit found that jobs will feel: too little free disk for the profile, no GPUs."""
    warnings = []
    free_gb = (facts.free_bytes or 0) / 1e9
    if min_free_gb and free_gb < min_free_gb:
        warnings.append(f"{facts.root} has {free_gb:.1f} GB free, below the profile's "
                        f"{min_free_gb:g} GB: jobs will be refused by the disk gate")
    if not facts.gpus:
        detail = f" ({facts.gpu_error})" if facts.gpu_error else ""
        warnings.append(f"no GPUs reported by nvidia-smi{detail}: jobs get {facts.cpus} CPU slots")
    return warnings


def _record(ledger: Ledger, out: Registered, target: str, *, held: bool, rented: HostFields | None) -> None:
    """The audited host into the ledger: a new row, or (rented) the row `gpuq up` held for it, whose lease
    starts running in the same transaction."""
    if not held:
        ledger.add_host(out.row)
        return
    fields: HostFields = {**audited(out.row), **(rented or {})}
    ledger.lease_transition(out.row.name, LeaseState.RUNNING, "", **fields)
    ledger.record_event("host", out.row.name, f"registered: {out.row.kind} {target} root={out.row.root} "
                                              f"profile={out.row.profile}")


def audit(host: Host, interpreter: str, root: str) -> HostFacts:
    """The registration audit's facts (see AUDIT); HostError when the host cannot serve as one."""
    from orchestrator import host_documents

    try:
        result = host.run([interpreter, "-c", AUDIT, root], timeout=60)
    except HostUnreachable as exc:
        if "no such command" in str(exc):
            raise HostError(host.name, f"no Python interpreter {interpreter!r} on the host; install python3 (3.8+) "
                                       "or pass --python PATH") from exc
        raise
    if result.exit_code == 127 or ("not found" in result.stderr and result.exit_code != 0):
        raise HostError(host.name, f"no Python interpreter {interpreter!r} on the host; install python3 (3.8+) "
                                   "or pass --python PATH")
    if result.exit_code != 0:
        raise HostError(host.name, f"the audit failed (exit {result.exit_code}): {result.stderr.strip()[-300:]}")
    try:
        facts = host_documents.read_facts(host.name, result.stdout)
    except host_documents.ProtocolError as exc:
        raise HostError(host.name, f"the audit's answer is unusable: {exc.detail}") from exc
    if tuple(facts.version) < (3, 8):
        raise HostError(host.name, f"{interpreter} is Python {'.'.join(map(str, facts.version))}; "
                                   "the host agent needs 3.8+; pass --python PATH")
    if not facts.writable:
        raise HostError(host.name, f"cannot write the data dir: {facts.error}; pass --root DIR")
    return facts


def audited(row: HostRow) -> HostFields:
    """What registering learns about a host (the fields ``_row_for`` and the audit fill in)."""
    return {"kind": row.kind, "target": row.target, "root": row.root, "python": row.python, "profile": row.profile,
            "slots_kind": row.slots_kind, "slots_total": row.slots_total, "port": row.port, "user": row.user,
            "key_path": row.key_path, "host_key": row.host_key, "train_device": row.train_device,
            "disk_free_bytes": row.disk_free_bytes, "min_free_gb": row.min_free_gb, "gpu_facts": row.gpu_facts}


def _row_for(name: str, target: str, endpoint: Endpoint, port: int | None, key: str, profile: str,
             facts: HostFacts, interpreter: str, train_device: str, min_free_gb: float) -> HostRow:
    gpus = facts.gpus
    return HostRow(
        name=name, kind="ssh", target=target, root=facts.root, python=interpreter, profile=profile,
        slots_kind="gpu" if gpus else "cpu", slots_total=clamp_slots(len(gpus) or facts.cpus),
        port=port or 0, user="", key_path=str(Path(key).expanduser()) if key else "",
        train_device=train_device, created_at=0.0, disk_free_bytes=facts.free_bytes,
        min_free_gb=min_free_gb, gpu_facts=facts_json((g.name, g.memory_total_mib) for g in gpus),
    )
