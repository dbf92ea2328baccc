"""``wrap JOB_ID ATTEMPT``: the per-attempt wrapper (docs/host-protocol.md), spawned by ``serve``.

It records its process group (pgid file), then runs the attempt's phases in order, each a method
that returns an exit code (the attempt ends) or None (the next phase runs): prepare (the job's
environment, run.env), setup check (bundle, entry, GPUs, the project's setup hook), gate (disk),
meet (one node of a multi-node job over SSH hosts), train (starts the trainer, touches
wrapper.alive, once the trainer is up probes provenance and samples memory into mem.tsv (gpuq_helpers.py),
forwards signals, ends every leftover process of the
attempt) and finalize (verifies the artifacts).  An attempt that ended well then gets its end record,
outputs.json (gpuq_outputs.py: path, bytes and sha256 of every result file).  It always leaves
exit.json, written last, with the forwarded secret values redacted (gpuq_wrap_exit.py).  The trainer's
process, the signals relayed to it and every leftover process of the attempt are gpuq_wrap_trainer.py's.

stdlib only, Python >= 3.8.
"""

# ruff: noqa: UP031  (%-formatting on purpose: one style for every Python >= 3.8 the agent meets)
from __future__ import annotations

import os
import shlex
import subprocess
import sys
import threading
import time
from dataclasses import replace
from typing import Any

from gpuq_base import gpuq_gang
from gpuq_records import gpuq_outputs
from gpuq_base import gpuq_protocol as P
from gpuq_slurmmode import gpuq_slurm
from gpuq_slurmmode import gpuq_slurm_node
from gpuq_attempt.gpuq_checks import cuda_sees, disk_gate, verify_artifacts
from gpuq_attempt.gpuq_wrap_exit import hidden_values, write_exit
from gpuq_attempt.gpuq_wrap_trainer import Supervisor, trainer_end
from gpuq_base import gpuq_secrets
from gpuq_base.gpuq_files import Layout, append_line, atomic_write, atomic_write_json, mkdirs, read_json, utc
from gpuq_attempt.gpuq_jail import read_only_prefix, split_loader_env
from gpuq_base.gpuq_jobspec import JobSpec, NodeSection, spec_or_reason
from gpuq_attempt.gpuq_launch import (
    build_env,
    job_argv,
    kill_grace,
    link_project,
    resume_note,
    secrets_for,
)
from gpuq_attempt.gpuq_helpers import Helpers
from gpuq_base.gpuq_procs import become_subreaper, boot_id, start_ticks
from gpuq_attempt.gpuq_setup import project_root, run_setup


def process_env(run_env: dict[str, str]) -> dict[str, str]:
    """The trainer's process environment: PATH, HOME, LANG, USER and TMPDIR from the wrapper's own,
    then run.env on top (the forwarded secrets are added only at the launch)."""
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
    return env


class Wrapper:
    def __init__(self, lay: Layout, job_id: str, attempt: int) -> None:
        self.lay = lay
        self.job_id = job_id
        self.attempt = attempt
        self.jdir = lay.job(job_id)
        self.adir = lay.attempt(job_id, attempt)
        self.started = time.time()
        self.phase = "setup"
        self._spec: JobSpec | None = None  # read first thing by run()
        self.supervisor = Supervisor()  # the trainer's process and the stop signal from outside
        self.done = threading.Event()
        self.slurm_restart = 0  # SLURM_RESTART_COUNT when Slurm runs this attempt (again)
        self.hide: list[str] = []  # forwarded secret values: never in a record the controller reads
        # what the phases settle for the ones after them
        self.launch: dict[str, Any] = {}
        self.sha = ""
        self.bundle = ""
        self.run_env: dict[str, str] = {}  # run.env: what the trainer gets on top of PATH/HOME/...
        self.env: dict[str, str] = {}  # the trainer's whole process environment
        self.node: NodeSection | None = None  # one node of a job over SSH hosts
        self.rendezvous: list[str] | None = None  # torchrun's multi-node arguments
        self.python = sys.executable
        self.gpus = 0

    @property
    def spec(self) -> JobSpec:
        """The attempt's spec (spec.json, parsed by ``run`` before any phase starts)."""
        if self._spec is None:
            raise RuntimeError("the wrapper read no spec yet")
        return self._spec

    def marker(self, word: str, extra: str) -> None:
        launch = read_json(os.path.join(self.adir, P.LAUNCH_FILE)) or {}
        name = self._spec.name if self._spec is not None else "?"
        self.lay.log("[%s] [%s/%s] %s %s %s a%d %s" % (
            utc(), launch.get("index", "?"), launch.get("count", "?"), word, name,
            self.job_id, self.attempt, extra))

    def finish(self, code: int, message: str, trainer_code: int | None = None,
               sig: int | None = None, extra: dict[str, Any] | None = None) -> int:
        sup = self.supervisor
        write_exit(self.lay, self.adir, self.jdir, self.job_id, self.attempt, code, message, phase=self.phase,
                   started=self.started, trainer_code=trainer_code, sig=sig, extra=extra,
                   wrapper_signal=sup.got_signal, slurm_restart=self.slurm_restart,
                   time_limit_near=sup.time_limit_near, held=self.hide)
        self.done.set()
        self.marker("FINISHED", "(exit=%d)" % code)
        return code

    def run(self) -> int:
        self.supervisor.catch_signals()
        if not os.path.isdir(self.adir):
            print(f"gpuq wrap: no attempt directory {self.adir}", file=sys.stderr)
            return P.EXIT_SETUP
        self.hide = gpuq_secrets.held_values(self.lay)  # before anything can delete them
        launch = read_json(os.path.join(self.adir, P.LAUNCH_FILE)) or {}
        if launch.get("slurm") and os.environ.get("SLURM_JOB_ID"):
            self.adir, self.slurm_restart = gpuq_slurm_node.enter_node(self.adir, launch)
        me = os.getpid()
        become_subreaper()
        atomic_write_json(os.path.join(self.adir, P.PGID_FILE),
                          {"pgid": os.getpgrp(), "start_ticks": start_ticks(me), "boot_id": boot_id()})
        doc = read_json(os.path.join(self.jdir, P.SPEC_FILE))
        got = spec_or_reason(doc)
        if not isinstance(got, JobSpec):
            return self.finish(P.EXIT_SETUP, "spec.json missing or unreadable" if doc is None else
                               "spec.json refused: %s" % got)
        self._spec = spec = got
        self.marker("STARTING", "({}, {}ep)".format(spec.task, spec.epochs or "-"))
        try:
            return self._run(spec)
        except Exception as e:  # a wrapper bug must still leave an exit record
            import traceback
            traceback.print_exc()
            self.supervisor.kill_trainer()
            return self.finish(P.EXIT_SETUP if self.phase in ("setup", "gate") else 1,
                               f"wrapper error in phase {self.phase}: {e!r}")

    def meet(self, node: NodeSection) -> tuple[str, str]:
        """(the head's address to use, "") or ("", why this node cannot take part)."""
        log = os.path.join(self.adir, P.JOB_LOG)
        if node.rank == 0:
            problem = gpuq_gang.port_free(node.master_port)
            return ("", problem) if problem else (node.master_addrs[0], "")
        master, problem = gpuq_gang.reach_head(node, lambda line: append_line(log, line))
        if master:
            append_line(log, "gpuq: node %d of %d reaches node 0 at %s:%d" % (
                node.rank, node.nodes, master, node.master_port))
        return master, problem

    def build_env(self, spec: JobSpec, launch: dict[str, Any]) -> dict[str, str]:
        return build_env(self.lay, self.job_id, self.attempt, spec, launch, adir=self.adir)

    def _run(self, spec: JobSpec) -> int:
        """The attempt's phases in order; the first to return an exit code ends it."""
        self._spec = spec
        for phase in (self._prepare, self._check_setup, self._gate, self._meet, self._train, self._finalize):
            code = phase()
            if code is not None:
                return code
        # the end record (gpuq_outputs.py): what the attempt's results are as it ends, before exit.json
        ended = gpuq_outputs.record(self.lay, self.job_id, self.attempt, spec, self.adir)
        return self.finish(P.EXIT_OK, checked_message(spec.verify), trainer_code=0, extra=ended)

    def _prepare(self) -> int | None:
        """Phase "setup", first half: the launch record as this node sees it, the bundle's paths, the
        job's environment (run.env written, the process env built) and its directories."""
        launch = read_json(os.path.join(self.adir, P.LAUNCH_FILE)) or {}
        if launch.get("slurm"):
            launch = gpuq_slurm_node.launch_on_node(launch)
            if self.slurm_restart:  # the controller's resume point is older than what this attempt saved
                self._spec = replace(self.spec, resume_from="")
        self.launch = launch
        spec = self.spec
        self.sha = spec.bundle_sha
        self.bundle = self.lay.p(P.BUNDLES_DIR, self.sha)
        run_env = self.build_env(spec, launch)
        same_env: dict[str, str] = {}
        self.node = None if launch.get("slurm") else spec.node  # one node of a job over SSH hosts
        if launch.get("slurm") and gpuq_slurm.job_nodes(spec) > 1:  # the same on every node but the rank
            self.rendezvous, same_env = gpuq_slurm_node.rendezvous(gpuq_slurm.job_nodes(spec))
        elif self.node is not None:  # the head's address is settled by the reachability check before the launch
            self.rendezvous, same_env = gpuq_gang.rendezvous(self.node, self.node.master_addrs[0])
        elif gpuq_slurm.job_nodes(spec) > 1:
            return self.finish(P.EXIT_SETUP, "a multi-node job reached this host without its node section")
        for key, value in same_env.items():
            run_env[key] = spec.env.get(key, value)  # the project's own setting wins
        atomic_write(os.path.join(self.adir, P.RUN_ENV_FILE),
                     "".join(f"{k}={shlex.quote(v)}\n" for k, v in sorted(run_env.items())))
        self.run_env, self.env = run_env, process_env(run_env)
        for d in (run_env["HF_HOME"], run_env["PIP_CACHE_DIR"], run_env[P.ENV_CKPT_DIR],
                  run_env[P.ENV_RESULT_DIR]):
            mkdirs(d)
        return None

    def _check_setup(self) -> int | None:
        """Phase "setup", second half: the bundle and its entry here, torch sees the assigned GPUs,
        the project's setup hook has succeeded on this host."""
        spec, launch = self.spec, self.launch
        if not self.sha or not os.path.isdir(self.bundle):
            return self.finish(P.EXIT_SETUP, f"bundle {self.sha} is not on this host")
        entry = os.path.join(self.bundle, spec.entry or P.TRAIN_ENTRY)
        if not spec.own_command and not os.path.isfile(entry):
            return self.finish(P.EXIT_SETUP, "trainer entry %s not found in bundle %s"
                               % (spec.entry, self.sha))
        self.gpus = len(launch.get("slots") or []) or spec.slots
        if launch.get("kind") == "gpu" and launch.get("device", "cuda") == "cuda" \
                and not cuda_sees(self.python, self.env, self.gpus):
            return self.finish(P.EXIT_SETUP, "torch.cuda does not see the %d assigned GPUs %s" % (
                self.gpus, self.run_env.get("CUDA_VISIBLE_DEVICES")))
        workdir = os.path.join(self.bundle, P.BUNDLE_WORKDIR)
        secrets = secrets_for(self.lay, spec)
        problem = run_setup(self.lay, spec, workdir, dict(self.env, **secrets),
                            hide=hidden_values(self.lay, self.hide, secrets))
        if not problem:
            return None
        key = spec.run.setup_key if spec.run is not None else ""
        failed = read_json(self.lay.p(P.SETUP_DIR, key, "failed.json")) if key else None
        tail = failed.get("tail") if isinstance(failed, dict) else None
        tail_text = "\n".join(str(t)[:300] for t in tail[-20:]) if isinstance(tail, list) else ""
        return self.finish(P.EXIT_SETUP, problem, extra={"setup_failed": True, "setup_key": key,
                                                         "setup_tail": tail_text})

    def _gate(self) -> int | None:
        """Phase "gate": room on the disk for the attempt's checkpoints and scratch."""
        self.phase = "gate"
        line = disk_gate(self.lay.root, self.run_env[P.ENV_CKPT_DIR], self.spec)
        if not line:
            return None
        append_line(os.path.join(self.adir, P.JOB_LOG), line)
        self.lay.log("[%s] %s %s a%d" % (utc(), line, self.job_id, self.attempt))
        return self.finish(P.EXIT_DISK_GATE, line)

    def _meet(self) -> int | None:
        """Phase "rendezvous" (one node of a multi-node job over SSH hosts), before the launch: node 0's
        port free here, or node 0 reachable from here."""
        node = self.node
        if node is None:
            return None
        self.phase = "rendezvous"
        master, problem = self.meet(node)
        if problem:  # a taken port is retried (the next attempt draws another); an unreachable head is not
            return self.finish(P.EXIT_TRANSIENT if node.rank == 0 else 1, problem)
        self.rendezvous, same_env = gpuq_gang.rendezvous(node, master)
        for key, value in same_env.items():
            self.run_env[key] = self.env[key] = self.spec.env.get(key, value)
        return None

    def _train(self) -> int | None:
        """Phase "train": start the trainer in the run dir, supervise it, end whatever it left."""
        self.phase = "train"
        spec, run_env = self.spec, self.run_env
        run_dir = run_env[P.ENV_RUN_DIR]
        link_project(project_root(self.lay, spec), run_dir, spec.run)  # as the setup hook left it
        try:
            argv = job_argv(self.lay, self.job_id, self.attempt, spec, run_env, self.python, self.gpus,
                            rendezvous=self.rendezvous)
        except ValueError as e:  # a template the controller should have refused
            self.phase = "setup"
            return self.finish(P.EXIT_SETUP, "cannot build the trainer's command: %s" % e)
        self.env.update(secrets_for(self.lay, spec))  # the process environment only: never run.env, never logged
        # the job's LD_* variables reach the trainer's exec only, never the root steps that make the bundles
        # read-only (unshare, mount, the jail): gpuq_jail.split_loader_env
        clean, loader = split_loader_env(self.env)
        # the jail (gpuq_jail): bundles/ and the interpreter read-only, secrets/ hidden (other sweeps' values)
        prefix, why = read_only_prefix(self.bundle, loader, root=self.lay.root, hidden=[self.lay.p(P.SECRETS_DIR)])
        env = clean if prefix else self.env
        log_path = os.path.join(self.adir, P.JOB_LOG)
        if why:
            append_line(log_path, "gpuq: %s" % why if prefix else
                        "gpuq: the bundle is read-only by mode bits only (%s)" % why)
        note = resume_note(run_dir, spec.run, self.attempt)
        if note:
            append_line(log_path, note)
        with open(log_path, "ab") as logf:
            logf.write(("=== gpuq %s a%d %s start %s cwd %s argv: %s ===\n" % (
                self.job_id, self.attempt, spec.name, utc(), run_dir,
                " ".join(shlex.quote(a) for a in argv))).encode())
            logf.flush()
            sup = self.supervisor
            if sup.got_signal is not None:
                return self.finish(P.EXIT_SIGNAL_BASE + sup.got_signal, "signal %d before training started"
                                   % sup.got_signal, sig=sup.got_signal)
            trainer = subprocess.Popen(prefix + argv, stdin=subprocess.DEVNULL, stdout=logf,
                                       stderr=subprocess.STDOUT, env=env, close_fds=True, cwd=run_dir)
            sup.trainer = trainer  # from here on, a relayed signal reaches it
        # the provenance probe and the memory sampler, once the trainer is up (its start-up is not theirs)
        gpu = (read_json(os.path.join(self.adir, P.LAUNCH_FILE)) or {}).get("kind") == "gpu"
        helpers = Helpers(self.adir, self.python, self.env, self.launch, gpu, trainer.pid, self.done).start()
        rc = sup.supervise(trainer, os.path.join(self.adir, P.WRAPPER_ALIVE), spec.heartbeat_s, kill_grace(spec))
        helpers.finish()  # a short trainer: the probe's record and the first row are there before the group ends
        if rc != 0 and sup.got_signal is None:  # after a relayed stop, gpuq's own grace kill ended the ranks
            sup.report_dead_ranks(log_path)
        sup.kill_rest()  # leftovers (workers, loaders) must not outlive the attempt
        self.done.set()
        return self._trainer_verdict(rc)

    def _trainer_verdict(self, rc: int) -> int | None:
        """None when the trainer exited 0, else the attempt's end as the trainer's status says it."""
        if rc == 0:
            return None
        end = trainer_end(rc, self.adir, self._why())
        return self.finish(end.code, end.message, trainer_code=end.trainer_code, sig=end.sig)

    def _finalize(self) -> int | None:
        """Phase "finalize": node 0 verifies the artifacts; None when they are sound."""
        self.phase = "finalize"
        node = self.node
        rank = node.rank if node is not None else gpuq_slurm_node.node_rank() if self.launch.get("slurm") else 0
        if rank > 0:  # rank 0 writes results and checkpoints, on node 0: they are verified there
            return self.finish(P.EXIT_OK, "trained as node %d; node 0 verifies the artifacts" % rank, trainer_code=0)
        problem = verify_artifacts(self.jdir, self.spec)
        if problem:
            return self.finish(P.EXIT_FINALIZE, problem, trainer_code=0)
        return None

    def _why(self) -> str:
        if os.path.exists(os.path.join(self.jdir, P.CANCEL_FILE)):
            return " (cancel requested)"
        if self.supervisor.got_signal is not None:
            return " (wrapper got signal %d)" % self.supervisor.got_signal
        return ""


def checked_message(verify: tuple[str, ...]) -> str:
    """What an exit-0 record says was checked: the artifacts ``verify`` named, or that none were."""
    if not verify:
        return "no artifacts checked (verify = [])"
    return "artifacts verified: " + ", ".join(verify)


def cmd_wrap(lay: Layout, job_id: str, attempt: str) -> int:
    if not job_id or "/" in job_id or not attempt.isdigit():
        print(f"gpuq wrap: bad arguments {job_id!r} {attempt!r}", file=sys.stderr)
        return P.EXIT_SETUP
    return Wrapper(lay, job_id, int(attempt)).run()
