"""The host contract shared by the controller, the host agent and the payload.

This module is the single source of truth for what crosses the wire between
``gpuq`` (the controller) and a host: the remote directory layout, the job
spec schema, the environment a job receives, the heartbeat/exit records and
the exit-code meanings.  The host agent (``payload/agent/gpuq_base/gpuq_protocol.py``)
and the payload helper (``payload/gpuq_payload/contract.py``) carry copies,
because they must run with nothing but the Python standard library on a
rented box; ``tests/unit/test_protocol_copies.py`` asserts the copies agree.

What each JSON document holds, field by field, and how a document is framed on stdout, is
``documents.py``; which file names may travel (the rule the agent shares) is ``filenames.py``.

Versioning: ``PROTOCOL_VERSION`` is ``MAJOR.MINOR``.  A minor bump adds
optional fields; a major bump changes meaning.  An agent refuses a job spec
whose major version is newer than its own, with a clear error.

Remote layout (one root per host, the profile's data dir)::

    $GPUQ_ROOT/
      agent.lock agent.pid agent.log agent.out   one host agent per root (flock)
      bundles/<sha256>/                           immutable, content-addressed
        payload/   train.py gpuq_payload/ agent/
        workdir/   the user's queue directory (configs)
      inbox/<job_id>.json          written by the controller via tmp + rename
      claimed/<job_id>.json        the agent claims by rename inbox -> claimed
      withdrawn/<job_id>.json      the controller withdrew (cancel / steal) by rename
      jobs/<job_id>/spec.json      frozen copy of the spec of the newest attempt
      jobs/<job_id>/cancel         cancel request (its presence is the request)
      jobs/<job_id>/ckpt/          latest-<step>.pt best.pt LATEST (single writer; LATEST names the rolling file)
      jobs/<job_id>/attempts/<n>/  launch.json run.env job.log pgid heartbeat
                                   wrapper.alive mem.tsv trainer_exit.json exit.json
                                   outputs.json (the end record of an attempt that ended well)
      jobs/<job_id>/result/        metrics.jsonl summary.json
      jobs/<job_id>/run/           the trainer's working directory for every attempt on this host
                                   (GPUQ_RUN_DIR): each top-level entry of the bundle's workdir is a
                                   symlink into the read-only bundle, except names that begin an
                                   `outputs`/`checkpoint` glob; what the job writes is real and its own
      setup/<setup_key>.lock       flock: one setup run per host and setup_key
      setup/<setup_key>/           ok.json | failed.json, setup.log
      bundles/.setup/<setup_key>/  project/ (the hook's cwd, a copy of the project), products.json
      bundles/.prepared/<sha>-<key>/  the project as the hook left it, read-only: what jobs link
      bundles/.data/               [data]: chunks/, files/<sha256>, trees/<tree>/ (transfer/datasync.py)
      secrets/<queue_id>.json      forwarded env values (0600, dir 0700); deleted once no job of that
                                   queue is queued, claimed or running here (by the serving agent, by
                                   cancel/withdraw, or by status on a Slurm login node)
      jobs/<job_id>/MANIFEST.json  what `gpuq pull` fetches and verifies (agent verb `manifest`)
"""

from __future__ import annotations

PROTOCOL_VERSION = "1.1"
SPEC_SCHEMA = "gpuq.job/1"  # an agent refuses a newer major: exit.json, wrapper code 80
STATUS_SCHEMA = "gpuq.status/1"
MANIFEST_SCHEMA = "gpuq.manifest/1"  # jobs/<job_id>/MANIFEST.json (agent verb `manifest`)
HEALTH_SCHEMA = "gpuq.health/1"  # agent verb `health` (GPU preflight, docs/health.md)
REAP_SCHEMA = "gpuq.reap/1"  # agent verb `reap` (VRAM zombies, docs/health.md)
OUTPUTS_SCHEMA = "gpuq.outputs/1"  # attempts/<n>/outputs.json (the wrapper, as an attempt ends well)

# --- layout (relative to GPUQ_ROOT) -------------------------------------------------
AGENT_LOCK = "agent.lock"
RETRY_LOCK = "retry.lock"  # the agent's retry and the controller's decide-retry never interleave
AGENT_PID = "agent.pid"
AGENT_LOG = "agent.log"
AGENT_OUT = "agent.out"
BUNDLES_DIR = "bundles"
INBOX_DIR = "inbox"
CLAIMED_DIR = "claimed"
WITHDRAWN_DIR = "withdrawn"
JOBS_DIR = "jobs"
CACHE_DIR = "cache"
QUARANTINE_DIR = "quarantine"
SETUP_DIR = "setup"  # setup/<setup_key>/{ok.json,failed.json,setup.log} + <key>.lock (gpuq_setup.py)
SECRETS_DIR = "secrets"  # secrets/<queue_id>.json (0600, dir 0700): forwarded env values

# per job (relative to jobs/<job_id>/)
SPEC_FILE = "spec.json"
CANCEL_FILE = "cancel"
CKPT_DIR = "ckpt"
ATTEMPTS_DIR = "attempts"
RESULT_DIR = "result"
RUN_DIR = "run"  # the trainer's working directory (docs/your-project.md)
JOB_MANIFEST_FILE = "MANIFEST.json"  # written by the agent's `manifest` verb for `gpuq pull`

# per attempt (relative to jobs/<job_id>/attempts/<n>/)
LAUNCH_FILE = "launch.json"
RUN_ENV_FILE = "run.env"
JOB_LOG = "job.log"
PGID_FILE = "pgid"
HEARTBEAT_FILE = "heartbeat"
WRAPPER_ALIVE = "wrapper.alive"
MEM_FILE = "mem.tsv"
PROVENANCE_FILE = "provenance.json"  # GPUs, driver, CUDA, torch, NCCL, Python the attempt ran with
EXIT_FILE = "exit.json"
TRAINER_EXIT_FILE = "trainer_exit.json"  # {"code", "rank", "message"}: first writer wins
NEXT_FILE = "next.json"  # who starts attempt n+1: {"by": "host"|"controller", ...} (gpuq_retry.py)
STACKS_FILE = "stacks.txt"  # where each process waited, saved before a stall kill (agent `stacks`)
OUTPUTS_FILE = "outputs.json"  # the end record: path, bytes, sha256 of every result file (gpuq_outputs.py)
OUTPUTS_MAX_FILES = 20_000  # files one end record lists (more: it records why not, and no file)
OUTPUTS_MAX_PATH = 1024  # characters of one path it lists

# checkpoint directory
LATEST_POINTER = "LATEST"
LATEST_CKPT = "latest.pt"
BEST_CKPT = "best.pt"

# result directory
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"

# bundle layout (relative to bundles/<sha>/)
BUNDLE_PAYLOAD = "payload"
BUNDLE_WORKDIR = "workdir"
BUNDLE_MANIFEST = "MANIFEST.json"
AGENT_ENTRY = "payload/agent/gpuq_agent.py"
TRAIN_ENTRY = "payload/train.py"

# --- exit codes (docs/host-protocol.md) ---------------------------------------------
EXIT_OK = 0
EXIT_TRANSIENT = 3
EXIT_CONFIG = 4
EXIT_SETUP = 80
EXIT_DISK_GATE = 81
EXIT_FINALIZE = 82
EXIT_SIGNAL_BASE = 128

EXIT_MEANINGS: dict[int, str] = {
    EXIT_OK: "trained",
    EXIT_TRANSIENT: "transient failure, safe to resume",
    EXIT_CONFIG: "configuration error (never retried)",
    EXIT_SETUP: "setup failed before training",
    EXIT_DISK_GATE: "disk gate refused; nothing ran",
    EXIT_FINALIZE: "training exited 0 but artifact verification failed",
}

# agent CLI exit codes
AGENT_EXIT_USAGE = 64
AGENT_EXIT_HEALTH_FAIL = 2  # `health` verdict FAIL: do not launch (0 = PASS or WARN)
AGENT_EXIT_REAP_FAILED = 1  # `reap`: no device nodes, no fuser/lsof, or a kill failed

# kernel log and reaping (docs/health.md)
FATAL_XIDS = (48, 79)  # double-bit ECC, fell off the bus: host unhealthy
KERNEL_MAX_XIDS = 50  # Xid records per document (fatal ones kept first)
KERNEL_MAX_OOM_KILLS = 20  # OOM-killer records per document (the newest)
REAP_MIN_AGE_S = 120  # a holder younger than this may still be starting its context
REAP_RESAMPLE_S = 60  # a zombie must be seen in two samples this far apart

# --- environment a job receives (docs/host-protocol.md) -----------------------------
ENV_JOB_ID = "GPUQ_JOB_ID"
ENV_JOB_NAME = "GPUQ_JOB_NAME"
ENV_QUEUE_ID = "GPUQ_QUEUE_ID"
ENV_ATTEMPT = "GPUQ_ATTEMPT"
ENV_CONFIG = "GPUQ_CONFIG"
ENV_TASK = "GPUQ_TASK"
ENV_EPOCHS = "GPUQ_EPOCHS"
ENV_SEED = "GPUQ_SEED"
ENV_CKPT_DIR = "GPUQ_CKPT_DIR"
ENV_RESULT_DIR = "GPUQ_RESULT_DIR"
ENV_LOG = "GPUQ_LOG"
ENV_HEARTBEAT = "GPUQ_HEARTBEAT"
ENV_HEARTBEAT_S = "GPUQ_HEARTBEAT_S"
ENV_RESUME_FROM = "GPUQ_RESUME_FROM"
ENV_CKPT_INTERVAL_S = "GPUQ_CKPT_INTERVAL_S"
ENV_DURABLE_DIR = "GPUQ_DURABLE_DIR"
ENV_SPEC_HASH = "GPUQ_SPEC_HASH"
ENV_BUNDLE_SHA = "GPUQ_BUNDLE_SHA"
ENV_EXIT_FILE = "GPUQ_EXIT_FILE"  # the payload records a deliberate exit code here
ENV_DEVICE = "GPUQ_DEVICE"  # "cuda" or "cpu": what the slots of this attempt are
ENV_RUN_DIR = "GPUQ_RUN_DIR"  # the job's run dir (its cwd)
ENV_SIGTERM_GRACE_S = "GPUQ_SIGTERM_GRACE_S"  # seconds from SIGTERM to SIGKILL for the trainer; "" = unknown

JOB_ENV_NAMES = (
    ENV_JOB_ID, ENV_JOB_NAME, ENV_QUEUE_ID, ENV_ATTEMPT, ENV_CONFIG, ENV_TASK, ENV_EPOCHS,
    ENV_SEED, ENV_CKPT_DIR, ENV_RESULT_DIR, ENV_LOG, ENV_HEARTBEAT, ENV_HEARTBEAT_S,
    ENV_RESUME_FROM, ENV_CKPT_INTERVAL_S, ENV_DURABLE_DIR, ENV_SPEC_HASH, ENV_BUNDLE_SHA,
    ENV_DEVICE, ENV_EXIT_FILE, ENV_SIGTERM_GRACE_S,
)

DEFAULT_HEARTBEAT_S = 30
DEFAULT_CKPT_INTERVAL_S = 600
DEFAULT_KILL_GRACE_S = 30
# `kill JOB N` of an attempt whose stall the host's agent already retried itself (gpuq_stall.py): the first
# words of its line; the controller then records the host's retry at its next look, never its own kill
KILL_HOST_RETRIED = "retried by the host"

# --- markers ------------------------------------------------------------------------
RESUMED_MARKER = "GPUQ_RESUMED"  # payload logs: GPUQ_RESUMED step=<s> epoch=<e> sha256=<h>


def end_record_path(attempt: int) -> str:
    """Attempt ``attempt``'s end record (``OUTPUTS_FILE``), relative to ``jobs/<job_id>/``."""
    return f"{ATTEMPTS_DIR}/{attempt}/{OUTPUTS_FILE}"
