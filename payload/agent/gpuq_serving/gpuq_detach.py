"""``serve --detach``: start the agent as a daemon and report whether it came up.

Double fork and setsid (the agent outlives the SSH session that started it), stdio to agent.out,
SIGHUP ignored.  The daemon answers over a pipe with one line: "ok PID" (it runs) or "held PID"
(another agent holds the root's lock); no answer within 60 s means it failed to start.

stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time
from typing import Callable

from gpuq_base import gpuq_protocol as P
from gpuq_base.gpuq_files import Layout


def serve_detached(lay: Layout, serve: Callable[[int], int]) -> int:
    """Run ``serve(notify_fd)`` in a detached daemon; print how it went; 0 when an agent runs."""
    os.makedirs(lay.root, exist_ok=True)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # first child: new session, fork again, leave
        try:
            os.close(r)
            os.setsid()
            if os.fork() > 0:
                os._exit(0)
            os.setpgid(0, 0)
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
            os.chdir(lay.root)
            dn = os.open(os.devnull, os.O_RDONLY)
            out = os.open(lay.p(P.AGENT_OUT), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.dup2(dn, 0)
            os.dup2(out, 1)
            os.dup2(out, 2)
            os.close(dn)
            os.close(out)
            sys.stdin = open(os.devnull)  # noqa: SIM115
            sys.stdout = os.fdopen(1, "w", buffering=1)
            sys.stderr = os.fdopen(2, "w", buffering=1)
            code = serve(w)
        except BaseException:
            import traceback
            traceback.print_exc()
            code = 1
        os._exit(code)
    os.close(w)
    os.waitpid(pid, 0)
    buf = b""
    deadline = time.time() + 60
    while time.time() < deadline:
        ready, _, _ = select.select([r], [], [], max(0.0, deadline - time.time()))
        if not ready:
            break
        chunk = os.read(r, 256)
        if not chunk:
            break
        buf += chunk
    os.close(r)
    words = buf.decode(errors="replace").split()
    if len(words) >= 2 and words[0] == "ok":
        print(f"agent started (pid {words[1]})")
        return 0
    if len(words) >= 2 and words[0] == "held":
        print(f"agent already running (pid {words[1]})")
        return 0
    print(f"agent failed to start; see {lay.p(P.AGENT_OUT)}", file=sys.stderr)
    return 1
