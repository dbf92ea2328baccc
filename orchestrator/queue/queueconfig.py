"""A queue line's config file, read once per path (queuefile.py): it must be a readable regular file inside the
project (symlinks resolved); its sha256, and its top-level YAML ``epochs:`` for the line's epochs warning."""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass

import yaml


@dataclass(frozen=True)
class ConfigInfo:
    """The environment's answer for one config path: an error, or its hash and YAML ``epochs:``."""

    error: str | None = None
    sha256: str = ""
    epochs: object = None


def inspect_config(root: str, rel: str) -> ConfigInfo:
    """Resolve ``rel`` under ``root``; it must stay inside and be a readable regular file."""
    try:
        real = os.path.realpath(os.path.join(root, rel))
        inside = os.path.commonpath([root, real]) == root
    except (OSError, ValueError) as exc:
        return ConfigInfo(error=f"cannot read config file {rel}: {_reason(exc)}")
    if not inside:
        return ConfigInfo(error=f"config path {rel} leads outside the project root through a symlink")
    try:
        mode = os.stat(real).st_mode
        if not stat.S_ISREG(mode):
            return ConfigInfo(error=f"config path is not a regular file: {rel}")
        with open(real, "rb") as handle:
            data = handle.read()
    except (FileNotFoundError, NotADirectoryError):
        return ConfigInfo(error=f"config file not found: {rel}")
    except OSError as exc:
        return ConfigInfo(error=f"cannot read config file {rel}: {_reason(exc)}")
    return ConfigInfo(sha256=hashlib.sha256(data).hexdigest(), epochs=_yaml_epochs(data))


def _reason(exc: Exception) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc)


def _yaml_epochs(data: bytes) -> object:
    """The config's top-level ``epochs:`` value, or None; YAML problems are the payload's business."""
    try:
        document = yaml.safe_load(data)
    except Exception:  # any YAML failure (syntax, recursion, bad keys) only means "no warning"
        return None
    if isinstance(document, dict):
        return document.get("epochs")
    return None


def epochs_differ(value: object, epochs: int) -> bool:
    if value is None:
        return False
    return isinstance(value, bool) or value != epochs
