"""Typed settings with one documented precedence.

    defaults < user config ($GPUQ_HOME/config.toml) < project gpuq.toml < GPUQ_* env < flags

``GPUQ_HOME`` (default ``~/.gpuq``) relocates all state: the ledger, the
local host's root, caches.  Tests set it per test.  Unknown keys in a config
file are errors naming the file and the key; an environment variable with a
malformed value is an error naming the variable.  Secrets are never read
from here (docs/security.md).
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import stat
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10 (Ubuntu 22.04's default)
    import tomli as tomllib

from orchestrator.core.errors import ConfigError

__all__ = ["tomllib"]
ENV_HOME = "GPUQ_HOME"
USER_CONFIG = "config.toml"
PROJECT_CONFIG = "gpuq.toml"
LOCAL_HOST = "local"
RUN_TABLE = "run"  # the project's trainer: read by orchestrator/queue/runconfig.py, not a setting
DATA_TABLE = "data"  # the project's datasets: read by orchestrator/queue/datasets.py, not a setting
STOP_TABLE = "stop"  # the sweep's early stopping: read by orchestrator/stopping/config.py, not a setting


_ALLOW_RE = re.compile(r"[A-Za-z0-9_*?]+")


class Settings(BaseModel):
    """Everything gpuq can be told, with its default.  Every number is bounded both ways: a project's
    gpuq.toml setting ``patrol_interval_s = 1e-9`` (a tick loop hammering every host) or 1e308 is refused."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    home: Path = Field(default_factory=lambda: Path.home() / ".gpuq")
    local_root: Path | None = None
    local_cpu_slots: int | None = Field(default=None, ge=1, le=1024)
    local_python: str = ""
    agent_idle_exit_s: int = Field(default=600, ge=5, le=604800)
    heartbeat_s: int = Field(default=10, ge=1, le=3600)
    ckpt_interval_s: int = Field(default=600, ge=1, le=604800)
    kill_grace_s: int = Field(default=30, ge=0, le=3600)
    min_free_gb: float = Field(default=1.0, ge=0, le=1e6)
    bundle_max_mb: float = Field(default=1024.0, gt=0, le=1e6)  # a bigger project: refused at submit (docs/security.md)
    retries: int = Field(default=2, ge=0, le=10)  # per-cell `retries=` overrides (docs/health.md)
    status_timeout_s: float = Field(default=25.0, ge=0.1, le=3600)
    # Health patrol (docs/health.md): thresholds, cadence, preflight, reaping, notifications
    stall_after_s: float = Field(default=900.0, ge=1, le=604800)  # heartbeat, log and checkpoint all older: stalled
    startup_grace_s: float = Field(default=600.0, ge=1, le=604800)  # launched this recently, no heartbeat: starting
    # no step reached yet (heartbeat at step 0, nothing in the metrics): nothing written this long is a deadlock at
    # start (DataLoader workers, NCCL init), killed after its stacks are saved and retried once at most
    start_stall_after_s: float = Field(default=300.0, ge=1, le=604800)
    patrol_interval_s: float = Field(default=60.0, ge=0.1, le=86400)  # `gpuq watch` tick while attempts run
    patrol_idle_interval_s: float = Field(default=300.0, ge=0.1, le=86400)  # ... while nothing runs
    patrol_min_interval_s: float = Field(default=15.0, ge=0.1, le=86400)  # floor for --interval (sshd MaxStartups)
    patrol_max_backoff_s: float = Field(default=900.0, ge=1, le=604800)  # cap of the per-host probe backoff
    preflight: bool = True  # GPU preflight (`gpuq doctor`) before a host's first job
    preflight_samples: int = Field(default=5, ge=1, le=60)  # one-second GPU samples per preflight
    reap_min_age_s: float = Field(default=120.0, ge=0, le=86400)  # younger device holders are starting contexts
    reap_resample_s: float = Field(default=60.0, ge=0, le=3600)  # a zombie must show in two samples this far apart
    webhook_url: str = ""  # JSON POST on escalations and sweep completion; "" = off; never logged
    # the webhook's body (orchestrator/tick/notify.py): gpuq's JSON, or Slack's, Discord's or ntfy's form of one line
    webhook_format: Literal["json", "slack", "discord", "ntfy"] = "json"
    # Rented hosts (gpuq up / down / resume; docs/providers.md, docs/checkpoints.md).  API keys never live
    # here (credentials).
    ssh_key: str = ""  # private key for hosts gpuq rents ("" = ~/.ssh/id_ed25519, else id_rsa)
    provider_poll_s: float | None = Field(default=None, ge=0.1, le=3600)  # API poll/pace (None = adapter default)
    provider_ready_timeout_s: float = Field(default=900.0, ge=1, le=86400)  # a rented machine must be ready by then
    # after a create that answered a server error or timed out: how long gpuq looks for the machine by its name
    create_lookup_s: float = Field(default=120.0, ge=0, le=3600)
    # `gpuq up --for --retry-until`: the first wait between two offer polls while capacity is short (doubling
    # up to offers_retry_max_s); tests and demos set it small (GPUQ_OFFERS_RETRY_S)
    offers_retry_s: float = Field(default=30.0, ge=0.01, le=3600)
    offers_retry_max_s: float = Field(default=600.0, ge=0.01, le=86400)
    ship_checkpoints: Literal["auto", "always", "never"] = "auto"  # auto: from rented hosts only
    # same-host: a project's own checkpoint is placed back only on the host(s) that wrote it (checkpoint_trust.py)
    checkpoint_trust: Literal["any-host", "same-host"] = "any-host"
    max_preemptions: int = Field(default=10, ge=0, le=1000)  # per job, counted apart from retries (docs/health.md)
    # Billing stops when the work stops (docs/providers.md, "Down when done"; tick/billing.py): `gpuq up` marks
    # every host it rents down-when-done (as --down-when-done does); a rented host with no work this many
    # minutes gets one idle_billing alert per idle period (0 = no alert)
    auto_down: bool = False
    idle_billing_alert_min: float = Field(default=15.0, ge=0, le=43200)
    # The host's own lease (docs/cost.md, "When no gpuq command runs"): a rented host whose agent has heard from no
    # gpuq command this many minutes and has no work stops its own billing (RunPod, vast.ai) or notifies (Lambda).
    # 0 = off.  Only your own config.toml or GPUQ_LEASE_TIMEOUT_MIN sets it; tests set a fraction of a minute.
    lease_timeout_min: float = Field(default=30.0, ge=0, le=43200)
    # A sweep's spending cap in dollars when `gpuq submit` is given no --budget (None = no cap; docs/cost.md).
    # Only your own config.toml or GPUQ_BUDGET_USD sets it: a cloned project must not set or raise it.
    budget_usd: float | None = Field(default=None, gt=0, le=1e9)
    # the user's cap on what every sweep together spends in a calendar month (UTC); user-only
    budget_usd_month: float | None = Field(default=None, gt=0, le=1e9)
    # Multi-node jobs over SSH hosts (docs/multinode.md): how long the nodes of one attempt may wait for
    # each other (a node not started, the head's rendezvous port not reachable) before the attempt is given up
    gang_timeout_s: float = Field(default=300.0, ge=10, le=86400)
    # Bring your own trainer (project gpuq.toml): a script in the project that honours the payload
    # contract (protocol.py).  "" = the bundled payload/train.py.  Recorded per sweep at submit.
    entry: str = ""
    launcher: Literal["torchrun", "python"] = "torchrun"
    verify: tuple[Literal["metrics", "best_ckpt"], ...] = ("metrics", "best_ckpt")
    # Which of your environment variables a project's `[run] forward_env` may send to hosts: names or
    # shell-style patterns ("WANDB_*").  Only your own config.toml or GPUQ_FORWARD_ENV_ALLOW sets it (a
    # cloned project must not choose what leaves this machine); gpuq's own credentials are never forwarded
    # whatever it says (orchestrator/queue/runconfig.py, docs/security.md).
    forward_env_allow: tuple[str, ...] = ()

    @field_validator("webhook_url")
    @classmethod
    def _webhook_is_private(cls, url: str) -> str:
        """https only, except plain http to this machine: a webhook carries job names and findings."""
        if not url:
            return url
        parts = urlsplit(url)
        if parts.scheme == "https" and parts.hostname:
            return url
        if parts.scheme == "http" and parts.hostname and _is_loopback(parts.hostname):
            return url
        raise ValueError("must be an https:// URL (plain http:// only to this machine: 127.0.0.1, ::1, localhost)")

    @field_validator("forward_env_allow")
    @classmethod
    def _allow_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for item in value:
            if not _ALLOW_RE.fullmatch(item):
                raise ValueError(f"{item!r} is not a variable name or a pattern of one ([A-Za-z0-9_*?])")
        return value

    @property
    def ledger_path(self) -> Path:
        return self.home / "ledger.db"

    @property
    def local_host_root(self) -> Path:
        """``local_root`` when set, else the local profile's data dir ($GPUQ_HOME/local)."""
        if self.local_root is not None:
            return self.local_root
        return load_profile(LOCAL_HOST).data_dir(self.home)

    @property
    def bundle_cache(self) -> Path:
        return self.home / "bundles"


_FIELDS = {name for name in Settings.model_fields if name != "home"}
# settings only the user may set (their own config.toml or environment), never a project's gpuq.toml: a
# cloned repository must not redirect notifications (or change their form: a body the user's hook refuses
# silences them), choose what gpuq runs or writes on this machine, or set what it may spend
USER_ONLY = ("webhook_url", "webhook_format", "local_python", "local_root", "forward_env_allow", "checkpoint_trust",
             "budget_usd", "budget_usd_month", "lease_timeout_min")
_LIST_FIELDS = {name for name, f in Settings.model_fields.items() if "tuple" in str(f.annotation)}


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_private_file(path: Path, what: str, *, others_may_read: bool = False) -> bool:
    """False when ``path`` does not exist; ConfigError when another user owns it, or group or others may
    write it, or (unless ``others_may_read``) read it: it may hold secrets (API keys, a webhook URL)."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
    if info.st_uid != os.getuid():
        raise ConfigError(f"{path}: refusing a {what} owned by another user (uid {info.st_uid})")
    forbidden = (stat.S_IWGRP | stat.S_IWOTH) if others_may_read else (stat.S_IRWXG | stat.S_IRWXO)
    if info.st_mode & forbidden:
        raise ConfigError(f"{path}: refusing a {what} {'writable' if others_may_read else 'readable or writable'} "
                          f"by others (mode "
                          f"{stat.S_IMODE(info.st_mode):04o}); run: chmod 600 {path}")
    return True


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ProfilePaths(_Strict):
    data_dir: str
    durable_dir: str
    cache_dir: str = ""
    python: str = ""


class ProfileLaunch(_Strict):
    detach: str = "setsid"
    setup_hook: str = ""
    cred_file: str = ""
    kill_grace_s: int = Field(default=30, ge=0, le=3600)
    min_free_gb: float = Field(default=20, ge=0)
    # "" trains on whatever the slots are; "cpu" trains on CPU even on GPU slots (rehearsal hosts)
    train_device: Literal["", "cpu"] = ""


class Profile(_Strict):
    """One platform's facts (profiles/<name>.toml, docs/profiles.md).  Unset vs empty matters:
    ``durable_dir = ""`` disables the durable tier, it does not mean "default"."""

    name: str
    kind: str
    provider: str
    verified: str = Field(pattern=r"^\d{4}-\d{2}$")
    gotchas: list[str] = Field(default_factory=list)
    connect: dict[str, Any] = Field(default_factory=dict)
    paths: ProfilePaths
    launch: ProfileLaunch = Field(default_factory=ProfileLaunch)
    spot: dict[str, Any] = Field(default_factory=dict)
    teardown: dict[str, Any] = Field(default_factory=dict)
    clocks: list[dict[str, Any]] = Field(default_factory=list)
    survival: dict[str, dict[str, str]] = Field(default_factory=dict)

    def data_dir(self, home: Path) -> Path:
        return Path(self.paths.data_dir.replace("$GPUQ_HOME", str(home))).expanduser()


def profiles_dir() -> Path:
    here = Path(__file__).resolve().parents[1]  # orchestrator/: a wheel's _profiles, else the checkout's
    for candidate in (here / "_profiles", here.parent / "profiles"):
        if candidate.is_dir():
            return candidate
    raise ConfigError("the gpuq profiles are missing from this installation; reinstall gpuq")


_ADDED_PROFILES: dict[str, Path] = {}


def add_profile(path: Path) -> None:
    """Make the profile file ``path`` loadable by its stem: a provider from outside gpuq brings its own
    (orchestrator/providers/registry.py).  gpuq's own profiles keep their names."""
    _ADDED_PROFILES[path.stem] = path


def load_profile(name: str) -> Profile:
    """profiles/<name>.toml (or a profile a provider plugin added), validated; errors name the file and the field."""
    path = profiles_dir() / f"{name}.toml"
    if not path.is_file() and name in _ADDED_PROFILES:
        path = _ADDED_PROFILES[name]
    if not path.is_file():
        known = ", ".join(sorted({p.stem for p in profiles_dir().glob("*.toml")} | set(_ADDED_PROFILES)))
        raise ConfigError(f"unknown profile {name!r} (known: {known})")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        return Profile(**data)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from exc
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        raise ConfigError(f"{path}: {where}: {err['msg']}") from exc


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except FileNotFoundError:
        return {}
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}; fix the file or remove it") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}); save it as UTF-8") from exc
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
    section = data.get("gpuq", data)
    if not isinstance(section, dict):
        raise ConfigError(f"{path}: [gpuq] must be a table")
    unknown = sorted(set(section) - _FIELDS - {RUN_TABLE, DATA_TABLE, STOP_TABLE})  # tables read elsewhere
    if unknown:
        allowed = ", ".join(sorted(_FIELDS))
        raise ConfigError(f"{path}: unknown setting {unknown[0]!r} (allowed: {allowed})")
    return {key: (str(value) if key == "local_root" else value) for key, value in section.items()
            if key not in (RUN_TABLE, DATA_TABLE, STOP_TABLE)}


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    """GPUQ_<SETTING> variables; a list setting takes a comma-separated list or a JSON array
    (GPUQ_VERIFY=metrics,best_ckpt or GPUQ_VERIFY='["metrics"]'; empty = the empty list)."""
    out: dict[str, Any] = {}
    for name in _FIELDS:
        var = "GPUQ_" + name.upper()
        if var not in env:
            continue
        value: Any = env[var]
        if name in _LIST_FIELDS:
            text = value.strip()
            if text.startswith("["):
                try:
                    value = json.loads(text)
                except ValueError as exc:
                    raise ConfigError(f"{var}: not a JSON list: {exc}; or write a comma-separated list") from exc
            else:
                value = [item.strip() for item in text.split(",") if item.strip()]
        out[name] = value
    return out


def load_settings(
    *,
    env: Mapping[str, str] | None = None,
    project_dir: Path | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Build Settings from every layer; raises ConfigError naming the bad source."""
    env = os.environ if env is None else env
    home_raw = env.get(ENV_HOME)
    if home_raw is not None and home_raw == "":
        raise ConfigError(f"{ENV_HOME} is set but empty; unset it or point it at a directory")
    home = Path(home_raw).expanduser() if home_raw else Path.home() / ".gpuq"
    user_config = home / USER_CONFIG
    check_private_file(user_config, "config file", others_may_read=True)
    user_values = _read_toml(user_config)
    if user_values.get("webhook_url"):  # a secret: the file must be the user's alone, like keys.toml
        check_private_file(user_config, "config file that sets webhook_url")
    layers: list[tuple[str, dict[str, Any]]] = [(str(user_config), user_values)]
    if project_dir is not None:
        project = project_dir / PROJECT_CONFIG
        values = _read_toml(project)
        for key in USER_ONLY:
            if key in values:
                raise ConfigError(f"{project}: {key} can only be set in your own {user_config} or the environment "
                                  f"(GPUQ_{key.upper()}): a project's gpuq.toml must not choose it; remove it")
        layers.append((str(project), values))
    layers.append(("environment (GPUQ_*)", _from_env(env)))
    layers.append(("command line", dict(overrides or {})))
    merged: dict[str, Any] = {"home": home}
    for _, values in layers:
        merged.update(values)
    try:
        return Settings(**merged)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = str(err["loc"][0]) if err["loc"] else "?"
        source = next((src for src, values in reversed(layers) if key in values), "defaults")
        shown = "GPUQ_" + key.upper() if source.startswith("environment") else key
        raise ConfigError(f"{source}: {shown}: {err['msg']}") from exc


def refused_root(root: Path, gpuq_home: Path | None = None) -> str:
    """Why the resolved path ``root`` may not be bundled (``[run] project``) or synced (``[data]``) ("" when
    it may): it is ``/`` or your home directory, holds gpuq's state directory or lies inside it (a cloned
    project must not send your other files, nor gpuq's keys and ledger)."""
    if root == Path("/"):
        return "is /"
    if root == Path.home().resolve():
        return "is your home directory"
    state = gpuq_home.resolve() if gpuq_home is not None else None
    if state is not None and state.is_relative_to(root):
        return f"holds gpuq's state directory {gpuq_home}"
    if state is not None and root.is_relative_to(state):
        return f"is inside gpuq's state directory {gpuq_home}"
    return ""
