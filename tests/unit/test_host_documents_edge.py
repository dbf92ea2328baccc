"""No host document reaches below the edge as plain data (issue 22): the readers of
``orchestrator/host_documents/`` return models, and no code outside that package takes or keeps a
host's document as ``dict[str, Any]`` / ``Mapping[str, Any]`` (or indexes it with ``.get``)."""

from __future__ import annotations

import ast
import inspect
import typing
from pathlib import Path

from pydantic import BaseModel

from orchestrator import host_documents as hd
from orchestrator.host_documents import readers

ROOT = Path(__file__).resolve().parents[2] / "orchestrator"
EDGE = ROOT / "host_documents"

# the names a host's document (or a part of it) goes by in the controller
HOST_NAMES = frozenset({
    "doc", "docs", "entry", "entries", "seen", "exit_doc", "pointer", "facts", "reply", "replies", "verdicts",
    "summary", "beat", "heartbeat", "scan", "kernel", "memory", "disk", "progress", "candidates", "killed",
})
# modules whose "doc" / "entry" is not a host's (the --json documents gpuq writes, a queue file's line)
NOT_HOST = {"cli/documents.py", "cli/emit.py", "cli/cloud.py", "cli/up.py", "queue/queuefile.py", "queue/queueline.py",
            "core/config.py", "queue/runconfig.py", "providers", "report", "agent/launcher.py", "transfer/verify.py",
            "ledger/pulls.py"}


def _plain(annotation: ast.expr | None) -> bool:
    """``dict[str, Any]``, ``Mapping[str, Any]`` (or ``| None`` of them)."""
    if annotation is None:
        return False
    text = ast.unparse(annotation).replace(" ", "")
    return any(f"{kind}[str,Any]" in text or f"{kind}[str,object]" in text
               for kind in ("dict", "Dict", "Mapping", "MutableMapping"))


def _modules() -> list[tuple[str, ast.Module]]:
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if path.is_relative_to(EDGE) or any(rel == skip or rel.startswith(skip + "/") for skip in NOT_HOST):
            continue
        out.append((rel, ast.parse(path.read_text(encoding="utf-8"))))
    return out


def test_every_reader_returns_a_model() -> None:
    hints = typing.get_type_hints(readers)
    named = {id(getattr(readers, name)): name for name in hints if name.startswith("read_")}
    assert set(named) == {id(read) for read in hd.READERS.values()}  # every reader is in READERS
    for name, read in hd.READERS.items():
        returned = typing.get_args(hints[named[id(read)]])[-1]
        assert inspect.isclass(returned) and issubclass(returned, BaseModel), name


def test_no_host_document_is_plain_data_below_the_edge() -> None:
    found = []
    for rel, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
                found += [f"{rel}:{a.lineno} {node.name}({a.arg})" for a in args
                          if a.arg in HOST_NAMES and _plain(a.annotation)]
            elif (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                  and node.target.id in HOST_NAMES and _plain(node.annotation)):
                found.append(f"{rel}:{node.lineno} {node.target.id}")
    assert found == []


def test_nothing_below_the_edge_reads_a_host_document_with_get() -> None:
    """``probe.doc.get(...)`` / ``entry.get(...)`` were how the controller read host JSON; the models
    have named fields instead."""
    found = []
    for rel, tree in _modules():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"):
                continue
            owner = node.func.value
            name = owner.attr if isinstance(owner, ast.Attribute) else owner.id if isinstance(owner, ast.Name) else ""
            if name in HOST_NAMES - {"docs", "entries", "replies", "verdicts"}:  # dicts *of* models are fine
                found.append(f"{rel}:{node.lineno} {ast.unparse(node)[:80]}")
    assert found == []


def test_the_probe_and_the_verdicts_carry_models() -> None:
    from orchestrator.api.health import ReapReport
    from orchestrator.fleet.registering import Registered
    from orchestrator.tick.preflight import HealthVerdict
    from orchestrator.tick.probe import Probe

    assert typing.get_type_hints(Probe)["doc"] == hd.StatusDocument | None
    assert typing.get_type_hints(HealthVerdict)["doc"] == hd.HealthDocument | None
    assert typing.get_type_hints(ReapReport)["doc"] == hd.ReapDocument | None
    # fleet imports the host documents only where one is read: its annotation names the model all the same
    assert typing.get_type_hints(Registered, localns=vars(hd))["facts"] is hd.HostFacts
