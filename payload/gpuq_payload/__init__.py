"""gpuq training payload helpers: contract copy, config, data, model, checkpoints, heartbeat.

Standard library plus torch (and pyyaml for configs); nothing from ``orchestrator/``.
"""

from __future__ import annotations


class ConfigError(Exception):
    """A configuration error: the trainer exits 4 with a one-line message (never retried)."""
