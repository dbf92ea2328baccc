"""Benchmark: `gpuq submit --dry-run` of a queue that expands to 10,000 jobs (target: under 3 s).

Builds a project in a temp dir (a [run] table with `command = "train.py {args}"`, 10 grid lines of
1,000 jobs each), then prints the median of 3 wall-clock runs of `python -m orchestrator submit
--dry-run` (a fresh GPUQ_HOME, output to /dev/null) and the median time of parsing the queue alone.

    python scripts/bench_dryrun.py [--lines 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.queue.queuefile import parse_queue  # noqa: E402

VALUES = ",".join(str(v) for v in range(10))


def build(tmp: Path, lines: int) -> Path:
    (tmp / "gpuq.toml").write_text('[run]\ncommand = "train.py {args}"\nlauncher = "python"\n')
    (tmp / "train.py").write_text("import sys\nprint(sys.argv)\n")
    queue = tmp / "queue.txt"
    rows = [f"name=c{i} gpus=1 est_min=5 -- --lr {{{VALUES}}} --wd {{{VALUES}}} --bs {{{VALUES}}}"
            for i in range(lines)]
    queue.write_text("\n".join(rows) + "\n")
    return queue


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=10, help="grid lines of 1,000 jobs each")
    parser.add_argument("--repeat", type=int, default=3)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpuq-bench-dryrun-") as name:
        tmp = Path(name)
        queue = build(tmp, opts.lines)
        parse_times = []
        for _ in range(opts.repeat):
            start = time.perf_counter()
            parsed = parse_queue(queue, needs_config=False)
            parse_times.append(time.perf_counter() - start)
        env = {**os.environ, "GPUQ_HOME": str(tmp / "home"), "PYTHONPATH": str(ROOT)}
        runs = []
        for _ in range(opts.repeat):
            start = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "orchestrator", "submit", "--dry-run", str(queue)],
                                  env=env, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            runs.append(time.perf_counter() - start)
            if done.returncode != 0:
                sys.exit(f"submit --dry-run failed ({done.returncode}): {done.stderr.strip()}")
    print(f"jobs: {len(parsed.jobs)}")
    print(f"parse only: median {statistics.median(parse_times):.3f} s over {opts.repeat}")
    print(f"submit --dry-run (whole command, new process): median {statistics.median(runs):.3f} s over "
          f"{opts.repeat} (runs: {', '.join(f'{t:.2f}' for t in runs)}); target < 3 s")


if __name__ == "__main__":
    main()
