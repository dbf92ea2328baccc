"""Slurm hosts: a Slurm cluster's login node registered as one gpuq host (docs/slurm.md).

gpuq submits into Slurm and never schedules the cluster's nodes itself: each attempt is one Slurm
job (``sbatch``) running gpuq's wrapper from the bundle on a root the compute nodes share with the
login node.  The host agent does the Slurm work on the login node (payload/agent/gpuq_slurmmode/gpuq_slurm.py);
this module holds the settings, the registration audit and what the scheduler may assume.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, field_validator

from orchestrator import host_documents
from orchestrator.core import documents
from orchestrator.core.config import Settings, load_profile
from orchestrator.core.errors import HostError, UsageError
from orchestrator.fleet import registering, registry
from orchestrator.hosts.base import Host
from orchestrator.hosts.local import LocalHost
from orchestrator.ledger import HostRow, Ledger

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$")
TIME_LIMIT = re.compile(r"^([0-9]{1,6}(-[0-9]{1,2})?(:[0-9]{1,2}){0,2}|UNLIMITED|INFINITE)$")
# sbatch options gpuq sets itself for every attempt: a user's copy would break logs, identity, resume or
# the job's environment (--export: the login node's environment must not be stored with the job)
OWN_LONG = ("--output", "--error", "--job-name", "--chdir", "--parsable", "--wrap", "--array", "--requeue",
            "--no-requeue", "--signal", "--open-mode", "--comment", "--dependency", "--nodes", "--ntasks", "--gres",
            "--export")
OWN_SHORT = {"o": "--output", "e": "--error", "J": "--job-name", "D": "--chdir", "a": "--array", "N": "--nodes",
             "n": "--ntasks", "d": "--dependency"}
# sbatch's other short options (getopt): those that take a value (attached, "-pgpu", or it would take the
# next word) and those that do not (they may be clustered, "-HQ"); "-h", "-u", "-V" print and exit
SHORT_WITH_VALUE = frozenset("AbBcCFGiLMmpqStwx")
SHORT_FLAGS = frozenset("HkOQsvW")
OWN_OPTIONS = (*OWN_LONG, *(f"-{c}" for c in OWN_SHORT))
DEFAULT_MAX_JOBS = 100
PROBE_WAIT_S = 120.0


class SlurmSettings(BaseModel):
    """What `gpuq hosts add --slurm` records (the ledger's host.slurm, and ROOT/slurm.json for the agent)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    partition: str = ""
    account: str = ""
    qos: str = ""
    time_limit: str = ""
    sbatch_args: tuple[str, ...] = ()
    max_jobs: int = Field(DEFAULT_MAX_JOBS, ge=1, le=100_000)
    gres: bool = True  # ask for --gres=gpu:N (False: the partition has no GPU GRES; jobs get CPUs)
    gpus_per_node: int = Field(0, ge=0, le=1024)  # from the audit; 0 = unknown
    nodes: int = Field(0, ge=0, le=1_000_000)  # the partition's nodes, from the audit: the most one job may span
    signal_grace_s: int = Field(0, ge=0, le=3600)  # --signal=B:USR1@this (0: kill_grace_s + 30, at least 60)
    train_device: str = ""
    python: str = ""

    @field_validator("partition", "account", "qos")
    @classmethod
    def _name(cls, value: str) -> str:
        if value and not NAME.match(value):
            raise ValueError(f"{value!r} is not a Slurm name (letters, digits, _ . + -)")
        return value

    @field_validator("time_limit")
    @classmethod
    def _time(cls, value: str) -> str:
        if value and not TIME_LIMIT.match(value):
            raise ValueError(f"{value!r} is not a Slurm time (MINUTES, H:MM:SS, D-HH:MM:SS or UNLIMITED)")
        return value

    @field_validator("sbatch_args")
    @classmethod
    def _args(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for arg in value:
            problem = sbatch_arg_problem(arg)
            if problem:
                raise ValueError(f"{arg!r}: {problem}")
        return value

    def agent_config(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def sbatch_arg_problem(arg: str) -> str:
    """Why ``arg`` may not be a user's sbatch option ("" when it may), read the way sbatch's getopt_long
    reads it: a short option's value may be attached (``-o/x`` is ``--output``), short flags may be
    clustered (``-HJx``), and a long option may be any unique prefix (``--out=`` is ``--output``; a prefix
    of one of gpuq's own options is refused even where sbatch would find it ambiguous)."""
    if not arg.startswith("-") or arg == "-":
        return "give each sbatch option as one --name=value word"
    if arg.startswith("--"):
        name = "--" + arg[2:].split("=", 1)[0]
        if name == "--":
            return "a bare -- would end sbatch's options; give each option as one --name=value word"
        own = [o for o in OWN_LONG if o.startswith(name)]
        if own:
            meant = f"{name} (which sbatch reads as {own[0]})" if own[0] != name else name
            return f"gpuq sets {meant} itself for every job" if len(own) == 1 else \
                f"{name} could mean {', '.join(own)}, which gpuq sets itself for every job"
        return ""
    for index, char in enumerate(arg[1:], start=1):
        if char in OWN_SHORT:
            return f"gpuq sets -{char} ({OWN_SHORT[char]}) itself for every job"
        if char in SHORT_WITH_VALUE:
            if index == len(arg) - 1:
                return f"-{char} needs its value in the same word (-{char}VALUE, or the --name=value form)"
            return ""  # the rest of the word is its value
        if char not in SHORT_FLAGS:
            return f"-{char} is not an sbatch option gpuq can pass on; use the --name=value form"
    return ""


def settings_of(row: HostRow) -> SlurmSettings | None:
    """A Slurm host's settings; None for other hosts (or a row an older gpuq wrote wrongly)."""
    if row.kind != "slurm" or not row.slurm:
        return None
    try:
        return SlurmSettings.model_validate_json(row.slurm)
    except ValidationError:
        return None


# Runs on the login node (argv: root, settings JSON, probe wait): tools, partitions, and whether a job
# on a compute node writes where the login node reads.  One framed JSON document; exit 0 regardless.
AUDIT = r"""
import json, os, shlex, subprocess, sys, uuid
root = os.path.abspath(os.path.expanduser(sys.argv[1].replace("$HOME", os.path.expanduser("~"))))
conf = json.loads(sys.argv[2]); wait_s = float(sys.argv[3])
doc = {"root": root, "versions": {}, "missing": [], "partitions": [], "probe": "", "probe_detail": ""}
def run(argv, timeout=30):
    try:
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=timeout)
        return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")
    except OSError as e:
        return 127, "", "%s: %s" % (argv[0], e.strerror or e)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode("utf-8", "replace") if isinstance(e.stdout, bytes) else ""
        return 124, out, "%s did not finish within %gs" % (argv[0], timeout)
for tool in ("sinfo", "sbatch", "squeue", "scancel"):
    code, out, err = run([tool, "--version"])
    if code == 0:
        doc["versions"][tool] = out.strip()[:100]
    else:
        doc["missing"].append("%s (%s)" % (tool, (err.strip() or "exit %d" % code)[-200:]))
if not doc["missing"]:
    code, out, err = run(["sinfo", "--noheader", "--format=%P|%a|%D|%G|%c|%l"])
    if code != 0:
        doc["missing"].append("sinfo (%s)" % (err.strip() or "exit %d" % code)[-300:])
    for line in out.splitlines()[:1000]:
        parts = line.strip().split("|")
        if len(parts) == 6:
            doc["partitions"].append({"name": parts[0].rstrip("*"), "default": parts[0].endswith("*"),
                                      "avail": parts[1], "nodes": parts[2], "gres": parts[3][:200],
                                      "cpus": parts[4], "time_limit": parts[5]})
if not doc["missing"] and wait_s > 0:
    os.makedirs(root, exist_ok=True)
    probe = os.path.join(root, ".gpuq-slurm-probe-" + uuid.uuid4().hex[:12])
    argv = ["sbatch", "--parsable", "--wait", "--job-name=gpuq-probe", "--output=/dev/null", "--chdir=/",
            "--time=1", "--nodes=1", "--ntasks=1"]
    for key, flag in (("partition", "--partition"), ("account", "--account"), ("qos", "--qos")):
        if conf.get(key):
            argv.append("%s=%s" % (flag, conf[key]))
    argv += list(conf.get("sbatch_args") or [])
    argv += ["--wrap", "echo gpuq > %s" % shlex.quote(probe)]
    code, out, err = run(argv, timeout=wait_s)
    seen = False
    try:
        with open(probe) as fh:
            seen = fh.read().strip() == "gpuq"
        os.unlink(probe)
    except OSError:
        pass
    if seen:
        doc["probe"] = "shared"
    elif code == 124:
        jid = out.strip().split(";")[0]
        if jid.isdigit():
            run(["scancel", jid])
        doc["probe"] = "pending"
        doc["probe_detail"] = "the probe job %s did not run within %gs" % (jid or "?", wait_s)
    elif code == 0:
        doc["probe"] = "not_shared"
    else:
        doc["probe"] = "failed"
        doc["probe_detail"] = (err.strip() or out.strip() or "exit %d" % code)[-400:]
print("\n@BEGIN@\n" + json.dumps(doc) + "\n@END@")
""".replace("@BEGIN@", documents.DOCUMENT_BEGIN).replace("@END@", documents.DOCUMENT_END)

_Text = Annotated[str, StringConstraints(max_length=400)]


class AuditPartition(BaseModel):
    """One line of the audit's ``sinfo --format=%P|%a|%D|%G|%c|%l``, bounded."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: Annotated[str, StringConstraints(max_length=128)]
    default: bool = False
    avail: Annotated[str, StringConstraints(max_length=32)] = ""
    nodes: Annotated[str, StringConstraints(max_length=32)] = ""
    gres: Annotated[str, StringConstraints(max_length=300)] = ""
    cpus: Annotated[str, StringConstraints(max_length=64)] = ""
    time_limit: Annotated[str, StringConstraints(max_length=64)] = ""


class SlurmAudit(BaseModel):
    """The login node's answer to ``AUDIT``: parsed here, at the edge, into bounded fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    root: Annotated[str, StringConstraints(max_length=4096)] = ""
    versions: dict[Annotated[str, StringConstraints(max_length=16)], _Text] = Field(default_factory=dict,
                                                                                      max_length=8)
    missing: list[_Text] = Field(default_factory=list, max_length=8)
    partitions: list[AuditPartition] = Field(default_factory=list, max_length=1000)
    probe: Literal["", "shared", "pending", "not_shared", "failed"] = ""
    probe_detail: Annotated[str, StringConstraints(max_length=1000)] = ""


MAX_NODE_DIGITS = 7  # sinfo's %D of one partition line: a bigger count is a lie, not a cluster


def _node_count(text: str) -> int | None:
    """A partition line's node count (None for sinfo's placeholders such as "n/a"); ValueError for a
    number too long to be one."""
    if not re.fullmatch(r"[0-9]+", text):
        return None
    if len(text) > MAX_NODE_DIGITS:
        raise ValueError(f"a partition of {text[:12]}... nodes")
    return int(text)


WRITE_CONFIG = ('set -eu; cd "$1"; umask 077; cat > .slurm.json.tmp; mv -f .slurm.json.tmp slurm.json')


def register(ledger: Ledger, settings: Settings, name: str, target: str, slurm: SlurmSettings, *,
             port: int | None = None, key: str = "", root: str = "", python: str = "",
             profile: str = registering.DEFAULT_SSH_PROFILE, trust_new_host_key: bool = False,
             probe_wait_s: float = PROBE_WAIT_S) -> registering.Registered:
    """Register a Slurm login node (over SSH, or this machine with target "local"): the host audit,
    then the Slurm audit, then ROOT/slurm.json, then the ledger row.  All or nothing."""

    def then(host: Host, out: registering.Registered) -> None:
        _slurm_checks(host, out, slurm, probe_wait_s)

    if target != registry.SLURM_ON_THIS_MACHINE:
        return registering.register(ledger, settings, name, target, port=port, key=key, root=root, python=python,
                              profile=profile, trust_new_host_key=trust_new_host_key, then=then)
    if not registering.HOST_NAME.match(name) or ledger.host(name) is not None:
        raise UsageError(f'host name "{name}": already registered, or not 1-32 of a-z 0-9 _ -')
    if not root:
        raise UsageError("--slurm local needs --root DIR: a directory the compute nodes see (e.g. /scratch/$USER/gpuq)")
    interpreter = python or "python3"
    host = LocalHost(Path(root).expanduser(), name=name, python=interpreter)
    facts = registering.audit(host, interpreter, root)
    row = HostRow(name=name, kind="slurm", target=target, root=facts.root, python=interpreter,
                  profile=profile, created_at=0.0, disk_free_bytes=facts.free_bytes,
                  train_device=load_profile(profile).launch.train_device)
    out = registering.Registered(row, facts)
    then(host, out)
    ledger.add_host(out.row)
    return out


def _slurm_checks(host: Host, out: registering.Registered, slurm: SlurmSettings, probe_wait_s: float) -> None:
    row = out.row
    doc = _run_audit(host, row.python or "python3", row.root, slurm, probe_wait_s)
    wanted, gpus, nodes, update = _partition_facts(host.name, doc, slurm, out)
    update.update({"python": row.python, "train_device": slurm.train_device or row.train_device})
    _check_probe(host.name, doc, row.root, out)
    try:  # validated again, never model_copy: the audit's counts must pass the same bounds as the user's
        final = SlurmSettings.model_validate({**slurm.model_dump(), **update})
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(x) for x in err["loc"])
        raise HostError(host.name, f"the Slurm audit reported {field} = {str(update.get(field, '?'))[:20]}, "
                        f"which gpuq refuses ({err['msg']})") from None
    written = host.run(["sh", "-c", WRITE_CONFIG, "sh", row.root], stdin=json.dumps(final.agent_config()).encode(),
                       timeout=60)
    if written.exit_code != 0:
        raise HostError(host.name, f"cannot write {row.root}/slurm.json: {written.stderr.strip()[-300:]}")
    out.slurm = {"version": doc.versions.get("sbatch", ""), "partition": wanted, "gpus_per_node": gpus,
                 "nodes": nodes, "probe": doc.probe}
    row.kind, row.slurm = "slurm", final.model_dump_json()
    row.slots_kind, row.slots_total = "slurm", final.max_jobs


def _run_audit(host: Host, python: str, root: str, slurm: SlurmSettings, probe_wait_s: float) -> SlurmAudit:
    """The bounded Slurm audit run on the login node, parsed into its model; HostError for anything else."""
    result = host.run([python, "-c", AUDIT, root, slurm.model_dump_json(), str(probe_wait_s)],
                      timeout=probe_wait_s + 120)
    if result.exit_code != 0:
        raise HostError(host.name, f"the Slurm audit failed (exit {result.exit_code}): {result.stderr.strip()[-300:]}")
    text, _noise = host_documents.unframe(result.stdout)
    try:
        doc = SlurmAudit.model_validate_json(text)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err["loc"]) or "document"
        raise HostError(host.name, f"the Slurm audit's answer is not a valid document ({where}: "
                        f"{err['msg']})") from None
    if doc.missing:
        raise HostError(host.name, "Slurm's commands do not work on the login node: " + "; ".join(doc.missing[:4])
                        + " (is this a login node? is SLURM_CONF or the munge socket missing?)")
    return doc


def _partition_facts(name: str, doc: SlurmAudit, slurm: SlurmSettings,
                     out: registering.Registered) -> tuple[str, int, int, dict[str, Any]]:
    """The partition jobs go to, its GPUs per node and node count, and the settings they change."""
    parts = doc.partitions
    wanted = slurm.partition or next((p.name for p in parts if p.default), "")
    mine = [p for p in parts if p.name == wanted]
    if not mine:
        known = ", ".join(sorted({p.name for p in parts})) or "none"
        raise UsageError(f"host {name}: partition {wanted or '(default)'!r} not found on the cluster "
                         f"(partitions: {known}); pass --partition NAME")
    if not any(p.avail == "up" for p in mine):
        out.warnings.append(f"partition {wanted} is {mine[0].avail}: jobs wait until it is up")
    gpus = max((_gres_gpus(p.gres) for p in mine), default=0)
    try:
        nodes = sum(n for n in (_node_count(p.nodes) for p in mine) if n is not None)
    except ValueError as exc:
        raise HostError(name, f"the Slurm audit reported {exc}: refusing the registration") from None
    update: dict[str, Any] = {"gpus_per_node": gpus, "nodes": nodes, "partition": wanted}
    if gpus == 0 and slurm.gres:
        update["gres"] = False
        out.warnings.append(f"partition {wanted} offers no GPU GRES (sinfo %G: "
                            f"{', '.join(sorted({p.gres for p in mine}))}): jobs run on CPUs without "
                            "--gres")
    return wanted, gpus, nodes, update


def _check_probe(name: str, doc: SlurmAudit, root: str, out: registering.Registered) -> None:
    """The shared-root probe job's verdict: refused where the root is not shared or sbatch refused it."""
    if doc.probe == "not_shared":
        raise HostError(name, f"a job on a compute node wrote into {root}, and the login node does not see "
                        "the file: the root is not on a filesystem the compute nodes share; pass --root on one "
                        "(e.g. /scratch/$USER/gpuq or your home on the cluster)")
    if doc.probe == "failed":
        raise HostError(name, f"sbatch refused the probe job: {doc.probe_detail}; check --partition, "
                        "--account, --qos and --sbatch-arg")
    if doc.probe == "pending":
        out.warnings.append(f"could not confirm that {root} is shared with the compute nodes: "
                            f"{doc.probe_detail} (the partition is busy)")


def _gres_gpus(gres: str) -> int:
    """GPUs per node from sinfo's %G ("gpu:4", "gpu:a100:8(S:0-1)", "gpu:2,shard:8"); 0 when none."""
    best = 0
    for item in gres.split(","):
        fields = item.split("(")[0].split(":")
        if fields and fields[0] == "gpu" and len(fields) >= 2 and re.fullmatch(r"[0-9]{1,300}", fields[-1]):
            best = max(best, int(fields[-1]))
    return best
