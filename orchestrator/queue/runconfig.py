"""The ``[run]`` table of a project's gpuq.toml: how to run a trainer that is not gpuq's payload
(docs/your-project.md).  Without ``[run]`` gpuq runs the bundled payload exactly as before.

Every error names gpuq.toml, the key and, for template problems, the line and column in that file.
Secrets: ``forward_env`` holds NAMES only; values are read from the controller's environment when a
job is enqueued and never stored (docs/security.md).  A project may forward only names the user allowed
(``forward_env_allow`` in their own config.toml or GPUQ_FORWARD_ENV_ALLOW) and never gpuq's own
credentials (``never_forwarded``).  The project root stays inside the gpuq.toml's repository
(``project_root``).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from orchestrator.core.agent_modules import argv_module
from orchestrator.core.config import refused_root, tomllib
from orchestrator.core.errors import ConfigError
from orchestrator.core.specs import JobSpec
from orchestrator.providers import registry

TABLE = "run"
LEGACY_USES = frozenset({"config", "task", "epochs"})  # `command = []`: the payload's own argv
DEPENDENCY_GLOBS = ("requirements*.txt", "pyproject.toml", "setup.py", "setup.cfg", "environment.y*ml",
                    "Pipfile*", "poetry.lock", "uv.lock")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_VERIFY = ("metrics", "best_ckpt")
VCS_MARKERS = (".git", ".hg")  # a directory holding one is a repository's root
USER_CONFIG_HINT = "$GPUQ_HOME/config.toml"


def never_forwarded(name: str) -> str:
    """Why gpuq never forwards ``name`` to a host ("" when it may): its own settings and credentials
    (``GPUQ_*``: the webhook, the provider keys and URLs) and the providers' conventional key variables."""
    upper = name.upper()
    for spec in registry.specs():
        if upper in (*spec.key_vars, *spec.url_vars, *(v for e in spec.more_urls for v in e.url_vars)):
            return f"gpuq's {spec.label} API credential"
    if upper.startswith("GPUQ_"):
        return "gpuq's own setting or credential (GPUQ_*)"
    return ""


def is_allowed(name: str, allowed: Iterable[str]) -> bool:
    """True when ``name`` matches a name or shell pattern of the user's ``forward_env_allow``."""
    return not never_forwarded(name) and any(fnmatch.fnmatchcase(name, item) for item in allowed)


def _argv(value: object) -> object:
    if isinstance(value, str):
        try:
            return shlex.split(value)
        except ValueError as exc:
            raise ValueError(f"cannot split like a shell: {exc}") from exc
    return value


def _globs(value: object) -> object:
    return [value] if isinstance(value, str) else value


class RunConfig(BaseModel):
    """The validated ``[run]`` table (all keys optional)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    project: str = "."
    command: tuple[str, ...] = ()  # () = the bundled payload's command
    launcher: Literal["torchrun", "python", "none"] = "torchrun"
    setup: str = ""
    env: dict[str, str] = Field(default_factory=dict)
    forward_env: tuple[str, ...] = ()
    checkpoint: tuple[str, ...] = ()
    resume_args: tuple[str, ...] = ()
    smoke_args: tuple[str, ...] = ()  # appended to a cell's arguments by `gpuq submit --smoke` (literal)
    outputs: tuple[str, ...] = ()
    metrics: str = ""
    metrics_regex: str = ""
    metric: str = ""
    mode: Literal["max", "min"] = "max"
    progress: str = ""
    verify: tuple[Literal["metrics", "best_ckpt"], ...] = ()

    _split = field_validator("command", "resume_args", "smoke_args", mode="before")(_argv)
    _wrap = field_validator("checkpoint", "outputs", mode="before")(_globs)

    @field_validator("forward_env", "env")
    @classmethod
    def _names(cls, value: Any) -> Any:
        for name in value:
            if not _ENV_NAME_RE.fullmatch(name):
                raise ValueError(f"{name!r} is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)")
        return value

    @field_validator("forward_env")
    @classmethod
    def _not_gpuqs_own(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            why = never_forwarded(name)
            if why:
                raise ValueError(f"{name} is {why}: gpuq never sends it to a host; remove it")
        return value

    @field_validator("progress", "metrics_regex")
    @classmethod
    def _regex(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression: {exc}") from exc
        return value

    @field_validator("metrics")
    @classmethod
    def _metrics(cls, value: str) -> str:
        if value in ("", "log") or value.endswith((".csv", ".jsonl", ".json")):
            if value.startswith("/") or ".." in value.split("/"):
                raise ValueError("must be a path relative to the job's run dir")
            return value
        raise ValueError('must be "", "log", or a .csv/.jsonl/.json file relative to the run dir, or a glob of '
                         'them (lightning_logs/version_*/metrics.csv)')

    def uses(self) -> set[str]:
        """Placeholders the command and resume_args use (the payload's command: config, task, epochs)."""
        module = argv_module()
        used: set[str] = set(module.uses(list(self.command))) if self.command else set(LEGACY_USES)
        return used | set(module.uses(list(self.resume_args)))

    @property
    def needs_config(self) -> bool:
        return bool(self.uses() & {"config", "task"})

    def wire(self) -> dict[str, Any]:
        """The JSON stored on the sweep (no secret values: forward_env is names only)."""
        return self.model_dump(mode="json")


def load_run(toml_path: Path) -> RunConfig | None:
    """The ``[run]`` table of ``toml_path`` (None when the file or the table is absent)."""
    try:
        text = toml_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"{toml_path}: cannot read: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{toml_path}: not UTF-8 text (byte {exc.start}); save it as UTF-8") from exc
    try:
        table = tomllib.loads(text).get(TABLE)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{toml_path}: invalid TOML: {exc}; fix the file or remove it") from exc
    if table is None:
        return None
    if not isinstance(table, dict):
        raise ConfigError(f"{toml_path}: [run] must be a table")
    try:
        run = RunConfig(**table)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = str(err["loc"][0]) if err["loc"] else "?"
        if err["type"] == "extra_forbidden":
            allowed = ", ".join(RunConfig.model_fields)
            raise ConfigError(f"{toml_path}: [run] unknown key {key!r} (allowed: {allowed})") from exc
        where = _where(text, key, None)
        raise ConfigError(f"{toml_path}:{where}: [run] {key}: {err['msg']}") from exc
    _check_templates(run, toml_path, text)
    return run


def _check_templates(run: RunConfig, toml_path: Path, text: str) -> None:
    module = argv_module()
    for key, template, allow_args in (("command", run.command, True), ("resume_args", run.resume_args, False)):
        problems = module.check(list(template), allow_args=allow_args)
        if problems:
            first = problems[0]
            where = _where(text, key, (template[first.index], first.column))
            raise ConfigError(f"{toml_path}:{where}: [run] {key}: {first.message}")


def _where(text: str, key: str, element: tuple[str, int] | None) -> str:
    """``line:column`` of ``key`` in the [run] table (of ``element``'s column when it is found)."""
    section = re.search(r"^\s*\[run\]\s*$", text, re.M)
    start = section.end() if section else 0
    match = re.compile(rf"^\s*{re.escape(key)}\s*=", re.M).search(text, start)
    if match is None:
        return "1:1"
    offset = match.start() + len(match.group()) - len(match.group().lstrip())
    if element is not None:
        found = text.find(element[0], match.end()) if element[0] else -1
        if found >= 0:
            offset = found + element[1] - 1
    line = text.count("\n", 0, offset) + 1
    column = offset - (text.rfind("\n", 0, offset) + 1) + 1
    return f"{line}:{column}"


def repository_root(toml_dir: Path) -> Path:
    """The VCS root holding ``toml_dir`` (the nearest directory above it with ``.git`` or ``.hg``), else
    ``toml_dir`` itself."""
    start = toml_dir.resolve()
    for directory in (start, *start.parents):
        if any((directory / marker).exists() for marker in VCS_MARKERS):
            return directory
    return start


def project_root(run: RunConfig | None, toml_dir: Path, *, gpuq_home: Path | None = None) -> Path:
    """The directory bundled as the project root (``project``, relative to gpuq.toml).  A root other than
    the file's own directory must stay inside its repository (``repository_root``) and must be neither
    ``/``, your home directory, a directory holding ``gpuq_home`` nor one inside it (``config.refused_root``,
    as for ``[data]``): a cloned project must not bundle your other files."""
    if run is None:
        return toml_dir
    toml = toml_dir / "gpuq.toml"
    try:
        root = (toml_dir / run.project).resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop, a permission error
        raise ConfigError(f"{toml}: [run] project: cannot resolve {run.project!r}: {exc}") from exc
    if not root.is_dir():
        raise ConfigError(f"{toml}: [run] project: {run.project!r} is not a directory")
    if root == toml_dir.resolve():
        return root
    repo = repository_root(toml_dir)
    if not root.is_relative_to(repo):
        raise ConfigError(f"{toml}: [run] project: {run.project!r} is {root}, outside the repository {repo}; "
                          "the project root must stay inside the repository that holds gpuq.toml")
    why = refused_root(root, gpuq_home)
    if why:
        raise ConfigError(f"{toml}: [run] project: {run.project!r} ({root}) {why}; point it at the project's "
                          "own directory")
    return root


def check_forward_allowed(run: RunConfig, toml_path: Path, allowed: Sequence[str],
                          user_config: str = USER_CONFIG_HINT) -> None:
    """ConfigError (one line) for the first ``forward_env`` name the user did not allow."""
    for name in run.forward_env:
        if not is_allowed(name, allowed):
            raise ConfigError(f"{toml_path}: [run] forward_env: {name} is not in your forward_env_allow; if this "
                              f"project may send it to its hosts, add forward_env_allow = [\"{name}\"] to "
                              f"{user_config} (or set GPUQ_FORWARD_ENV_ALLOW={name}); nothing was submitted")


def check_jobs(run: RunConfig, jobs: Sequence[JobSpec], toml_path: Path, queue: str,
               environ: Mapping[str, str] | None = None) -> list[str]:
    """Submit errors of these jobs under ``run`` (one line each; values of secrets never appear)."""
    environ = os.environ if environ is None else environ
    used = run.uses()
    errors = []
    for job in jobs:
        if "seed" in used and job.seed is None:
            errors.append(f"{queue}:{job.line}: job {job.name!r} has no seed but [run] uses {{seed}} "
                          f"({toml_path}); add seed= or seeds= to the line")
        for name in ("config", "task"):
            if name in used and not getattr(job, name):
                errors.append(f"{queue}:{job.line}: job {job.name!r} has no {name} but [run] command uses "
                              f"{{{name}}} ({toml_path}); give the line a config path and task")
    errors = list(dict.fromkeys(errors))
    for name in run.forward_env:
        if name not in environ:
            errors.append(f"{toml_path}: [run] forward_env: {name} is not set in this environment; "
                          f"export it before submitting (its value is sent to the hosts, never stored)")
    return errors


def secrets_for(names: Iterable[str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The forwarded variables' values, read now; a missing one raises (naming it, never a value)."""
    environ = os.environ if environ is None else environ
    out = {}
    for name in names:
        if name not in environ:
            raise ConfigError(f"forward_env: {name} is not set in the controller's environment; export it "
                              "and run the command again")
        out[name] = environ[name]
    return out


def setup_key(run: RunConfig, project_dir: Path) -> str:
    """sha256 of what setup depends on: its command, the env, and the project's dependency files
    (``DEPENDENCY_GLOBS`` at the project root, plus any project file named by a word of the setup
    command).  "" when there is no setup."""
    if not run.setup:
        return ""
    root = project_dir.resolve()
    files: set[str] = set()
    for pattern in DEPENDENCY_GLOBS:
        files.update(p.name for p in root.glob(pattern) if p.is_file())
    try:
        words = shlex.split(run.setup)
    except ValueError:
        words = run.setup.split()
    for word in words:
        path = (root / word).resolve()
        if path.is_file() and path.is_relative_to(root):
            files.add(path.relative_to(root).as_posix())
    digest = hashlib.sha256()
    digest.update(json.dumps({"setup": run.setup, "env": sorted(run.env.items())}).encode())
    for rel in sorted(files):
        digest.update(f"\0{rel}\0".encode())
        digest.update((root / rel).read_bytes())
    return digest.hexdigest()
