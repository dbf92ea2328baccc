"""gpuq's exit codes, in one table (``gpuq --help`` and docs/cli.md repeat it).

======  ==========================================================================
code    meaning
======  ==========================================================================
0       ok
1       a job or a host failed (a job did not succeed, a pull is not verified...)
2       usage, config or queue error: nothing was written
3       a health check failed (``gpuq doctor``: a host FAILs or cannot be checked)
4       timeout (``gpuq wait --timeout``: the sweep was still running)
130     interrupted (Ctrl-C, or a confirmation answered no)
======  ==========================================================================

The live ``gpuq status`` view, ended by SIGTERM or SIGHUP, exits 128 + the signal's number, as a
shell reports a process a signal ended.
"""

from __future__ import annotations

OK = 0
FAILED = 1
USAGE = 2
HEALTH = 3
TIMEOUT = 4
INTERRUPTED = 130

TABLE = {
    OK: "ok",
    FAILED: "a job or host failed",
    USAGE: "usage, config or queue error (nothing was written)",
    HEALTH: "health check failed (doctor)",
    TIMEOUT: "timeout (wait --timeout)",
    INTERRUPTED: "interrupted",
}
