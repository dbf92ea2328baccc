"""``wrap JOB_ID ATTEMPT``: the per-attempt wrapper (docs/host-protocol.md), spawned by ``serve``.

It records its process group (pgid file), builds the job's environment (run.env), runs the setup
checks and the disk gate, starts the trainer (torchrun or python), touches wrapper.alive, samples
memory into mem.tsv, forwards signals, ends every leftover process of the attempt, verifies the
artifacts and always leaves exit.json, written last.

stdlib only, Python >= 3.8.
"""

# ruff: noqa: UP031  (%-formatting on purpose: one style for every Python >= 3.8 the agent meets)
from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

import gpuq_gang
import gpuq_protocol as P
import gpuq_slurm
import gpuq_slurm_node
from gpuq_files import (
    Layout,
    append_line,
    atomic_write,
    atomic_write_json,
    exit_record,
    mkdirs,
    read_json,
    read_text,
    sha256_file,
    spec_slots,
    touch,
    utc,
)
from gpuq_hostfacts import disk_info, memory_info, query_gpus
from gpuq_launch import (
    build_env,
    job_argv,
    kill_grace,
    link_project,
    read_only_prefix,
    run_section,
    secrets_for,
)
from gpuq_procs import become_subreaper, boot_id, descendants, group_members, start_ticks
from gpuq_setup import run_setup

INODE_LIMIT_PCT = 95.0
MEM_SAMPLE_S = 5.0


class Wrapper:
    def __init__(self, lay: Layout, job_id: str, attempt: int) -> None:
        self.lay = lay
        self.job_id = job_id
        self.attempt = attempt
        self.jdir = lay.job(job_id)
        self.adir = lay.attempt(job_id, attempt)
        self.started = time.time()
        self.phase = "setup"
        self.spec: dict[str, Any] = {}
        self.trainer: subprocess.Popen | None = None
        self.got_signal: int | None = None
        self.sig_at: float | None = None
        self.done = threading.Event()
        self.time_limit_near = False
        self.slurm_restart = 0  # SLURM_RESTART_COUNT when Slurm runs this attempt (again)

    def _on_signal(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGUSR1:  # Slurm's --signal=B:USR1@grace: the time limit is near
            self.time_limit_near = True
            signum = signal.SIGTERM  # the trainer checkpoints and stops, as for any stop request
        if self.got_signal is None:
            self.got_signal = signum
            self.sig_at = time.time()
            if self.trainer is not None and self.trainer.poll() is None:
                with contextlib.suppress(OSError):
                    self.trainer.send_signal(signum)

    def marker(self, word: str, extra: str) -> None:
        launch = read_json(os.path.join(self.adir, P.LAUNCH_FILE)) or {}
        s = self.spec
        self.lay.log("[%s] [%s/%s] %s %s %s a%d %s" % (
            utc(), launch.get("index", "?"), launch.get("count", "?"), word, s.get("name", "?"),
            self.job_id, self.attempt, extra))

    def finish(self, code: int, message: str, trainer_code: int | None = None,
               sig: int | None = None, extra: dict[str, Any] | None = None) -> int:
        hb = read_json(os.path.join(self.adir, P.HEARTBEAT_FILE))
        best = sha256_file(os.path.join(self.jdir, P.CKPT_DIR, P.BEST_CKPT))
        rec = exit_record(self.job_id, self.attempt, code, self.phase, message, started_at=self.started,
                          trainer_code=trainer_code, sig=sig, heartbeat=hb, best_sha256=best)
        rec["wrapper_signal"] = self.got_signal  # a stop from outside, whatever the trainer's code
        if os.environ.get("SLURM_JOB_ID"):
            rec["slurm_job_id"] = os.environ["SLURM_JOB_ID"]
            rec["slurm_restart"] = self.slurm_restart
            if self.time_limit_near:
                rec["slurm_time_limit"] = True
                rec["message"] = "Slurm time limit near (SIGUSR1): checkpointed and stopped; " + rec["message"]
        rec.update(extra or {})
        atomic_write_json(os.path.join(self.adir, P.EXIT_FILE), rec)
        self.done.set()
        self.marker("FINISHED", "(exit=%d)" % code)
        return code

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            signal.signal(sig, self._on_signal)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        if not os.path.isdir(self.adir):
            print(f"gpuq wrap: no attempt directory {self.adir}", file=sys.stderr)
            return P.EXIT_SETUP
        launch = read_json(os.path.join(self.adir, P.LAUNCH_FILE)) or {}
        if launch.get("slurm") and os.environ.get("SLURM_JOB_ID"):
            rank = gpuq_slurm_node.node_rank()
            if rank > 0 and os.path.isdir(self.adir):  # a multi-node job's other nodes keep their own files
                self.adir = os.path.join(self.adir, "node-%d" % rank)
                mkdirs(self.adir)
                atomic_write_json(os.path.join(self.adir, P.LAUNCH_FILE), launch)
            self.slurm_restart = gpuq_slurm.restart_count()
            if int(os.environ.get("SLURM_NNODES") or 1) > 1:  # which machine got which node rank
                atomic_write_json(os.path.join(self.adir, gpuq_slurm.NODE_FILE), {
                    "rank": rank, "host": socket.gethostname(), "slurm_job_id": os.environ["SLURM_JOB_ID"],
                    "restart": self.slurm_restart, "time": utc()})
            stale = gpuq_slurm_node.set_aside_stale_exit(self.adir)
            if self.slurm_restart:
                append_line(os.path.join(self.adir, P.JOB_LOG), "=== gpuq: Slurm job %s runs this attempt again "
                            "(restart %d)%s; resuming from the newest checkpoint ===" % (
                                os.environ["SLURM_JOB_ID"], self.slurm_restart,
                                ", the stopped run's record is " + os.path.basename(stale) if stale else ""))
        me = os.getpid()
        become_subreaper()
        atomic_write_json(os.path.join(self.adir, P.PGID_FILE),
                          {"pgid": os.getpgrp(), "start_ticks": start_ticks(me), "boot_id": boot_id()})
        spec = read_json(os.path.join(self.jdir, P.SPEC_FILE))
        if not isinstance(spec, dict):
            return self.finish(P.EXIT_SETUP, "spec.json missing or unreadable")
        self.spec = spec
        self.marker("STARTING", "({}, {}ep)".format(spec.get("task"), spec.get("epochs")))
        try:
            return self._run(spec)
        except Exception as e:  # a wrapper bug must still leave an exit record
            import traceback
            traceback.print_exc()
            if self.trainer is not None and self.trainer.poll() is None:
                self.trainer.kill()
            return self.finish(P.EXIT_SETUP if self.phase in ("setup", "gate") else 1,
                               f"wrapper error in phase {self.phase}: {e!r}")

    def meet(self, node: dict[str, Any]) -> tuple[str, str]:
        """(the head's address to use, "") or ("", why this node cannot take part)."""
        log = os.path.join(self.adir, P.JOB_LOG)
        if node["rank"] == 0:
            problem = gpuq_gang.port_free(node["master_port"])
            return ("", problem) if problem else (node["master_addrs"][0], "")
        master, problem = gpuq_gang.reach_head(node, lambda line: append_line(log, line))
        if master:
            append_line(log, "gpuq: node %d of %d reaches node 0 at %s:%d" % (
                node["rank"], node["nodes"], master, node["master_port"]))
        return master, problem

    def build_env(self, spec: dict[str, Any], launch: dict[str, Any]) -> dict[str, str]:
        return build_env(self.lay, self.job_id, self.attempt, spec, launch, adir=self.adir)

    def _run(self, spec: dict[str, Any]) -> int:
        lay = self.lay
        launch = read_json(os.path.join(self.adir, P.LAUNCH_FILE)) or {}
        if launch.get("slurm"):
            launch = gpuq_slurm_node.launch_on_node(launch)
            if self.slurm_restart:  # the controller's resume point is older than what this attempt saved
                spec = dict(spec, resume_from="")
        sha = str(spec.get("bundle_sha", ""))
        bundle = lay.p(P.BUNDLES_DIR, sha)
        workdir = os.path.join(bundle, P.BUNDLE_WORKDIR)
        entry = os.path.join(bundle, str(spec.get("entry") or P.TRAIN_ENTRY))
        run_env = self.build_env(spec, launch)
        rendezvous: list[str] | None = None
        same_env: dict[str, str] = {}
        node = None if launch.get("slurm") else gpuq_gang.node_of(spec)  # one node of a job over SSH hosts
        if launch.get("slurm") and gpuq_slurm.job_nodes(spec) > 1:  # the same on every node but the rank
            rendezvous, same_env = gpuq_slurm_node.rendezvous(gpuq_slurm.job_nodes(spec))
        elif node is not None:  # the head's address is settled by the reachability check before the launch
            rendezvous, same_env = gpuq_gang.rendezvous(node, node["master_addrs"][0])
        elif gpuq_slurm.job_nodes(spec) > 1:
            return self.finish(P.EXIT_SETUP, "a multi-node job reached this host without its node section")
        for key, value in same_env.items():
            run_env[key] = str((spec.get("env") or {}).get(key, value))  # the project's own setting wins
        atomic_write(os.path.join(self.adir, P.RUN_ENV_FILE),
                     "".join(f"{k}={shlex.quote(v)}\n" for k, v in sorted(run_env.items())))
        env: dict[str, str] = {}
        for k in ("PATH", "HOME", "LANG", "USER", "TMPDIR"):
            if os.environ.get(k) is not None:
                env[k] = os.environ[k]
        env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
        # the job's interpreter first on PATH, as activating its venv does: the `pip` of a project's
        # setup and a `python` in its command are the interpreter the trainer runs with
        bindir = os.path.dirname(sys.executable)
        if bindir and env["PATH"].split(":")[0] != bindir:
            env["PATH"] = bindir + ":" + env["PATH"]
        env.update(run_env)
        for d in (run_env["HF_HOME"], run_env["PIP_CACHE_DIR"], run_env[P.ENV_CKPT_DIR],
                  run_env[P.ENV_RESULT_DIR]):
            mkdirs(d)
        # setup checks
        if not sha or not os.path.isdir(bundle):
            return self.finish(P.EXIT_SETUP, f"bundle {sha} is not on this host")
        if not (run_section(spec) or {}).get("command") and not os.path.isfile(entry):
            return self.finish(P.EXIT_SETUP, "trainer entry %s not found in bundle %s"
                               % (spec.get("entry"), sha))
        python = sys.executable
        gpus = len(launch.get("slots") or []) or spec_slots(spec)
        if launch.get("kind") == "gpu" and launch.get("device", "cuda") == "cuda":
            probe = ("import sys, torch; ok = torch.cuda.is_available() and "
                     "torch.cuda.device_count() == %d; sys.exit(0 if ok else 1)" % gpus)
            try:
                rc = subprocess.run([python, "-c", probe], env=env, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    timeout=300).returncode
            except (OSError, subprocess.SubprocessError):
                rc = 1
            if rc != 0:
                return self.finish(P.EXIT_SETUP, "torch.cuda does not see the %d assigned GPUs %s" % (
                    gpus, run_env.get("CUDA_VISIBLE_DEVICES")))
        problem = run_setup(lay, spec, workdir, dict(env, **secrets_for(lay, spec)))
        if problem:
            key = str((run_section(spec) or {}).get("setup_key") or "")
            failed = read_json(lay.p(P.SETUP_DIR, key, "failed.json")) if key else None
            tail = failed.get("tail") if isinstance(failed, dict) else None
            tail_text = "\n".join(str(t)[:300] for t in tail[-20:]) if isinstance(tail, list) else ""
            return self.finish(P.EXIT_SETUP, problem, extra={"setup_failed": True, "setup_key": key,
                                                             "setup_tail": tail_text})
        # disk gate
        self.phase = "gate"
        ckpt = run_env[P.ENV_CKPT_DIR]
        for name in os.listdir(ckpt):
            if name.endswith(".tmp"):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(ckpt, name))
        pointer = read_json(os.path.join(ckpt, P.LATEST_POINTER))  # names the rolling latest-<step>.pt
        ckpt_bytes = int(pointer.get("bytes") or 0) if isinstance(pointer, dict) else 0
        gb = 1e9
        need = max(float(spec.get("min_free_gb") or 0),
                   ckpt_bytes * 2 / gb + float(spec.get("scratch_gb") or 0))
        disk = disk_info(lay.root)
        have = (disk["free_bytes"] or 0) / gb
        ipct = disk["inodes_used_pct"] or 0.0
        if have < need or ipct >= INODE_LIMIT_PCT:
            line = f"DISK_GATE_ABORT need={need:.2f} have={have:.2f} inodes={ipct:.1f}"
            append_line(os.path.join(self.adir, P.JOB_LOG), line)
            self.lay.log("[%s] %s %s a%d" % (utc(), line, self.job_id, self.attempt))
            return self.finish(P.EXIT_DISK_GATE, line)
        if node is not None:  # before the launch: node 0's port free here, or node 0 reachable from here
            self.phase = "rendezvous"
            master, problem = self.meet(node)
            if problem:  # a taken port is retried (the next attempt draws another); an unreachable head is not
                return self.finish(P.EXIT_TRANSIENT if node["rank"] == 0 else 1, problem)
            rendezvous, same_env = gpuq_gang.rendezvous(node, master)
            for key, value in same_env.items():
                run_env[key] = env[key] = str((spec.get("env") or {}).get(key, value))
        # train
        self.phase = "train"
        run_dir = run_env[P.ENV_RUN_DIR]
        link_project(workdir, run_dir, run_section(spec))
        try:
            argv = job_argv(lay, self.job_id, self.attempt, spec, run_env, python, gpus, rendezvous=rendezvous)
        except ValueError as e:  # a template the controller should have refused
            self.phase = "setup"
            return self.finish(P.EXIT_SETUP, "cannot build the trainer's command: %s" % e)
        env.update(secrets_for(lay, spec))  # the process environment only: never run.env, never logged
        prefix, why = read_only_prefix(bundle)
        if why:
            append_line(os.path.join(self.adir, P.JOB_LOG),
                        "gpuq: the bundle is read-only by mode bits only (%s)" % why)
        log_path = os.path.join(self.adir, P.JOB_LOG)
        with open(log_path, "ab") as logf:
            logf.write(("=== gpuq %s a%d %s start %s cwd %s argv: %s ===\n" % (
                self.job_id, self.attempt, spec.get("name", ""), utc(), run_dir,
                " ".join(shlex.quote(a) for a in argv))).encode())
            logf.flush()
            if self.got_signal is not None:
                return self.finish(P.EXIT_SIGNAL_BASE + self.got_signal, "signal %d before training started"
                                   % self.got_signal, sig=self.got_signal)
            self.trainer = subprocess.Popen(prefix + argv, stdin=subprocess.DEVNULL, stdout=logf,
                                            stderr=subprocess.STDOUT, env=env, close_fds=True,
                                            cwd=run_dir)
        sampler = threading.Thread(target=self.sample_memory, args=(self.trainer.pid,), name="gpuq-mem")
        sampler.daemon = True
        sampler.start()
        hb_s = float(spec.get("heartbeat_s") or P.DEFAULT_HEARTBEAT_S)
        grace = kill_grace(spec)
        alive_path = os.path.join(self.adir, P.WRAPPER_ALIVE)
        next_touch = 0.0
        killed_rest = False
        while True:
            now = time.time()
            if now >= next_touch:
                with contextlib.suppress(OSError):
                    touch(alive_path)
                next_touch = now + hb_s
            if self.sig_at is not None and not killed_rest and now - self.sig_at >= grace:
                self.kill_rest()
                killed_rest = True
            try:
                rc = self.trainer.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                continue
        self.kill_rest()  # leftovers (workers, loaders) must not outlive the attempt
        self.done.set()
        if rc < 0:
            sig = -rc
            return self.finish(P.EXIT_SIGNAL_BASE + sig, "trainer killed by signal %d%s" % (
                sig, self._why()), trainer_code=rc, sig=sig)
        if rc != 0:
            told = read_json(os.path.join(self.adir, P.TRAINER_EXIT_FILE))
            if isinstance(told, dict) and isinstance(told.get("code"), int) and 0 < told["code"] < 256:
                # torchrun turns every worker failure into 1; the payload said what it meant
                code = told["code"]
                detail = str(told.get("message") or "")
                return self.finish(code, "trainer exited %d (rank %s exited %d%s)%s" % (
                    rc, told.get("rank"), code, ": " + detail if detail else "", self._why()), trainer_code=code)
            return self.finish(rc, "trainer exited %d%s" % (rc, self._why()), trainer_code=rc)
        self.phase = "finalize"
        rank = node["rank"] if node is not None else gpuq_slurm_node.node_rank() if launch.get("slurm") else 0
        if rank > 0:  # rank 0 writes results and checkpoints, on node 0: they are verified there
            return self.finish(P.EXIT_OK, "trained as node %d; node 0 verifies the artifacts" % rank, trainer_code=0)
        problem = self.verify(spec, env)
        if problem:
            return self.finish(P.EXIT_FINALIZE, problem, trainer_code=0)
        return self.finish(P.EXIT_OK, "trained, artifacts verified", trainer_code=0)

    def _why(self) -> str:
        if os.path.exists(os.path.join(self.jdir, P.CANCEL_FILE)):
            return " (cancel requested)"
        if self.got_signal is not None:
            return " (wrapper got signal %d)" % self.got_signal
        return ""

    def kill_rest(self) -> None:
        """SIGKILL our group and every descendant (workers in other sessions included), then reap.

        The trainer is reaped through its Popen first: a status reaped here would be lost to it (Popen
        then reads the missing child as exit 0, and a trainer killed after its grace would look trained)."""
        me = os.getpid()
        for pid in set(group_members(os.getpgrp())) | set(descendants(me)):
            if pid != me:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        trainer = self.trainer
        if trainer is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                trainer.wait(timeout=2.0)
        deadline = time.time() + 2.0
        while time.time() < deadline:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                time.sleep(0.02)
            elif trainer is not None and pid == trainer.pid and trainer.returncode is None:
                trainer.returncode = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)

    def verify(self, spec: dict[str, Any], env: dict[str, str]) -> str:
        checks = spec.get("verify") or []
        if "metrics" in checks:
            path = os.path.join(self.jdir, P.RESULT_DIR, P.METRICS_FILE)
            try:
                with open(path, encoding="utf-8") as f:
                    lines = [ln for ln in f.read().splitlines() if ln.strip()]
            except OSError:
                return f"finalize: {path} missing"
            if not lines:
                return f"finalize: {path} is empty"
            for i, ln in enumerate(lines):
                try:
                    json.loads(ln)
                except ValueError:
                    return "finalize: %s line %d is not JSON" % (path, i + 1)
        if "best_ckpt" in checks:
            path = os.path.join(self.jdir, P.CKPT_DIR, P.BEST_CKPT)
            if not os.path.isfile(path):
                return f"finalize: {path} missing"
            code = ("import sys, torch\n"
                    "obj = torch.load(sys.argv[1], map_location='cpu', weights_only=True)\n"
                    "sys.exit(0 if isinstance(obj, dict) else 3)\n")
            try:
                rc = subprocess.run([sys.executable, "-c", code, path], env=env, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    timeout=900).returncode
            except (OSError, subprocess.SubprocessError) as e:
                return f"finalize: cannot check {path}: {e}"
            if rc != 0:
                return "finalize: %s does not load with weights_only=True as a dict (rc=%d)" % (path, rc)
        return ""

    def sample_memory(self, trainer_pid: int) -> None:
        path = os.path.join(self.adir, P.MEM_FILE)
        gpu = (read_json(os.path.join(self.adir, P.LAUNCH_FILE)) or {}).get("kind") == "gpu"
        try:
            if not os.path.exists(path):
                append_line(path, "\t".join([
                    "time", "cg_used_bytes", "cg_limit_bytes", "cg_used_pct", "oom_kill", "cpu_pct",
                    "trainer_rss_bytes", "trainer_threads", "trainer_fds", "group_procs", "group_rss_bytes",
                    "gpus"]))
        except OSError:
            return
        last_cpu: tuple[float, float] | None = None
        page = os.sysconf("SC_PAGE_SIZE")
        tick = os.sysconf("SC_CLK_TCK")
        while not self.done.is_set():
            try:
                m = memory_info()
                members = group_members(os.getpgrp())
                rss_total, cpu_ticks = 0, 0.0
                for pid in members:
                    statm = (read_text("/proc/%d/statm" % pid) or "0 0").split()
                    rss_total += int(statm[1]) * page if len(statm) > 1 else 0
                    text = read_text("/proc/%d/stat" % pid) or ""
                    rest = text[text.rfind(")") + 2:].split()
                    if len(rest) > 12:
                        cpu_ticks += int(rest[11]) + int(rest[12])
                now = time.time()
                cpu_pct = ""
                if last_cpu is not None and now > last_cpu[0]:
                    dt = now - last_cpu[0]
                    cpu_pct = "%.1f" % max(0.0, 100.0 * (cpu_ticks - last_cpu[1]) / tick / dt)
                last_cpu = (now, cpu_ticks)
                tstat = read_text("/proc/%d/status" % trainer_pid) or ""
                t_rss = t_thr = ""
                for line in tstat.splitlines():
                    if line.startswith("VmRSS:"):
                        t_rss = str(int(line.split()[1]) * 1024)
                    elif line.startswith("Threads:"):
                        t_thr = line.split()[1]
                try:
                    t_fds = str(len(os.listdir("/proc/%d/fd" % trainer_pid)))
                except OSError:
                    t_fds = ""
                gpus = ""
                if gpu:
                    gpus = ";".join("{}:{}%:{}MiB".format(g["index"], g["util_pct"], g["mem_used_mib"])
                                    for g in query_gpus())
                fields = [utc(now), m["used_bytes"], m["limit_bytes"], m["used_pct"], m["oom_kill"], cpu_pct,
                          t_rss, t_thr, t_fds, len(members), rss_total, gpus]
                append_line(path, "\t".join("" if f is None else str(f) for f in fields))
            except Exception:  # the sampler must never take the attempt down
                pass
            self.done.wait(MEM_SAMPLE_S)


def cmd_wrap(lay: Layout, job_id: str, attempt: str) -> int:
    if not job_id or "/" in job_id or not attempt.isdigit():
        print(f"gpuq wrap: bad arguments {job_id!r} {attempt!r}", file=sys.stderr)
        return P.EXIT_SETUP
    return Wrapper(lay, job_id, int(attempt)).run()
