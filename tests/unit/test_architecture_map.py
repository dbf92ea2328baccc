"""docs/architecture.md's module map names every module, and its layers are the import contract's.

A module under ``orchestrator/`` counts as named when its path relative to ``orchestrator/`` appears in
backticks in the module map (``cli/render.py``), or when its file name does in a row whose first cell
names its folder (``ledger/`` ... ``store.py``).  The agent's entry (``payload/agent/gpuq_agent.py``)
counts as named when its file name appears in backticks in the agent paragraph, and an agent module
(``payload/agent/<package>/gpuq_*.py``) when its file name does in its package's bullet there
(``- `gpuq_base/`: `gpuq_files.py`, ...``).
"""

from __future__ import annotations

import re
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"


def section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start:] if end < 0 else text[start:end]


def module_map(text: str) -> tuple[set[str], dict[str, set[str]]]:
    """(paths named in backticks, folder -> file names named in that folder's rows)."""
    block = section(text, "## Module map")
    named: set[str] = set()
    by_folder: dict[str, set[str]] = {}
    for line in block.splitlines():
        if not line.startswith("|"):
            continue
        cells = line.split("|")
        ticks = set(re.findall(r"`([^`]+)`", line))
        named |= ticks
        first = set(re.findall(r"`([^`]+)`", cells[1] if len(cells) > 1 else ""))
        for folder in (t for t in first if t.endswith("/")):
            by_folder.setdefault(folder, set()).update(t.split("/")[-1] for t in ticks)
            by_folder[folder].update(re.findall(r"`([A-Za-z_0-9]+)`", line))  # `store` for store.py
    return named, by_folder


def agent_bullets(text: str) -> tuple[str, dict[str, set[str]]]:
    """(the agent paragraph, package folder -> file names in backticks in that package's bullet)."""
    block = section(text, "## Module map")
    para = block[block.index("Agent packages (`payload/agent/`"):]
    bullets: dict[str, set[str]] = {}
    for bullet in re.split(r"\n- ", para)[1:]:
        folder = re.match(r"`([A-Za-z_0-9]+/)`", bullet)
        if folder:
            bullets[folder[1]] = set(re.findall(r"`([^`]+\.py)`", bullet))
    return para, bullets


def unnamed_agent_modules(text: str) -> list[str]:
    para, bullets = agent_bullets(text)
    agent = ROOT / "payload" / "agent"
    missing = [f"payload/agent/{p.name}" for p in sorted(agent.glob("*.py")) if f"`{p.name}`" not in para]
    for path in sorted(agent.glob("*/*.py")):
        if path.name != "__init__.py" and path.name not in bullets.get(f"{path.parent.name}/", set()):
            missing.append(path.relative_to(ROOT).as_posix())
    return missing


def unnamed_modules(text: str) -> list[str]:
    named, by_folder = module_map(text)
    missing: list[str] = []
    for path in sorted((ROOT / "orchestrator").rglob("*.py")):
        rel = path.relative_to(ROOT / "orchestrator").as_posix()
        if path.name == "__init__.py" and rel != "__init__.py":
            folder = rel.rsplit("/", 1)[0] + "/"
            if folder in by_folder or folder in named:
                continue
            missing.append(f"orchestrator/{rel}")
            continue
        if rel in named or rel == "__init__.py":
            continue
        folder = rel.rsplit("/", 1)[0] + "/" if "/" in rel else ""
        names = by_folder.get(folder, set())
        if folder and (path.name in names or path.stem in names):
            continue
        missing.append(f"orchestrator/{rel}")
    return missing + unnamed_agent_modules(text)


def test_every_module_is_in_the_map() -> None:
    missing = unnamed_modules(DOC.read_text(encoding="utf-8"))
    assert not missing, f"docs/architecture.md's module map does not name: {missing}"


def test_the_map_check_can_fail() -> None:
    text = DOC.read_text(encoding="utf-8")
    without = text.replace("`scheduling/scheduler.py`", "`scheduler-gone`")
    assert "orchestrator/scheduling/scheduler.py" in unnamed_modules(without)


def test_the_agent_map_check_can_fail() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert "payload/agent/gpuq_base/gpuq_gang.py" in unnamed_modules(text.replace("`gpuq_gang.py`", "gang"))
    moved = text.replace("`gpuq_stall.py` (a", "(a").replace("`gpuq_cancel.py`,", "`gpuq_cancel.py`, `gpuq_stall.py`,")
    assert unnamed_modules(moved) == ["payload/agent/gpuq_serving/gpuq_stall.py"]  # named, in another package


def test_the_drawn_layers_are_the_contracts_layers() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    layers = next(c["layers"] for c in contracts if c["type"] == "layers")
    block = section(DOC.read_text(encoding="utf-8"), "## Layers")
    drawn = block.split("```")[1].strip().splitlines()
    assert [" ".join(x.split()) for x in drawn] == [" ".join(x.split()) for x in layers]
