"""Import a host-agent module (payload/agent: stdlib only, imported by sibling name) into a test."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

AGENT = Path(__file__).resolve().parents[2] / "payload" / "agent"


def load_agent_module(name: str, *, qualified: bool = False) -> ModuleType:
    """``name`` from payload/agent, without writing .pyc files into payload/ (bundles must be
    byte-identical to the repository).  ``qualified``: import it as ``payload.agent.<name>`` (its
    siblings still by their own names), the module path scripts/mutation.py's mutmut sees."""
    if str(AGENT) not in sys.path:
        sys.path.insert(0, str(AGENT))
    before = sys.dont_write_bytecode
    sys.dont_write_bytecode = True
    try:
        return importlib.import_module(f"payload.agent.{name}" if qualified else name)
    finally:
        sys.dont_write_bytecode = before
