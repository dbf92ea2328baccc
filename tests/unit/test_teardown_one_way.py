"""gpuq ends a machine it rented one way (tick/teardown.end_instance): terminate, wait until the provider says
it is gone, then forget its SSH identity and mark its lease.  ``gpuq down``, down-when-done and ``gpuq up``'s
machines it will not use all go through it; only ``gpuq down --orphans`` (instances with no row) calls a
provider's terminate itself."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "orchestrator"
ENDS = {"terminate", "wait_gone"}
ALLOWED = {"tick/teardown.py": {"end_instance"}, "api/orphans.py": None}  # None: any function there


def callers() -> dict[str, set[str]]:
    """module -> the functions in it that call ``<something>.terminate(...)`` or ``.wait_gone(...)``."""
    found: dict[str, set[str]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("providers/"):
            continue
        for func in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(func):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ENDS
                        and not (isinstance(node.func.value, ast.Name) and node.func.value.id == "teardown")):
                    found.setdefault(rel, set()).add(func.name)
    return found


def test_only_the_teardown_ends_a_rented_machine() -> None:
    found = callers()
    assert found.get("tick/teardown.py") == {"end_instance"}, found
    for rel, funcs in found.items():
        assert rel in ALLOWED, f"{rel} ({', '.join(sorted(funcs))}) ends a machine itself: use teardown.end_instance"
        allowed = ALLOWED[rel]
        assert allowed is None or funcs <= allowed, (rel, funcs)
