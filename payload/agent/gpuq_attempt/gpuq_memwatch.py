"""The wrapper's sampler (docs/health.md): every MEM_SAMPLE_S while the trainer runs, one row of the
attempt's memory, CPU and GPU use appended to its ``mem.tsv`` (cgroup usage and limit, OOM kills,
the trainer's RSS, threads and fds, the process group's size and RSS, per-GPU utilisation).

stdlib only, Python >= 3.8.
"""

# ruff: noqa: UP031  (%-formatting on purpose: one style for every Python >= 3.8 the agent meets)
from __future__ import annotations

import os
import threading
import time

from gpuq_base.gpuq_files import append_line, read_text, utc
from gpuq_base.gpuq_hostfacts import memory_info, query_gpus
from gpuq_base.gpuq_procs import group_members

MEM_SAMPLE_S = 5.0
COLUMNS = ("time", "cg_used_bytes", "cg_limit_bytes", "cg_used_pct", "oom_kill", "cpu_pct", "trainer_rss_bytes",
           "trainer_threads", "trainer_fds", "group_procs", "group_rss_bytes", "gpus")


def sample_memory(path: str, trainer_pid: int, gpu: bool, done: threading.Event,
                  first_row: threading.Event | None = None) -> None:
    """Append rows to ``path`` until ``done`` is set, the first one even when it is set already;
    ``first_row`` is set once that row is written (or could not be).  Never raises (the sampler must never
    take the attempt down)."""
    try:
        if not os.path.exists(path):
            append_line(path, "\t".join(COLUMNS))
    except OSError:
        return
    last_cpu: tuple[float, float] | None = None
    page = os.sysconf("SC_PAGE_SIZE")
    tick = os.sysconf("SC_CLK_TCK")
    while True:
        try:
            m = memory_info()
            members = group_members(os.getpgrp())
            rss_total, cpu_ticks = 0, 0.0
            for pid in members:
                statm = (read_text("/proc/%d/statm" % pid) or "0 0").split()
                rss_total += int(statm[1]) * page if len(statm) > 1 else 0
                text = read_text("/proc/%d/stat" % pid) or ""
                rest = text[text.rfind(")") + 2:].split()
                if len(rest) > 12:
                    cpu_ticks += int(rest[11]) + int(rest[12])
            now = time.time()
            cpu_pct = ""
            if last_cpu is not None and now > last_cpu[0]:
                dt = now - last_cpu[0]
                cpu_pct = "%.1f" % max(0.0, 100.0 * (cpu_ticks - last_cpu[1]) / tick / dt)
            last_cpu = (now, cpu_ticks)
            tstat = read_text("/proc/%d/status" % trainer_pid) or ""
            t_rss = t_thr = ""
            for line in tstat.splitlines():
                if line.startswith("VmRSS:"):
                    t_rss = str(int(line.split()[1]) * 1024)
                elif line.startswith("Threads:"):
                    t_thr = line.split()[1]
            try:
                t_fds = str(len(os.listdir("/proc/%d/fd" % trainer_pid)))
            except OSError:
                t_fds = ""
            gpus = ""
            if gpu:
                gpus = ";".join("{}:{}%:{}MiB".format(g["index"], g["util_pct"], g["mem_used_mib"])
                                for g in query_gpus())
            fields = [utc(now), m["used_bytes"], m["limit_bytes"], m["used_pct"], m["oom_kill"], cpu_pct,
                      t_rss, t_thr, t_fds, len(members), rss_total, gpus]
            append_line(path, "\t".join("" if f is None else str(f) for f in fields))
        except Exception:  # the sampler must never take the attempt down
            pass
        if first_row is not None:
            first_row.set()
        if done.is_set() or done.wait(MEM_SAMPLE_S):
            return
