"""The host agent's static checks (docs/testing.md, "The agent's checks"): its layout (packages by role,
no flat module but the entry, every package in the import contract), the house rules' sizes (no function
over 60 lines, no module over 400: the caps tests/unit/test_architecture.py holds the controller to),
mypy --strict over it, and its Python 3.8 compatibility, each shown to fail on a probe.

mypy cannot check the agent for 3.8 itself: the installed mypy refuses ``--python-version 3.8`` (1.16
is the last that accepts it), so mypy checks the agent's types at the lowest target it accepts and the
3.8 check is vermin's (``tests/unit/test_static.py``: stdlib members, modules and syntax by version)
plus two rules vermin cannot see: every module defers its annotations (``from __future__ import
annotations``, so ``list[int]`` in an annotation is never evaluated on 3.8) and no builtin generic is
subscripted at run time (``list[int]`` in code)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import tomllib

from tests.support.devtools import dev_tool
from tests.unit.test_architecture import MAX_FUNCTION_LINES, MAX_MODULE_LINES, long_functions

ROOT = Path(__file__).resolve().parents[2]
AGENT = ROOT / "payload" / "agent"
ENTRY = "gpuq_agent.py"
MYPY_TARGET = "3.10"  # the lowest --python-version the installed mypy accepts (the agent runs on 3.8)
PEP585 = frozenset({"list", "dict", "tuple", "set", "frozenset", "type"})  # subscriptable at run time from 3.9


def packages() -> list[str]:
    return sorted(p.name for p in AGENT.iterdir() if (p / "__init__.py").is_file())


def modules() -> list[Path]:
    return [AGENT / ENTRY, *sorted(p for pkg in packages() for p in (AGENT / pkg).glob("*.py"))]


def _run(argv: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
                          env={**os.environ, **env})


def test_no_flat_module_but_the_entry() -> None:
    flat = sorted(p.name for p in AGENT.glob("*.py"))
    assert flat == [ENTRY], f"payload/agent/ holds only the entry; put {flat} in a package by role"
    stray = sorted(p.name for p in AGENT.iterdir() if p.is_dir() and p.name != "__pycache__"
                   and not p.name.startswith(".")  # a tool's cache (.mypy_cache of a run from here) is no module
                   and not (p / "__init__.py").is_file())
    assert not stray, f"not packages: {stray}"
    assert len(packages()) == 7, packages()


def test_every_package_is_in_the_import_contract() -> None:
    """import-linter cannot be exhaustive over top-level packages: this is, over the agent's."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
    layers = next(c["layers"] for c in config["contracts"] if c["name"].startswith("the host agent's packages"))
    layered = sorted(name.strip() for layer in layers for name in layer.split("|"))
    acyclic = next(c["ancestors"] for c in config["contracts"] if c["name"].startswith("no import circle among "
                                                                                          "the modules of one agent"))
    assert layered == packages() == sorted(acyclic)
    assert set(packages()) <= set(config["root_packages"])


def test_each_package_says_what_it_owns_and_may_import() -> None:
    for pkg in packages():
        doc = ast.get_docstring(ast.parse((AGENT / pkg / "__init__.py").read_text(encoding="utf-8"))) or ""
        assert "\n" not in doc and "import" in doc, (pkg, doc)


def long_modules(paths: list[Path]) -> list[str]:
    """``file: N lines`` for each of ``paths`` over the module cap."""
    sizes = [(p, len(p.read_text(encoding="utf-8").splitlines())) for p in paths]
    return [f"{p}: {n} lines" for p, n in sizes if n > MAX_MODULE_LINES]


def test_no_agent_function_is_over_sixty_lines() -> None:
    long = long_functions(modules())
    assert long == [], f"over {MAX_FUNCTION_LINES} lines: split into its steps\n" + "\n".join(long)


def test_no_agent_module_is_over_four_hundred_lines() -> None:
    long = long_modules(modules())
    assert long == [], f"over {MAX_MODULE_LINES} lines: move a part with a purpose of its own\n" + "\n".join(long)


def test_the_size_checks_fail_on_probes(tmp_path: Path) -> None:
    probe = tmp_path / "gpuq_long.py"
    probe.write_text("def f():\n" + "    x = 1\n" * MAX_FUNCTION_LINES + "\n\ndef g():\n    pass\n")
    assert [hit.rsplit(": ", 1)[1] for hit in long_functions([probe])] == [f"f is {MAX_FUNCTION_LINES + 1} lines"]
    big, small = tmp_path / "gpuq_big.py", tmp_path / "gpuq_small.py"
    big.write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    small.write_text("x = 1\n" * MAX_MODULE_LINES)
    assert long_modules([big, small]) == [f"{big}: {MAX_MODULE_LINES + 1} lines"]


def test_mypy_strict_over_the_agent() -> None:
    targets = ["-m", Path(ENTRY).stem] + [arg for pkg in packages() for arg in ("-p", pkg)]
    result = _run([sys.executable, "-m", "mypy", "--strict", "--python-version", MYPY_TARGET, *targets],
                  MYPYPATH=str(AGENT))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"in {len(modules())} source files" in result.stdout, result.stdout


def deferred_annotations(path: Path) -> bool:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    annotated = any((isinstance(n, (ast.AnnAssign, ast.arg)) and n.annotation is not None)
                    or (isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.returns is not None)
                    for n in ast.walk(tree))
    future = any(isinstance(n, ast.ImportFrom) and n.module == "__future__"
                 and any(a.name == "annotations" for a in n.names) for n in tree.body)
    return future or not annotated


def runtime_generics(path: Path) -> list[str]:
    """``list[int]`` and its kind outside annotations: a TypeError on Python 3.8."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip: set[int] = set()
    for node in ast.walk(tree):
        notes = [getattr(node, "annotation", None), getattr(node, "returns", None)]
        for note in filter(None, notes):
            skip |= {id(sub) for sub in ast.walk(note)}
    return [f"{path.name}:{n.lineno}" for n in ast.walk(tree) if isinstance(n, ast.Subscript)
            and id(n) not in skip and isinstance(n.value, ast.Name) and n.value.id in PEP585]


def test_the_agent_is_python38_clean_where_vermin_cannot_see() -> None:
    assert [p.name for p in modules() if not deferred_annotations(p)] == []
    assert [hit for p in modules() for hit in runtime_generics(p)] == []


def test_the_38_checks_fail_on_probes(tmp_path: Path) -> None:
    eager = tmp_path / "eager.py"
    eager.write_text("def f(names: list[str]) -> None:\n    pass\n")
    generic = tmp_path / "generic.py"
    generic.write_text("from __future__ import annotations\n\nROWS = list[int]\nx: dict[str, int] = {}\n")
    prefix = tmp_path / "prefix.py"
    prefix.write_text("def f(s: str) -> str:\n    return str.removeprefix(s, 'gpuq_')\n")
    assert not deferred_annotations(eager) and deferred_annotations(generic)
    assert runtime_generics(generic) == ["generic.py:3"]
    result = _run([dev_tool("vermin"), "--target=3.8-", "--no-tips", "--violations", "--backport", "typing",
                   str(prefix)])
    assert result.returncode != 0 and "str.removeprefix" in result.stdout, result.stdout + result.stderr


def test_mypy_over_the_agent_fails_on_a_probe(tmp_path: Path) -> None:
    pkg = tmp_path / "gpuq_probe"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('"""A probe."""\n')
    (pkg / "gpuq_bad.py").write_text("from __future__ import annotations\n\n\ndef f(x: int) -> str:\n"
                                     "    return x\n")
    result = _run([sys.executable, "-m", "mypy", "--strict", "--python-version", MYPY_TARGET, "-p", "gpuq_probe"],
                  MYPYPATH=str(tmp_path))
    assert result.returncode == 1 and "[return-value]" in result.stdout, result.stdout + result.stderr
