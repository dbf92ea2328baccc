#!/usr/bin/env python3
"""The read commands print what they printed before: render ``results``, ``report`` and ``status --all`` on
built ledgers with two copies of gpuq's code, and compare the bytes.

    python scripts/check_read_outputs.py build DIR [--jobs 1000 10000]
    python scripts/check_read_outputs.py render DIR OUT [--code ROOT]   # ROOT: a checkout (default: this one)
    python scripts/check_read_outputs.py compare OUT_A OUT_B

``build`` makes one ledger per size with ``bench_results_scale.build_sweep`` (DIR/homeN/ledger.db);
``render`` runs each command as a user runs it (a fresh ``python -m orchestrator``, ``COLUMNS=200``,
``TZ=UTC``) with ``PYTHONPATH=ROOT`` and writes stdout, stderr and the exit status to OUT/homeN/NAME;
``compare`` says which differ (exit 1) apart from the lines that name a time relative to now (none of the
commands here print one for this ledger's finished jobs, so none is masked).  The ledgers are opened read
only by every command here; main's code and this one read the same file.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SWEEP = "qscale1"
COMMANDS: dict[str, list[str]] = {
    "results": ["results", "--sweep", SWEEP],
    "results-csv": ["results", "--sweep", SWEEP, "--csv"],
    "results-json": ["results", "--sweep", SWEEP, "--json"],
    "report": ["report", SWEEP],
    "report-csv": ["report", SWEEP, "--format", "csv"],
    "report-json": ["report", SWEEP, "--format", "json"],
    "report-md": ["report", SWEEP, "--format", "md"],
    "status-all": ["status", "--once", "--all", "--no-probe"],
    "status-all-json": ["status", "--once", "--all", "--no-probe", "--json"],
}


def build(target: Path, sizes: list[int]) -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    sys.path.insert(0, str(ROOT))
    from bench_results_scale import build_sweep

    for jobs in sizes:
        home = target / f"home{jobs}"
        home.mkdir(parents=True, exist_ok=False)
        build_sweep(home, jobs, 10, 50)
        print(f"built {home}")


def render(source: Path, out: Path, code: Path, names: list[str]) -> None:
    for home in sorted(p for p in source.iterdir() if (p / "ledger.db").is_file()):
        env = {**os.environ, "GPUQ_HOME": str(home), "PYTHONPATH": str(code), "COLUMNS": "200", "TZ": "UTC",
               "PYTHONDONTWRITEBYTECODE": "1"}
        env.pop("NO_COLOR", None)
        (out / home.name).mkdir(parents=True, exist_ok=True)
        for name in names:
            ran = subprocess.run([sys.executable, "-m", "orchestrator", *COMMANDS[name]], env=env,
                                 capture_output=True, cwd=code, check=False)
            dest = out / home.name / name
            dest.write_bytes(ran.stdout)
            dest.with_suffix(".err").write_bytes(ran.stderr + f"\nexit {ran.returncode}\n".encode())
        print(f"rendered {home.name} with {code}")


def _generated_at(data: bytes) -> bytes:
    """``generated_at`` (the time of the snapshot, in ``status --json``) blanked: the one time printed."""
    lines = data.split(b"\n")
    return b"\n".join(b'  "generated_at": 0,' if line.startswith(b'  "generated_at": ') else line for line in lines)


def compare(a: Path, b: Path) -> int:
    bad = 0
    for left in sorted(p for p in a.rglob("*") if p.is_file()):
        right = b / left.relative_to(a)
        same = right.is_file() and _generated_at(left.read_bytes()) == _generated_at(right.read_bytes())
        bad += not same
        print(f"{'same' if same else 'DIFFERENT'}  {left.relative_to(a)}")
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="verb", required=True)
    b = sub.add_parser("build")
    b.add_argument("dir", type=Path)
    b.add_argument("--jobs", type=int, nargs="+", default=[1000, 10_000])
    r = sub.add_parser("render")
    r.add_argument("dir", type=Path)
    r.add_argument("out", type=Path)
    r.add_argument("--code", type=Path, default=ROOT)
    r.add_argument("--only", nargs="+", choices=sorted(COMMANDS), default=list(COMMANDS))
    c = sub.add_parser("compare")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    args = ap.parse_args()
    if args.verb == "build":
        build(args.dir, args.jobs)
    elif args.verb == "render":
        render(args.dir, args.out, args.code.resolve(), args.only)
    else:
        return compare(args.a, args.b)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
