"""``serve``: the long-lived host agent, one per root.

It claims inbox specs (oldest first, smaller jobs backfill), packs them onto slots (GPUs, or CPU
slots on a GPU-less host), starts one wrapper per attempt in its own process group, reaps them,
kills whatever an ended attempt left behind (end_leftovers), acts on cancel files, adopts live
groups after a restart and exits when idle.  With ``--detach`` it runs as a daemon (gpuq_detach.py).

stdlib only, Python >= 3.8.
"""

# ruff: noqa: UP031  (%-formatting on purpose: one style for every Python >= 3.8 the agent meets)
from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import os
import select
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import gpuq_protocol as P
import gpuq_retry
import gpuq_secrets
import gpuq_slurm
import gpuq_stall
from gpuq_files import (
    Layout,
    atomic_write_json,
    exit_record,
    list_specs,
    mkdirs,
    mtime,
    read_json,
    unfinished_claims,
    utc,
)
from gpuq_jobspec import JobSpec, attempt_of, read_spec, spec_or_reason
from gpuq_detach import serve_detached
from gpuq_hostfacts import detect_slots
from gpuq_inboxview import InboxView
from gpuq_procs import (
    boot_id,
    group_alive,
    group_members,
    leader_alive,
    live_attempt,
    proc_cmdline,
    proc_stat,
    signal_group,
    start_ticks,
)

# the wrapper is spawned as `python gpuq_agent.py --root R wrap JOB N`: cancel and restart
# recovery recognise it by that argv
AGENT_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpuq_agent.py")


class Running:
    def __init__(self, job_id: str, attempt: int, slots: list[int], spec: JobSpec,
                 pid: int | None, rec: dict[str, Any] | None) -> None:
        self.job_id = job_id
        self.attempt = attempt
        self.slots = slots
        self.spec = spec
        self.pid = pid  # our child (waitpid) or None when adopted (liveness polling)
        self.rec = rec  # {"pgid","start_ticks","boot_id"}
        self.kill_at: float | None = None  # SIGKILL deadline once a cancel (or a host stall kill) was acted on
        self.killed = False
        self.stall_next = 0.0  # when its files are looked at again for a stall (monotonic; gpuq_stall.py)
        self.stall_off = False  # its stalls are not this agent's to heal (no limits, handled, or left to gpuq)


class Agent:
    def __init__(self, lay: Layout, args: argparse.Namespace, notify_fd: int | None = None) -> None:
        self.lay = lay
        self.idle_exit_s = float(args.idle_exit_s)
        self.poll_s = float(args.poll_s)
        self.cpu_slots = args.cpu_slots
        self.train_device = getattr(args, "train_device", "auto")
        self.notify_fd = notify_fd
        self.lock_fd: int | None = None
        self.slots: dict[str, Any] = {}
        self.busy: dict[int, str] = {}  # slot id -> job id
        self.running: dict[str, Running] = {}
        self.by_pid: dict[int, str] = {}
        self.pending: list[str] = []  # claimed, never launched (found at start-up)
        self.refused: dict[str, int] = {}  # job id -> attempt waiting for an earlier one to end (logged once)
        self.stop = False
        self.host = socket.gethostname()
        self.queue_of: dict[str, str] = {}
        self.queues_open: dict[str, bool] = {}
        self.wake_r, self.wake_w = os.pipe()
        self.inbox = InboxView(lay.p(P.INBOX_DIR))
        self.last_round: tuple[Any, ...] | None = None  # what the last claim round decided from
        self.last_waiting = 0

    # lock and pid file
    def try_lock(self) -> bool:
        fd = os.open(self.lay.p(P.AGENT_LOCK), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return False
            raise
        self.lock_fd = fd
        return True

    def release_lock(self) -> None:
        if self.lock_fd is not None:
            try:
                fcntl.flock(self.lock_fd, fcntl.LOCK_UN)
            finally:
                os.close(self.lock_fd)
                self.lock_fd = None

    def write_pid(self) -> None:
        pid = os.getpid()
        atomic_write_json(self.lay.p(P.AGENT_PID), {
            "pid": pid, "pgid": os.getpgrp(), "start_ticks": start_ticks(pid), "boot_id": boot_id(),
            "started_at": utc(), "protocol": P.PROTOCOL_VERSION,
            "slots": {"kind": self.slots["kind"], "ids": self.slots["ids"]}})

    def remove_pid(self) -> None:
        rec = read_json(self.lay.p(P.AGENT_PID))
        if isinstance(rec, dict) and rec.get("pid") == os.getpid():
            with contextlib.suppress(OSError):
                os.unlink(self.lay.p(P.AGENT_PID))

    def notify(self, msg: str) -> None:
        if self.notify_fd is not None:
            try:
                os.write(self.notify_fd, (msg + "\n").encode())
                os.close(self.notify_fd)
            except OSError:
                pass
            self.notify_fd = None

    def log(self, msg: str) -> None:
        self.lay.log(f"[{utc()}] {msg}")

    # main
    def serve(self) -> int:
        lay = self.lay
        mkdirs(lay.root, lay.p(P.INBOX_DIR), lay.p(P.CLAIMED_DIR), lay.p(P.WITHDRAWN_DIR),
               lay.p(P.JOBS_DIR), lay.p(P.CACHE_DIR))
        if not self.try_lock():
            rec = read_json(lay.p(P.AGENT_PID))
            pid = rec.get("pid") if isinstance(rec, dict) else "?"
            msg = f"agent already running (pid {pid})"
            print(msg, flush=True)
            self.notify(f"held {pid}")
            return 0
        self.slots = detect_slots(self.cpu_slots)
        self.write_pid()
        for fd in (self.wake_r, self.wake_w):
            fl = fcntl.fcntl(fd, fcntl.F_GETFL)
            fcntl.fcntl(fd, fcntl.F_SETFL, fl | os.O_NONBLOCK)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda s, f: None)
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        self.log("agent %d started on %s: %d %s slots %s, protocol %s" % (
            os.getpid(), self.host, len(self.slots["ids"]), self.slots["kind"], self.slots["ids"],
            P.PROTOCOL_VERSION))
        self.notify("ok %d" % os.getpid())
        self.recover()
        try:
            return self.loop()
        finally:
            self.remove_pid()
            self.release_lock()

    def _on_stop(self, signum: int, frame: Any) -> None:
        self.stop = True

    def recover(self) -> None:
        """Restart safety: adopt live groups, leave dead attempts dead, launch claimed-unlaunched."""
        lay = self.lay
        for job_id, spec, n in unfinished_claims(lay):
            launch = read_json(lay.attempt(job_id, n, P.LAUNCH_FILE))
            rec = read_json(lay.attempt(job_id, n, P.PGID_FILE))
            if not isinstance(spec, JobSpec) or launch is None and not os.path.exists(
                    lay.attempt(job_id, n, P.LAUNCH_FILE)):  # a refused spec is failed with its reason
                self.pending.append(job_id)
                continue
            if rec is None:
                rec = self._find_wrapper(job_id, n)
            if rec is not None and group_alive(rec):
                slots = [s for s in (launch or {}).get("slots", []) if s in self.slots["ids"]]
                r = Running(job_id, n, slots, spec, None, rec)
                self.running[job_id] = r
                for s in slots:
                    self.busy[s] = job_id
                self.log("ADOPTED %s a%d pgid %s slots %s" % (job_id, n, rec.get("pgid"), slots))
            else:
                self.log("DEAD %s a%d: launched, group gone, no exit.json (not re-run)" % (job_id, n))
                self.retry(Running(job_id, n, [], spec, None, rec))  # a stall kill this agent decided on

    def _find_wrapper(self, job_id: str, n: int) -> dict[str, Any] | None:
        """The agent died between spawning a wrapper and its pgid record: find it by exact argv."""
        want = ["--root", self.lay.root, "wrap", job_id, str(n)]
        for name in os.listdir("/proc"):
            if name.isdigit():
                argv = proc_cmdline(int(name))
                if argv[-5:] == want and any(a.endswith("gpuq_agent.py") for a in argv):
                    pid = int(name)
                    return {"pgid": pid, "start_ticks": start_ticks(pid), "boot_id": boot_id()}
        return None

    def free_slots(self) -> list[int]:
        return [s for s in self.slots["ids"] if s not in self.busy]

    def loop(self) -> int:
        idle_since: float | None = None
        while not self.stop:
            try:
                self.reap()
                self.watch_adopted()
                self.handle_cancels()
                self.watch_stalls()
                inbox = self.claim_and_launch()
            except Exception:  # one bad round (disk full, odd file) must not end the agent
                import traceback
                self.log("agent round failed:\n" + traceback.format_exc())
                time.sleep(1.0)
                continue
            if inbox or self.pending or self.running:
                idle_since = None
            else:
                now = time.monotonic()
                idle_since = idle_since if idle_since is not None else now
                if now - idle_since >= self.idle_exit_s:
                    if self.idle_exit():
                        return 0
                    idle_since = None
            try:
                select.select([self.wake_r], [], [], self.poll_s)
                while True:
                    os.read(self.wake_r, 4096)
            except (OSError, ValueError):
                pass
        self.log("agent %d stopping on signal; %d groups keep running" % (os.getpid(), len(self.running)))
        return 0

    def idle_exit(self) -> bool:
        """Race-free against a controller adding a job: drop pid + lock, then look again."""
        self.remove_pid()
        self.release_lock()
        if not list_specs(self.lay.p(P.INBOX_DIR)):
            self.log("agent %d idle for %gs: exiting" % (os.getpid(), self.idle_exit_s))
            return True
        if not self.try_lock():
            self.log("agent %d: job arrived during idle exit, another agent took over" % os.getpid())
            return True
        self.write_pid()
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
            path = self.lay.attempt(job_id, r.attempt, P.EXIT_FILE)
            if not os.path.exists(path):
                if os.WIFSIGNALED(status):
                    sig = os.WTERMSIG(status)
                    code, msg = 128 + sig, "wrapper killed by signal %d before writing exit.json" % sig
                else:
                    code = os.WEXITSTATUS(status) or P.EXIT_SETUP
                    sig = None
                    msg = "wrapper exited %d without writing exit.json" % os.WEXITSTATUS(status)
                hb = read_json(self.lay.attempt(job_id, r.attempt, P.HEARTBEAT_FILE))
                started = mtime(self.lay.attempt(job_id, r.attempt, P.LAUNCH_FILE))
                rec = exit_record(job_id, r.attempt, code, "train", msg, started_at=started, sig=sig, heartbeat=hb)
                rec["vanished"] = True  # the whole attempt died (kill -9, OOM of the group): not a verdict
                atomic_write_json(path, rec)
                self.log("FINISHED %s a%d (exit=%d) %s" % (job_id, r.attempt, code, msg))
            # anything the wrapper left behind goes with it (its group, escapees carrying its log path)
            if r.rec and r.rec.get("pgid") == pid:
                self.end_leftovers(job_id, r)
            self.finish(job_id)

    def finish(self, job_id: str) -> None:
        r = self.running.pop(job_id, None)
        if r is None:
            return
        for s in r.slots:
            if self.busy.get(s) == job_id:
                del self.busy[s]
        self.retry(r)
        self.queue_done_check(r.spec.queue_id)
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

    def free_port(self) -> int:
        """A free TCP port for MASTER_PORT that no live attempt of this root holds."""
        taken = set()
        for r in self.running.values():
            launch = read_json(self.lay.attempt(r.job_id, r.attempt, P.LAUNCH_FILE))
            if isinstance(launch, dict) and isinstance(launch.get("master_port"), int):
                taken.add(launch["master_port"])
        for _ in range(50):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("127.0.0.1", 0))
                port = int(s.getsockname()[1])
            if port not in taken:
                return port
        return port

    def end_leftovers(self, job_id: str, r: Running) -> int:
        """SIGKILL what an ended attempt left behind: the rest of its process group (a trainer's
        child holding GPU memory must not outlive the job) and any process whose environment carries
        this attempt's own GPUQ_LOG path (escapees in other sessions, orphaned when the wrapper, their
        subreaper, died first).  Identity: same boot as the recorded group; a pgid cannot be reused
        while members remain; an escapee must carry this root's attempt path and have started after
        the wrapper.  Returns how many processes were signalled."""
        rec = r.rec or {}
        if rec.get("boot_id") != boot_id():
            return 0  # pids of another boot mean nothing: kill nothing
        pgid = rec.get("pgid")
        victims: set[int] = set()
        if isinstance(pgid, int) and pgid > 1 and group_alive(rec):
            victims.update(group_members(pgid))
            signal_group(pgid, signal.SIGKILL)
        for pid in attempt_processes(self.lay.attempt(job_id, r.attempt, P.JOB_LOG), rec.get("start_ticks")):
            if pid not in victims:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
                victims.add(pid)
        if victims:
            self.log("LEFTOVERS %s a%d: killed %d processes the attempt left behind: %s" % (
                job_id, r.attempt, len(victims), " ".join(str(p) for p in sorted(victims))))
        return len(victims)

    def watch_adopted(self) -> None:
        for job_id, r in list(self.running.items()):
            if r.pid is not None:
                continue
            rec = r.rec or {}
            leader = rec.get("pgid")
            if isinstance(leader, int) and leader_alive(leader, rec.get("start_ticks"), rec.get("boot_id")):
                continue  # the wrapper still supervises its attempt
            # the wrapper is gone, so the attempt has ended: nothing it started may keep running
            self.end_leftovers(job_id, r)
            if os.path.exists(self.lay.attempt(job_id, r.attempt, P.EXIT_FILE)):
                self.log("adopted %s a%d exited" % (job_id, r.attempt))
            else:
                self.log("DEAD %s a%d: adopted group gone, no exit.json (not re-run)" % (job_id, r.attempt))
            self.finish(job_id)

    def handle_cancels(self) -> None:
        now = time.monotonic()  # the SIGKILL deadline: a wall-clock step must not move it
        for job_id, r in list(self.running.items()):
            if r.kill_at is None:
                if not os.path.exists(self.lay.job(job_id, P.CANCEL_FILE)):
                    continue
                if not r.rec or not group_alive(r.rec):
                    continue
                grace = r.spec.kill_grace_s
                self.log("CANCEL %s a%d: TERM to group %d, KILL in %.0fs" % (
                    job_id, r.attempt, r.rec["pgid"], grace))
                signal_group(r.rec["pgid"], signal.SIGTERM)
                r.kill_at = now + grace
            elif not r.killed and now >= r.kill_at:
                if group_alive(r.rec):
                    signal_group(r.rec["pgid"], signal.SIGKILL)
                r.killed = True

    def watch_stalls(self) -> None:
        """A running attempt that stalled is healed here, at once, when its spec lets the host retry it
        (gpuq_stall.py): decided under retry.lock, its stacks saved, its group killed (TERM, then KILL after
        kill_grace_s by handle_cancels); attempt n+1's spec follows once it has ended (``retry``)."""
        mono = time.monotonic()
        for job_id, r in list(self.running.items()):
            if r.stall_off or r.kill_at is not None or mono < r.stall_next:
                continue
            th = gpuq_stall.limits(r.spec)
            if th is None:
                r.stall_off = True
                continue
            r.stall_next = mono + gpuq_stall.check_every(th)
            try:
                r.stall_off, kill_at = gpuq_stall.heal(self.lay, r.job_id, r.attempt, r.spec, r.rec, th, self.log)
                r.kill_at = kill_at if kill_at is not None else r.kill_at
            except Exception as e:  # an odd file: the patrol judges the attempt as ever, the round goes on
                r.stall_off = True
                self.log("STALL %s a%d: not watched here any more: %s" % (job_id, r.attempt, e))

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
        """Launch what fits now: the jobs claimed but never launched first, then the inbox oldest
        first (a smaller job behind one that waits may backfill).  Returns how many inbox jobs wait.

        A round decides from the inbox, the busy slots, the running jobs and the pending claims alone:
        when none of them changed since the last round ended, it would decide the same, and is skipped
        (an idle agent with a thousand waiting jobs must not re-read them ten times a second).  The state
        recorded is the inbox this round saw, less what it claimed: a spec renamed in while the round ran
        is new to the next round's listing, never mistaken for one already decided on."""
        self._launch_pending()
        entries = self.inbox.specs()
        if self._round_state() == self.last_round:
            return self.last_waiting
        waiting = sum(self._take(job_id, spec) for _created, job_id, spec in entries)
        self.last_round, self.last_waiting = self._round_state(), waiting
        return waiting

    def _round_state(self) -> tuple[Any, ...]:
        return (self.inbox.generation, tuple(sorted(self.busy.items())), tuple(sorted(self.running)),
                tuple(self.pending))

    def _launch_pending(self) -> None:
        """Claimed but never launched (found at start-up): launched once they fit, failed if they never can."""
        total = len(self.slots["ids"])
        for job_id in list(self.pending):
            doc = read_json(self.lay.p(P.CLAIMED_DIR, job_id + ".json"))
            spec = spec_or_reason(doc)
            if doc is None or not isinstance(spec, JobSpec):
                self.pending.remove(job_id)
                if doc is not None:
                    self._fail(job_id, None, P.EXIT_SETUP, spec)
                continue
            need = spec.slots
            if need > total:
                self.pending.remove(job_id)
                self._fail(job_id, spec, P.EXIT_SETUP, self._too_big(need, total))
            elif need <= len(self.free_slots()) and self.alive_other(job_id, spec.attempt) is None:
                self.pending.remove(job_id)
                self.launch(job_id, spec, need)

    def _unfit(self, spec: Any) -> str:
        """Why this host can never run the spec ("" when it can); ``spec``: a ``JobSpec``, or the reason
        its inbox file was refused (not a JSON object, no or a newer schema, a field wrong: gpuq_jobspec)."""
        if not isinstance(spec, JobSpec):
            return str(spec)
        need, total = spec.slots, len(self.slots["ids"])
        return self._too_big(need, total) if need > total else ""

    def _take(self, job_id: str, spec: Any) -> int:
        """Claim and launch one inbox job, or fail it when it can never run here.  1 when it waits."""
        unfit = self._unfit(spec)
        if unfit:
            if self._claim(job_id):
                self._fail(job_id, spec if isinstance(spec, JobSpec) else None, P.EXIT_SETUP, unfit)
            return 0
        need = spec.slots
        if need > len(self.free_slots()):
            return 1  # waits; a smaller job behind it may backfill
        other = self.alive_other(job_id, spec.attempt)
        if other is not None:  # attempt n+1 waits in the inbox until attempt n has ended
            if self.refused.get(job_id) != spec.attempt:
                self.refused[job_id] = spec.attempt
                self.log("WAITING %s a%d: attempt %d of this job is still alive here; never two at once"
                         % (job_id, spec.attempt, other))
            return 1
        if self._claim(job_id):
            self.queue_of[job_id] = spec.queue_id
            self.launch(job_id, spec, need)
        return 0

    def _too_big(self, need: int, total: int) -> str:
        return "job needs %d slots and the host has %d (%s)" % (need, total, self.slots["kind"])

    def _queue_pos(self, job_id: str, qid: str) -> tuple[int, int]:
        claimed = list_specs(self.lay.p(P.CLAIMED_DIR))
        mine = 0
        for j in claimed:
            if j not in self.queue_of:
                s = read_spec(self.lay.p(P.CLAIMED_DIR, j + ".json"))
                self.queue_of[j] = s.queue_id if s is not None else ""
            if self.queue_of[j] == qid:
                mine += 1
        waiting = 0
        for j in list_specs(self.lay.p(P.INBOX_DIR)):
            s = read_spec(self.lay.p(P.INBOX_DIR, j + ".json"))
            if s is not None and s.queue_id == qid:
                waiting += 1
        return mine, mine + waiting

    def queue_done_check(self, qid: str) -> None:
        if not qid or not self.queues_open.get(qid):
            return
        if any(r.spec.queue_id == qid for r in self.running.values()):
            return
        for j in list_specs(self.lay.p(P.INBOX_DIR)):
            s = read_spec(self.lay.p(P.INBOX_DIR, j + ".json"))
            if s is not None and s.queue_id == qid:
                return
        failed, n = [], 0
        for j in list_specs(self.lay.p(P.CLAIMED_DIR)):
            if self.queue_of.get(j) != qid:
                continue
            s = read_spec(self.lay.p(P.CLAIMED_DIR, j + ".json"))
            n += 1
            ex = read_json(self.lay.attempt(j, s.attempt if s is not None else 1, P.EXIT_FILE))
            if not isinstance(ex, dict) or ex.get("wrapper_code") != 0:
                failed.append(s.name if s is not None else j)
        self.queues_open[qid] = False
        if failed:
            self.lay.log("=== gpuq queue %s done on %s: %d jobs FAILED: %s ===" % (
                qid, self.host, len(failed), " ".join(failed)))
        else:
            self.lay.log("=== gpuq queue %s done on %s: all %d jobs exited 0 ===" % (qid, self.host, n))

    def alive_other(self, job_id: str, n: int) -> int | None:
        """Another attempt of ``job_id`` than ``n`` that still lives on this host (ours, adopted, or
        one whose group lives on from an earlier agent), else None."""
        r = self.running.get(job_id)
        if r is not None and r.attempt != n:
            return r.attempt
        return live_attempt(self.lay.root, job_id, other_than=n)

    def launch(self, job_id: str, spec: JobSpec, need: int) -> None:
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
        self.queue_of[job_id] = qid
        if os.path.exists(lay.job(job_id, P.CANCEL_FILE)):
            atomic_write_json(os.path.join(adir, P.EXIT_FILE), exit_record(
                job_id, n, P.EXIT_SIGNAL_BASE + signal.SIGTERM, "setup", "cancelled before launch",
                sig=int(signal.SIGTERM)))
            self.log("CANCELLED %s a%d before launch" % (job_id, n))
            return
        slots = self.free_slots()[:need]
        idx, count = self._queue_pos(job_id, qid)
        if qid and not self.queues_open.get(qid):
            self.queues_open[qid] = True
            lay.log("=== gpuq queue %s on %s: %d jobs ===" % (qid, self.host, count))
        now = time.time()
        atomic_write_json(os.path.join(adir, P.LAUNCH_FILE), {
            "time": utc(now), "slots": slots, "kind": self.slots["kind"],
            "device": "cpu" if self.train_device == "cpu" or self.slots["kind"] != "gpu" else "cuda",
            "total_slots": len(self.slots["ids"]), "agent_pid": os.getpid(), "index": idx,
            "count": count, "master_port": self.free_port()})
        python = spec.python or sys.executable
        argv = [python, wrapper_file(lay, spec), "--root", lay.root, "wrap", job_id, str(n)]
        try:
            logf = open(os.path.join(adir, P.JOB_LOG), "ab")  # noqa: SIM115 (handed to the child)
        except OSError as e:
            self._fail(job_id, spec, P.EXIT_SETUP, f"cannot open job.log: {e}")
            return
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                    cwd=lay.root, start_new_session=True, close_fds=True)
        except OSError as e:
            logf.close()
            self._fail(job_id, spec, P.EXIT_SETUP, f"cannot start wrapper with {python}: {e}")
            return
        logf.close()
        proc.returncode = 0  # we reap with os.waitpid; keep Popen.__del__ from touching it
        rec = {"pgid": proc.pid, "start_ticks": start_ticks(proc.pid), "boot_id": boot_id()}
        if rec["start_ticks"] is not None and not os.path.exists(os.path.join(adir, P.PGID_FILE)):
            with contextlib.suppress(OSError):
                atomic_write_json(os.path.join(adir, P.PGID_FILE), rec)
        r = Running(job_id, n, slots, spec, proc.pid, rec)
        self.running[job_id] = r
        self.by_pid[proc.pid] = job_id
        for s in slots:
            self.busy[s] = job_id


def attempt_processes(log_path: str, min_ticks: Any) -> list[int]:
    """Live processes whose environment has ``GPUQ_LOG=<log_path>`` (the attempt's own job.log, an
    absolute path under this root, set by the wrapper for the trainer and inherited by everything
    it starts) and that started no earlier than ``min_ticks`` (the wrapper's start)."""
    needle = ("%s=%s" % (P.ENV_LOG, log_path)).encode()
    me = os.getpid()
    out: list[int] = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open("/proc/%s/environ" % name, "rb") as f:
                env = f.read()
        except OSError:
            continue  # gone, or another user's: not ours to judge
        if needle not in env.split(b"\0"):
            continue
        st = proc_stat(int(name))
        if st is None or st[0] in ("Z", "X"):
            continue
        if isinstance(min_ticks, int) and st[2] < min_ticks:
            continue
        out.append(int(name))
    return out


def wrapper_file(lay: Layout, spec: JobSpec) -> str:
    """The wrapper comes from the job's own bundle: a fix shipped in a new bundle applies to the
    jobs of that bundle even while an agent started from an older bundle keeps serving."""
    sha = spec.bundle_sha
    own = lay.p(P.BUNDLES_DIR, sha, P.AGENT_ENTRY) if sha and "/" not in sha and not sha.startswith(".") else ""
    return own if own and os.path.isfile(own) else AGENT_FILE


def cmd_serve(lay: Layout, args: argparse.Namespace) -> int:
    if gpuq_slurm.config(lay) is not None:  # a Slurm login node: sbatch runs the attempts, never an agent here
        print("this root is a Slurm login node's (slurm.json): no agent serves it; jobs go to sbatch")
        return 0
    if not args.detach:
        return Agent(lay, args).serve()
    return serve_detached(lay, lambda notify_fd: Agent(lay, args, notify_fd=notify_fd).serve())
