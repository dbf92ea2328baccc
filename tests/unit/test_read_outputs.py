"""``gpuq results``, ``report`` and ``status --all`` print, byte for byte, what they printed before they read
through the read path without the ORM (issue 42; docs/performance.md).

``tests/fixtures/reads/ledger.sql`` is a 40-job sweep (``scripts/bench_results_scale.build_sweep(home, 40, 4,
4)``: 1-3 attempts, preempted and lost ones, multi-GPU jobs, a CPU-slot host, priced hosts, failed jobs,
from-scratch findings) dumped as SQL; the ``*.out`` files beside it are what each command printed on it with
the code before the change (rendered by this file: ``python tests/unit/test_read_outputs.py OUT_DIR``).  A
later schema migrates the loaded file first (the ``Ledger`` does, as a user's first command would).
``scripts/check_read_outputs.py`` makes the same comparison on the benchmark's 1k-100k ledgers.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.check_read_outputs import COMMANDS  # the one list of what is compared

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "reads"

NOW = re.compile(rb'^(\s*"generated_at": )[0-9.e+]+(,?)$', re.M)  # the one time printed: when it was drawn


def load_ledger(home: Path) -> Path:
    """The fixture's ledger at ``home/ledger.db`` (at the schema it was dumped with, then migrated by the
    ``Ledger`` if this gpuq's is newer)."""
    text = (FIXTURES / "ledger.sql").read_text()
    version = int(re.match(r"-- gpuq ledger v(\d+)", text).group(1))  # type: ignore[union-attr]
    path = home / "ledger.db"
    db = sqlite3.connect(path)
    db.executescript(text)
    db.execute(f"PRAGMA user_version = {version}")
    db.commit()
    db.close()
    from orchestrator.ledger.migrate import SCHEMA_VERSION

    if version != SCHEMA_VERSION:
        from orchestrator.ledger import Ledger

        Ledger(path).close()
    return path


def render(argv: list[str]) -> bytes:
    """What ``gpuq ARGV`` writes on stdout, run in this process as a user's terminal-less run (COLUMNS=200)."""
    from orchestrator.cli.main import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            main(argv)
        except SystemExit as exc:
            assert not exc.code, (argv, exc.code)
    return NOW.sub(rb"\g<1>0\g<2>", out.getvalue().encode())


@pytest.fixture
def fixture_home(gpuq_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setenv("TZ", "UTC")
    monkeypatch.delenv("NO_COLOR", raising=False)
    load_ledger(gpuq_home)
    return gpuq_home


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_the_read_commands_print_what_they_printed_before(fixture_home: Path, name: str) -> None:
    want = (FIXTURES / f"{name}.out").read_bytes()
    assert want.strip()
    assert render(COMMANDS[name]) == want


def test_results_and_report_read_without_the_orm_the_fleet_or_the_providers(fixture_home: Path) -> None:
    heavy = ("sqlalchemy", "sqlmodel", "orchestrator.ledger.store", "orchestrator.fleet", "orchestrator.providers",
             "orchestrator.cli.emit", "orchestrator.cli.documents", "orchestrator.tick.collect")
    code = ("import sys\nfrom orchestrator.cli.main import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            f"print(' '.join(sorted(m for m in sys.modules if m.startswith({heavy!r}))) or 'light', file=sys.stderr)\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for argv in (COMMANDS["results"], COMMANDS["report"], COMMANDS["report-json"]):
        ran = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120,
                             check=False, env=env, cwd=REPO)
        assert ran.returncode == 0, ran.stderr
        assert ran.stderr.strip().splitlines()[-1] == "light", (argv, ran.stderr[-500:])
        assert "c" in ran.stdout  # it printed its rows


if __name__ == "__main__":  # the reference outputs, rendered by whatever gpuq is on PYTHONPATH
    import tempfile

    target = Path(sys.argv[1])
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.update({"GPUQ_HOME": tmp, "COLUMNS": "200", "TZ": "UTC"})
        os.environ.pop("NO_COLOR", None)
        load_ledger(Path(tmp))
        for key, args in COMMANDS.items():
            (target / f"{key}.out").write_bytes(render(args))
