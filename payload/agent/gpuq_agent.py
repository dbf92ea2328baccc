#!/usr/bin/env python3
"""gpuq host agent: one per root, stdlib only, Python >= 3.8.

Commands (``python gpuq_agent.py --root ROOT <command>``):

  serve [--detach] [--idle-exit-s S] [--cpu-slots N] [--poll-s S] [--lease-timeout-s S]
                          the long-lived agent: claims inbox specs, packs them onto slots, runs one
                          wrapper per attempt, adopts live groups after a restart, exits when idle
                          (a rented host with a lease stays, and stops its own billing: gpuq_selfstop.py)
  wrap JOB_ID ATTEMPT     internal: the per-attempt wrapper (docs/host-protocol.md)
  status --json [--scan JOB:N:LOG_OFF:METRICS_OFF ...] [--kernel-since CURSOR]
                          read-only probe, one "gpuq.status/1" document on stdout
  health [--gpus 0,1] [--samples 5] [--python PY] [--min-free-gb X] [--kernel-since CURSOR]
                          GPU preflight, one "gpuq.health/1" verdict; exit 0 pass/warn, 2 fail
  reap [--force] [--min-age-s 120] [--resample-s 60] [--include-other-users]
                          VRAM zombies: holders of /dev/nvidia* outside nvidia-smi and our trees,
                          one "gpuq.reap/1" document; dry run unless --force
  cancel JOB_ID...        withdraw queued jobs, then kill running ones (identity-checked)
  kill JOB_ID ATTEMPT     kill one running attempt (a stalled one) without cancelling the job
  decide-retry JOB_ID:N...  before the controller settles ended attempts: who starts attempt n+1,
                          the host's agent (it already did) or the controller (gpuq_retry.py)
  stacks JOB_ID ATTEMPT   save where each process of a running attempt waits (before a stall kill)
                          to attempts/<n>/stacks.txt: py-spy dump, else /proc (gpuq_stacks.py)
  enqueue [--serve ...]   write job specs (JSON list on stdin) into the inbox, idempotently;
                          with --serve, then make sure a detached agent runs (gpuq_inbox.py)
  collect JOB_ID...       summaries and sha256-hashed result files of finished jobs
  manifest JOB_ID...      build jobs/<id>/MANIFEST.json (path, bytes, sha256) of jobs that exited 0
  snapshot JOB_ID         hard-link the checkpoint LATEST names to ckpt/.ship.pt, print the pointer
  stop-agent [--force]    stop this root's agent now; refused while it has work unless --force
  version                 print the protocol version

A root with slurm.json is on a Slurm login node (gpuq_slurm.py): ``enqueue --serve`` submits each
attempt with sbatch instead of starting an agent, ``status`` asks squeue once, ``cancel`` and
``kill`` scancel.

The contract (layout, documents, exit codes, environment) lives in gpuq_protocol.py, a copy of
orchestrator/core/protocol.py.  Killing is always by recorded process group after identity proof.

This file only parses the command line; each command lives in a module of a package by role
(docs/architecture.md): gpuq_serving/ (serve: gpuq_serve.py, gpuq_detach.py, gpuq_stall.py),
gpuq_attempt/ (wrap: gpuq_wrap.py and what it runs around the trainer), gpuq_verbs/ (status, health,
reap, cancel, kill, stacks, stop-agent, manifest), gpuq_records/gpuq_inbox.py (enqueue, collect),
gpuq_watch/gpuq_retry.py (host retries, decide-retry) and gpuq_slurmmode/ (Slurm mode), on top of
gpuq_base/ (the contract, files, processes, host facts).  Run by path, this file puts its own
directory first on sys.path, so the packages import by name; a trainer never sees them.
Whatever the agent creates is private: umask 077 for every command, and serve/enqueue close the root
itself to 0700 (docs/security.md).
"""

from __future__ import annotations

import sys
from typing import Callable

sys.dont_write_bytecode = True  # bundles are read-only; `status` must never write (before any agent import)

import argparse  # noqa: E402
import contextlib  # noqa: E402
import io  # noqa: E402
import os  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the packages beside it, when run by path
from gpuq_base import gpuq_protocol as P  # noqa: E402
from gpuq_base.gpuq_files import PRIVATE_UMASK, Layout, make_private  # noqa: E402

# Each verb imports its own module when it runs, never the others: the agent runs from a read-only
# bundle without bytecode files, so every module it imports is compiled from source on every call, and
# `status` runs on every host at every tick (it needs about a third of the agent's code).


def _verb(argv: list[str]) -> str | None:
    """The command word of ``argv`` (the first word that is not ``--root`` or its value)."""
    words = iter(argv)
    for word in words:
        if word == "--root":
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


def main(argv: list[str] | None = None) -> int:
    ap = parser(_verb(sys.argv[1:] if argv is None else argv))
    try:
        args = ap.parse_args(argv)
    except SystemExit as e:
        return P.AGENT_EXIT_USAGE if e.code else 0
    lay = Layout(args.root)
    os.umask(PRIVATE_UMASK)  # the agent's every directory 0700, every file 0600 (docs/security.md)
    if args.cmd in ("serve", "enqueue"):
        make_private(lay.root)
    if args.cmd not in ("serve", "wrap"):  # every other verb is a gpuq command: the lease's heartbeat
        from gpuq_serving.gpuq_selfstop import touch_contact
        touch_contact(lay.root)
    if args.cmd in FRAMED:
        return framed(lambda: run_document_verb(lay, args))
    if args.cmd == "version":
        print(P.PROTOCOL_VERSION)
        return 0
    if args.cmd in ("serve", "wrap", "cancel", "kill", "stacks", "enqueue"):
        return run_verb(lay, args)
    ap.print_usage(sys.stderr)
    return P.AGENT_EXIT_USAGE


def parser(verb: str | None) -> argparse.ArgumentParser:
    """The agent's command line, one sub-parser per verb; health's and reap's options are added only
    when ``verb`` is theirs (their modules are imported for them)."""
    ap = argparse.ArgumentParser(prog="gpuq_agent.py", description="gpuq host agent")
    ap.add_argument("--root", required=True, help="GPUQ_ROOT: the host's data dir")
    sub = ap.add_subparsers(dest="cmd")
    _add_serving_verbs(sub)
    _add_probe_verbs(sub, verb)
    _add_attempt_verbs(sub)
    _add_record_verbs(sub)
    return ap


def _add_serving_verbs(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``serve`` (its options) and ``wrap``: the verbs that run jobs."""
    sp = sub.add_parser("serve", help="run the host agent (one per root)")
    sp.add_argument("--idle-exit-s", type=float, default=600.0)
    sp.add_argument("--lease-timeout-s", type=float, default=None)
    sp.add_argument("--cpu-slots", type=int, default=None)
    sp.add_argument("--poll-s", type=float, default=0.1)
    sp.add_argument("--detach", action="store_true", help="double-fork, setsid, log to agent.out")
    sp.add_argument("--train-device", choices=("auto", "cpu"), default="auto",
                    help="cpu: train on CPU even on GPU slots (rehearsal hosts with an emulated nvidia-smi)")
    wp = sub.add_parser("wrap", help="internal: run one attempt")
    wp.add_argument("job_id")
    wp.add_argument("attempt")


def _add_probe_verbs(sub: argparse._SubParsersAction[argparse.ArgumentParser], verb: str | None) -> None:
    """``status``, ``health`` and ``reap``: the read-only probes (health's and reap's options only when
    ``verb`` is one of them)."""
    st = sub.add_parser("status", help="read-only probe")
    st.add_argument("--json", action="store_true")
    st.add_argument("--results-for", nargs="*", default=(), metavar="JOB",
                    help="also carry the collected results of these jobs when they exited 0")
    st.add_argument("--curves-for", nargs="*", default=(), metavar="JOB",
                    help="also carry the learning curves so far of these jobs while they run (early stopping)")
    st.add_argument("--kernel-since", default=None, metavar="CURSOR",
                    help="kernel.xids: only Xid lines after this cursor (TS or BOOT_ID:TS)")
    st.add_argument("--scan", nargs="*", default=(), metavar="JOB:ATTEMPT:LOG_OFF:METRICS_OFF",
                    help="scan these attempts' new log and metrics bytes for crash signatures and NaN")
    hp = sub.add_parser("health", help="GPU preflight")
    rp = sub.add_parser("reap", help="find (--force: kill) VRAM zombies")
    if verb == "health":
        from gpuq_verbs import gpuq_health
        gpuq_health.add_arguments(hp)
    elif verb == "reap":
        from gpuq_verbs import gpuq_reap
        gpuq_reap.add_arguments(rp)


def _add_attempt_verbs(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``cancel``, ``kill``, ``stacks``, ``withdraw``, ``decide-retry`` and ``version``: the verbs that act
    on given jobs or attempts (and the protocol's version)."""
    cp = sub.add_parser("cancel", help="withdraw or kill a job")
    cp.add_argument("job_ids", nargs="+")
    kp = sub.add_parser("kill", help="kill one attempt's process group (identity-checked), no cancel")
    kp.add_argument("job_id")
    kp.add_argument("attempt", type=int)
    stp = sub.add_parser("stacks", help="save where each process of a running attempt waits, to stacks.txt")
    stp.add_argument("job_id")
    stp.add_argument("attempt", type=int)
    wd = sub.add_parser("withdraw", help="take unstarted jobs back out of the inbox (work stealing)")
    wd.add_argument("job_ids", nargs="+")
    dr = sub.add_parser("decide-retry", help="the controller settles these ended attempts unless the host retried them")
    dr.add_argument("items", nargs="+", metavar="JOB_ID:ATTEMPT")
    sub.add_parser("version", help="print the protocol version")


def _add_record_verbs(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``enqueue`` (with serve's options), ``collect``, ``snapshot``, ``manifest`` and ``stop-agent``: the
    verbs that write or read a root's records."""
    ep = sub.add_parser("enqueue", help="write job specs (JSON list on stdin) into the inbox, idempotently")
    ep.add_argument("--serve", action="store_true", help="then make sure a detached agent runs")
    ep.add_argument("--idle-exit-s", type=float, default=600.0)
    ep.add_argument("--lease-timeout-s", type=float, default=None, help="rented: stop billing after S silent")
    ep.add_argument("--cpu-slots", type=int, default=None)
    ep.add_argument("--poll-s", type=float, default=0.1)
    ep.add_argument("--train-device", choices=("auto", "cpu"), default="auto",
                    help="cpu: train on CPU even on GPU slots (rehearsal hosts with an emulated nvidia-smi)")
    co = sub.add_parser("collect", help="summaries and hashed result files of finished jobs")
    co.add_argument("job_ids", nargs="+")
    sn = sub.add_parser("snapshot", help="pin a job's current checkpoint as ckpt/.ship.pt for copying")
    sn.add_argument("job_id")
    mp = sub.add_parser("manifest", help="build MANIFEST.json of finished jobs for `gpuq pull`")
    mp.add_argument("job_ids", nargs="+")
    sa = sub.add_parser("stop-agent", help="stop this root's idle agent now (--force: even with work)")
    sa.add_argument("--force", action="store_true")


def run_verb(lay: Layout, args: argparse.Namespace) -> int:
    if args.cmd == "serve":
        from gpuq_serving.gpuq_serve import cmd_serve
        return cmd_serve(lay, args)
    if args.cmd == "wrap":
        from gpuq_attempt.gpuq_wrap import cmd_wrap
        return cmd_wrap(lay, args.job_id, args.attempt)
    if args.cmd == "cancel":
        from gpuq_verbs.gpuq_cancel import cmd_cancel
        return cmd_cancel(lay, args.job_ids)
    if args.cmd == "kill":
        from gpuq_verbs.gpuq_cancel import cmd_kill
        return cmd_kill(lay, args.job_id, args.attempt)
    if args.cmd == "stacks":
        from gpuq_verbs.gpuq_stacks import cmd_stacks
        return cmd_stacks(lay, args.job_id, args.attempt)
    return enqueue(lay, args)


def enqueue(lay: Layout, args: argparse.Namespace) -> int:
    from gpuq_base.gpuq_hostfacts import write_cpu_slots
    from gpuq_records import gpuq_inbox
    from gpuq_slurmmode import gpuq_slurm
    if args.serve and args.cpu_slots:  # before the specs: a running agent claims them on these slots
        write_cpu_slots(lay.root, args.cpu_slots)
    code = framed(lambda: gpuq_inbox.cmd_enqueue(lay.root, sys.stdin))
    if code != 0 or not args.serve:
        return code
    if gpuq_slurm.config(lay) is not None:  # a Slurm login node: sbatch now, no agent stays behind
        from gpuq_slurmmode import gpuq_slurm_submit
        return gpuq_slurm_submit.cmd_submit(lay, os.path.abspath(__file__))
    from gpuq_serving.gpuq_serve import cmd_serve
    args.detach = True
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries only the verdict JSON
        return cmd_serve(lay, args)


FRAMED = ("status", "health", "reap", "withdraw", "decide-retry", "collect", "snapshot", "manifest", "stop-agent")


def run_document_verb(lay: Layout, args: argparse.Namespace) -> int:
    if args.cmd == "status":
        from gpuq_verbs.gpuq_status import cmd_status
        return cmd_status(lay, args)
    if args.cmd == "health":
        from gpuq_verbs import gpuq_health
        return gpuq_health.cmd_health(lay, args)
    if args.cmd == "reap":
        from gpuq_verbs import gpuq_reap
        return gpuq_reap.cmd_reap(lay, args)
    if args.cmd == "withdraw":
        from gpuq_verbs.gpuq_cancel import cmd_withdraw
        return cmd_withdraw(lay, args.job_ids)
    if args.cmd == "decide-retry":
        from gpuq_watch.gpuq_retry import cmd_decide_retry
        return cmd_decide_retry(lay, args.items)
    if args.cmd == "collect":
        from gpuq_records import gpuq_inbox
        return gpuq_inbox.cmd_collect(lay.root, args.job_ids)
    if args.cmd == "stop-agent":
        from gpuq_verbs.gpuq_stopagent import cmd_stop_agent
        return cmd_stop_agent(lay, args.force)
    from gpuq_verbs import gpuq_manifest
    if args.cmd == "snapshot":
        return gpuq_manifest.cmd_snapshot(lay.root, args.job_id)
    return gpuq_manifest.cmd_manifest(lay.root, args.job_ids)


def framed(verb: Callable[[], int]) -> int:
    """Run a document verb with its stdout between the protocol's marker lines: whatever the login
    shell prints before or after (~/.bashrc echoes, conda banners) stays outside the frame."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = verb()
    text = buf.getvalue()
    if text:
        sys.stdout.write("\n" + P.DOCUMENT_BEGIN + "\n" + text + ("" if text.endswith("\n") else "\n")
                         + P.DOCUMENT_END + "\n")
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
