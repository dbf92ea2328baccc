"""docs/security.md cites the tests that prove each line: every cited test file and test exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def citations(text: str) -> list[tuple[str, str]]:
    """(file, test name or "") for every `tests/...py` and `tests/...py::test_x` the text cites, and every
    backticked `test_x` name that follows a file within the same table cell or sentence."""
    found: list[tuple[str, str]] = []
    for cell in re.split(r"\|", text):
        files = re.findall(r"tests/[\w/]+\.py", cell)
        for match in re.finditer(r"(tests/[\w/]+\.py)(?:::(test_\w+))?", cell):
            found.append((match.group(1), match.group(2) or ""))
        if files:
            for name in re.findall(r"`(test_\w+)`", cell):
                if not name.endswith(("_", "…")):
                    found.append((files[-1] if len(files) == 1 else "", name))
    return found


def test_every_cited_test_exists() -> None:
    text = (ROOT / "docs" / "security.md").read_text(encoding="utf-8")
    missing = []
    sources = {p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8")
               for p in (ROOT / "tests").rglob("test_*.py")}
    for path, name in citations(text):
        if path and path not in sources:
            missing.append(path)
        elif name and not any(re.search(rf"def {name}\b", src) for f, src in sources.items()
                              if not path or f == path):
            missing.append(f"{path}::{name}")
    assert not missing, f"docs/security.md cites tests that do not exist: {sorted(set(missing))}"


def test_the_citation_reader_sees_files_and_names() -> None:
    cell = "| x | y | `tests/unit/test_a.py::test_b`, `tests/unit/test_c.py` (`test_d`) |"
    assert ("tests/unit/test_a.py", "test_b") in citations(cell)
    assert ("tests/unit/test_c.py", "") in citations(cell)
    assert ("tests/unit/test_c.py", "test_d") in citations("| `tests/unit/test_c.py` (`test_d`) |")
