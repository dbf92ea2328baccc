"""The error tree drawn in ``orchestrator/core/errors.py``'s docstring is the real one.

Every subclass of ``GpuqError`` defined anywhere under ``orchestrator/`` must be drawn there, under
its real parent, and nothing may be drawn that does not exist.
"""

from __future__ import annotations

import importlib
import pkgutil
import re

import orchestrator
from orchestrator.core import errors

BRANCH = re.compile(r"^(?P<indent>[ │]*)(?:├── |└── )(?P<name>[A-Za-z]+)\b")


def drawn_tree(doc: str) -> dict[str, str]:
    """Class name -> drawn parent name, read from the box-drawing tree in ``doc``."""
    parents: dict[str, str] = {}
    stack: list[tuple[int, str]] = []  # (depth, name)
    for raw in doc.splitlines():
        line = raw[4:] if raw.startswith("    ") else raw
        if line.startswith("GpuqError"):
            stack = [(-1, "GpuqError")]
            continue
        match = BRANCH.match(line)
        if not match or not stack:
            continue
        depth = len(match.group("indent")) // 4
        while stack and stack[-1][0] >= depth:
            stack.pop()
        name = match.group("name")
        parents[name] = stack[-1][1]
        stack.append((depth, name))
    return parents


def all_error_classes() -> dict[str, type[errors.GpuqError]]:
    for info in pkgutil.walk_packages(orchestrator.__path__, "orchestrator."):
        if not info.name.endswith(".__main__"):
            importlib.import_module(info.name)
    found: dict[str, type[errors.GpuqError]] = {}
    pending: list[type[errors.GpuqError]] = [errors.GpuqError]
    while pending:
        cls = pending.pop()
        for sub in cls.__subclasses__():
            if sub.__module__.startswith("orchestrator."):
                found[sub.__name__] = sub
                pending.append(sub)
    return found


def test_every_gpuq_error_is_drawn_under_its_real_parent() -> None:
    drawn = drawn_tree(errors.__doc__ or "")
    real = all_error_classes()
    assert real, "no GpuqError subclasses found"
    missing = sorted(set(real) - set(drawn))
    assert not missing, f"errors.py's tree does not draw: {missing}"
    wrong = {name: (drawn[name], cls.__mro__[1].__name__) for name, cls in real.items()
             if drawn[name] != cls.__mro__[1].__name__}
    assert not wrong, f"drawn under the wrong parent (drawn, real): {wrong}"
    ghosts = sorted(set(drawn) - set(real))
    assert not ghosts, f"errors.py's tree draws classes that do not exist: {ghosts}"


def test_the_tree_reader_sees_a_wrong_parent() -> None:
    doc = "    GpuqError\n    ├── HostError\n    │   └── TransferError\n    └── AgentError\n"
    assert drawn_tree(doc) == {"HostError": "GpuqError", "TransferError": "HostError", "AgentError": "GpuqError"}
    moved = doc.replace("    │   └── TransferError\n", "")
    moved = moved.replace("└── AgentError", "├── TransferError\n    └── AgentError")
    assert drawn_tree(moved)["TransferError"] == "GpuqError"
