"""A cloned project's code run on this machine (``gpuq submit --smoke``), kept from your credentials.

The command runs with ``HOME`` at its own root and, where this machine can make a private mount
namespace (as root ``unshare --mount``; otherwise ``unshare --user --map-root-user --mount``, an
unprivileged user namespace), with an empty tmpfs mounted over ``$GPUQ_HOME`` (the command's own root,
which lies inside it, bound back at its path) and over the credential directories of your real home
(``HIDDEN_DIRS``), and ``/dev/null`` bound over its credential files (``HIDDEN_FILES``): the names of
the bundle's deny list.  Mounts are made private first, so nothing of this reaches the machine's other
processes; an unprivileged smoke drops back to your own uid (a nested user namespace) before it execs
the command, so it runs as you, as it did.  Where no namespace can be made, ``prefix`` says why and the
command runs with ``HOME`` set only (docs/security.md).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

HIDDEN_DIRS = (".ssh", ".aws", ".config/gcloud", ".azure", ".gnupg", ".kube", ".docker", ".huggingface",
               ".config/gh", ".password-store")
HIDDEN_FILES = (".netrc", "_netrc", ".git-credentials", ".pypirc", ".npmrc", ".pgpass", ".my.cnf",
                ".cache/huggingface/token", ".cache/huggingface/stored_tokens",  # its model cache stays
                ".bash_history", ".zsh_history", ".python_history")

# Run by the interpreter that runs the command, inside the new mount namespace (stdlib only, Python 3.8).
# argv: uid and gid to become again (-1: stay), the root to keep, directories to hide, files to hide (JSON
# lists), then the command's argv.
JAIL = r"""
import ctypes, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
def mount(src, dst, fstype, flags, data):
    if libc.mount(src and os.fsencode(src), os.fsencode(dst), fstype and fstype.encode(), flags,
                  data and data.encode()) != 0:
        sys.exit("gpuq: cannot mount over %s: %s" % (dst, os.strerror(ctypes.get_errno())))
uid, gid, keep = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
mount(None, "/", None, MS_REC | MS_PRIVATE, None)
fd = os.open(keep, os.O_RDONLY | os.O_DIRECTORY)
for d in json.loads(sys.argv[4]):
    if os.path.isdir(d):
        mount("tmpfs", d, "tmpfs", 0, "mode=0700,size=1m")
for f in json.loads(sys.argv[5]):
    if os.path.isfile(f):
        mount("/dev/null", f, None, MS_BIND, None)
if not os.path.isdir(keep):
    os.makedirs(keep, 0o700)
    mount("/proc/self/fd/%d" % fd, keep, None, MS_BIND | MS_REC, None)
os.close(fd)
if uid >= 0:
    if libc.unshare(0x10000000) != 0:
        sys.exit("gpuq: cannot drop back to uid %d: %s" % (uid, os.strerror(ctypes.get_errno())))
    for name, text in (("setgroups", "deny"), ("uid_map", "%d 0 1" % uid), ("gid_map", "%d 0 1" % gid)):
        with open("/proc/self/" + name, "w") as out:
            out.write(text)
os.chdir(keep)
os.execvp(sys.argv[6], sys.argv[6:])
"""


@dataclass(frozen=True)
class Jail:
    """How a command under ``root`` is started: the argv before its own, its environment, and "" or the
    one line saying why nothing is hidden but ``HOME``."""

    prefix: list[str]
    env: dict[str, str]
    why_not: str = ""


def hidden_paths(gpuq_home: Path, home: str) -> tuple[list[str], list[str]]:
    """(directories, files) to hide: ``$GPUQ_HOME`` and the credential paths of the real ``home``."""
    dirs = [str(gpuq_home.resolve())]
    if home:
        dirs += [os.path.join(home, d) for d in HIDDEN_DIRS]
    files = [os.path.join(home, f) for f in HIDDEN_FILES] if home else []
    return dirs, files


def prefix(python: str, root: str, gpuq_home: Path, env: dict[str, str]) -> Jail:
    """The jail of a command run under ``root`` (inside ``gpuq_home``) with ``env`` (LocalHost's); probed
    once with ``true``, so a machine that refuses namespaces is said, not a failed smoke."""
    dirs, files = hidden_paths(gpuq_home, env.get("HOME", ""))
    jailed = {**env, "HOME": root}
    unshare = shutil.which("unshare", path=env.get("PATH"))
    if unshare is None:
        return Jail([], jailed, "unshare not found")
    if os.geteuid() == 0:
        ns, ids = [unshare, "--mount"], ["-1", "-1"]
    else:
        ns, ids = [unshare, "--user", "--map-root-user", "--mount"], [str(os.getuid()), str(os.getgid())]
    argv = [*ns, "--", python, "-I", "-c", JAIL, *ids, root, json.dumps(dirs), json.dumps(files)]
    try:
        probe = subprocess.run([*argv, "true"], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                               env=jailed, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError) as e:
        return Jail([], jailed, f"unshare failed: {e}")
    if probe.returncode != 0:
        said = " ".join(probe.stderr.split())[-200:]
        return Jail([], jailed, f"{' '.join(ns[1:])} failed" + (f": {said}" if said else ""))
    return Jail(argv, jailed)
