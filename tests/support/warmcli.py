"""Run `gpuq` commands as real processes forked from a warm interpreter.

The suite runs about five hundred `gpuq` commands.  Each one, started by exec, spends about 0.8 s of CPU
importing the controller (sqlalchemy, sqlmodel, pydantic, click, paramiko) before it reads its first
argument: roughly a quarter of the suite's CPU on two cores.  `run` instead asks a server process, one
per test worker, that has imported every controller module once, to fork a child for the command.  The
child is a process of its own, as with exec: it gets the command's arguments, environment and working
directory, stdin from /dev/null, its stdout and stderr on pipes that are read to their end (so a command
that leaves a daemon holding its output hangs here as it would under ``subprocess.run``), its exit status
(a signal as a negative code), and the caller kills it on a timeout.  Its Python is the one exec would
start (the same interpreter, flags and ``sys.path`` of ``python -m orchestrator``); it exits the way the
interpreter does (``SystemExit`` codes, a traceback and 1 for an uncaught exception, threads joined and
atexit handlers run before the streams are flushed).

What this does not exercise, exec does: tests/unit/test_warmcli.py runs commands both ways and compares
them, and every test that is about the process itself (a kill -9 mid-command, concurrent commands, the
terminal dashboard, ``gpuq`` as an installed script) starts it by exec.  ``GPUQ_TEST_EXEC_CLI=1`` makes
every command exec'd, as before (docs/testing.md).

A command whose environment changes how the interpreter starts (``PYTHON*``, the locale) is exec'd.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MAIN = str(ROOT / "orchestrator" / "__main__.py")
EXEC_ENV = "GPUQ_TEST_EXEC_CLI"

# what the interpreter reads once at start-up: a command whose environment differs here is exec'd
_STARTUP_PREFIXES = ("PYTHON", "LC_")
_STARTUP_NAMES = ("LANG", "LANGUAGE", "TZ")


def _startup_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(_STARTUP_PREFIXES) or k in _STARTUP_NAMES}


# ------------------------------------------------------------------------------------------ the server


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


def _exit_code(exc: SystemExit) -> int:
    """What the interpreter exits with for this SystemExit (Python/pythonrun.c handle_system_exit)."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    with contextlib.suppress(Exception):
        print(code, file=sys.stderr)
    return 1


def _run_command(request: dict[str, Any]) -> None:
    """In the forked child: become `python -m orchestrator ARGS` and exit as the interpreter would."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = [MAIN, *request["args"]]
    sys.path[0] = os.getcwd()  # `python -m` puts the working directory first
    import runpy

    code = 0
    try:
        runpy.run_module("orchestrator", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = _exit_code(exc)
    except KeyboardInterrupt:
        code = -signal.SIGINT
    except BaseException:  # the interpreter's own last resort: print it, exit 1
        with contextlib.suppress(Exception):
            sys.excepthook(*sys.exc_info())
        code = 1
    with contextlib.suppress(BaseException):
        threading._shutdown()  # type: ignore[attr-defined]  # non-daemon threads are joined at exit
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()
    if code < 0:  # an uncaught KeyboardInterrupt: the interpreter re-raises SIGINT on itself
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


def _handle(conn: socket.socket, listener: socket.socket) -> None:
    """In the per-request child: fork the command, tell the caller its pid, then its wait status."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    size = struct.unpack("!I", _recv_exact(conn, 4))[0]
    msg, fds, _flags, _addr = socket.recv_fds(conn, size, 2)
    while len(msg) < size:
        msg += _recv_exact(conn, size - len(msg))
    request = json.loads(msg)
    out_fd, err_fd = fds
    pid = os.fork()
    if pid == 0:
        try:
            listener.close()
            conn.close()
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(out_fd, 1)
            os.dup2(err_fd, 2)
            for fd in (null, out_fd, err_fd):
                os.close(fd)
            _run_command(request)
        finally:
            os._exit(120)
    os.close(out_fd)
    os.close(err_fd)
    conn.sendall(struct.pack("!i", pid))  # the caller's to kill on a timeout
    _, status = os.waitpid(pid, 0)
    conn.sendall(struct.pack("!i", status))


def serve(path: str) -> None:
    """The server: import every controller module, then fork a handler per request, forever."""
    import importlib
    import pkgutil

    import orchestrator

    for mod in pkgutil.walk_packages(orchestrator.__path__, "orchestrator."):
        if not mod.name.endswith("__main__"):
            importlib.import_module(mod.name)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # handlers are reaped by the kernel
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    print("ready", flush=True)
    while True:
        conn, _ = listener.accept()
        if os.fork() == 0:
            try:
                _handle(conn, listener)
            finally:
                os._exit(0)
        conn.close()


# ------------------------------------------------------------------------------------------ the caller


class _Server:
    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="gpuq-warmcli-")
        self.path = os.path.join(self.dir, "sock")
        self.startup = _startup_env(dict(os.environ))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", f"from tests.support.warmcli import serve; serve({self.path!r})"],
            cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, start_new_session=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line.strip() != b"ready":
            self.proc.kill()
            raise RuntimeError("the warm gpuq server did not start")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # the server and idle handlers; commands are waited for
        self.proc.wait()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
            os.rmdir(self.dir)


_server: _Server | None = None
_lock = threading.Lock()


def _get_server() -> _Server:
    global _server
    with _lock:
        if _server is None or not _server.alive():
            _server = _Server()
            atexit.register(_server.close)
        return _server


def _text(data: bytes) -> str:
    """What subprocess's text mode makes of a pipe's bytes (universal newlines)."""
    import locale

    return data.decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")


def _send(conn: socket.socket, path: str, args: list[str], env: dict[str, str], cwd: Path, out_w: int,
          err_w: int) -> None:
    """The command to the warm server: its length-framed JSON, with the two pipes' write ends."""
    conn.connect(path)
    msg = json.dumps({"args": list(args), "env": env, "cwd": str(cwd)}).encode()
    conn.sendall(struct.pack("!I", len(msg)))
    socket.send_fds(conn, [msg], [out_w, err_w])


def _collect(conn: socket.socket, argv: list[str], timeout: float, out_r: int, err_r: int,
             chunks: dict[int, list[bytes]]) -> int:
    """The command's output into ``chunks`` until both pipes close and its wait status has come: that
    status.  Past ``timeout`` the command is killed and TimeoutExpired raised, as subprocess.run does."""
    pid: int | None = None
    status: int | None = None
    deadline = time.monotonic() + timeout
    sel = selectors.DefaultSelector()
    sel.register(out_r, selectors.EVENT_READ)
    sel.register(err_r, selectors.EVENT_READ)
    sel.register(conn, selectors.EVENT_READ)
    reply = b""
    open_pipes = 2
    while open_pipes or status is None:
        left = deadline - time.monotonic()
        if left <= 0:
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            raise subprocess.TimeoutExpired(argv, timeout, b"".join(chunks[out_r]), b"".join(chunks[err_r]))
        for key, _ in sel.select(left):
            fd = key.fd
            if fd == conn.fileno():
                data = conn.recv(4096)
                if not data:
                    sel.unregister(conn)
                    if status is None:
                        raise RuntimeError("the warm gpuq server went away mid-command")
                    continue
                reply += data  # the command's pid, then its wait status: 4 bytes each
                if len(reply) >= 4:
                    pid = struct.unpack("!i", reply[:4])[0]
                if len(reply) >= 8:
                    status = struct.unpack("!i", reply[4:8])[0]
            else:
                data = os.read(fd, 65536)
                if data:
                    chunks[fd].append(data)
                else:
                    sel.unregister(fd)
                    open_pipes -= 1
    sel.close()
    assert status is not None
    return status


def run(args: list[str], env: dict[str, str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """`python -m orchestrator ARGS` with ``env`` in ``cwd``: as subprocess.run(capture_output=True,
    text=True) would return it."""
    argv = [sys.executable, "-m", "orchestrator", *args]
    server = None
    if os.environ.get(EXEC_ENV) != "1":
        server = _get_server()
        if _startup_env(env) != server.startup:
            server = None
    if server is None:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd,
                              check=False)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    chunks: dict[int, list[bytes]] = {out_r: [], err_r: []}
    try:
        _send(conn, server.path, args, env, cwd, out_w, err_w)
        os.close(out_w)
        os.close(err_w)
        out_w = err_w = -1
        status = _collect(conn, argv, timeout, out_r, err_r, chunks)
    finally:
        conn.close()
        for fd in (out_r, err_r, out_w, err_w):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
    return subprocess.CompletedProcess(argv, os.waitstatus_to_exitcode(status),
                                       _text(b"".join(chunks[out_r])), _text(b"".join(chunks[err_r])))
