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


# --- an event's words are for people ----------------------------------------------------------------

TEXT_READS = frozenset({"split", "rsplit", "partition", "rpartition", "startswith", "endswith", "removeprefix",
                        "removesuffix", "find", "rfind", "index"})
PATTERN_READS = frozenset({"match", "search", "fullmatch", "findall", "finditer"})
WORDS = "message"  # an Event's (and a Finding's) text
MIGRATIONS = PACKAGE / "ledger" / "migrate.py"  # v15 reads older events' words once, into their fields


def _is_words(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == WORDS


def words_read_back(source: str, label: str) -> list[str]:
    """``label:line`` for each place that recovers data from an event's words: a string method that
    splits or tests ``x.message``, a regular expression run over it, or ``"..." in x.message``."""
    found = []
    for node in ast.walk(ast.parse(source, filename=label)):
        hit = False
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            method = node.func.attr
            hit = ((method in TEXT_READS and _is_words(node.func.value))
                   or (method in PATTERN_READS and any(_is_words(a) for a in node.args)))
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            hit = any(_is_words(c) for c in node.comparators)
        if hit:
            found.append(f"{label}:{getattr(node, 'lineno', 0)}")
    return found


def test_no_event_text_is_parsed_back_into_data() -> None:
    found = [hit for path, text in _sources() if path != MIGRATIONS
             for hit in words_read_back(text, str(path.relative_to(ROOT)))]
    assert found == [], ("an event's reason, failure class and attempt are fields (Event.reason, "
                         "failure_class, attempt; Finding's too): read those, not its words: " + ", ".join(found))


def test_the_words_scan_sees_the_old_reads() -> None:
    """The reads this replaced (api/jobs.py, api/report.py twice, tick/ending.py, tick/answers.py,
    api/explaining.py three times), as they were written."""
    old = textwrap.dedent("""
        errors[job.id] = event.message.split(": succeeded, but ", 1)[-1]
        why = event.message.split(": succeeded, but ", 1)[-1]
        what = finding.message.split(": ", 1)[-1]
        if not any(e.rule == "stalled" and e.message.startswith(seen) for e in events): pass
        hit = _CLASS.search(event.message)
        if hit and (event.new == job.state or "(class:" in event.message): pass
        named = _CLASS_NOTE.search(event.message) if event.rule else None
        said = re.match(pattern, event.message)
        fine = event.message == message and line.split(": ", 1)
    """)
    assert sorted(int(hit.split(":")[1]) for hit in words_read_back(old, "old.py")) == [2, 3, 4, 5, 6, 7, 8, 9]
