"""The host agent's ``gpuq_argv.py``, loaded by file path: one implementation of the trainer's command
line for both sides (docs/your-project.md).  The controller uses it to check ``[run]`` templates at
submit and to print the exact argv in ``gpuq submit --dry-run``; nothing here copies its logic."""

from __future__ import annotations

import functools
import importlib.util
from types import ModuleType

from orchestrator.bundle import payload_dir
from orchestrator.errors import BundleError

_MODULE = "gpuq_argv"


@functools.lru_cache(maxsize=1)
def argv_module() -> ModuleType:
    """``payload/agent/gpuq_argv.py`` of this installation, imported once."""
    path = payload_dir() / "agent" / f"{_MODULE}.py"
    spec = importlib.util.spec_from_file_location(f"gpuq_payload_agent_{_MODULE}", path)
    if spec is None or spec.loader is None or not path.is_file():
        raise BundleError(f"{path} is missing from this installation; reinstall gpuq")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
