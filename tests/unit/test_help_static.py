"""``gpuq --help`` is printed from cli/helptext.py without importing click, and says what click says."""

from __future__ import annotations

import os
import subprocess
import sys

from orchestrator.cli import entry, helptext
from orchestrator.cli.main import cli


def _run(code: str, columns: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": columns}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60,
                          check=True)


def test_static_text_is_what_click_prints() -> None:
    assert helptext.render() == helptext.TEXT, (
        "cli/helptext.py is stale: regenerate it with python -m orchestrator.cli.helptext")


def test_static_text_lists_every_command_with_its_short_help() -> None:
    for name, command in cli.commands.items():
        assert f"  {name} " in helptext.TEXT
        assert command.get_short_help_str(limit=10)[:8].rstrip(".") in helptext.TEXT


def test_help_imports_no_click_and_prints_the_same() -> None:
    code = ("import sys\nfrom orchestrator.cli.entry import main\nmain(['--help'])\n"
            "print(sorted(m for m in sys.modules if m == 'click' or m.startswith('click.')), file=sys.stderr)")
    for flag in ("--help", "-h"):
        done = _run(code.replace("'--help'", repr(flag)), "120")
        assert done.stderr.strip() == "[]"
        assert done.stdout == helptext.render()


def test_module_entry_prints_the_same_as_click() -> None:
    env = {**os.environ, "COLUMNS": "100"}
    done = subprocess.run([sys.executable, "-m", "orchestrator", "--help"], capture_output=True, text=True, env=env,
                          timeout=60, check=True)
    assert done.stdout == helptext.render()


def test_narrow_terminal_and_other_arguments_go_through_click() -> None:
    code = "import sys\nfrom orchestrator.cli.entry import main\nmain(sys.argv[1:])\n"
    narrow = subprocess.run([sys.executable, "-c", code, "--help"], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "COLUMNS": "60"})
    assert narrow.stdout.startswith("Usage: gpuq ") and max(map(len, narrow.stdout.splitlines())) <= 60
    assert narrow.stdout != helptext.TEXT
    assert not entry.static_help(["--debug", "--help"])
    assert not entry.static_help(["pull", "--help"])
    assert not entry.static_help([])
