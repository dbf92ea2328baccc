"""Where a provider adapter gets its base URL and API key (docs/providers.md, docs/security.md).

Key, first found wins::

    GPUQ_RUNPOD_API_KEY  > RUNPOD_API_KEY  > [runpod] api_key  in $GPUQ_HOME/keys.toml (or credentials.toml)
    GPUQ_LAMBDA_API_KEY  > LAMBDA_API_KEY  > [lambda] api_key  in the same file

The keys file is read only when it is owned by the user and neither group- nor world-accessible
(mode 0600 or stricter); otherwise gpuq refuses it and says how to fix it.  A variable that is set
but empty is an error, never "unset".  Keys live in :class:`ApiKey`, which never shows its value in
``str``/``repr``; adapters send it in an ``Authorization`` header only (never a URL).

Base URL, first found wins: ``GPUQ_RUNPOD_REST_URL`` > ``GPUQ_RUNPOD_URL``; ``GPUQ_LAMBDA_API_URL`` >
``GPUQ_LAMBDA_URL``; else the vendor's (RunPod's REST API v2, ``https://api.runpod.io/v2``).  A provider
with a second API (:attr:`ProviderSpec.more_urls`; none of gpuq's own has one since RunPod left GraphQL) has
variables of its own for it; when only one of its URLs is overridden, the others follow it to the same scheme,
host and port with their default paths, so a fake or a proxy never sends half the calls to the vendor.  Plain
``http://`` is accepted only for loopback addresses (the local fakes), so a key never crosses a network unencrypted.

The providers gpuq knows, with these facts, are listed by ``orchestrator.providers.registry``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from orchestrator.core.config import ENV_HOME, check_private_file, tomllib
from orchestrator.core.errors import ConfigError, ProviderAuthError

KEY_FILES = ("keys.toml", "credentials.toml")


class ApiKey:
    """A provider API key.  ``source`` says where it came from (an env var name or a file), for messages."""

    __slots__ = ("_value", "source")

    def __init__(self, value: str, source: str) -> None:
        if not value or value != value.strip():
            raise ConfigError(f"{source}: the API key is empty or has surrounding whitespace")
        self._value = value
        self.source = source

    def reveal(self) -> str:
        """The key itself, for an Authorization header and nothing else."""
        return self._value

    def scrub(self, text: str) -> str:
        """``text`` with every occurrence of the key replaced (for server messages that echo it)."""
        return text.replace(self._value, "***") if self._value else text

    def __repr__(self) -> str:
        return f"ApiKey(from {self.source})"

    __str__ = __repr__

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("ApiKey cannot be pickled")


@dataclass(frozen=True)
class Endpoint:
    """A provider's second (third, ...) API: its name, the variables that override its URL, its default."""

    name: str
    url_vars: tuple[str, ...]
    default_url: str


@dataclass(frozen=True)
class ProviderSpec:
    """The facts about one provider's credentials and endpoints (one per registry entry)."""

    name: str  # the registry name: "runpod", "lambda", ...
    label: str  # shown to people
    key_vars: tuple[str, ...]  # first is gpuq's own, last is the vendor-conventional one
    url_vars: tuple[str, ...]  # the main API's URL
    default_url: str
    section: str  # table in the keys file
    more_urls: tuple[Endpoint, ...] = ()  # other APIs of the same account (a plugin's)


RUNPOD = ProviderSpec("runpod", "RunPod", ("GPUQ_RUNPOD_API_KEY", "RUNPOD_API_KEY"),
                      ("GPUQ_RUNPOD_REST_URL", "GPUQ_RUNPOD_URL"), "https://api.runpod.io/v2", "runpod")
LAMBDA = ProviderSpec("lambda", "Lambda Cloud", ("GPUQ_LAMBDA_API_KEY", "LAMBDA_API_KEY"),
                      ("GPUQ_LAMBDA_API_URL", "GPUQ_LAMBDA_URL"), "https://cloud.lambda.ai/api/v1", "lambda")
VASTAI = ProviderSpec("vastai", "vast.ai", ("GPUQ_VASTAI_API_KEY", "VAST_API_KEY"),
                      ("GPUQ_VASTAI_API_URL", "GPUQ_VASTAI_URL"), "https://console.vast.ai", "vastai")


def how_to_set(spec: ProviderSpec) -> str:
    """One sentence telling the user where to put a key."""
    return (f"set {spec.key_vars[-1]} (or {spec.key_vars[0]}), or put `api_key = \"...\"` under "
            f"[{spec.section}] in $GPUQ_HOME/{KEY_FILES[0]} (mode 0600)")


def gpuq_home(env: Mapping[str, str]) -> Path:
    raw = env.get(ENV_HOME)
    return Path(raw).expanduser() if raw else Path.home() / ".gpuq"


def load_key(spec: ProviderSpec, env: Mapping[str, str] | None = None) -> ApiKey:
    """The API key for ``spec``; raises ProviderAuthError (none anywhere) or ConfigError (bad file/var)."""
    env = os.environ if env is None else env
    for var in spec.key_vars:
        if var in env:
            if not env[var].strip():
                raise ConfigError(f"{var} is set but empty; unset it or set it to your {spec.label} API key")
            return ApiKey(env[var].strip(), var)
    home = gpuq_home(env)
    for filename in KEY_FILES:
        path = home / filename
        found = _key_from_file(path, spec)
        if found is not None:
            return found
    raise ProviderAuthError(spec.label, f"no API key: {how_to_set(spec)}", code="no-api-key")


def _key_from_file(path: Path, spec: ProviderSpec) -> ApiKey | None:
    if not check_private_file(path, "keys file"):
        return None
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        # The decoder's message quotes no values, only positions.
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
    section = data.get(spec.section)
    if section is None:
        return None
    if not isinstance(section, dict) or not isinstance(section.get("api_key"), str):
        raise ConfigError(f"{path}: [{spec.section}] needs a string `api_key`")
    value = section["api_key"].strip()
    if not value:
        raise ConfigError(f"{path}: [{spec.section}] api_key is empty")
    return ApiKey(value, f"{path} [{spec.section}]")


def load_url(spec: ProviderSpec, env: Mapping[str, str] | None = None, endpoint: str = "") -> str:
    """The base URL of ``spec``'s main API (or of its ``endpoint``, one of :attr:`ProviderSpec.more_urls`):
    its own variable, else where an overridden sibling points (same origin, its default path), else the
    vendor's; validated."""
    env = os.environ if env is None else env
    apis = [("", spec.url_vars, spec.default_url), *((e.name, e.url_vars, e.default_url) for e in spec.more_urls)]
    chosen = [api for api in apis if api[0] == endpoint]
    if not chosen:
        raise ValueError(f"{spec.label} has no API named {endpoint!r}")
    found = _from_env(chosen[0][1], env)
    if found is not None:
        return found
    for name, url_vars, _default in apis:
        sibling = _from_env(url_vars, env) if name != endpoint else None
        if sibling is not None:
            return follow(sibling, chosen[0][2])
    return chosen[0][2]


def _from_env(url_vars: tuple[str, ...], env: Mapping[str, str]) -> str | None:
    for var in url_vars:
        if var in env:
            return check_url(env[var], var)
    return None


def follow(overridden: str, default: str) -> str:
    """``default``'s path on ``overridden``'s scheme, host and port (a sibling API on the same server)."""
    there, path = urlsplit(overridden), urlsplit(default).path
    return urlunsplit((there.scheme, there.netloc, path, "", "")).rstrip("/")


def check_url(url: str, source: str) -> str:
    """https anywhere, http only to loopback; no credentials or query in the URL."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{source}: not an http(s) URL")
    if parts.username or parts.password or parts.query:
        raise ConfigError(f"{source}: the URL must not carry credentials or a query string")
    if parts.scheme == "http" and parts.hostname not in ("127.0.0.1", "localhost", "::1"):
        raise ConfigError(f"{source}: plain http is allowed only to a loopback address; use https")
    return url.strip().rstrip("/")
