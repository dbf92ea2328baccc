"""The job spec as the agent reads it: frozen dataclasses, parsed once at the edge (``parse_spec``).

stdlib only, Python >= 3.8.  A spec arrives from the controller through the host's inbox (docs/host-
protocol.md, "Job spec"; the controller builds it as orchestrator/agent/spec.py ``OutboundSpec``).
``parse_spec`` checks every field's type and bounds and refuses a bad document with a ``SpecError``
that names the field; every reader of a spec (enqueue, the serve loop, the wrapper, Slurm, the
probe...) goes through it, and then reads attributes only.  ``JobSpec.document`` is the JSON as it
came (every key, unknown ones included): what the agent writes back to disk (claimed/, spec.json).
"""

# ruff: noqa: UP031  (%-formatting on purpose, as in the other agent modules)
from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field
from typing import Any

from gpuq_base.gpuq_lazyre import lazy
from gpuq_base import gpuq_protocol as P
from gpuq_base.gpuq_files import Layout, list_specs, read_json

JOB_ID_RE = lazy(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
LAUNCHERS = ("torchrun", "python", "none")
MAX_NODES = 64
MAX_SLOTS = 4096
MAX_ADDRS = 8
DAY_S = 24 * 3600.0


class SpecError(ValueError):
    """A spec the agent refuses: the message names the field and what is wrong with it."""


@dataclass(frozen=True)
class DataRef:
    tree: str
    file: str = ""


@dataclass(frozen=True)
class RunSection:
    """The spec's ``run``: the project's ``[run]`` table (every key optional, as in gpuq.toml)."""

    command: tuple[str, ...] = ()
    launcher: str = "torchrun"
    resume_args: tuple[str, ...] = ()
    checkpoint: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    metrics: str = ""
    metrics_regex: str = ""
    metric: str = ""
    mode: str = "max"
    progress: str = ""
    setup: str = ""
    setup_key: str = ""
    forward_env: tuple[str, ...] = ()
    data: dict[str, DataRef] = field(default_factory=dict)


@dataclass(frozen=True)
class RetryPolicy:
    """The spec's ``retry``: what this host may retry by itself (gpuq_retry.py, gpuq_stall.py)."""

    left: int
    on: tuple[str, ...]
    signals: tuple[int, ...]
    deadlock_left: int
    stall_after_s: float
    startup_grace_s: float
    start_stall_after_s: float


@dataclass(frozen=True)
class NodeSection:
    """The spec's ``node``: one node of a multi-node job over SSH hosts (gpuq_gang.py)."""

    rank: int
    nodes: int
    hosts: tuple[str, ...]
    master_addrs: tuple[str, ...]  # the head's addresses, at most MAX_ADDRS
    master_port: int
    timeout_s: float  # at most a day


@dataclass(frozen=True)
class JobSpec:
    schema: str
    job_id: str
    name: str
    queue_id: str
    attempt: int
    task: str
    epochs: int | None
    gpus: int
    nodes: int
    seed: int | None
    config: str
    bundle_sha: str
    entry: str
    launcher: str
    python: str
    verify: tuple[str, ...]
    heartbeat_s: float
    ckpt_interval_s: float
    kill_grace_s: float
    min_free_gb: float
    scratch_gb: float
    durable_dir: str
    resume_from: str | None
    spec_hash: str
    env: dict[str, str]
    created_at: float
    protocol: str = ""
    args: tuple[str, ...] = ()
    run: RunSection | None = None
    sigterm_grace_s: float | None = None
    retry: RetryPolicy | None = None
    node: NodeSection | None = None
    started_by: str = ""
    document: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)  # the JSON as it came

    @property
    def slots(self) -> int:
        """Slots (GPUs, or CPU slots on a GPU-less host) the job asks for: at least 1."""
        return max(1, self.gpus)

    @property
    def own_command(self) -> bool:
        """A project's own trainer (a ``run`` with a command), not gpuq's payload."""
        return self.run is not None and bool(self.run.command)

    def host_retry_document(self, created_at: float, by: str) -> dict[str, Any]:
        """Attempt n+1's spec as this host writes it for a retry of its own: one retry less, no
        deadlock retry left, ``started_by`` ``by`` ("host")."""
        doc = dict(self.document)
        retry = dict(doc.get("retry") or {})  # the wire object as it came: keys this agent does not know stay
        left = self.retry.left if self.retry is not None else 1
        retry.update(left=left - 1, deadlock_left=0)
        doc.update(attempt=self.attempt + 1, created_at=created_at, started_by=by, retry=retry)
        return doc


# --- the parser -----------------------------------------------------------------------------------

_MISSING = object()


def _value(doc: dict[str, Any], key: str, where: str, default: Any) -> Any:
    value = doc.get(key, _MISSING)
    if value is _MISSING:
        if default is _MISSING:
            raise SpecError("%s%s is missing" % (where, key))
        return default
    return value


def _bad(where: str, key: str, want: str, value: Any) -> SpecError:
    shown = repr(value)
    return SpecError("%s%s must be %s, not %s" % (where, key, want, shown if len(shown) <= 60 else shown[:57] + "..."))


def _str(doc: dict[str, Any], key: str, where: str = "", default: Any = _MISSING, limit: int = 65536) -> str:
    value = _value(doc, key, where, default)
    if not isinstance(value, str) or len(value) > limit:
        raise _bad(where, key, "a string" if limit == 65536 else "a string of at most %d characters" % limit, value)
    return value


def _opt_str(doc: dict[str, Any], key: str, where: str = "") -> str | None:
    """A string or null; absent is not null (the controller always sends the key)."""
    return None if _value(doc, key, where, _MISSING) is None else _str(doc, key, where)


def _int(doc: dict[str, Any], key: str, where: str = "", default: Any = _MISSING, low: int | None = None,
         high: int | None = None) -> int:
    value = _value(doc, key, where, default)
    if isinstance(value, bool) or not isinstance(value, int) or (low is not None and value < low) \
            or (high is not None and value > high):
        want = "an integer" + ("" if low is None else " >= %d" % low) + ("" if high is None else " <= %d" % high)
        raise _bad(where, key, want, value)
    return value


def _opt_int(doc: dict[str, Any], key: str, where: str = "", low: int | None = None) -> int | None:
    return None if _value(doc, key, where, _MISSING) is None else _int(doc, key, where, low=low)


def _num(doc: dict[str, Any], key: str, where: str = "", default: Any = _MISSING, low: float = 0.0,
         above: bool = False) -> float:
    value = _value(doc, key, where, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value \
            or value in (float("inf"), float("-inf")) or value < low or (above and value <= low):
        raise _bad(where, key, "a number %s %g" % (">" if above else ">=", low), value)
    return float(value)


def _strs(doc: dict[str, Any], key: str, where: str = "", default: Any = _MISSING) -> tuple[str, ...]:
    value = _value(doc, key, where, default)
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise _bad(where, key, "a list of strings", value)
    return tuple(value)


def _object(doc: dict[str, Any], key: str, where: str = "") -> dict[str, Any] | None:
    value = doc.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _bad(where, key, "an object or null", value)
    return value


def _env(doc: dict[str, Any]) -> dict[str, str]:
    value = _value(doc, "env", "", _MISSING)
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise _bad("", "env", "an object of string values", value)
    return dict(value)


def parse_run(doc: dict[str, Any]) -> RunSection:
    """The ``run`` section (every key optional; types and choices checked)."""
    w = "run."
    launcher = _str(doc, "launcher", w, "torchrun")
    if launcher not in LAUNCHERS:
        raise _bad(w, "launcher", " or ".join(LAUNCHERS), launcher)
    mode = _str(doc, "mode", w, "max")
    if mode not in ("max", "min"):
        raise _bad(w, "mode", '"max" or "min"', mode)
    data = doc.get("data") or {}
    if not isinstance(data, dict):
        raise _bad(w, "data", "an object", data)
    refs = {}
    for name, ref in data.items():
        if not isinstance(ref, dict):
            raise _bad(w + "data.", str(name), "an object", ref)
        refs[str(name)] = DataRef(tree=_str(ref, "tree", w + "data.%s." % name),
                                  file=_str(ref, "file", w + "data.%s." % name, ""))
    return RunSection(
        command=_strs(doc, "command", w, ()), launcher=launcher, resume_args=_strs(doc, "resume_args", w, ()),
        checkpoint=_strs(doc, "checkpoint", w, ()), outputs=_strs(doc, "outputs", w, ()),
        metrics=_str(doc, "metrics", w, ""), metrics_regex=_str(doc, "metrics_regex", w, ""),
        metric=_str(doc, "metric", w, ""), mode=mode, progress=_str(doc, "progress", w, ""),
        setup=_str(doc, "setup", w, ""), setup_key=_str(doc, "setup_key", w, ""),
        forward_env=_strs(doc, "forward_env", w, ()), data=refs)


def parse_retry(doc: dict[str, Any]) -> RetryPolicy:
    w = "retry."
    signals = _value(doc, "signals", w, ())
    if not isinstance(signals, (list, tuple)) or not all(isinstance(s, int) and not isinstance(s, bool)
                                                          for s in signals):
        raise _bad(w, "signals", "a list of integers", signals)
    return RetryPolicy(left=_int(doc, "left", w, low=0), on=_strs(doc, "on", w), signals=tuple(signals),
                       deadlock_left=_int(doc, "deadlock_left", w, 0, low=0),
                       stall_after_s=_num(doc, "stall_after_s", w, above=True),
                       startup_grace_s=_num(doc, "startup_grace_s", w, above=True),
                       start_stall_after_s=_num(doc, "start_stall_after_s", w, above=True))


def _address(text: str) -> bool:
    if not text or len(text) > 253 or text.startswith("-"):
        return False
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return all(c.isalnum() or c in ".-" for c in text)


def parse_node(doc: dict[str, Any]) -> NodeSection:
    w = "node."
    nodes = _int(doc, "nodes", w, low=2, high=MAX_NODES)
    rank = _int(doc, "rank", w, low=0, high=nodes - 1)
    addrs = _strs(doc, "master_addrs", w)
    bad = [a for a in addrs if not _address(a)]
    if not addrs or bad:
        raise _bad(w, "master_addrs", "a non-empty list of host names or addresses", bad or addrs)
    return NodeSection(rank=rank, nodes=nodes, hosts=_strs(doc, "hosts", w, ()), master_addrs=addrs[:MAX_ADDRS],
                       master_port=_int(doc, "master_port", w, low=1024, high=65535),
                       timeout_s=min(_num(doc, "timeout_s", w, 300.0, above=True), DAY_S))


def check_schema(schema: Any) -> None:
    """Refuse a spec without a valid schema, or one newer than this agent reads."""
    major = spec_major(schema)
    if major is None:
        raise SpecError("job spec has no valid schema (%r); this agent reads %s" % (schema, P.SPEC_SCHEMA))
    if major > (spec_major(P.SPEC_SCHEMA) or 1):
        raise SpecError("job spec schema %s is newer than this agent (%s); upgrade the bundle"
                        % (schema, P.SPEC_SCHEMA))


def spec_major(schema: Any) -> int | None:
    if not isinstance(schema, str) or "/" not in schema:
        return None
    try:
        return int(schema.rsplit("/", 1)[1].split(".")[0])
    except ValueError:
        return None


def parse_spec(doc: Any) -> JobSpec:
    """The one parser of a job spec: a ``JobSpec``, or ``SpecError`` naming the field that is wrong."""
    if not isinstance(doc, dict):
        raise SpecError("job spec is not a JSON object")
    check_schema(doc.get("schema"))
    job_id = _str(doc, "job_id", limit=128)
    if not JOB_ID_RE.match(job_id):
        raise _bad("", "job_id", "a job id ([A-Za-z0-9][A-Za-z0-9._-]*)", job_id)
    run, retry, node = _object(doc, "run"), _object(doc, "retry"), _object(doc, "node")
    return JobSpec(
        schema=doc["schema"], job_id=job_id, name=_str(doc, "name"), queue_id=_str(doc, "queue_id", limit=128),
        attempt=_int(doc, "attempt", low=1), task=_str(doc, "task"), epochs=_opt_int(doc, "epochs", low=0),
        gpus=_int(doc, "gpus", low=0, high=MAX_SLOTS), nodes=_int(doc, "nodes", low=1, high=MAX_NODES),
        seed=_opt_int(doc, "seed"), config=_str(doc, "config"), bundle_sha=_str(doc, "bundle_sha", limit=128),
        entry=_str(doc, "entry"), launcher=_str(doc, "launcher"), python=_str(doc, "python"),
        verify=_strs(doc, "verify"), heartbeat_s=_num(doc, "heartbeat_s", above=True),
        ckpt_interval_s=_num(doc, "ckpt_interval_s", above=True), kill_grace_s=_num(doc, "kill_grace_s"),
        min_free_gb=_num(doc, "min_free_gb"), scratch_gb=_num(doc, "scratch_gb"),
        durable_dir=_str(doc, "durable_dir"), resume_from=_opt_str(doc, "resume_from"),
        spec_hash=_str(doc, "spec_hash"), env=_env(doc), created_at=_num(doc, "created_at"),
        protocol=_str(doc, "protocol", default=""), args=_strs(doc, "args", default=()),
        run=parse_run(run) if run is not None else None,
        sigterm_grace_s=None if doc.get("sigterm_grace_s") is None else _num(doc, "sigterm_grace_s"),
        retry=parse_retry(retry) if retry is not None else None,
        node=parse_node(node) if node is not None else None,
        started_by=_str(doc, "started_by", default=""), document=doc)


def spec_or_reason(doc: Any) -> JobSpec | str:
    """``parse_spec(doc)``, or the refusal's reason (a str) for a document that is not a sound spec."""
    try:
        return parse_spec(doc)
    except SpecError as e:
        return "malformed job spec: %s" % e if not str(e).startswith("job spec") else str(e)


def read_spec(path: str) -> JobSpec | None:
    """The spec in the file at ``path``; None when it is missing, half-written or not a sound spec
    (readers never raise: the serve loop refuses a bad inbox file with its reason, ``spec_or_reason``)."""
    got = spec_or_reason(read_json(path))
    return got if isinstance(got, JobSpec) else None


def attempt_of(doc: Any) -> int:
    """The attempt a spec document names (0 when it names none): for documents that may not parse."""
    value = doc.get("attempt") if isinstance(doc, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else 0


def unfinished_claims(lay: Layout) -> list[tuple[str, JobSpec | str, int]]:
    """(job id, claimed spec, attempt) of every claimed job whose current attempt has no exit record:
    launched or not, what an agent (re)starting or stopping must account for.  The spec is a
    ``JobSpec``, or for a claimed file that is not a sound spec the reason (``spec_or_reason``)."""
    out = []
    for job_id in list_specs(lay.p(P.CLAIMED_DIR)):
        doc = read_json(lay.p(P.CLAIMED_DIR, job_id + ".json"))
        if doc is None:
            continue
        spec = spec_or_reason(doc)
        n = spec.attempt if isinstance(spec, JobSpec) else attempt_of(doc) or 1
        if not os.path.exists(lay.attempt(job_id, n, P.EXIT_FILE)):
            out.append((job_id, spec, n))
    return out
