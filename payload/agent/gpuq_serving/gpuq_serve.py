"""``serve``: the long-lived host agent, one per root.

It claims inbox specs, starts what admission lets start (gpuq_admission.py: oldest first, smaller jobs
backfill, packed onto slots: GPUs, or CPU slots on a GPU-less host), one wrapper per attempt in its
own process group (gpuq_serve_start.py), reaps them, kills whatever an ended attempt left behind
(gpuq_serve_ends.py), acts on cancel files and heals stalls (gpuq_serve_watch.py), adopts live groups
after a restart (gpuq_serve_adopt.py) and exits when idle; the queue banners of agent.log are
gpuq_serve_queues.py's, its signal handlers and the wait between rounds gpuq_serve_wake.py's.  One
agent per root (gpuq_serve_lock.py); with ``--detach`` it runs as a daemon (gpuq_detach.py).

stdlib only, Python >= 3.8.
"""

# ruff: noqa: UP031  (%-formatting on purpose: one style for every Python >= 3.8 the agent meets)
from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import socket
import time
from typing import Any, Callable, Sequence

from gpuq_base import gpuq_protocol as P
from gpuq_watch import gpuq_retry
from gpuq_base import gpuq_secrets
from gpuq_slurmmode import gpuq_slurm
from gpuq_serving import gpuq_stall
from gpuq_serving.gpuq_admission import FAIL, START, Candidate, Decision, Parsed, admit, candidate
from gpuq_serving.gpuq_detach import serve_detached
from gpuq_base.gpuq_files import (
    Layout,
    atomic_write_json,
    exit_record,
    list_specs,
    mkdirs,
    read_json,
    utc,
)
from gpuq_base.gpuq_jobspec import JobSpec, attempt_of, spec_or_reason
from gpuq_base.gpuq_hostfacts import detect_slots, reslot, write_cpu_slots
from gpuq_serving.gpuq_inboxview import InboxView
from gpuq_base.gpuq_procs import live_attempt
from gpuq_serving.gpuq_serve_adopt import found_claims
from gpuq_serving.gpuq_serve_ends import end_leftovers, write_vanished
from gpuq_serving.gpuq_serve_lock import AgentLock
from gpuq_serving.gpuq_serve_queues import QueueBanners
from gpuq_serving.gpuq_serve_start import StartFailed, free_port, start_wrapper
from gpuq_serving.gpuq_serve_wake import Wakeup
from gpuq_serving.gpuq_serve_watch import Running, handle_cancels, watch_adopted, watch_stalls
from gpuq_serving.gpuq_selfstop import SelfStop, write_lease


class Agent:
    def __init__(self, lay: Layout, args: argparse.Namespace, notify_fd: int | None = None) -> None:
        self.lay = lay
        self.idle_exit_s = float(args.idle_exit_s)
        self.poll_s = float(args.poll_s)
        self.cpu_slots = args.cpu_slots
        self.train_device = getattr(args, "train_device", "auto")
        self.lock = AgentLock(lay, notify_fd)
        self.slots: dict[str, Any] = {}
        self.busy: dict[int, str] = {}  # slot id -> job id
        self.running: dict[str, Running] = {}
        self.by_pid: dict[int, str] = {}
        self.pending: list[str] = []  # claimed, never launched (found at start-up)
        self.refused: dict[str, int] = {}  # job id -> attempt waiting for an earlier one to end (logged once)
        self.stop = False
        self.host = socket.gethostname()
        self.queues = QueueBanners(lay, self.host)
        self.wake = Wakeup()
        self.inbox = InboxView(lay.p(P.INBOX_DIR))
        self.last_round: tuple[Any, ...] | None = None  # what the last claim round decided from
        self.last_waiting = 0
        self.lease_s: float | None = getattr(args, "lease_timeout_s", None)
        self.selfstop = SelfStop(lay.root, self.log)  # the lease: billing ends when the controller is gone

    def log(self, msg: str) -> None:
        self.lay.log(f"[{utc()}] {msg}")

    # main
    def serve(self) -> int:
        lay = self.lay
        mkdirs(lay.root, lay.p(P.INBOX_DIR), lay.p(P.CLAIMED_DIR), lay.p(P.WITHDRAWN_DIR),
               lay.p(P.JOBS_DIR), lay.p(P.CACHE_DIR))
        if self.lease_s is not None:  # the controller that rented this host sets its lease (also to a running agent)
            write_lease(lay.root, self.lease_s)
        write_cpu_slots(lay.root, self.cpu_slots)  # and the CPU slots it plans with (a running agent: ``reslot``)
        if not self.lock.take():
            pid = self.lock.holder()
            msg = f"agent already running (pid {pid})"
            print(msg, flush=True)
            self.lock.notify(f"held {pid}")
            return 0
        self.slots = detect_slots(self.cpu_slots)
        self.lock.write_pid(self.slots)
        self.wake.install(self._on_stop)
        self.log("agent %d started on %s: %d %s slots %s, protocol %s" % (
            os.getpid(), self.host, len(self.slots["ids"]), self.slots["kind"], self.slots["ids"],
            P.PROTOCOL_VERSION))
        self.lock.notify("ok %d" % os.getpid())
        self.recover()
        try:
            return self.loop()
        finally:
            self.lock.remove_pid()
            self.lock.release()

    def _on_stop(self, signum: int, frame: Any) -> None:
        self.stop = True

    def recover(self) -> None:
        """Restart safety: adopt live groups, leave dead attempts dead, launch claimed-unlaunched."""
        for c in found_claims(self.lay, self.slots["ids"]):
            job_id, n, rec = c.job_id, c.attempt, c.rec
            if not c.launched or c.spec is None:  # a refused spec is never launched: failed with its reason
                self.pending.append(job_id)
            elif c.alive and rec is not None:
                slots = list(c.slots)
                self.running[job_id] = Running(job_id, n, slots, c.spec, None, rec)
                for s in slots:
                    self.busy[s] = job_id
                self.log("ADOPTED %s a%d pgid %s slots %s" % (job_id, n, rec.get("pgid"), slots))
            else:
                self.log("DEAD %s a%d: launched, group gone, no exit.json (not re-run)" % (job_id, n))
                self.retry(Running(job_id, n, [], c.spec, None, rec))  # a stall kill this agent decided on

    def free_slots(self) -> list[int]:
        return [s for s in self.slots["ids"] if s not in self.busy]

    def loop(self) -> int:
        idle_since: float | None = None
        while not self.stop:
            try:
                self.reap()
                self.slots = reslot(self.lay.root, self.slots, self.log, self.lock.write_pid)  # cpu_slots.json
                watch_adopted(self.lay, list(self.running.values()), self.log, self.finish)
                handle_cancels(self.lay, list(self.running.values()), self.log)
                watch_stalls(self.lay, list(self.running.values()), self.log)
                inbox = self.claim_and_launch()
            except Exception:  # one bad round (disk full, odd file) must not end the agent
                import traceback
                self.log("agent round failed:\n" + traceback.format_exc())
                time.sleep(1.0)
                continue
            self.selfstop.check(inbox + len(self.pending) + len(self.running))
            if inbox or self.pending or self.running or self.selfstop.lease_on():
                idle_since = None
            else:
                now = time.monotonic()
                idle_since = idle_since if idle_since is not None else now
                if now - idle_since >= self.idle_exit_s:
                    if self.idle_exit():
                        return 0
                    idle_since = None
            self.wake.wait(self.poll_s)
        self.log("agent %d stopping on signal; %d groups keep running" % (os.getpid(), len(self.running)))
        return 0

    def idle_exit(self) -> bool:
        """Race-free against a controller adding a job: drop pid + lock, then look again."""
        self.lock.remove_pid()
        self.lock.release()
        if not list_specs(self.lay.p(P.INBOX_DIR)):
            self.log("agent %d idle for %gs: exiting" % (os.getpid(), self.idle_exit_s))
            return True
        if not self.lock.take():
            self.log("agent %d: job arrived during idle exit, another agent took over" % os.getpid())
            return True
        self.lock.write_pid(self.slots)
        return False

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            job_id = self.by_pid.pop(pid, None)
            if job_id is None or job_id not in self.running:
                continue
            r = self.running[job_id]
            if r.pid != pid:
                continue  # not this attempt's wrapper: never write another attempt's exit or free its slots
            vanished = write_vanished(self.lay, job_id, r.attempt, status)
            if vanished is not None:
                self.log("FINISHED %s a%d (exit=%d) %s" % (job_id, r.attempt, vanished[0], vanished[1]))
            # anything the wrapper left behind goes with it (its group, escapees carrying its log path)
            if r.rec and r.rec.get("pgid") == pid:
                end_leftovers(self.lay, job_id, r.attempt, r.rec, self.log)
            self.finish(job_id)

    def finish(self, job_id: str) -> None:
        r = self.running.pop(job_id, None)
        if r is None:
            return
        for s in r.slots:
            if self.busy.get(s) == job_id:
                del self.busy[s]
        self.retry(r)
        self.queues.done_check(r.spec.queue_id, (x.spec for x in self.running.values()))
        self.drop_secrets()

    def retry(self, r: Running) -> None:
        """Attempt n ended: a signal death gpuq did not cause is retried here, now, with resume, when the
        spec allows (gpuq_retry.py): attempt n+1's spec goes into the inbox for this round to launch."""
        try:
            rec = gpuq_retry.retry_after(self.lay, r.job_id, r.spec, r.attempt) \
                or gpuq_stall.follow(self.lay, r.job_id, r.spec, r.attempt)
        except Exception as e:  # an odd spec or file: the controller settles the attempt, the round goes on
            self.log("RETRY %s a%d: not retried here: %s" % (r.job_id, r.attempt, e))
            return
        if rec is not None:
            self.log("RETRY %s a%d -> a%d started by the host: %s (%s)" % (
                r.job_id, r.attempt, rec["attempt"], rec["class"], rec["why"]))

    def drop_secrets(self) -> None:
        """Delete secrets/<queue_id>.json once no job of that queue is queued, claimed or running."""
        lay = self.lay
        gpuq_secrets.drop_unused(lay, lambda j, s: j in self.running or not os.path.exists(
            lay.attempt(j, s.attempt, P.EXIT_FILE)))

    # claiming
    def _fail(self, job_id: str, spec: JobSpec | None, code: int, msg: str) -> None:
        """End a claimed job that never launches (a refused spec: ``spec`` None, its claimed file as it came)."""
        doc = spec.document if spec is not None else read_json(self.lay.p(P.CLAIMED_DIR, job_id + ".json"))
        n = spec.attempt if spec is not None else attempt_of(doc) or 1
        adir = self.lay.attempt(job_id, n)
        mkdirs(adir)
        if isinstance(doc, dict):
            atomic_write_json(self.lay.job(job_id, P.SPEC_FILE), doc)
        atomic_write_json(os.path.join(adir, P.EXIT_FILE), exit_record(job_id, n, code, "setup", msg))
        self.log("FAILED %s a%d (exit=%d): %s" % (job_id, n, code, msg))

    def _claim(self, job_id: str) -> bool:
        try:
            os.rename(self.lay.p(P.INBOX_DIR, job_id + ".json"), self.lay.p(P.CLAIMED_DIR, job_id + ".json"))
        except FileNotFoundError:
            return False  # withdrawn by the controller, or taken by someone else
        self.inbox.taken(job_id)
        return True

    def claim_and_launch(self) -> int:
        """Launch what admission lets start now (gpuq_admission.py): the jobs claimed but never launched
        first, then the inbox oldest first (a smaller job behind one that waits may backfill).  Returns
        how many inbox jobs wait.

        A round decides from the inbox, the busy slots, the running jobs and the pending claims alone:
        when none of them changed since the last round ended, it would decide the same, and is skipped
        (an idle agent with a thousand waiting jobs must not re-read them ten times a second).  The state
        recorded is the inbox this round saw, less what it claimed: a spec renamed in while the round ran
        is new to the next round's listing, never mistaken for one already decided on."""
        self._launch_pending()
        entries = self.inbox.specs()
        if self._round_state() == self.last_round:
            return self.last_waiting
        specs = {job_id: spec for _created, job_id, spec in entries}
        cands = [candidate(job_id, spec) for _created, job_id, spec in entries]
        waiting = self._admit(cands, specs, lambda d: self._take(d, specs[d.job_id]))
        self.last_round, self.last_waiting = self._round_state(), waiting
        return waiting

    def _round_state(self) -> tuple[Any, ...]:
        return (self.inbox.generation, tuple(sorted(self.busy.items())), tuple(sorted(self.running)),
                tuple(self.pending), tuple(self.slots["ids"]))

    def _launch_pending(self) -> None:
        """Claimed but never launched (found at start-up): launched once they fit, failed if they never can
        (a claimed file that is not a sound spec among them, with the parser's reason)."""
        specs: dict[str, Parsed] = {}
        for job_id in list(self.pending):
            doc = read_json(self.lay.p(P.CLAIMED_DIR, job_id + ".json"))
            if doc is None:
                self.pending.remove(job_id)
                continue
            specs[job_id] = spec_or_reason(doc)
        self._admit([candidate(j, spec) for j, spec in specs.items()], specs,
                    lambda d: self._start_pending(d, specs[d.job_id]))

    def _admit(self, cands: list[Candidate], specs: dict[str, Parsed], act: Callable[[Decision], int]) -> int:
        """Act on admission's decisions, in order; returns the sum of what ``act`` returned.

        A job admission would start is looked at first, one at a time and only then, for another
        attempt of it alive here (a host full of waiting jobs reads no attempt directory): one found
        alive waits, and admission is asked again.  A start that took no slots (its spec withdrawn
        meanwhile, refused, failed to start) leaves them free to the jobs after it: asked again too."""
        done = 0
        looked: set[str] = set()
        while cands:
            free = self.free_slots()
            decisions = admit(cands, free, len(self.slots["ids"]), self.slots["kind"])
            unseen = next((d.job_id for d in decisions if d.action == START and d.job_id not in looked), None)
            if unseen is not None:
                looked.add(unseen)
                spec = specs[unseen]  # parsed: admission starts no refused spec
                alive = self.alive_other(unseen, spec.attempt) if isinstance(spec, JobSpec) else None
                cands = [dataclasses.replace(c, alive=alive) if c.job_id == unseen else c for c in cands]
                continue
            for i, d in enumerate(decisions):
                done += act(d)
                if d.action == START:
                    free = [s for s in free if s not in d.slots]
                    if self.free_slots() != free:
                        cands = cands[i + 1:]
                        break
            else:
                return done
        return done

    def _start_pending(self, d: Decision, spec: Parsed) -> int:
        if d.action == FAIL:
            self.pending.remove(d.job_id)
            self._fail(d.job_id, spec if isinstance(spec, JobSpec) else None, P.EXIT_SETUP, d.why)
        elif d.action == START and isinstance(spec, JobSpec):  # admission starts parsed specs only
            self.pending.remove(d.job_id)
            self.launch(d.job_id, spec, d.slots)
        return 0

    def _take(self, d: Decision, spec: Parsed) -> int:
        """Claim and launch one inbox job admission starts, or fail it when it can never run here (a
        spec the parser refused among them, with its reason).  1 when it waits (a smaller job behind it
        may backfill)."""
        job_id = d.job_id
        if d.action == FAIL:
            if self._claim(job_id):
                self._fail(job_id, spec if isinstance(spec, JobSpec) else None, P.EXIT_SETUP, d.why)
            return 0
        if not isinstance(spec, JobSpec):
            return 0  # never so: admission fails every spec the parser refused
        if d.action != START:
            if d.alive is not None and self.refused.get(job_id) != spec.attempt:
                # attempt n+1 waits in the inbox until attempt n has ended
                self.refused[job_id] = spec.attempt
                self.log("WAITING %s a%d: attempt %d of this job is still alive here; never two at once"
                         % (job_id, spec.attempt, d.alive))
            return 1
        if self._claim(job_id):
            self.queues.queue_of[job_id] = spec.queue_id
            self.launch(job_id, spec, d.slots)
        return 0

    def alive_other(self, job_id: str, n: int) -> int | None:
        """Another attempt of ``job_id`` than ``n`` that still lives on this host (ours, adopted, or
        one whose group lives on from an earlier agent), else None."""
        r = self.running.get(job_id)
        if r is not None and r.attempt != n:
            return r.attempt
        return live_attempt(self.lay.root, job_id, other_than=n)

    def launch(self, job_id: str, spec: JobSpec, slots: Sequence[int]) -> None:
        lay = self.lay
        n = spec.attempt
        adir = lay.attempt(job_id, n)
        if os.path.exists(os.path.join(adir, P.LAUNCH_FILE)):
            self.log("REFUSED %s a%d: attempt already launched once; never run twice" % (job_id, n))
            return
        other = self.alive_other(job_id, n)
        if other is not None:
            self.log("REFUSED %s a%d: attempt %d is still alive here; never two at once" % (job_id, n, other))
            return
        mkdirs(adir, lay.job(job_id, P.CKPT_DIR), lay.job(job_id, P.RESULT_DIR))
        atomic_write_json(lay.job(job_id, P.SPEC_FILE), spec.document)
        qid = spec.queue_id
        self.queues.queue_of[job_id] = qid
        if os.path.exists(lay.job(job_id, P.CANCEL_FILE)):
            atomic_write_json(os.path.join(adir, P.EXIT_FILE), exit_record(
                job_id, n, P.EXIT_SIGNAL_BASE + signal.SIGTERM, "setup", "cancelled before launch",
                sig=int(signal.SIGTERM)))
            self.log("CANCELLED %s a%d before launch" % (job_id, n))
            return
        idx, count = self.queues.started(job_id, qid)
        try:
            pid, rec = start_wrapper(lay, job_id, n, spec, {
                "time": utc(time.time()), "slots": list(slots), "kind": self.slots["kind"],
                "device": "cpu" if self.train_device == "cpu" or self.slots["kind"] != "gpu" else "cuda",
                "total_slots": len(self.slots["ids"]), "agent_pid": os.getpid(), "index": idx,
                "count": count, "master_port": free_port(lay, ((r.job_id, r.attempt) for r in self.running.values()))})
        except StartFailed as e:
            self._fail(job_id, spec, P.EXIT_SETUP, str(e))
            return
        self.running[job_id] = Running(job_id, n, list(slots), spec, pid, rec)
        self.by_pid[pid] = job_id
        for s in slots:
            self.busy[s] = job_id


def cmd_serve(lay: Layout, args: argparse.Namespace) -> int:
    if gpuq_slurm.config(lay) is not None:  # a Slurm login node: sbatch runs the attempts, never an agent here
        print("this root is a Slurm login node's (slurm.json): no agent serves it; jobs go to sbatch")
        return 0
    if not args.detach:
        return Agent(lay, args).serve()
    return serve_detached(lay, lambda notify_fd: Agent(lay, args, notify_fd=notify_fd).serve())
