"""The host agent's copy of the contract in ``orchestrator/core/protocol.py``.

Standard library only, Python >= 3.8.  Same names, same values as the
controller's module; ``tests/unit/test_protocol_copies.py`` compares them.
Read ``orchestrator/core/protocol.py`` for the documentation of every document.
"""

from __future__ import annotations

PROTOCOL_VERSION = "1.1"
SPEC_SCHEMA = "gpuq.job/1"
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

# Every document the agent prints for the controller sits between these two lines, so shell start-up
# output around it (an `echo` in ~/.bashrc, a conda banner) is ignored (docs/host-protocol.md).
DOCUMENT_BEGIN = "-----BEGIN GPUQ DOCUMENT-----"
DOCUMENT_END = "-----END GPUQ DOCUMENT-----"

# --- JSON documents -----------------------------------------------------------------
#
# Job spec (inbox/<job_id>.json, then claimed/, then jobs/<job_id>/spec.json):
#   schema        "gpuq.job/1"       an agent refuses a newer major (exit 65, clear message)
#   job_id name queue_id             identity (job_id = "c" + 12 hex)
#   attempt       int >= 1           the attempt this spec launches
#   task epochs gpus nodes seed      seed is null when the queue line has no seed=
#   config        str                POSIX path relative to bundles/<sha>/workdir/
#   bundle_sha    str                bundles/<bundle_sha>/ must exist on the host
#   entry         str                trainer path relative to the bundle root ("payload/train.py")
#   launcher      "torchrun"|"python" torchrun: python -m torch.distributed.run --standalone
#                                    --nnodes=1 --nproc-per-node=<gpus> <entry> ...; python: <entry> ...
#   python        str                interpreter for the wrapper/trainer ("" = the agent's own)
#   verify        list[str]          finalize checks: "metrics" (result/metrics.jsonl parses, non-empty),
#                                    "best_ckpt" (ckpt/best.pt loads with torch weights_only=True)
#   heartbeat_s ckpt_interval_s kill_grace_s min_free_gb scratch_gb durable_dir resume_from
#   spec_hash     str                identity hash (docs/queue.md)
#   env           dict[str,str]      extra run.env entries (never secrets)
#   created_at    float              UTC epoch seconds
#   retry         {"left", "on", "signals", "deadlock_left", "stall_after_s", "startup_grace_s",
#                 "start_stall_after_s"} or absent: what this agent may retry itself (gpuq_retry.py,
#                 gpuq_stall.py: the stall limits are the controller's patrol's)
#   started_by    "host" when this agent wrote the spec itself as attempt n+1 (a host retry)
#
# Trainer arguments: <entry> --config <abs config path> --task <task> --epochs <epochs>
#
# Heartbeat ($GPUQ_HEARTBEAT, written atomically by rank 0):
#   {"time", "step", "total_steps", "epoch", "epochs", "loss", "lr", "phase": "train"|"eval"|"done",
#    "steps_per_s"}
#
# LATEST pointer (ckpt/LATEST): {"file", "step", "epoch", "sha256", "bytes", "written_at"}
#
# result/metrics.jsonl: one JSON object per line; train lines {"kind": "train", "step", "epoch",
#   "loss", "lr", "time"}; eval lines {"kind": "eval", "step", "epoch", "val_loss", "val_acc", "time"}
# result/summary.json: {"metric": "val_acc", "mode": "max", "final": {...eval line...},
#   "best": {...eval line...}, "weights_sha256", "world_size", "effective_batch", "steps"}
#
# pgid (attempt dir): {"pgid", "start_ticks", "boot_id"}  start_ticks = field 22 of /proc/<pgid>/stat
#
# exit.json (attempt dir, written atomically last): {"job_id", "attempt", "wrapper_code",
#   "trainer_code", "signal", "phase": "setup"|"gate"|"train"|"finalize", "started_at", "ended_at",
#   "last_step", "last_epoch", "best_sha256", "durable": "disabled"|"synced"|"failed", "message",
#   "wrapper_signal" (the signal the wrapper itself received, else null: a stop from outside),
#   "vanished" (only in a record the agent wrote: true, the wrapper's whole group died, e.g. kill -9)}
#
# Status document (`gpuq_agent.py --root R status --json`, schema "gpuq.status/1"): one object
#   {"schema", "protocol", "hostname", "root", "time", "boot_id", "uptime_s",
#    "agent": {"alive", "pid"},
#    "slots": {"kind": "gpu"|"cpu", "total", "free"},
#    "gpus": [{"index", "name", "uuid", "util_pct", "mem_used_mib", "mem_total_mib", "temp_c"}],
#    "disk": {"path", "total_bytes", "free_bytes", "used_pct", "inodes_total", "inodes_free",
#             "inodes_used_pct"},
#    "memory": {"source", "used_bytes", "limit_bytes", "used_pct", "oom_kill"},
#    "bundles": [sha, ...],
#    "jobs": [{"job_id", "name", "queue_id", "attempt", "state", "slots", "pgid", "group_alive",
#              "launched_at", "exit", "heartbeat", "heartbeat_age_s", "log_bytes", "log_mtime",
#              "ckpt", "cancel_requested"}],
#    "kernel": {"readable", "error", "cursor", "xids": [{"ts", "code", "pci", "line"}]}}
#   job "state": "queued" (in inbox) | "withdrawn" | "claimed" (claimed, not yet launched) |
#                "running" (group alive) | "exited" (exit.json present) | "dead" (launched, group
#                gone, no exit.json)
#   "kernel" (gpuq_kernel.py): the kernel log read with `dmesg` (5 s timeout; `journalctl -k -o
#   short-monotonic` only where dmesg is not installed).  "readable" false (with "error", e.g. "dmesg:
#   read kernel buffer failed: Operation not permitted") means Xids are unknown, never "none".
#   "cursor" is the monotonic timestamp (string, as printed) of the last kernel line seen; pass it back
#   as `status --json --kernel-since CURSOR` (or "BOOT_ID:CURSOR") and "xids" holds only Xid lines
#   after it.  A cursor of another boot, or one past this boot's uptime, is ignored (all lines new).
#   Unreadable or empty logs return the cursor they were given.  Each Xid: {"ts": float (null when
#   the line has no timestamp), "code": int, "pci": "0000:3b:00", "line": str <= 400 chars};
#   at most KERNEL_MAX_XIDS (50), the fatal ones (FATAL_XIDS: 48, 79) kept first, in log order.
#   "oom_kills" (only when the OOM killer struck after the cursor): [{"ts", "pid", "line"}], at most
#   KERNEL_MAX_OOM_KILLS (20), the newest: evidence that a signal death was a host OOM.
#
# Health document (`gpuq_agent.py --root R health [--gpus 0,1] [--samples 5] [--python PY]
#   [--min-free-gb X] [--kernel-since CURSOR] [--gpu-model NAME ...] [--min-gpu-mem-mib MIB]`, schema
#   "gpuq.health/1", gpuq_health.py, docs/health.md): one object
#   {"schema", "verdict": "pass"|"warn"|"fail", "host", "time", "root",
#    "checks": [{"check", "status": "pass"|"warn"|"fail", "detail"}],
#    "gpus": [{"index", "name", "uuid", "pci_bus_id", "memory_total_mib", "memory_used_mib", "temp_c",
#              "temp_max_c", "sm_clock_mhz", "sm_clock_max_mhz", "throttle": [reason...], "ecc_mode",
#              "ecc_corrected", "ecc_uncorrected", "ecc_corrected_rising", "retired_pages_pending",
#              "remapped_rows_failure", "samples", "gpuq_job" (the live attempt's job id, or null)}],
#    "kernel": {...as in the status document...}}
#   checks, in this order: tooling identity visibility driver kernel throttle heat ecc busy disk
#   inodes shm.  The verdict is the worst status.  A host without nvidia-smi and without expected
#   GPUs (no --gpus, no GPU slots in agent.pid, no /dev/nvidiaN) is a CPU host: its GPU checks
#   pass with detail "no GPUs (cpu slots)".  Findings also go to stderr.  Exit 0 (pass or warn:
#   launch allowed), 2 (AGENT_EXIT_HEALTH_FAIL: do not launch), 64 (usage).
#
# Reap document (`gpuq_agent.py --root R reap [--force] [--min-age-s 120] [--resample-s 60]
#   [--include-other-users]`, schema "gpuq.reap/1", gpuq_reap.py, docs/health.md): one object
#   {"schema", "clean": bool, "dry_run": bool, "host", "time", "devices": [/dev/nvidia* nodes],
#    "tool": "fuser"|"lsof", "candidates": [{"pid", "user", "comm", "age_s", "devices", "cmdline"
#    (secret-looking values redacted)}], "killed": [{"pid", "outcome": "terminated"|"killed"|"gone"|
#    "failed: ..."}], "excluded": {reason: count}, "notes": [str], "memory_used_mib" (--force only:
#    {"before", "after"}: {gpu index: MiB}), "error" (only when it could not look)}
#   Candidates hold a /dev/nvidia* node, are not listed by nvidia-smi, not in a live agent/attempt
#   tree of this root, not a system daemon, older than --min-age-s, this user's (unless
#   --include-other-users), and seen in two samples --resample-s apart with the same start time.
#   Pids are the host's (the reaper's PID namespace).  Dry run unless --force (SIGTERM, 10 s,
#   SIGKILL).  Exit 0; 1 (AGENT_EXIT_REAP_FAILED) for no device nodes, no fuser/lsof, or a failed
#   kill; 64 usage.
