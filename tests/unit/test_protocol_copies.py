"""The agent's and the payload's copies of the host contract agree with orchestrator/core/protocol.py (and
its documents.py and filenames.py)."""

from __future__ import annotations

import ast
import contextlib
from pathlib import Path

from orchestrator.core import documents, filenames, protocol

ROOT = Path(__file__).resolve().parents[2]


def _constants(path: Path) -> dict[str, object]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: dict[str, object] = {}
    for node in tree.body:
        targets: list[ast.expr] = []
        value = None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        for target in targets:
            if isinstance(target, ast.Name) and target.id.isupper() and value is not None:
                with contextlib.suppress(ValueError):
                    found[target.id] = ast.literal_eval(value)
    return found


MASTER = {k: v for module in (protocol, documents, filenames) for k, v in vars(module).items() if k.isupper()}
LAYOUT = {k for k in MASTER if k.endswith(("_DIR", "_FILE", "_LOG", "_CKPT", "_POINTER", "_ENTRY"))}
CODES = {k for k in MASTER if k.startswith("EXIT_") and isinstance(MASTER[k], int)}


def test_agent_copy_matches() -> None:
    copy = _constants(ROOT / "payload" / "agent" / "gpuq_base" / "gpuq_protocol.py")
    shared = set(copy) & set(MASTER)
    assert {"PROTOCOL_VERSION", "SPEC_SCHEMA", "STATUS_SCHEMA"} <= shared
    assert LAYOUT - {"BUNDLE_MANIFEST"} <= set(copy), sorted(LAYOUT - set(copy))
    assert set(copy) >= CODES, sorted(CODES - set(copy))
    mismatched = {k: (copy[k], MASTER[k]) for k in shared if copy[k] != MASTER[k]}
    assert not mismatched


def test_payload_copy_matches() -> None:
    copy = _constants(ROOT / "payload" / "gpuq_payload" / "contract.py")
    shared = set(copy) & set(MASTER)
    assert {"ENV_CKPT_DIR", "ENV_RESULT_DIR", "ENV_HEARTBEAT", "LATEST_POINTER", "RESUMED_MARKER"} <= shared
    mismatched = {k: (copy[k], MASTER[k]) for k in shared if copy[k] != MASTER[k]}
    assert not mismatched


def test_copies_import_nothing_from_the_controller() -> None:
    for path in (ROOT / "payload").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert "import orchestrator" not in text and "from orchestrator" not in text, path
