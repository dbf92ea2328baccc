#!/usr/bin/env python3
"""Bytes against the wire: gpuq's push and pull of one large file against rsync and ``ssh cat`` in the same run.

Starts one namespace host (tests/support/testhosts: a real sshd; needs root), registers it as a user would,
then in alternating rounds (medians printed):

- push: ``SSHHost.put`` (the system ssh path, and paramiko's for reference) against ``rsync`` and
  ``ssh host 'cat > file'`` of the same file, with the same ssh options gpuq uses;
- pull: ``transfer.pull_jobs`` of a finished job holding the file (the host agent's manifest hashes it,
  the copy is hashed as it is written, then sealed and recorded: a real, verified pull) against
  ``rsync`` and ``ssh host cat`` of the same file into a fresh local path;
- no-op pull: ``gpuq pull --sweep`` (the CLI in a process of its own) of the sweep once verified.

    sudo python scripts/bench_transfer.py --mb 300 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SWEEP = "qbenchwire"


def _timed(what: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    what()
    return time.perf_counter() - t0


def _ssh_argv(host: Any) -> list[str]:
    from orchestrator.hosts.sshsystem import system_ssh

    argv = system_ssh(host.endpoint, host.options.known_hosts, connect_timeout_s=10)
    if argv is None:
        raise SystemExit("bench_transfer: the system ssh client cannot be used for the host (see hosts/sshsystem.py)")
    return argv


def _sh(argv: list[str], **kw: Any) -> None:
    subprocess.run(argv, check=True, **kw)


def _add_job(ledger: Any, root: Path, host: str, big: Path, n: int) -> Any:
    from orchestrator.core.specs import JobSpec
    from orchestrator.core.states import AttemptState, JobState
    from tests.support.jobtree import SHA, finished_job

    spec = JobSpec(name=f"big{n}", config="c.yaml", task="classify", config_sha256="0" * 64, line=n + 1)
    (row,) = ledger.add_sweep(sweep_id=f"{SWEEP}{n}", queue_path="q.txt", workdir="/w", queue_text="", jobs=[spec],
                              default_retries=1)
    ledger.start_attempt(row.id, host=host, bundle_sha=SHA)
    ledger.transition(row.id, AttemptState.RUNNING, attempt=1)
    ledger.transition(row.id, JobState.RUNNING)
    ledger.transition(row.id, AttemptState.EXITED, attempt=1)
    ledger.transition(row.id, JobState.SUCCEEDED)
    jdir = finished_job(root, row.id, queue_id=f"{SWEEP}{n}")
    os.link(big, jdir / "result" / "big.bin")  # the same bytes in every job, written once
    return ledger.job(row.id)


def _hosts(ctx: Any) -> tuple[Any, Any]:
    """The registered host as gpuq makes it, and the same host with the system ssh path off (paramiko only)."""
    from dataclasses import replace

    from orchestrator.context import host_for
    from orchestrator.hosts.ssh import SSHHost

    host = host_for(ctx, ctx.ledger.host("bench0"))
    assert isinstance(host, SSHHost)
    plain = SSHHost("bench0", host.endpoint, root=host.root, python=host.python,
                    options=replace(host.options, system_ssh=False))
    return host, plain


def _cat_and_hash(ssh: list[str], remote: str, local: Path) -> None:
    """The floor of a verified pull done by hand: the host hashes the file, then ``ssh cat`` hashed as written."""
    import hashlib

    _sh([*ssh, f"sha256sum {remote}"], stdout=subprocess.DEVNULL)
    h = hashlib.sha256()
    with subprocess.Popen([*ssh, f"cat {remote}"], stdout=subprocess.PIPE) as proc, open(local, "wb") as dst:
        assert proc.stdout is not None
        while block := proc.stdout.read(1 << 20):
            dst.write(block)
            h.update(block)


def _rounds(args: argparse.Namespace, tmp: Path, ctx: Any, farm: Any) -> tuple[dict[str, list[float]], str]:
    from orchestrator.agent import client
    from orchestrator.transfer import pull_jobs
    from tests.support.jobtree import SHA, install_agent

    host, plain = _hosts(ctx)
    ssh = _ssh_argv(host)
    rsh = " ".join(shlex.quote(a) for a in ssh[:-2])
    target = f"{host.endpoint.user}@{ssh[-1]}" if host.endpoint.user else ssh[-1]
    local_root = farm.hosts[0].root / Path(host.root).relative_to("/root")
    install_agent(local_root)
    src = tmp / "big.bin"
    with open(src, "wb") as f:
        for _ in range(args.mb):
            f.write(os.urandom(1 << 20))
    on_host = local_root / "big.bin"
    shutil.copyfile(src, on_host)
    remote_big, remote_push = f"{host.root}/big.bin", f"{host.root}/pushed.bin"
    results = Path(os.environ["GPUQ_HOME"]) / "results"
    times: dict[str, list[float]] = {k: [] for k in ("push gpuq", "push rsync", "push ssh cat", "push paramiko",
                                                     "pull gpuq", "pull rsync", "pull ssh cat+sha256")}
    sweep, back = "", tmp / "back.bin"
    for n in range(args.rounds):
        times["push gpuq"].append(_timed(lambda: host.put(src, remote_push)))
        times["push rsync"].append(_timed(lambda: _sh(["rsync", "-W", "-e", rsh, str(src), f"{target}:{remote_push}"])))
        with open(src, "rb") as stdin:
            times["push ssh cat"].append(_timed(lambda: _sh([*ssh, f"cat > {remote_push}"], stdin=stdin)))
        if n == 0 or args.paramiko:
            times["push paramiko"].append(_timed(lambda: plain.put(src, remote_push)))
        job = _add_job(ctx.ledger, local_root, "bench0", on_host, n)
        sweep = job.sweep_id
        out: list[Any] = []

        def pull(job: Any = job, out: list[Any] = out) -> None:
            out.extend(pull_jobs(ctx.ledger, host, client.command(host, SHA), [job], results,
                                 results.parent / "quarantine"))

        times["pull gpuq"].append(_timed(pull))
        if not out[0].verified:
            raise SystemExit(f"bench_transfer: the pull did not verify: {out[0].reason}")
        times["pull rsync"].append(_timed(lambda: _sh(["rsync", "-W", "-e", rsh, f"{target}:{remote_big}", str(back)])))
        back.unlink()
        times["pull ssh cat+sha256"].append(_timed(lambda: _cat_and_hash(ssh, remote_big, back)))
        back.unlink()
    host.close()
    plain.close()
    return times, sweep


def _noop_pulls(sweep: str, rounds: int) -> list[float]:
    """``gpuq pull --sweep`` of a verified sweep, the CLI in a process of its own (bytecode cached)."""
    argv = [sys.executable, "-m", "orchestrator", "pull", "--sweep", sweep]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)  # warm: bytecode and page cache
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        done = subprocess.run(argv, env=env, capture_output=True, text=True)
        times.append(time.perf_counter() - t0)
        if done.returncode != 0 or "already verified" not in done.stdout:
            raise SystemExit(f"bench_transfer: the no-op pull did not find the sweep verified:\n{done.stdout}"
                             f"{done.stderr}")
    return times


def _report(args: argparse.Namespace, times: dict[str, list[float]], noop: list[float]) -> None:
    med = {k: statistics.median(v) for k, v in times.items() if v}
    print(f"bench_transfer: one {args.mb} MB file, {args.rounds} rounds, medians (one namespace host, same run)")
    for k, v in med.items():
        print(f"  {k:<22} {v:7.2f} s   {args.mb / v:7.0f} MB/s   [{', '.join(f'{t:.2f}' for t in times[k])}]")
    print(f"  push: gpuq / rsync = {med['push gpuq'] / med['push rsync']:.2f}x   "
          f"(paramiko / rsync = {med['push paramiko'] / med['push rsync']:.2f}x)")
    print(f"  pull: gpuq / rsync = {med['pull gpuq'] / med['pull rsync']:.2f}x   "
          f"(verified pull floor, ssh cat + host sha256 / rsync = "
          f"{med['pull ssh cat+sha256'] / med['pull rsync']:.2f}x)")
    print(f"  no-op pull of a verified sweep (CLI): {statistics.median(noop):.2f} s "
          f"[{', '.join(f'{t:.2f}' for t in noop)}]")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--mb", type=int, default=300, help="size of the file (MB)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (its GPUQ_HOME holds the sweeps)")
    parser.add_argument("--paramiko", action="store_true", help="time paramiko's push every round, not once")
    args = parser.parse_args()
    from tests.support.testhosts import HostFarm, requirements_problem

    problem = requirements_problem() or (None if shutil.which("rsync") else "rsync is not installed")
    if problem:
        print(f"bench_transfer: {problem}", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="gpuq-bench-transfer-"))
    os.environ["GPUQ_HOME"] = str(tmp / "home")
    farm = HostFarm(tmp / "farm", 1, 1)
    ctx = None
    try:
        farm.start()
        from orchestrator import api

        ctx = api.open_context()
        api.hosts_add(ctx, "bench0", f"root@{farm.hosts[0].address}", key=str(farm.client_key), profile="rehearsal",
                      trust_new_host_key=True)
        times, sweep = _rounds(args, tmp, ctx, farm)
        ctx.close()
        ctx = None
        noop = _noop_pulls(sweep, args.rounds)
    finally:
        if ctx is not None:
            ctx.close()
        farm.teardown()
        if args.keep:
            print(f"bench_transfer: kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    _report(args, times, noop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
