"""What a finished job left on its host, as the host reports it: the checkpoint pointer, the summary's
metrics and learning curves, the result files (``collect``), the manifest ``gpuq pull`` fetches, and
a pinned checkpoint snapshot (docs/host-protocol.md, gpuq_inbox.py, gpuq_manifest.py).

Every metric is a finite number here: a NaN or an infinity in a host's summary never reaches the
ledger (docs/security.md).
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    Field,
    RootModel,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    field_validator,
)
from pydantic import model_validator as model_check
from pydantic_core import PydanticCustomError

from orchestrator.core import filenames, protocol
from orchestrator.host_documents.bounds import (
    MAX_ATTEMPTS,
    MAX_CURVE_POINTS,
    MAX_CURVES,
    MAX_FILES,
    MAX_INT,
    MAX_JOBS,
    AnyInt,
    Attempt,
    Count,
    Finite,
    LenientCount,
    LenientFloat,
    LenientInt,
    LenientText,
    Open,
    Sha256,
    Short,
    Text,
    finite_number,
    none_if_invalid,
)

NOT_METRICS = frozenset({"step", "epoch", "time", "kind"})  # a summary row's fields that are no metric


class ResultCheckpoint(Open):
    """A checkpoint as the ledger records it (a collect's ``ckpt``, or a pointer made one): absent
    fields take the ledger's defaults, a null one is refused."""

    sha256: Text = ""
    file: Text = ""
    step: AnyInt = 0
    epoch: AnyInt | None = None
    bytes: Count = 0
    written_at: Finite | None = None  # None: recorded at the time it is stored

    def written(self) -> float:
        return self.written_at if self.written_at is not None else time.time()


class Pointer(Open):
    """The checkpoint pointer (ckpt/LATEST, a file the trainer writes) as the agent read it, with the
    file's ``mtime``: a value that does not fit is dropped (None), the pointer kept."""

    file: LenientText = None
    step: LenientInt = None
    epoch: LenientInt = None
    mtime: LenientFloat = None
    written_at: LenientFloat = None
    sha256: LenientText = None
    bytes: LenientCount = None

    def recorded(self) -> ResultCheckpoint:
        """The pointer as the ledger records it."""
        return ResultCheckpoint(sha256=self.sha256 or "", file=self.file or "", step=self.step or 0,
                                epoch=self.epoch, bytes=self.bytes or 0, written_at=self.written_at)


class ResultFile(Open):
    path: Text
    bytes: Count
    sha256: Sha256


Number = Annotated[AnyInt | Finite | None, WrapValidator(none_if_invalid)]


class SummaryRow(Open):
    """One scope of summary.json (final, best): metric name -> number, plus where it was taken."""

    step: Number = None  # a project's own metrics may log fractional epochs
    epoch: Number = None

    def metrics(self) -> dict[str, float]:
        """The row's metrics: its other fields that are finite numbers (a NaN loss is no metric)."""
        out: dict[str, float] = {}
        for name, value in (self.model_extra or {}).items():
            number = finite_number(value)
            if name not in NOT_METRICS and number is not None and len(name) <= 128:
                out[name] = number
        return out

    def step_int(self) -> int | None:
        return None if self.step is None else int(self.step)

    def epoch_int(self) -> int | None:
        return None if self.epoch is None else int(self.epoch)


CurvePoint = tuple[Annotated[float, Field(ge=-MAX_INT, le=MAX_INT, allow_inf_nan=False)], Finite]
Curve = Annotated[list[CurvePoint], Field(max_length=MAX_CURVE_POINTS)]


class Summary(Open):
    metric: Short | None = None
    mode: Short | None = None
    final: SummaryRow | None = None
    best: SummaryRow | None = None
    # a project's own metrics (gpuq_runmetrics.run_summary): how many files the setting matched
    # (attempts' logs with metrics = "log") and how many rows they gave; None from gpuq's payload
    files: Count | None = None
    rows: Count | None = None
    # metric -> [[step, value]]
    curves: Annotated[dict[Short, Curve], Field(max_length=MAX_CURVES)] = Field(default_factory=dict)


def _travels(path: str) -> str:
    """A relative POSIX path by the agent's and the pull's one rule (filenames.path_problem)."""
    why = filenames.path_problem(path)
    if why is not None or path.startswith("/"):
        raise ValueError(f"an end record lists a path that cannot travel: {why or 'absolute'}")
    return path


OutputPath = Annotated[str, Field(min_length=1, max_length=protocol.OUTPUTS_MAX_PATH), AfterValidator(_travels)]


class OutputFile(Open):
    path: OutputPath
    bytes: Count
    sha256: Sha256


class Outputs(Open):
    """The attempt's end record, ``attempts/<n>/outputs.json``, as ``collect`` carries it: what the
    wrapper hashed as the attempt ended (gpuq_outputs.py), with the record file's own size and sha256
    (None when it could not be read: ``error`` says why, and ``files`` is empty)."""

    attempt: Attempt
    files: Annotated[list[OutputFile], Field(max_length=protocol.OUTPUTS_MAX_FILES)] = Field(default_factory=list)
    sha256: Sha256 | None = None
    bytes: Count | None = None
    seconds: LenientFloat = None
    error: LenientText = None

    @property
    def path(self) -> str:
        """The record's own path, relative to the job's directory."""
        return protocol.end_record_path(self.attempt)

    def artifacts(self) -> list[tuple[str, int, str]]:
        """(path, bytes, sha256) of every file it lists, and of the record itself ("" when unread):
        the rows the ledger keeps, against which a pull is checked."""
        rows = [(f.path, f.bytes, f.sha256) for f in self.files]
        return [*rows, (self.path, self.bytes or 0, self.sha256 or "")]


class Results(Open):
    attempt: Attempt = 0
    summary: Summary | None = None
    files: Annotated[list[ResultFile], Field(max_length=MAX_FILES)] = Field(default_factory=list)
    outputs: Outputs | None = None  # the attempt's end record; None from an older agent's attempt
    ckpt: ResultCheckpoint | None = None

    def artifacts(self) -> list[tuple[str, int, str]]:
        """What the ledger keeps of the files: the end record's rows when the attempt has one (of this
        attempt), else the files hashed at collect time (an attempt an older agent ran)."""
        if self.outputs is not None and self.outputs.attempt == self.attempt:
            return self.outputs.artifacts()
        return [(f.path, f.bytes, f.sha256) for f in self.files]


class Partial(Open):
    """A running job's learning curves so far (``status --curves-for``): what early stopping reads at its
    rungs (finite points only, bounded like a summary's curves)."""

    attempt: Attempt = 0
    curves: Annotated[dict[Short, Curve], Field(max_length=MAX_CURVES)] = Field(default_factory=dict)


class CollectDocument(RootModel[Annotated[dict[Short, Results], Field(max_length=MAX_JOBS)]]):
    """``collect``: {job_id: its results}."""


class ManifestReply(Open):
    error: Text | None = None
    manifest: Text | None = None
    sha256: Sha256 | None = None
    attempt: Attempt | None = None
    files: Count | None = None
    bytes: Count | None = None


class ManifestDocument(RootModel[Annotated[dict[Short, ManifestReply], Field(max_length=MAX_JOBS)]]):
    """``manifest``: {job_id: where its MANIFEST.json is, or why there is none}."""


MAX_PATH_CHARS = filenames.MAX_PATH_PARTS * (filenames.MAX_NAME_BYTES + 1)  # one path a manifest lists, at most


def _said(why: str) -> PydanticCustomError:
    return PydanticCustomError("manifest", "{why}", {"why": why})


def _refused(words: str) -> WrapValidator:
    """A field whose every problem is one line: ``words`` with the value as the host wrote it."""
    def check(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except ValidationError:
            raise _said(words.format(value=value)) from None
    return WrapValidator(check)


class ManifestFile(Open):
    """One file a MANIFEST.json lists: a relative POSIX path that can travel (filenames.path_problem), its
    size and sha256; each problem one line that names the file."""

    path: Annotated[str, Field(min_length=1, max_length=MAX_PATH_CHARS)]
    bytes: Count
    sha256: Sha256

    @field_validator("path")
    @classmethod
    def _travels(cls, path: str) -> str:
        if path.startswith("/") or path.endswith(".tmp") or filenames.path_problem(path) is not None:
            raise ValueError("unsafe")
        return path

    @model_check(mode="wrap")
    @classmethod
    def _one_line(cls, item: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(item)
        except ValidationError as exc:
            field = exc.errors()[0]["loc"][:1]
            if not isinstance(item, dict) or field in ((), ("path",)):
                raise _said(f"manifest lists an unsafe path: {item!r}") from None
            if field == ("bytes",):
                raise _said(f"manifest size of {item['path']} is not a byte count: {item.get('bytes')!r}") from None
            raise _said(f"manifest sha256 of {item['path']} is malformed: {item.get('sha256')!r}") from None


class JobManifest(Open):
    """``jobs/<job_id>/MANIFEST.json`` as `gpuq pull` fetched it (schema ``gpuq.manifest/1``, written by the
    agent's ``manifest`` verb; protocol.py).  What a pull asks of it beyond its shape (its job, the files
    its checks need) is ``transfer/verify.py``'s."""

    schema_: Annotated[Literal["gpuq.manifest/1"],  # protocol.MANIFEST_SCHEMA
                       _refused(f"manifest schema is {{value!r}}, expected {protocol.MANIFEST_SCHEMA!r}")] \
        = Field(None, alias="schema", validate_default=True)
    job_id: Annotated[Short, _refused("manifest is for job {value!r}")] = Field(None, validate_default=True)
    attempt: Annotated[Annotated[int, Field(ge=1, le=MAX_ATTEMPTS, strict=True)],
                       _refused("manifest attempt {value!r} is not a positive integer")] \
        = Field(None, validate_default=True)
    queue_id: LenientText = None
    files: Annotated[list[ManifestFile] | None, Field(max_length=MAX_FILES)] = None


def read_job_manifest(raw: bytes) -> JobManifest:
    """A fetched MANIFEST.json, checked; ValueError says, in one line, what is wrong with it."""
    try:
        return JobManifest.model_validate_json(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        if err["type"] == "json_invalid":
            raise ValueError(f"manifest is not JSON: {err['msg']}") from None
        if err["type"] == "manifest":
            raise ValueError(err["msg"]) from None
        if not err["loc"]:  # not a JSON object
            raise ValueError(f"manifest schema is None, expected {protocol.MANIFEST_SCHEMA!r}") from None
        raise ValueError(f"manifest {'.'.join(str(p) for p in err['loc'])}: {err['msg']}") from None


class SnapshotPointer(Open):
    """A checkpoint pinned for copying (``snapshot``): the pointer plus the pinned file's path."""

    file: Annotated[str, Field(min_length=1, max_length=1024)]
    sha256: Sha256
    snapshot: Annotated[str, Field(min_length=1, max_length=1024)]
    bytes: Count | None = None
    step: AnyInt | None = None
    epoch: LenientInt = None
    mtime: Annotated[Finite | None, WrapValidator(none_if_invalid)] = None
    written_at: Annotated[Finite | None, WrapValidator(none_if_invalid)] = None
    # a checkpoint directory (docs/checkpoints.md): its files, hashed one by one; sha256 is their tree hash
    dir: bool = False
    files: Annotated[list[ResultFile], Field(max_length=MAX_FILES)] = Field(default_factory=list)


class FileHash(Open):
    """One file the host hashed for ``gpuq`` to copy and check (a failed attempt's evidence)."""

    bytes: Count | None = None
    sha256: Sha256 | None = None
    error: LenientText = None


class FileHashes(RootModel[Annotated[dict[Annotated[str, Field(max_length=4096)], FileHash | None],
                                     Field(max_length=MAX_FILES)]]):
    """{remote path: its size and sha256, why not, or null when it is absent} (transfer/evidence.py)."""
