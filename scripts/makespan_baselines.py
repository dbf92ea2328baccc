"""bench_makespan's baselines: the scripts a user runs instead of gpuq, over the same farm and project.

- ``run_baseline``: ``run_queue.sh``, one sequential loop per host, jobs dealt round-robin;
- ``run_static_split``: one loop per GPU, the queue dealt round-robin over every host x GPU slot;
- ``run_dynamic_pool``: one local worker per host x GPU slot taking the next job in queue order.

Each copies the project to the hosts before its clock starts and returns its wall makespan and its
trainers' own span.
"""

from __future__ import annotations

import shlex
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scripts.makespan_report import trainer_span


def _ship(farm: Any, project: Path, dirname: str) -> None:
    """Copy the trainer and configs to /root/<dirname> on every host (before any clock starts)."""
    tar = subprocess.run(["tar", "-C", str(project), "-cf", "-", "sleeper.py", "configs"], capture_output=True,
                         check=True).stdout
    unpack = f"rm -rf /root/{dirname} && mkdir -p /root/{dirname} && tar -xf - -C /root/{dirname}"
    for i in range(len(farm.hosts)):
        subprocess.run([*farm.ssh_argv(i), "--", unpack], input=tar, capture_output=True, check=True, timeout=60)


def _job_cmd(dirname: str, cfg: str, gpu: int | None) -> str:
    """One job the way a user's script runs it (``$cfg`` may be a shell variable)."""
    pin = "" if gpu is None else f"CUDA_VISIBLE_DEVICES={gpu} "
    return (f"name=${{cfg##*/}}; name=${{name%.yaml}}; {pin}GPUQ_RESULT_DIR=/root/{dirname}/results/$name "
            f"python3 sleeper.py --config \"{cfg}\" --task sleep --epochs 1 || echo \"FAILED {cfg}\" >&2")


def _summaries(farm: Any, dirname: str, configs: Sequence[str], label: str) -> list[Path]:
    found = [p for h in farm.hosts for p in (h.root / dirname / "results").glob("*/summary.json")]
    if len(found) != len(configs):
        raise RuntimeError(f"{label}: {len(found)} of {len(configs)} jobs left a summary")
    return found


def _run_loops(farm: Any, loops: Sequence[str], label: str) -> list[float]:
    """One OpenSSH session per host running ``loops[i]``; wall time of each from a common start."""
    started = time.monotonic()
    procs = [subprocess.Popen([*farm.ssh_argv(i), "--", shlex.join(["bash", "-c", loop])],
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for i, loop in enumerate(loops)]
    walls = []
    for i, proc in enumerate(procs):
        _out, err = proc.communicate(timeout=3600)
        walls.append(time.monotonic() - started)
        if proc.returncode != 0 or b"FAILED" in err:
            raise RuntimeError(f"{label} on host {i} failed ({proc.returncode}): {err.decode()[-500:]}")
    return walls


def run_baseline(farm: Any, project: Path, configs: Sequence[str]) -> dict[str, Any]:
    """run_queue.sh: one sequential loop per host, jobs dealt round-robin in queue order."""
    n = len(farm.hosts)
    _ship(farm, project, "baseline")
    loops = [f"cd /root/baseline && for cfg in {' '.join(shlex.quote(c) for c in configs[i::n])}; do "
             + _job_cmd("baseline", "$cfg", None) + "; done" for i in range(n)]
    walls = _run_loops(farm, loops, "baseline loop")
    summaries = _summaries(farm, "baseline", configs, "baseline")
    return {"makespan_s": max(walls), "per_host_s": walls, "trainer_span_s": trainer_span(summaries)}


def run_static_split(farm: Any, project: Path, configs: Sequence[str], gpus: int) -> dict[str, Any]:
    """The careful user's static split: one loop per GPU (CUDA_VISIBLE_DEVICES=g), the queue dealt
    round-robin in queue order over every host x GPU slot, all loops started together."""
    n = len(farm.hosts)
    slots = n * gpus
    _ship(farm, project, "static")
    loops = []
    for i in range(n):
        parts = []
        for g in range(gpus):
            mine = configs[i * gpus + g::slots]
            if mine:
                parts.append(f"( for cfg in {' '.join(shlex.quote(c) for c in mine)}; do "
                             + _job_cmd("static", "$cfg", g) + "; done ) &")
        loops.append("cd /root/static || exit 1; " + " ".join(parts) + " wait")
    walls = _run_loops(farm, loops, "static split")
    summaries = _summaries(farm, "static", configs, "static split")
    return {"makespan_s": max(walls), "per_host_s": walls, "trainer_span_s": trainer_span(summaries)}


def run_dynamic_pool(farm: Any, project: Path, configs: Sequence[str], gpus: int) -> dict[str, Any]:
    """The careful user's dynamic pool: a local worker per host x GPU slot; whichever slot is free first
    starts the next job in queue order, one OpenSSH command per job (like ``xargs -P`` over ssh)."""
    import queue as queue_mod
    import threading

    _ship(farm, project, "pool")
    todo: queue_mod.Queue[str] = queue_mod.Queue()
    for cfg in configs:
        todo.put(cfg)
    errors: list[str] = []

    def worker(host: int, gpu: int) -> None:
        while True:
            try:
                cfg = todo.get_nowait()
            except queue_mod.Empty:
                return
            cmd = f"cd /root/pool && cfg={shlex.quote(cfg)}; " + _job_cmd("pool", "$cfg", gpu)
            proc = subprocess.run([*farm.ssh_argv(host), "--", shlex.join(["bash", "-c", cmd])],
                                  stdin=subprocess.DEVNULL, capture_output=True, timeout=3600)
            if proc.returncode != 0 or b"FAILED" in proc.stderr:
                errors.append(f"{cfg} on host {host} GPU {gpu}: {proc.stderr.decode()[-300:]}")

    started = time.monotonic()
    threads = [threading.Thread(target=worker, args=(h, g)) for h in range(len(farm.hosts)) for g in range(gpus)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - started
    if errors:
        raise RuntimeError("dynamic pool: " + "; ".join(errors[:3]))
    summaries = _summaries(farm, "pool", configs, "dynamic pool")
    return {"makespan_s": wall, "trainer_span_s": trainer_span(summaries)}
