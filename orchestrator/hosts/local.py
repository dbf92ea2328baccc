"""LocalHost: this machine, through subprocess (the embedded default host).

Commands get a fixed minimal environment (``command_env``), never the controller's own: on a Slurm
login node (``--slurm local``) it would otherwise reach sbatch and be stored with every job, keys and
tokens included (docs/security.md).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from orchestrator.core.errors import HostError, HostUnreachable
from orchestrator.core.specs import CommandResult
from orchestrator.hosts.base import Digest, Host, Progress, too_big

# what a command on this machine inherits from the controller: enough to find programs (PATH), name
# the user and their files (HOME, USER, LOGNAME, TMPDIR), speak their locale (LANG, LC_*, TZ) and reach
# a site's Slurm (SLURM_CONF); the agent gets everything else it needs as arguments (--root, specs)
INHERITED = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "TMPDIR", "TZ", "SLURM_CONF")
INHERITED_PREFIXES = ("LC_",)
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"


def command_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of every command LocalHost runs: ``INHERITED`` and ``LC_*`` from ``environ``."""
    environ = os.environ if environ is None else environ
    env = {k: v for k, v in environ.items() if k in INHERITED or k.startswith(INHERITED_PREFIXES)}
    env.setdefault("PATH", DEFAULT_PATH)
    return env


def gpu_count(timeout: float = 15.0) -> int:
    """How many GPUs this machine's ``nvidia-smi`` lists (0 without one): the slots its agent will
    find (the agent's ``detect_slots`` takes GPUs over CPU slots), known before it has ever run."""
    env = command_env()
    exe = shutil.which("nvidia-smi", path=env["PATH"])
    if exe is None:
        return 0
    try:
        out = subprocess.run([exe, "--query-gpu=index", "--format=csv,noheader"], stdin=subprocess.DEVNULL,
                             capture_output=True, text=True, timeout=timeout, env=env, check=False)
    except (OSError, subprocess.SubprocessError):
        return 0
    if out.returncode != 0:
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.strip().isdigit())


def gpus(timeout: float = 15.0) -> list[tuple[str, float | None]]:
    """(model, memory.total MiB or None) of each GPU this machine's ``nvidia-smi`` lists ([] without one)."""
    env = command_env()
    exe = shutil.which("nvidia-smi", path=env["PATH"])
    if exe is None:
        return []
    try:
        out = subprocess.run([exe, "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"],
                             stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout, env=env,
                             check=False)
    except (OSError, subprocess.SubprocessError):
        return []
    if out.returncode != 0:
        return []
    found: list[tuple[str, float | None]] = []
    for line in out.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if parts and parts[0].isdigit():
            mib = parts[2] if len(parts) > 2 else ""
            memory = float(mib) if mib.replace(".", "", 1).isdigit() else None
            found.append((parts[1] if len(parts) > 1 else "", memory))
    return found


class LocalHost(Host):
    """Runs commands on the controller's own machine."""

    def __init__(self, root: Path, *, name: str = "local", python: str = "") -> None:
        self.name = name
        self.root = str(root)
        self.python = python or sys.executable

    def run(self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float = 60.0) -> CommandResult:
        started = time.monotonic()
        env = command_env()
        try:
            proc = subprocess.run(
                list(argv),
                input=stdin if stdin is not None else b"",
                capture_output=True,
                timeout=timeout,
                env=env,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise HostUnreachable(self.name, f"{argv[0]} did not finish within {timeout:.0f} s") from exc
        except OSError as exc:
            raise HostUnreachable(self.name, f"cannot run {argv[0]}: {exc.strerror}") from exc
        return CommandResult(
            host=self.name,
            argv=tuple(argv),
            exit_code=proc.returncode,
            stdout=proc.stdout.decode("utf-8", "replace"),
            stderr=proc.stderr.decode("utf-8", "replace"),
            duration_s=time.monotonic() - started,
        )

    def put(self, local: Path, remote: str, *, progress: Progress | None = None) -> None:
        target = Path(remote)
        tmp = target.with_name(f".{target.name}.tmp.{os.getpid()}")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(local, tmp)
            os.replace(tmp, target)
            if progress is not None:
                progress(target.stat().st_size)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise HostError(self.name, f"cannot write {remote}: {exc.strerror}") from exc

    def get(self, remote: str, local: Path, *, offset: int = 0, size: int | None = None,
            progress: Progress | None = None, digest: Digest | None = None) -> None:
        try:
            local.parent.mkdir(parents=True, exist_ok=True)
            with open(remote, "rb") as src:
                actual = os.fstat(src.fileno()).st_size
                if size is not None and actual > size:
                    raise too_big(self.name, remote, actual, size)
                with open(local, "r+b" if offset and local.exists() else "wb") as dst:
                    dst.truncate(offset)
                    dst.seek(offset)
                    src.seek(offset)
                    done = offset
                    while block := src.read(1 << 20 if size is None else min(1 << 20, size - done)):
                        dst.write(block)
                        if digest is not None:
                            digest.update(block)
                        done += len(block)
                        if progress is not None:
                            progress(done)
        except OSError as exc:
            raise HostError(self.name, f"cannot read {remote}: {exc.strerror}") from exc
