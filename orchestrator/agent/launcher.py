"""Carry out assignments on a host: place the bundle, write inbox specs, ensure the agent.

Order matters for exactly-once: the ledger records attempt n (STARTING) before
the spec reaches the host, and the agent's ``enqueue`` refuses a spec whose
job/attempt already exists anywhere under the root.  So a controller killed
between the two steps leaves an attempt the next reconcile re-enqueues, never
a job that runs without the ledger knowing.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from orchestrator import host_documents
from orchestrator.agent import bundle_check, client, handed
from orchestrator.agent.bundle import Bundle
from orchestrator.agent.spec import OutboundSpec, RetryPolicy, RunSection
from orchestrator.core import protocol
from orchestrator.core.config import Settings, load_profile
from orchestrator.core.errors import AgentError, BundleError, GpuqError, IllegalTransition, LedgerError
from orchestrator.host_documents import Verdicts
from orchestrator.hosts.base import Host
from orchestrator.ledger import Attempt, HostRow, Job, Ledger, Sweep
from orchestrator.queue import runconfig
from orchestrator.transfer import datasync
from orchestrator.transfer import progress as transfer_progress

_log = logging.getLogger(__name__)

# Unpack into a private temp dir, then rename: a live bundle is never overwritten.
UNPACK_SCRIPT = (
    'set -eu; umask 077; cd "$1"; mkdir -p bundles; '
    'if command -v sha256sum >/dev/null 2>&1; then printf "%s  %s\\n" "$2" "$3" | sha256sum -c - >/dev/null '
    '|| { rm -f "$3"; echo "bundle bytes do not match sha256 $2 after upload" >&2; exit 3; }; fi; '
    'd="bundles/.$2.unpack.$$"; rm -rf "$d"; mkdir -p "$d"; '
    'tar -xf "$3" -C "$d"; '
    # the agent's bytecode, compiled once here with the host's Python: every agent call would compile it
    # again from the read-only bundle (bundle_check admits exactly these files); a failure only costs speed
    'if [ -d "$d/payload/agent" ]; then "$4" -I -m compileall -q "$d/payload/agent" >/dev/null 2>&1 || true; fi; '
    'chmod -R a-w "$d"; '
    'if [ -d "bundles/$2" ]; then chmod -R u+w "$d"; rm -rf "$d"; else mv "$d" "bundles/$2"; fi; rm -f "$3"'
)


ENQUEUE_S_PER_SPEC = 0.5  # the enqueue call's time allowance per spec (sbatch on a busy slurmctld)


def ensure_bundle(host: Host, bundle: Bundle) -> bool:
    """Place the bundle on the host unless it is there and still matches its manifest (a tampered
    copy is moved aside on the host and pushed again, bundle_check.py); True when bytes were pushed."""
    verdict = bundle_check.verify_on_host(host, bundle.sha256, bundle_check.manifest_digest(bundle.path))
    if verdict.code == bundle_check.PRESENT:
        return False
    if verdict.code == bundle_check.TAMPERED:
        _log.warning("host %s: %s; pushing it again", host.name, verdict.detail)
    # a name of its own per push: two submits pushing the same bundle to a fresh host must not share it
    remote_tar = host.path(protocol.BUNDLES_DIR, f".{bundle.sha256}.{secrets.token_hex(8)}.tar")
    with transfer_progress.track(f"bundle {bundle.sha256[:12]} -> {host.name}", bundle.path.stat().st_size) as shown:
        host.put(bundle.path, remote_tar, progress=shown)
    result = host.run(["sh", "-c", UNPACK_SCRIPT, "sh", host.root, bundle.sha256, remote_tar, host.python],
                      timeout=300)
    if result.exit_code != 0:
        raise BundleError(f"host {host.name}: unpacking bundle {bundle.sha256[:12]} failed: {result.stderr.strip()}")
    return True


def sigterm_grace_s(row: HostRow | None) -> float | None:
    """Seconds between SIGTERM and SIGKILL on a spot host (RunPod: about 5): the payload saves a
    final checkpoint only if it fits (docs/checkpoints.md).  None where a stop waits for kill_grace_s."""
    if row is None or not row.spot:
        return None
    for name in (row.profile, row.provider):
        if not name:
            continue
        try:
            spot = load_profile(name).spot
        except GpuqError:
            continue
        if spot.get("available") and spot.get("grace_s") is not None:
            return float(spot["grace_s"])
    return 0.0  # a spot host whose grace nobody documents: assume none


HOST_RETRY_CLASSES = ("killed", "host_oom", "vanished", "stalled", "deadlock_at_start")  # a host's agent retries
HOST_RETRY_SIGNALS = (int(signal.SIGKILL), int(signal.SIGSEGV), int(signal.SIGBUS))  # the trainer's deaths it retries
DEADLOCK_RETRIES = 1  # health.verdicts.DEADLOCK_RETRIES (a sibling layer: not imported; tests/unit check they agree)


def host_retry(job: Job, failed: int, settings: Settings, *, host: HostRow | None,
               sweep: Sweep | None) -> RetryPolicy | None:
    """The spec's "retry" (protocol.py): what the host's agent may retry by itself, at once, with resume
    (docs/checkpoints.md, "Who retries what").  ``failed``: the job's attempts that already count against
    ``retries=`` (``Ledger.failed_attempts``).  None, and the controller settles every end, for a job with
    no retries left, a multi-node job, a capped sweep (the budget admits each start), a held host (its
    jobs go elsewhere), a job pinned to another host, or a Slurm login node (no agent there)."""
    retries = job.retries if job.retries is not None else settings.retries
    left = retries - failed
    if left < 1 or job.nodes > 1 or host is None or host.kind == "slurm" or host.held:
        return None
    if (sweep is not None and sweep.budget_usd is not None) or (job.host_pin and job.host_pin != host.name):
        return None
    # a stall: the patrol's own limits (payload/agent/gpuq_serving/gpuq_stall.py); a deadlock at start only as the first
    # failure
    return RetryPolicy(left=left, on=HOST_RETRY_CLASSES, signals=HOST_RETRY_SIGNALS,
                       deadlock_left=max(0, min(retries, DEADLOCK_RETRIES) - failed),
                       stall_after_s=settings.stall_after_s, startup_grace_s=settings.startup_grace_s,
                       start_stall_after_s=settings.start_stall_after_s)


def attempt_spec(ledger: Ledger, job: Job, attempt: Attempt, settings: Settings, *, host: str,
                 created_at: float | None = None, sweep: Sweep | None = None,
                 row: HostRow | None = None, waits: bool = True) -> OutboundSpec:
    """Attempt ``attempt``'s spec for ``host`` (its ledger row ``row`` when the caller read it) with the
    retries its host may make itself (``host_retry``) and its dependencies' checkpoints (``handed.py``;
    ``waits=False``: the caller knows it has none): the same whether the spec is sent first, sent again
    (never delivered) or moved (work stealing)."""
    row = row if row is not None else ledger.host(host)
    sweep = sweep if sweep is not None else ledger.sweep(job.sweep_id)
    failed = ledger.failed_attempts(job.id) if attempt.number > 1 else 0
    return job_spec(job, attempt, settings, created_at=created_at, sweep=sweep, host=row,
                    retry=host_retry(job, failed, settings, host=row, sweep=sweep),
                    handed_over=handed.handed_paths(ledger, job, row) if waits else None)


def job_spec(job: Job, attempt: Attempt, settings: Settings, *, created_at: float | None = None,
             sweep: Sweep | None = None, host: HostRow | None = None,
             retry: RetryPolicy | None = None, handed_over: Mapping[str, str] | None = None) -> OutboundSpec:
    """The inbox spec for one attempt (protocol.py, "Job spec"; its JSON: ``OutboundSpec.as_document``).
    The trainer entry, launcher and checks come from the sweep (recorded at submit), never from the
    caller's project; a spot host's preemption grace comes from its profile; ``retry`` is what the host
    may retry itself (``host_retry``); ``handed_over``: {after= name: its checkpoint's path on the host}
    (``handed.py``: ``{checkpoint.NAME}`` in the arguments, ``GPUQ_CHECKPOINT_<NAME>``)."""
    handed_over = handed_over or {}
    entry = f"{protocol.BUNDLE_WORKDIR}/{sweep.entry}" if sweep is not None and sweep.entry else protocol.TRAIN_ENTRY
    return OutboundSpec(
        schema=protocol.SPEC_SCHEMA, protocol=protocol.PROTOCOL_VERSION, job_id=job.id, name=job.name,
        queue_id=job.sweep_id, attempt=attempt.number, task=job.task,
        epochs=job.epochs or None,  # None: nothing gave the job epochs (GPUQ_EPOCHS is then empty)
        gpus=job.gpus, nodes=job.nodes, seed=job.seed, config=job.config, bundle_sha=attempt.bundle_sha,
        entry=entry, launcher=sweep.launcher if sweep is not None else "torchrun", python="",
        verify=tuple(v for v in sweep.verify.split(",") if v) if sweep is not None else ("metrics", "best_ckpt"),
        heartbeat_s=settings.heartbeat_s, ckpt_interval_s=settings.ckpt_interval_s,
        kill_grace_s=settings.kill_grace_s, min_free_gb=settings.min_free_gb, scratch_gb=0, durable_dir="",
        resume_from=attempt.resume_from, spec_hash=job.spec_hash,
        env=run_env(sweep) | handed.handed_env(handed_over),
        created_at=created_at if created_at is not None else attempt.created_at,
        args=handed.render_args(job.arg_list(), handed_over),
        run=run_spec(sweep), sigterm_grace_s=sigterm_grace_s(host), retry=retry)


def run_env(sweep: Sweep | None) -> dict[str, str]:
    """The project's ``[run] env`` (plain values, never secrets): the job's run.env, for its setup and
    its trainer alike."""
    run = sweep.run_config() if sweep is not None else None
    return dict(run.env) if run is not None else {}


def run_spec(sweep: Sweep | None) -> RunSection | None:
    """The spec's "run" from the sweep's [run] table (None without one); forward_env holds names only.
    setup_key was computed at submit from the project's files.  A sweep whose stored table cannot be
    read gets no spec (LedgerError): its jobs must not run as the bundled payload."""
    run = sweep.run_config() if sweep is not None else None
    if sweep is None or run is None:
        return None
    if run.unreadable:
        raise LedgerError(unreadable_run(sweep.id, run.unreadable))
    return RunSection(command=run.command, launcher=run.launcher, resume_args=run.resume_args,
                      checkpoint=run.checkpoint, outputs=run.outputs, metrics=run.metrics,
                      metrics_regex=run.metrics_regex, metric=run.metric, mode=run.mode, progress=run.progress,
                      setup=run.setup, setup_key=run.setup_key, forward_env=run.forward_env,
                      data=dict(run.data))  # {NAME: {"tree", "file"}}: synced before the specs go (datasync)


def unreadable_run(sweep_id: str, why: str) -> str:
    return (f"sweep {sweep_id}: its recorded [run] table cannot be read ({why}); its jobs are not sent: "
            f"cancel it (`gpuq cancel --sweep {sweep_id}`) and submit it again")


def enqueue_payload(specs: Sequence[OutboundSpec], environ: Mapping[str, str] | None = None,
                    allowed: Sequence[str] = ()) -> bytes:
    """The `enqueue` verb's stdin: the plain list of specs, or, when any spec forwards variables,
    {"specs": [...], "secrets": {queue_id: {NAME: value}}} with values read from the environment now.
    Only names the user's ``forward_env_allow`` allows leave the machine, and never gpuq's own
    credentials, whatever a sweep recorded (checked again here: the sweep may predate the rule)."""
    environ = os.environ if environ is None else environ
    secrets: dict[str, dict[str, str]] = {}
    for spec in specs:
        for name in spec.run.forward_env if spec.run is not None else ():
            why = runconfig.never_forwarded(name)
            if why:
                raise GpuqError(f"forward_env: {name} is {why}; gpuq never sends it to a host (sweep "
                                f"{spec.queue_id}: cancel it and submit again without it)")
            if not runconfig.is_allowed(name, allowed):
                raise GpuqError(f"forward_env: {name} is not in your forward_env_allow (sweep {spec.queue_id}); "
                                f"add it to $GPUQ_HOME/config.toml or GPUQ_FORWARD_ENV_ALLOW, or cancel the sweep "
                                "(the job stays queued)")
            if name not in environ:
                raise GpuqError(f"forward_env: {name} is not set in the controller's environment; export it "
                                "and run the command again (the job stays queued)")
            secrets.setdefault(spec.queue_id, {})[name] = environ[name]
    documents = [spec.as_document() for spec in specs]
    if not secrets:
        return json.dumps(documents).encode()
    return json.dumps({"specs": documents, "secrets": secrets}).encode()


def _serve_args(host: Host, settings: Settings) -> list[str]:
    return ["--idle-exit-s", str(settings.agent_idle_exit_s), *host.agent_flags]


def ensure_agent(host: Host, bundle_sha: str, settings: Settings) -> str:
    """Start the host's agent unless one runs (the agent's flock makes this safe to repeat)."""
    result = client.run(host, bundle_sha, "serve", "--detach", *_serve_args(host, settings), timeout=90)
    if result.exit_code != 0:
        raise AgentError(f"host {host.name}: the agent did not start: {result.stderr.strip()[-300:]}")
    return result.stdout.strip()


def enqueue(host: Host, bundle_sha: str, specs: Sequence[OutboundSpec], settings: Settings) -> Verdicts:
    """Write specs into the host's inbox (idempotent) and make sure its agent runs.

    Returns the agent's verdict per job id ("queued", "exists").
    """
    # [data] first: a killed sync resumes on re-delivery
    datasync.sync_data(host, [spec.data for spec in specs], settings.home)
    # a Slurm login node runs one sbatch per spec inside this call: allow for each of them
    result = client.run(host, bundle_sha, "enqueue", "--serve", *_serve_args(host, settings),
                        stdin=enqueue_payload(specs, allowed=settings.forward_env_allow),
                        timeout=60 + ENQUEUE_S_PER_SPEC * len(specs))
    if result.exit_code != 0:
        raise AgentError(f"host {host.name}: the agent refused the jobs: {result.stderr.strip() or result.stdout}")
    return host_documents.read_verdicts(host.name, result.stdout)  # ProtocolError: this host only


def record_attempts(ledger: Ledger, host: str, bundle_sha: str, jobs: Sequence[Job],
                    settings: Settings) -> list[OutboundSpec]:
    """Record attempt n of each job on ``host`` (ledger first: exactly-once; one transaction for the
    whole delivery) and build their specs.

    A job that is no longer QUEUED when its attempt is recorded (a concurrent `gpuq watch` or
    `gpuq status` started it) is left out: it gets no spec, so it is never enqueued twice.

    The host runs its inbox in ``created_at`` order, so specs get increasing times in the
    order given (the scheduler's planned start order).
    """
    now = time.time()
    specs = []
    row = ledger.host(host)
    sweeps = {sweep_id: ledger.sweep(sweep_id) for sweep_id in dict.fromkeys(job.sweep_id for job in jobs)}
    jobs = [job for job in jobs if run_readable(ledger, job, sweeps[job.sweep_id])]
    started = ledger.start_attempts([job.id for job in jobs], host=host, bundle_sha=bundle_sha)  # one transaction
    waiting = ledger.dependencies(job.id for job in jobs)
    for index, job in enumerate(jobs):
        attempt = started[job.id]
        if isinstance(attempt, IllegalTransition):  # another gpuq command started it since our QUEUED read
            ledger.record_event("job", job.id, f"not started on {host}: {attempt}; it was started elsewhere "
                                "meanwhile", unless_repeated=True)
            continue
        specs.append(attempt_spec(ledger, job, attempt, settings, host=host, created_at=now + index * 1e-3,
                                  sweep=sweeps[job.sweep_id], row=row, waits=job.id in waiting))
    return specs


def run_readable(ledger: Ledger, job: Job, sweep: Sweep | None) -> bool:
    """False, with an event on the job (it stays QUEUED), when its sweep's stored [run] cannot be read."""
    run = sweep.run_config() if sweep is not None else None
    if sweep is None or run is None or not run.unreadable:
        return True
    ledger.record_event("job", job.id, f"not started: {unreadable_run(sweep.id, run.unreadable)}", unless_repeated=True)
    return False


def on_each_host(work: Sequence[tuple[Host, Callable[[], object]]]) -> dict[str, str]:
    """Run one call per host, hosts in parallel; returns {host: error} for the calls that failed."""
    def one(item: tuple[Host, Callable[[], object]]) -> tuple[str, str]:
        host, call = item
        try:
            call()
        except GpuqError as exc:
            return host.name, str(exc)
        return host.name, ""

    if len(work) <= 1:
        results = [one(w) for w in work]
    else:
        with ThreadPoolExecutor(max_workers=min(8, len(work))) as pool:
            results = list(pool.map(one, work))
    return {name: err for name, err in results if err}


def push_all(hosts: Sequence[Host], bundle: Bundle, pushed: list[str] | None = None) -> dict[str, str]:
    """Place the bundle on every host in parallel; returns {host: error} for those that failed.

    ``pushed`` collects the hosts that lacked the bundle and received its bytes.
    """
    def push(host: Host) -> None:
        if ensure_bundle(host, bundle) and pushed is not None:
            pushed.append(host.name)

    return on_each_host([(host, partial(push, host)) for host in hosts])


def deliver_all(ledger: Ledger, hosts: Mapping[str, Host], bundle_sha: str, by_host: Mapping[str, Sequence[Job]],
                settings: Settings) -> dict[str, str]:
    """Record attempts (ledger, this thread), then enqueue on every host in parallel.

    Returns {host: error} for hosts whose enqueue failed: their attempts stay STARTING and the
    next reconcile re-delivers them (the agent's enqueue is idempotent), so a lost reply can
    never make a job run twice.
    """
    work: list[tuple[Host, Callable[[], object]]] = []
    for name, jobs in by_host.items():
        if jobs:
            ledger.update_host(name, agent_bundle=bundle_sha)
            specs = record_attempts(ledger, name, bundle_sha, jobs, settings)
            if not specs:
                continue
            work.append((hosts[name], partial(enqueue, hosts[name], bundle_sha, specs, settings)))
    return on_each_host(work)
