"""The host agent's stdlib-only modules that the controller runs too, loaded by file path: one
implementation for both sides, nothing copied.

* ``gpuq_base/gpuq_argv.py``: the trainer's command line (docs/your-project.md).  The controller uses it to
  check ``[run]`` templates at submit and to print the exact argv in ``gpuq submit --dry-run``.
* ``gpuq_base/gpuq_ckptcheck.py``: is a file a sound torch checkpoint (docs/results.md).  The wrapper's
  ``best_ckpt`` check on the host and the controller's check of a pulled or shipped copy.

``payload_dir()`` finds that payload: a wheel's ``orchestrator/_payload``, else the checkout's ``payload/``.

Only modules that import nothing but the standard library can be loaded this way: the agent's others
import its packages (``gpuq_base.gpuq_files``) by absolute name from the agent's directory, which is
never put on the controller's ``sys.path``.  ``tests/unit/test_agent_modules.py`` keeps these two so.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path
from types import ModuleType

from orchestrator.core import protocol
from orchestrator.core.errors import BundleError


def payload_dir() -> Path:
    """The payload shipped with gpuq: a wheel's copy, else the source checkout's."""
    override = os.environ.get("GPUQ_PAYLOAD_DIR")
    if override:
        return Path(override)
    here = Path(__file__).resolve().parents[1]  # orchestrator/: a wheel's _payload, else the checkout's
    for candidate in (here / "_payload", here.parent / "payload"):
        if (candidate / protocol.AGENT_ENTRY.split("/", 1)[1]).is_file():
            return candidate
    raise BundleError("the gpuq payload is missing from this installation; reinstall gpuq")


SHARED = ("gpuq_base.gpuq_argv", "gpuq_base.gpuq_ckptcheck")  # the agent modules the controller runs too


@functools.cache
def _load(dotted: str) -> ModuleType:
    """``dotted`` (``package.module`` under payload/agent/), under a private name of its own: it joins
    no agent package in ``sys.modules``."""
    path = payload_dir() / "agent" / f"{dotted.replace('.', '/')}.py"
    spec = importlib.util.spec_from_file_location(f"gpuq_payload_agent_{dotted.replace('.', '_')}", path)
    if spec is None or spec.loader is None or not path.is_file():
        raise BundleError(f"{path} is missing from this installation; reinstall gpuq")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def argv_module() -> ModuleType:
    """``payload/agent/gpuq_base/gpuq_argv.py`` of this installation, imported once."""
    return _load(SHARED[0])


def ckptcheck_module() -> ModuleType:
    """``payload/agent/gpuq_base/gpuq_ckptcheck.py`` of this installation, imported once."""
    return _load(SHARED[1])
