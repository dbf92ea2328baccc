"""The sweep's stopping policy as the user gives it: the ``[stop]`` table of the project's gpuq.toml
and ``submit --stop RULE`` (``baseline``, ``halving`` or ``off``; the flag wins, its other keys come
from the table).  Off unless one of them names a rule.  Every error names gpuq.toml and the key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from orchestrator.core.config import STOP_TABLE, tomllib
from orchestrator.core.errors import ConfigError, UsageError
from orchestrator.stopping.policy import StopPolicy

RULES = ("baseline", "halving", "off")


def _table(toml_path: Path) -> dict[str, Any]:
    try:
        data = tomllib.loads(toml_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{toml_path}: cannot read it as TOML ({exc}); fix the file") from exc
    table = data.get("gpuq", data).get(STOP_TABLE, {})
    if not isinstance(table, dict):
        raise ConfigError(f'{toml_path}: [stop] must be a table, e.g. [stop] rule = "baseline"')
    return dict(table)


def load_stop(toml_path: Path, flag: str | None = None) -> StopPolicy | None:
    """The policy of ``[stop]`` in ``toml_path`` with ``--stop`` applied; None when off."""
    if flag is not None and flag not in RULES:
        raise UsageError(f"--stop {flag!r}: give one of {', '.join(RULES)}")
    table = _table(toml_path)
    if flag is not None:
        table["rule"] = flag
    if table.get("rule", "off") == "off":
        return None
    if isinstance(table.get("rungs"), list):
        table["rungs"] = tuple(table["rungs"])
    try:
        return StopPolicy(**table)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(part) for part in err["loc"]) or "?"
        if err["type"] == "extra_forbidden":
            allowed = ", ".join(StopPolicy.model_fields)
            raise ConfigError(f"{toml_path}: [stop] unknown key {key!r} (allowed: {allowed})") from exc
        raise ConfigError(f"{toml_path}: [stop] {key}: {err['msg']}") from exc
