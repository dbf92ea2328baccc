"""Measure a `[data]` sync of SIZE MB (default 200) to a local host root: hashing on the controller,
the first sync (every chunk moves), the second (0 bytes), and hashing again (the cache).

    PYTHONPATH=. python scripts/bench_data_sync.py [SIZE_MB]

tests/integration/test_data_sync.py runs the same path over SSH to two hosts with 200 MB
(GPUQ_TEST_DATA_MB); this script times the controller's part alone (idle 2-core box, 200 MB: hash
0.7 s, first sync 1.7 s, second sync 0.06 s with 0 bytes moved, hashing again 0 s).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

from orchestrator.agent.bundle import tree_rules
from orchestrator.hosts.local import LocalHost
from orchestrator.queue import datasets
from orchestrator.transfer import datasync


def main() -> None:
    size = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    with tempfile.TemporaryDirectory(prefix="gpuq-bench-data-") as tmp:
        base = Path(tmp)
        repo, home, root = base / "repo", base / "home", base / "host"
        (repo / "corpus").mkdir(parents=True)
        (repo / ".git").mkdir()
        for i in range(4):
            (repo / "corpus" / f"shard{i}.bin").write_bytes(os.urandom(size * (1 << 20) // 4))
        (repo / "gpuq.toml").write_text('[data]\ncorpus = "corpus"\n')
        host = LocalHost(root)
        t = time.perf_counter()
        (m,) = datasets.load_data(repo / "gpuq.toml", repo, home, tree_rules)
        hashed = time.perf_counter() - t
        t = time.perf_counter()
        moved = datasync.sync(host, m, home)
        first = time.perf_counter() - t
        t = time.perf_counter()
        again = datasync.sync(host, m, home)
        second = time.perf_counter() - t
        t = time.perf_counter()
        datasets.load_data(repo / "gpuq.toml", repo, home, tree_rules)
        cached = time.perf_counter() - t
    print(f"{size} MB: hash {hashed:.2f} s, first sync {first:.2f} s ({moved / 1e6:.0f} MB moved), "
          f"second sync {second:.2f} s ({again} bytes moved), hash again {cached:.2f} s (cached)")


if __name__ == "__main__":
    main()
