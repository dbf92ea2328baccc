"""Regenerate the README's report figure: run the example sweep (payload/queue.txt) with ``seeds=2``
on the local host in a scratch $GPUQ_HOME, then ``gpuq report --format html`` and copy its
val_acc curve to docs/images/report-val_acc.png.  Takes a few minutes on a 2-core machine; the
scratch directory (project, home, report) is left for a look.

    python scripts/make_readme_figure.py [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="Scratch dir for the project, home and report (default: a temp dir).")
    parser.add_argument("--seeds", type=int, default=2)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="gpuq-readme-figure-")) if args.keep is None else args.keep
    project, home, out = scratch / "project", scratch / "home", scratch / "report"
    shutil.copytree(ROOT / "payload", project, ignore=shutil.ignore_patterns("__pycache__", "queue.txt"))
    lines = [line.split("#", 1)[0].strip() for line in (ROOT / "payload" / "queue.txt").read_text().splitlines()]
    queue = project / "queue.txt"
    queue.write_text("".join(f"{line} seeds={args.seeds}\n" for line in lines if line))
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "GPUQ_HOME": str(home), "PYTHONPATH": str(ROOT)}

    def gpuq(*argv: str) -> None:
        print("+ gpuq", " ".join(argv), flush=True)
        subprocess.run([sys.executable, "-m", "orchestrator", *argv], env=env, check=True)

    gpuq("submit", str(queue), "--wait")
    gpuq("report")
    gpuq("report", "--format", "html", "-o", str(out))
    target = ROOT / "docs" / "images" / "report-val_acc.png"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(out / "curve-val_acc.png", target)
    # the scratch dir stays: the local host agent idles there until its idle exit (docs/host-protocol.md)
    print(f"wrote {target}; the sweep, its ledger and the HTML report are in {scratch}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
