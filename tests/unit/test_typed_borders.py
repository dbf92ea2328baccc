"""Typing does not stop at the ledger (issue 44): what gpuq stored is read back through its one parser,
never re-parsed by hand (an AST scan of ``orchestrator/``, in tests/unit/test_architecture.py's style).

- A sweep's ``[run]`` JSON (``Sweep.run``, a submit's ``run_json``) is parsed only by
  ``orchestrator/ledger/sweeprun.py`` (``Sweep.run_config()``): no other module calls ``json.loads``
  (or a model's ``model_validate_json``) on an expression that names ``run`` or ``run_json``.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "orchestrator"
RUN_PARSER = PACKAGE / "ledger" / "sweeprun.py"
RUN_NAMES = frozenset({"run", "run_json"})
PARSERS = frozenset({"loads", "model_validate_json", "validate_json"})


def _names(node: ast.AST) -> set[str]:
    found = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            found.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            found.add(sub.attr)
    return found


def run_reparses(source: str, label: str) -> list[str]:
    """``label:line`` for each call that parses JSON text naming a sweep's run (``json.loads(sweep.run)``)."""
    found = []
    for node in ast.walk(ast.parse(source, filename=label)):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name in PARSERS and _names(node.args[0]) & RUN_NAMES:
            found.append(f"{label}:{node.lineno}")
    return found


def _sources() -> list[tuple[Path, str]]:
    return [(p, p.read_text()) for p in sorted(PACKAGE.rglob("*.py"))]


def test_a_sweeps_run_is_parsed_in_one_place() -> None:
    found = [hit for path, text in _sources() if path != RUN_PARSER
             for hit in run_reparses(text, str(path.relative_to(ROOT)))]
    assert found == [], "parse a sweep's [run] with Sweep.run_config() (ledger/sweeprun.py): " + ", ".join(found)


def test_the_run_scan_sees_the_old_reparses() -> None:
    """The seven hand re-parses this replaced (launcher.py twice, tick/findings.py, tick/checkpoints.py,
    observed.py, ledger/redaction.py, api/dryrun.py), as they were written."""
    old = textwrap.dedent("""
        env = json.loads(sweep.run).get("env") or {}
        doc = json.loads(sweep.run)
        globs = json.loads(sweep.run).get("checkpoint") if sweep is not None and sweep.run else None
        run = json.loads(run_json) if run_json.strip() else None
        found = json.loads(run).get("forward_env") or []
        recorded = json.loads(result.run_json) if result.run_json else {}
        table = SomeModel.model_validate_json(row.run)
        fine = json.loads(host.stdout)
    """)
    assert sorted(int(hit.split(":")[1]) for hit in run_reparses(old, "old.py")) == [2, 3, 4, 5, 6, 7, 8]
