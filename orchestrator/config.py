"""Typed settings with one documented precedence.

    defaults < user config ($GPUQ_HOME/config.toml) < project gpuq.toml < GPUQ_* env < flags

``GPUQ_HOME`` (default ``~/.gpuq``) relocates all state: the ledger, the
local host's root, caches.  Tests set it per test.  Unknown keys in a config
file are errors naming the file and the key; an environment variable with a
malformed value is an error naming the variable.  Secrets are never read
from here (DOMAIN.md 16).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import tomllib
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.errors import ConfigError

ENV_HOME = "GPUQ_HOME"
USER_CONFIG = "config.toml"
PROJECT_CONFIG = "gpuq.toml"
LOCAL_HOST = "local"


class Settings(BaseModel):
    """Everything gpuq can be told, with its default."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    home: Path = Field(default_factory=lambda: Path.home() / ".gpuq")
    local_root: Path | None = None
    local_cpu_slots: int | None = Field(default=None, ge=1, le=1024)
    local_python: str = ""
    agent_idle_exit_s: int = Field(default=600, ge=5)
    heartbeat_s: int = Field(default=10, ge=1)
    ckpt_interval_s: int = Field(default=600, ge=1)
    kill_grace_s: int = Field(default=30, ge=0)
    min_free_gb: float = Field(default=1.0, ge=0)
    retries: int = Field(default=1, ge=0, le=10)
    status_timeout_s: float = Field(default=25.0, gt=0)

    @property
    def ledger_path(self) -> Path:
        return self.home / "ledger.db"

    @property
    def local_host_root(self) -> Path:
        return self.local_root if self.local_root is not None else self.home / "local"

    @property
    def bundle_cache(self) -> Path:
        return self.home / "bundles"


_FIELDS = {name for name in Settings.model_fields if name != "home"}


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except FileNotFoundError:
        return {}
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}; fix the file or remove it") from exc
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
    section = data.get("gpuq", data)
    if not isinstance(section, dict):
        raise ConfigError(f"{path}: [gpuq] must be a table")
    unknown = sorted(set(section) - _FIELDS)
    if unknown:
        allowed = ", ".join(sorted(_FIELDS))
        raise ConfigError(f"{path}: unknown setting {unknown[0]!r} (allowed: {allowed})")
    return {key: (str(value) if key == "local_root" else value) for key, value in section.items()}


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in _FIELDS:
        var = "GPUQ_" + name.upper()
        if var in env:
            out[name] = env[var]
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
    layers: list[tuple[str, dict[str, Any]]] = [(str(home / USER_CONFIG), _read_toml(home / USER_CONFIG))]
    if project_dir is not None:
        layers.append((str(project_dir / PROJECT_CONFIG), _read_toml(project_dir / PROJECT_CONFIG)))
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
