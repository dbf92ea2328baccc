"""Ablation config (YAML) loading and strict validation.

Every key below is required except ``epochs`` (the ``--epochs`` argument wins anyway).
Unknown or missing keys raise :class:`ConfigError` naming the key and the file.
"""

from __future__ import annotations

import os

from . import ConfigError

TASKS = ("classify", "regress")

# key -> type (a dict means a nested section); bool is rejected where a number is expected
_INT = "int"
_NUM = "num"
SCHEMA: dict = {
    "seed": _INT,
    "epochs": _INT,
    "batch_size": _INT,
    "model": {"width": _INT, "depth": _INT, "dropout": _NUM},
    "data": {"n_train": _INT, "n_val": _INT, "n_features": _INT, "n_classes": _INT, "noise": _NUM},
    "augment": {"noise_std": _NUM, "feature_drop": _NUM},
    "optim": {"lr": _NUM, "momentum": _NUM, "weight_decay": _NUM},
    "schedule": {"warmup_steps": _INT, "kind": ("cosine", "constant")},
    "ckpt_every_steps": _INT,
    "log_every_steps": _INT,
    "test_hook_step_sleep_s": _NUM,  # TEST HOOK: seconds of sleep per step (tests that interrupt a job)
    "test_hook_threads": _INT,  # TEST HOOK: torch's intra-op threads (tests whose hosts share the machine's cores)
}
OPTIONAL = {"epochs", "test_hook_step_sleep_s", "test_hook_threads"}


def load_config(path: str) -> dict:
    """Load and validate ``path``; raises ConfigError with a one-line message."""
    try:
        import yaml
    except ImportError as exc:  # pragma: no cover - pyyaml ships with the bundle's environment
        raise ConfigError(f"pyyaml is not installed; cannot read {path}") from exc
    if not os.path.isfile(path):
        raise ConfigError(f"config file not found: {path}")
    try:
        with open(path, encoding="utf-8") as fh:
            doc = yaml.safe_load(fh)
    except yaml.YAMLError as exc:
        msg = " ".join(str(exc).split())
        raise ConfigError(f"{path}: invalid YAML: {msg}") from exc
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    _check(doc, SCHEMA, "", path)
    _check_ranges(doc, path)
    return doc


def _check(doc: dict, schema: dict, prefix: str, path: str) -> None:
    for key in doc:
        if key not in schema:
            raise ConfigError(f"{path}: unknown key '{prefix}{key}'")
    for key, kind in schema.items():
        name = prefix + key
        if key not in doc:
            if not prefix and key in OPTIONAL:
                continue
            raise ConfigError(f"{path}: missing key '{name}'")
        value = doc[key]
        if isinstance(kind, dict):
            if not isinstance(value, dict):
                raise ConfigError(f"{path}: key '{name}' must be a mapping")
            _check(value, kind, name + ".", path)
        elif isinstance(kind, tuple):
            if value not in kind:
                raise ConfigError(f"{path}: key '{name}' must be one of {', '.join(kind)}, got {value!r}")
        elif kind == _INT:
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{path}: key '{name}' must be an integer, got {value!r}")
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path}: key '{name}' must be a number, got {value!r}")


def _check_ranges(doc: dict, path: str) -> None:
    def need(cond: bool, key: str, what: str) -> None:
        if not cond:
            raise ConfigError(f"{path}: key '{key}' {what}")

    need(doc["batch_size"] >= 1, "batch_size", "must be >= 1")
    need(doc["model"]["width"] >= 1, "model.width", "must be >= 1")
    need(doc["model"]["depth"] >= 1, "model.depth", "must be >= 1")
    need(0 <= doc["model"]["dropout"] < 1, "model.dropout", "must be in [0, 1)")
    need(doc["data"]["n_train"] >= 1, "data.n_train", "must be >= 1")
    need(doc["data"]["n_val"] >= 1, "data.n_val", "must be >= 1")
    need(doc["data"]["n_features"] >= 1, "data.n_features", "must be >= 1")
    need(doc["data"]["n_classes"] >= 2, "data.n_classes", "must be >= 2")
    need(doc["data"]["noise"] >= 0, "data.noise", "must be >= 0")
    need(doc["augment"]["noise_std"] >= 0, "augment.noise_std", "must be >= 0")
    need(0 <= doc["augment"]["feature_drop"] < 1, "augment.feature_drop", "must be in [0, 1)")
    need(doc["optim"]["lr"] > 0, "optim.lr", "must be > 0")
    need(doc["schedule"]["warmup_steps"] >= 0, "schedule.warmup_steps", "must be >= 0")
    need(doc["ckpt_every_steps"] >= 0, "ckpt_every_steps", "must be >= 0 (0 = timer only)")
    need(doc["log_every_steps"] >= 1, "log_every_steps", "must be >= 1")
    if "epochs" in doc:
        need(doc["epochs"] >= 1, "epochs", "must be >= 1")
    if "test_hook_threads" in doc:
        need(doc["test_hook_threads"] >= 1, "test_hook_threads", "must be >= 1")
