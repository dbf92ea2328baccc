"""The jail a root trainer runs in (docs/security.md, "other jobs on the host").

A private mount namespace (``unshare -m``) in which, before the trainer's exec:

- all of ``bundles/`` (every project's code and data) is bind-mounted read-only;
- the interpreter's directories (``sys.prefix``, ``sys.base_prefix``, their exec prefixes, the
  site-packages and the user site that exist) are bind-mounted read-only, so that no job plants a
  ``.pth``, a ``sitecustomize`` or a patched library that runs in the agent or in another job;
- ``secrets/`` is covered by an empty read-only tmpfs: a job gets its own sweep's forwarded values
  in its environment (the wrapper reads them outside the namespace) and reads no other sweep's file;
- CAP_SYS_ADMIN, CAP_SYS_PTRACE and CAP_SYS_MODULE leave the bounding set, so the trainer cannot
  remount, unmount, reach the host's own view through ``/proc/<pid>/root`` or load a module.

The jail's own Python runs with ``-I -S``: no PYTHON* variable, no cwd, no site-packages and no
``.pth`` file of any kind runs while it still holds every capability.  What stays writable: the
agent's root (run dirs, caches) and whatever is not named above (``/tmp``, ``$HOME``...).

stdlib only, Python >= 3.8.
"""

# ruff: noqa: UP031  (%-formatting on purpose, as in the other agent modules)
from __future__ import annotations

import contextlib
import json
import os
import shutil
import site
import subprocess
import sys

CAPS_DROPPED = {"CAP_SYS_MODULE": 16, "CAP_SYS_PTRACE": 19, "CAP_SYS_ADMIN": 21}
PR_CAPBSET_DROP = 24
# argv: mount, [dirs read-only] and [dirs hidden] as JSON, the job's dynamic-loader variables as JSON
# (set only for the trainer's exec, ``split_loader_env``), then the trainer's argv.  --rbind: the
# mounts below an interpreter dir (a container's driver libraries) stay as they are.
JAIL = (
    "import ctypes, json, os, subprocess, sys\n"
    "mount = sys.argv[1]\n"
    "steps = [[mount, '-t', 'tmpfs', '-o', 'ro,size=4k,mode=0700', 'gpuq-hidden', d]"
    " for d in json.loads(sys.argv[3])]\n"
    "for d in json.loads(sys.argv[2]):\n"
    "    steps += [[mount, '--rbind', d, d], [mount, '-o', 'remount,bind,ro', d]]\n"
    "for argv in steps:\n"
    "    if subprocess.call(argv, stdin=subprocess.DEVNULL) != 0:\n"
    "        sys.exit('gpuq: %%s failed' %% ' '.join(argv))\n"
    "prctl = ctypes.CDLL(None, use_errno=True).prctl\n"
    "for cap in %r:\n"
    "    if prctl(%d, cap, 0, 0, 0) != 0:\n"
    "        sys.exit('gpuq: cannot drop capability %%d: %%s' %% (cap, os.strerror(ctypes.get_errno())))\n"
    "os.environ.update(json.loads(sys.argv[4]))\n"
    "os.execvp(sys.argv[5], sys.argv[5:])\n"
) % (tuple(sorted(CAPS_DROPPED.values())), PR_CAPBSET_DROP)

LOADER_NAMES = ("GCONV_PATH", "GLIBC_TUNABLES", "LOCPATH")  # besides every LD_* name


def split_loader_env(env: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(``env`` without the dynamic loader's variables, those variables).  A job's ``LD_PRELOAD`` or
    ``LD_LIBRARY_PATH`` (its ``[run] env``) would load its code into unshare, mount and the jail's
    Python, as root with every capability, before the bundles are read-only: the jail is started
    without them and sets them for the trainer's exec only (``read_only_prefix(bundle, loader)``)."""
    loader = {k: v for k, v in env.items() if k.startswith("LD_") or k in LOADER_NAMES}
    return {k: v for k, v in env.items() if k not in loader}, loader


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def interpreter_dirs(keep_writable: list[str]) -> list[str]:
    """The real paths of this interpreter's prefixes, site-packages and user site that exist, outermost
    only; never ``/`` nor a directory holding one of ``keep_writable`` (the agent's root, /tmp)."""
    try:
        sites = [*list(site.getsitepackages()), site.getusersitepackages()]
    except AttributeError:  # a virtualenv's old site.py
        sites = []
    found = set()
    for d in [sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix, *sites]:
        real = os.path.realpath(d)
        if real != "/" and os.path.isdir(real) and not any(_under(os.path.realpath(w), real) for w in keep_writable):
            found.add(real)
    return sorted(d for d in found if not any(o != d and _under(d, o) for o in found))


def _probe(argv: list[str]) -> str:
    """"" when the jail's argv starts ``true``, else why not."""
    try:
        rc = subprocess.run([*argv, "true"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, timeout=30).returncode
    except (OSError, subprocess.SubprocessError) as e:
        return "unshare failed: %s" % e
    return "unshare --mount exited %d" % rc if rc != 0 else ""


def read_only_prefix(bundle: str, loader: dict[str, str] | None = None, *, root: str | None = None,
                     hidden: list[str] | None = None) -> tuple[list[str], str]:
    """As root (mode bits do not stop root), the argv prefix that runs the trainer in the jail (above):
    ``bundle``'s parent (all of ``bundles/``) and the interpreter's directories read-only, ``hidden``
    (``secrets/``, made 0700 when missing, so that another sweep's values written later land under the cover)
    covered.  ``root``: the agent's root, kept writable (an interpreter dir holding it is
    left out).  Returns (argv prefix, "" or why it fell back: to the bundles alone when the interpreter's
    directories cannot be made read-only, to mode bits when no jail starts).  ``loader``: the job's LD_*
    variables, set just before the trainer's exec; start the prefix with an environment without them
    (``split_loader_env``).  unshare and python exec, so the trainer keeps the pid Popen gave it."""
    if os.geteuid() != 0:
        return [], ""
    unshare, mount = shutil.which("unshare"), shutil.which("mount")
    if not unshare or not mount:
        return [], "unshare/mount not found"
    bundles = os.path.dirname(os.path.normpath(bundle))
    keep = [bundles, "/tmp"] + ([root] if root else [])
    for d in hidden or []:  # made now if missing: a dir made later would not be covered
        with contextlib.suppress(OSError):
            os.makedirs(d, mode=0o700, exist_ok=True)
    covered = [d for d in (hidden or []) if os.path.isdir(d)]
    loader_doc = json.dumps(loader or {}, sort_keys=True)
    start = [unshare, "-m", "--propagation", "private", "--", sys.executable, "-I", "-S", "-c", JAIL, mount]
    full = [*start, json.dumps([bundles, *interpreter_dirs(keep)]), json.dumps(covered), loader_doc]
    why = _probe(full)
    if not why:
        return full, ""
    least = [*start, json.dumps([bundles]), json.dumps(covered), loader_doc]
    if _probe(least):
        return [], why
    return least, "the interpreter's directories stay writable (%s)" % why
