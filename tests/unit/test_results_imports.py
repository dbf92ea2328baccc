"""``gpuq results`` as a table or CSV loads neither the gang machinery (``tick.gangs``, which pulls in the
fleet, host documents and launcher) nor ``cli.emit`` (every command's JSON document models): those are for
``cancel`` and for ``--json`` (docs/performance.md, read path imports)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HEAVY = {"orchestrator.tick.gangs", "orchestrator.cli.emit"}


def imported_by(home: Path, *argv: str) -> set[str]:
    code = (
        "import sys\nfrom orchestrator.cli.main import main\n"
        f"try:\n    main({list(argv)!r})\nexcept SystemExit:\n    pass\n"
        "print('\\n'.join(sys.modules), file=sys.stderr)\n"
    )
    env = {**os.environ, "GPUQ_HOME": str(home), "PYTHONPATH": str(REPO)}
    ran = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False, env=env, cwd=REPO
    )
    assert ran.returncode == 0, ran.stderr
    return set(ran.stderr.splitlines())


def test_results_as_a_table_or_csv_leaves_gangs_and_the_json_models_unloaded(tmp_path: Path) -> None:
    for argv in (["results"], ["results", "--csv"]):
        mods = imported_by(tmp_path, *argv)
        assert "orchestrator.cli.resulttables" in mods, argv  # the command did run
        assert not mods & HEAVY, (argv, sorted(mods & HEAVY))

