"""The agent modules the controller loads by path (orchestrator/core/agent_modules.py): stdlib only,
so they load without the agent's packages, and loading them leaves the controller's import namespace
as it was (no agent package in ``sys.modules``, no agent directory on ``sys.path``)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from orchestrator.core import agent_modules

AGENT = Path(__file__).resolve().parents[2] / "payload" / "agent"


def non_stdlib_imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            names.add("." if node.level else (node.module or "").split(".")[0])
    return names - set(sys.stdlib_module_names) - {"__future__"}


def test_the_shared_modules_import_only_the_stdlib() -> None:
    for dotted in agent_modules.SHARED:
        path = AGENT / f"{dotted.replace('.', '/')}.py"
        assert path.is_file(), path
        assert not non_stdlib_imports(path), (dotted, non_stdlib_imports(path))


def test_the_import_check_sees_a_sibling_import(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("import os\nfrom gpuq_base.gpuq_files import read_json\nfrom . import x\n")
    assert non_stdlib_imports(probe) == {"gpuq_base", "."}


def test_loading_them_leaves_the_import_namespace_alone() -> None:
    code = ("import sys\n"
            "from orchestrator.core import agent_modules as a\n"
            "before = set(sys.modules)\n"
            "assert a.argv_module().job_argv and a.ckptcheck_module().checkpoint_problem\n"
            "new = sorted(m for m in set(sys.modules) - before if m.startswith('gpuq_'))\n"
            "print(new, [p for p in sys.path if p.rstrip('/').endswith('payload/agent')])\n")
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["[]", "[]"], ran.stdout
