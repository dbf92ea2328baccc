"""The repository is self-contained: no tracked file names a path outside it, and the docs' links resolve.

The design notes that preceded the code are not part of gpuq: a user who clones it, and the next
engineer, must find everything in the repository itself (docs/ is the reference).  So no tracked
file may name the shared design directory or cite the design files, and every relative Markdown
link in README.md and docs/*.md must point at a file inside the repository that exists.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Spelled in pieces so that this file does not itself name what it forbids.
_DESIGN = "|".join(("DOMAIN", "ARCHITECTURE", "PROVIDERS"))
FORBIDDEN = (
    re.compile(re.escape(".." + "/shared")),
    re.compile(re.escape("shared" + "/design")),
    re.compile(r"\b(?:" + _DESIGN + r")\.md\b"),
    re.compile(r"\b(?:" + _DESIGN + r")\s*\u00a7"),  # a section sign after a design file's name
)

DOC_PAGES = ("README.md", "architecture.md", "queue.md", "host-protocol.md", "trainer-contract.md", "health.md",
             "checkpoints.md", "results.md", "providers.md", "profiles.md", "security.md", "cli.md")

# [text](target) and [text](target "title"), images too; reference-style links are not used here.
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_BLOCK = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def tracked_files() -> list[Path]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: which files are tracked is unknown")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [ROOT / name for name in out.decode("utf-8", "surrogateescape").split("\0") if name]


def offending_lines(path: Path, root: Path) -> list[str]:
    """``file:line: text`` for each line of ``path`` that names a forbidden path."""
    try:
        text = path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):  # binary, or deleted but not yet committed
        return []
    return [f"{path.relative_to(root)}:{number}: {line.strip()[:160]}"
            for number, line in enumerate(text.splitlines(), 1)
            if any(p.search(line) for p in FORBIDDEN)]


def broken_links(page: Path, root: Path) -> list[str]:
    """Relative links of ``page`` whose target does not exist or lies outside ``root``."""
    text = CODE_BLOCK.sub("", page.read_text(encoding="utf-8"))  # examples in code blocks are not links
    broken = []
    for target in LINK.findall(text):
        if SCHEME.match(target) or target.startswith("#"):
            continue  # https:, mailto:, an anchor on the same page
        resolved = (page.parent / unquote(target.split("#", 1)[0])).resolve()
        if root.resolve() not in (resolved, *resolved.parents):
            broken.append(f"{page.relative_to(root)}: ({target}) leaves the repository")
        elif not resolved.exists():
            broken.append(f"{page.relative_to(root)}: ({target}) does not exist")
    return broken


def test_no_tracked_file_names_a_path_outside_the_repository() -> None:
    hits = [hit for path in tracked_files() for hit in offending_lines(path, ROOT)]
    assert not hits, ("these lines name the design notes or a path outside the repository; cite the "
                      "matching docs/ page instead:\n" + "\n".join(hits))


def test_the_path_check_catches_each_forbidden_form(tmp_path: Path) -> None:
    bad = ["see .." + "/shared/" + "design/x.md", "(" + "shared" + "/design)", "DOMAIN" + ".md 6.2",
           "# ARCHITECTURE" + ".md section 2", "PROVIDERS" + ".md 2.8", "DOMAIN " + "\u00a7" + "7.1"]
    good = ["docs/health.md", "the DOMAIN of a function", "a shared/ folder", "PROVIDERS = (...)", "MYDOMAIN.md"]
    sample = tmp_path / "sample.py"
    sample.write_text("\n".join(good + bad) + "\n", encoding="utf-8")
    found = [hit.split(": ", 1)[0] for hit in offending_lines(sample, tmp_path)]
    assert found == [f"sample.py:{n}" for n in range(len(good) + 1, len(good) + len(bad) + 1)]


def test_the_reference_pages_exist() -> None:
    missing = [page for page in DOC_PAGES if not (ROOT / "docs" / page).is_file()]
    assert not missing, f"missing from docs/: {missing}"


def test_relative_markdown_links_point_at_existing_files() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = [b for page in pages for b in broken_links(page, ROOT)]
    assert not broken, "broken relative links:\n" + "\n".join(broken)


def test_the_link_check_catches_missing_and_escaping_targets(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "docs").mkdir(parents=True)
    (repo / "docs" / "there.md").write_text("x\n", encoding="utf-8")
    (tmp_path / "outside.md").write_text("x\n", encoding="utf-8")
    page = repo / "docs" / "page.md"
    page.write_text("[ok](there.md#part) [web](https://example.com) [anchor](#top) [gone](missing.md)\n"
                    "[out](../../outside.md) ![img](there.md)\n"
                    "```\n[in a code block](nowhere.md)\n```\n", encoding="utf-8")
    assert broken_links(page, repo) == ["docs/page.md: (missing.md) does not exist",
                                        "docs/page.md: (../../outside.md) leaves the repository"]
