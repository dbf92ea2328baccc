"""Every document a host sends, parsed at the edge (docs/security.md, docs/host-protocol.md).

A rented host is someone else's machine: what its agent prints is input from the internet.  Each
reader here takes the agent's raw stdout, cuts the framed document out of any shell start-up noise
(``~/.bashrc`` echoes, conda banners), checks it against a strict, size-bounded model and returns
plain data the controller can index without surprises.  Anything else raises ``ProtocolError``, and
only that: the tick marks that one host "protocol error: ..." and goes on with the others.

The models keep fields they do not name (an agent of a newer minor protocol adds optional ones), but
every field the controller reads has its type and bounds checked here.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, RootModel, ValidationError

from orchestrator import protocol
from orchestrator.errors import GpuqError

BEGIN_MARK = protocol.DOCUMENT_BEGIN  # the agent prints each document between these two lines
END_MARK = protocol.DOCUMENT_END

MAX_DOCUMENT_CHARS = 64 * 1024 * 1024  # what one answer may weigh; the transport caps output too
MAX_JOBS = 20_000  # job entries in one status document
MAX_GPUS = 1_024
MAX_FILES = 200_000  # files in one collect / manifest entry
MAX_ITEMS = 10_000  # any other list (scan hits, checks, reap candidates, verdicts)
MAX_STR = 256 * 1024  # any one string the controller reads
MAX_ID = 128  # job ids, states, schema names
MAX_INT = 2**63 - 1
NOISE_SHOWN = 200  # characters of shell noise quoted in the warning
MAX_CURVES = 8  # learning curves per job (the headline metric and loss-like ones; gpuq report)
MAX_CURVE_POINTS = 1_000  # points per curve (the agent sends at most 200)


class ProtocolError(GpuqError):
    """A host answered with something that is not a gpuq document: that host only is affected."""

    def __init__(self, host: str, detail: str) -> None:
        self.host = host
        self.detail = detail
        super().__init__(f"host {host}: protocol error: {detail}")


Short = Annotated[str, Field(max_length=MAX_ID)]
Text = Annotated[str, Field(max_length=MAX_STR)]
Count = Annotated[int, Field(ge=0, le=MAX_INT)]
AnyInt = Annotated[int, Field(ge=-MAX_INT, le=MAX_INT)]


class _Open(BaseModel):
    """Known fields checked; unknown ones kept (a newer minor protocol adds optional fields)."""

    model_config = ConfigDict(extra="allow", str_max_length=MAX_STR, allow_inf_nan=True)


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", str_max_length=MAX_STR)


# --- status (gpuq.status/1) ---------------------------------------------------------------


class Slots(_Open):
    kind: Short = ""
    total: Count = 0
    free: Count = 0


class Disk(_Open):
    free_bytes: Count | None = None


class Memory(_Open):
    oom_kill: Count | None = None


class Agent(_Open):
    alive: bool = False


class Kernel(_Open):
    cursor: Text | None = None
    xids: Annotated[list[dict[str, Any]], Field(max_length=MAX_ITEMS)] = []


class ExitRecord(_Open):
    wrapper_code: AnyInt | None = None
    trainer_code: AnyInt | None = None
    wrapper_signal: AnyInt | None = None
    message: Text | None = None


class ScanHit(_Open):
    signature: Text = ""
    line: Text = ""


class Scan(_Open):
    log_to: Count = 0
    metrics_to: Count = 0
    hits: Annotated[list[ScanHit], Field(max_length=MAX_ITEMS)] = []
    traceback: Annotated[list[Text], Field(max_length=MAX_ITEMS)] = []


class ResultFile(_Open):
    path: Text
    bytes: Count
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class SummaryRow(_Open):
    """One scope of summary.json (final, best): metric name -> number, plus where it was taken."""

    step: AnyInt | float | None = None  # a project's own metrics may log fractional epochs
    epoch: AnyInt | float | None = None


Finite = Annotated[float, Field(allow_inf_nan=False)]
CurvePoint = tuple[Annotated[float, Field(ge=-MAX_INT, le=MAX_INT, allow_inf_nan=False)], Finite]
Curve = Annotated[list[CurvePoint], Field(max_length=MAX_CURVE_POINTS)]


class Summary(_Open):
    final: SummaryRow | None = None
    best: SummaryRow | None = None
    curves: Annotated[dict[Short, Curve], Field(max_length=MAX_CURVES)] = {}  # metric -> [[step, value]]


class ResultCheckpoint(_Open):
    """The checkpoint a collect names (stored in the ledger): absent fields take the ledger's defaults,
    a null one is refused."""

    sha256: Text = ""
    file: Text = ""
    step: AnyInt = 0
    epoch: AnyInt | None = None
    bytes: Count = 0
    written_at: float = 0.0


class Results(_Open):
    attempt: Count = 0
    summary: Summary | None = None
    files: Annotated[list[ResultFile], Field(max_length=MAX_FILES)] = []
    ckpt: ResultCheckpoint | None = None


class Pointer(_Open):
    """The checkpoint pointer (ckpt/LATEST) as the agent read it."""

    file: Text | None = None
    step: AnyInt | None = None
    mtime: float | None = None
    sha256: Text | None = None
    bytes: Count | None = None


class SlurmJob(_Open):
    """Slurm's word on a job of a Slurm host (squeue): its id, state and pending reason."""

    id: Annotated[str, Field(max_length=32, pattern=r"^[0-9]*$")] = ""
    state: Short = ""
    reason: Annotated[str, Field(max_length=256)] = ""
    nodes: Annotated[str, Field(max_length=256)] = ""


class SlurmSection(_Open):
    jobs: Count = 0
    error: Annotated[str, Field(max_length=1024)] = ""


class NodeRank(_Open):
    rank: Annotated[int, Field(ge=0, le=1_000_000)]
    host: Short = ""


class JobEntry(_Open):
    job_id: Short
    slurm: SlurmJob | None = None
    nodes: Annotated[list[NodeRank], Field(max_length=1024)] | None = None  # a multi-node attempt's machines
    attempt: Count = 0
    state: Short = ""
    boot_id: Short | None = None
    exit: ExitRecord | None = None
    scan: Scan | None = None
    results: Results | None = None
    slots: Annotated[list[AnyInt], Field(max_length=MAX_GPUS)] | None = None
    ckpt: Pointer | None = None
    heartbeat: dict[str, Any] | None = None
    heartbeat_age_s: float | None = None
    log_mtime: float | None = None
    log_bytes: Count | None = None


class Gpu(_Open):
    index: AnyInt | None = None
    name: Text = ""


class StatusDocument(_Open):
    schema_: Annotated[Literal["gpuq.status/1"], Field(alias="schema")]
    protocol: Short = ""
    boot_id: Short | None = None
    agent: Agent = Agent()
    slots: Slots = Slots()
    disk: Disk = Disk()
    memory: Memory | None = None
    kernel: Kernel | None = None
    gpus: Annotated[list[Gpu], Field(max_length=MAX_GPUS)] = []
    bundles: Annotated[list[Short], Field(max_length=MAX_ITEMS)] = []
    jobs: Annotated[list[JobEntry], Field(max_length=MAX_JOBS)] = []
    slurm: SlurmSection | None = None


# --- health, reap (docs/health.md) ----------------------------------------------------------


class Check(_Open):
    check: Text = ""
    status: Short = ""
    detail: Text = ""


class HealthDocument(_Open):
    verdict: Literal["pass", "warn", "fail"]
    checks: Annotated[list[Check], Field(max_length=MAX_ITEMS)] = []


class ReapEntry(_Open):
    pid: AnyInt | None = None
    outcome: Text = ""


class ReapDocument(_Open):
    schema_: Annotated[Literal["gpuq.reap/1"], Field(alias="schema")]
    candidates: Annotated[list[ReapEntry], Field(max_length=MAX_ITEMS)] = []
    killed: Annotated[list[ReapEntry], Field(max_length=MAX_ITEMS)] = []


# --- collect, manifest, snapshot, verdicts --------------------------------------------------


class CollectDocument(RootModel[Annotated[dict[Short, Results], Field(max_length=MAX_JOBS)]]):
    pass


class ManifestReply(_Open):
    error: Text | None = None
    manifest: Text | None = None
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] | None = None
    attempt: Count | None = None
    files: Count | None = None
    bytes: Count | None = None


class ManifestDocument(RootModel[Annotated[dict[Short, ManifestReply], Field(max_length=MAX_JOBS)]]):
    pass


class SnapshotPointer(_Open):
    file: Annotated[str, Field(min_length=1, max_length=1024)]
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    snapshot: Annotated[str, Field(min_length=1, max_length=1024)]
    bytes: Count | None = None
    step: AnyInt | None = None


class Verdicts(RootModel[Annotated[dict[Short, Short], Field(max_length=MAX_JOBS)]]):
    """enqueue / withdraw / cancel: {job_id: verdict}."""


class AuditGpu(_Open):
    index: AnyInt
    name: Text = ""


class HostFacts(_Open):
    """What `gpuq hosts add` learns about a host (its audit script, orchestrator/fleet.py)."""

    home: Text = ""
    root: Annotated[str, Field(min_length=1, max_length=4096)]
    python: Text = ""
    version: Annotated[list[Count], Field(min_length=1, max_length=5)]
    writable: bool = False
    error: Text = ""
    free_bytes: Count | None = None
    gpus: Annotated[list[AuditGpu], Field(max_length=MAX_GPUS)] = []
    gpu_error: Text | None = None
    cpus: Annotated[int, Field(ge=1, le=1_000_000)] = 1


# --- framing and parsing ---------------------------------------------------------------------

_warned: set[str] = set()
_warned_lock = threading.Lock()


def unframe(stdout: str) -> tuple[str, str]:
    """(the document's text, the noise around it).  An agent of an older bundle prints its
    document unframed: then the whole output is the document."""
    lines = stdout.splitlines()
    begins = [i for i, line in enumerate(lines) if line.strip() == BEGIN_MARK]
    if not begins:
        return stdout.strip(), ""
    start = begins[-1]
    ends = [i for i in range(start + 1, len(lines)) if lines[i].strip() == END_MARK]
    if not ends:
        return "", stdout.strip()
    end = ends[0]
    noise = "\n".join(lines[:start] + lines[end + 1:]).strip()
    return "\n".join(lines[start + 1:end]).strip(), noise


def warn_noise(host: str, noise: str) -> None:
    """Shell start-up output around an agent document: ignored, said once per host and process."""
    if not noise:
        return
    with _warned_lock:
        if host in _warned:
            return
        _warned.add(host)
    shown = noise[:NOISE_SHOWN].encode("unicode_escape", "replace").decode("ascii", "replace")
    print(f"gpuq: warning: host {host}: its shell start-up files print text around the agent's answer "
          f"(ignored): {shown!r}; remove the output from that login's ~/.bashrc or ~/.profile",
          file=sys.stderr)


def load(host: str, stdout: str) -> Any:
    """The JSON value the agent printed, unframed; ProtocolError when there is none."""
    if len(stdout) > MAX_DOCUMENT_CHARS:
        raise ProtocolError(host, f"the agent's answer is {len(stdout)} characters (more than "
                                  f"{MAX_DOCUMENT_CHARS})")
    text, noise = unframe(stdout)
    if not text:
        raise ProtocolError(host, "the agent printed no document" + (f": {_quote(noise)}" if noise else ""))
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(host, f"the agent's answer is not JSON: {_quote(text)}") from exc
    warn_noise(host, noise)
    return value


M = TypeVar("M", bound=BaseModel)


def _validate(host: str, what: str, model: type[M], value: Any) -> M:
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)
        where, msg = (".".join(str(p) for p in errors[0]["loc"]), errors[0]["msg"]) if errors else ("", str(exc))
        raise ProtocolError(host, f"bad {what} document ({where or 'the document'}: {msg[:200]})") from None
    except (RecursionError, ValueError, TypeError) as exc:
        raise ProtocolError(host, f"bad {what} document ({type(exc).__name__})") from None


def _dump(model: BaseModel) -> Any:
    return model.model_dump(mode="python", by_alias=True, exclude_unset=True)


def _reader(what: str, model: type[BaseModel]) -> Callable[[str, str], Any]:
    def read(host: str, stdout: str) -> Any:
        return _dump(_validate(host, what, model, load(host, stdout)))

    read.__name__ = f"read_{what}"
    read.__doc__ = f"The {what} document a host printed, checked; ProtocolError when it is not one."
    return read


read_status: Callable[[str, str], dict[str, Any]] = _reader("status", StatusDocument)
read_health: Callable[[str, str], dict[str, Any]] = _reader("health", HealthDocument)
read_reap: Callable[[str, str], dict[str, Any]] = _reader("reap", ReapDocument)
read_collect: Callable[[str, str], dict[str, Any]] = _reader("collect", CollectDocument)
read_manifest: Callable[[str, str], dict[str, Any]] = _reader("manifest", ManifestDocument)
read_snapshot: Callable[[str, str], dict[str, Any]] = _reader("snapshot", SnapshotPointer)
read_facts: Callable[[str, str], dict[str, Any]] = _reader("host audit", HostFacts)
read_pointer: Callable[[str, str], dict[str, Any]] = _reader("checkpoint pointer", Pointer)
read_verdicts: Callable[[str, str], dict[str, str]] = _reader("verdicts", Verdicts)

READERS: Mapping[str, Callable[[str, str], Any]] = {
    "status": read_status, "health": read_health, "reap": read_reap, "collect": read_collect,
    "manifest": read_manifest, "snapshot": read_snapshot, "pointer": read_pointer,
    "verdicts": read_verdicts, "facts": read_facts,
}


def known_jobs_only(doc: dict[str, Any], known: Callable[[str], bool]) -> dict[str, Any]:
    """The status document without the jobs gpuq does not know (another controller sharing the
    host, or a job the ledger forgot): they are ignored, never written to the ledger."""
    jobs = doc.get("jobs") or []
    kept = [j for j in jobs if known(str(j.get("job_id", "")))]
    return doc if len(kept) == len(jobs) else {**doc, "jobs": kept}


def _quote(text: str) -> str:
    return repr(text[:NOISE_SHOWN]) + ("…" if len(text) > NOISE_SHOWN else "")
