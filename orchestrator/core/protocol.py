"""The host contract shared by the controller, the host agent and the payload.

This module is the single source of truth for what crosses the wire between
``gpuq`` (the controller) and a host: the remote directory layout, the job
spec schema, the environment a job receives, the heartbeat/exit records and
the exit-code meanings.  The host agent (``payload/agent/gpuq_base/gpuq_protocol.py``)
and the payload helper (``payload/gpuq_payload/contract.py``) carry copies,
because they must run with nothing but the Python standard library on a
rented box; ``tests/unit/test_protocol_copies.py`` asserts the copies agree.

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
    EXIT_OK: "trained, artifacts verified",
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
#   schema        "gpuq.job/1"       an agent refuses a newer major (see below)
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
#   sigterm_grace_s  float (optional; only for spot hosts): seconds between the platform's SIGTERM and
#                    its SIGKILL (the profile's spot.grace_s, RunPod ~5); the wrapper passes
#                    min(sigterm_grace_s, kill_grace_s) as GPUQ_SIGTERM_GRACE_S
#   spec_hash     str                identity hash (docs/queue.md)
#   env           dict[str,str]      extra run.env entries (never secrets)
#   created_at    float              UTC epoch seconds
#   args          list[str]          (1.1, optional) the queue line's trainer arguments after `--`,
#                                    grid-expanded, literal (no placeholders); [] when none
#   run           null | object      (1.1, optional) the project's [run] table (gpuq.toml); null/absent:
#                                    the legacy payload argv below.  {"command": list[str] template
#                                    elements ([] = the payload's own command, still followed by args
#                                    and resume_args), "launcher": "torchrun"|"python"|"none",
#                                    "resume_args": list[str], "checkpoint": list[str] globs, "outputs":
#                                    list[str] globs (relative to the run dir), "metrics": str, "metrics_regex":
#                                    str, "metric": str, "mode": "max"|"min", "progress": str regex, "setup":
#                                    str, "setup_key": sha256 hex ("" = no setup), "forward_env": list[str]
#                                    NAMES (values travel beside the specs in the `enqueue` stdin object,
#                                    {"specs": [...], "secrets": {queue_id: {NAME: value}}}, never in a spec)}
#                                    argv: payload/agent/gpuq_base/gpuq_argv.py job_argv(...)
#   retry         null | object      (optional) what the host's agent may retry by itself (gpuq_retry.py,
#                                    docs/checkpoints.md "Who retries what"): {"left": int >= 1 (retries=
#                                    less the attempts that already counted), "on": classes ("killed",
#                                    "host_oom", "vanished", "stalled", "deadlock_at_start"), "signals": [int]
#                                    (the trainer's signal deaths it retries), "deadlock_left": 0|1 (a stall
#                                    before the first step may still be retried once), "stall_after_s",
#                                    "startup_grace_s", "start_stall_after_s" (the patrol's limits: the agent
#                                    heals a stall itself, gpuq_stall.py)}; absent: the controller settles
#                                    every end (no retries left, a multi-node job, a budget, a held host, a
#                                    Slurm host)
#   started_by    "host" (optional)  the host's agent wrote this spec itself as attempt n+1 (a host retry)
#
# Trainer arguments: <entry> --config <abs config path> --task <task> --epochs <epochs>
# A spec whose schema major is newer than the agent's is refused: its exit.json carries wrapper
# code 80 (setup) with a message naming both schemas.
#
# Heartbeat ($GPUQ_HEARTBEAT, written atomically by rank 0):
#   {"time", "step", "total_steps", "epoch", "epochs", "loss", "lr", "phase": "train"|"eval"|"done",
#    "steps_per_s"}   epoch is 1-based (the epoch being trained); loss is null when not finite
#
# LATEST pointer (ckpt/LATEST): {"file", "step", "epoch", "sha256", "bytes", "written_at"}; "file" is the
#   rolling checkpoint latest-<step:09d>.pt: every save writes a new name, moves the pointer, then
#   deletes older rolling files, so the file LATEST names is never rewritten in place
#
# result/metrics.jsonl: one JSON object per line; train lines {"kind": "train", "step", "epoch",
#   "loss", "lr", "time"}; eval lines {"kind": "eval", "step", "epoch", "val_loss", "val_acc", "time"}
# result/summary.json: {"metric": "val_acc", "mode": "max", "final": {...eval line...},
#   "best": {...eval line...}, "weights_sha256", "world_size", "effective_batch", "steps"}
#   A project's own trainer (spec "run" with "metrics", gpuq_runmetrics.py): the agent writes the
#   same shape from the project's metrics at `collect`/`manifest`: {"metric" (run.metric, "" ->
#   "val_acc"), "mode", "final": {..the last row that has the metric.., "step"}, "best": {..the row
#   with the best finite value by mode.., "step"} (null when no finite value), "steps" (the largest
#   step, else epoch, else row index), "rows", "source": "run/<metrics file>"|"log"}.  Rows: a CSV
#   with a header (empty cells left out, a repeated header skipped), JSON lines, or the named groups
#   of run.metrics_regex over every attempt's job.log; at most 64 MiB read (a bigger file: its header
#   and newest bytes).  Cells are numbers when they parse, NaN/inf as strings (strict JSON); "step" is
#   the row's step/global_step/epoch column, else its index.  `status --results-for` computes it
#   without writing (the probe is read-only).
#
# pgid (attempt dir): {"pgid", "start_ticks", "boot_id"}  start_ticks = field 22 of /proc/<pgid>/stat
#   (written by the agent right after spawning and again by the wrapper, same content)
# launch.json (attempt dir, written before the wrapper is spawned): {"time", "slots", "kind",
#   "total_slots", "agent_pid", "index", "count"}; its presence means "this attempt was launched":
#   a relaunch of the same attempt is refused, so no attempt ever runs twice.
# agent.pid (root): {"pid", "pgid", "start_ticks", "boot_id", "started_at", "protocol",
#   "slots": {"kind", "ids"}}
# Times in agent-written documents (launch.json, exit.json, status "time") are ISO-8601 UTC with
# milliseconds ("2026-11-21T20:12:37.123Z"); the payload's heartbeat and LATEST carry epoch floats.
#
# Agent verbs the controller uses (one round trip each):
#   status --json | enqueue [--serve ...] (JSON list of specs on stdin, or {"specs", "secrets"}; idempotent) |
#   collect JOB_ID... (summary + sha256 of result files and best.pt) | cancel JOB_ID... |
#   manifest JOB_ID... (build jobs/<id>/MANIFEST.json of jobs that exited 0; gpuq_manifest.py) |
#   snapshot JOB_ID (hard-link the checkpoint LATEST names to ckpt/.ship.pt and print the pointer plus
#   "snapshot": "ckpt/.ship.pt"; the controller copies the link, verifies it and removes it; for a
#   spec with run.checkpoint: the job's newest own checkpoint under run/ (gpuq_own.py: a real file, a
#   link to one of its files, or a complete directory), a file printed as {"file": "run/<rel>", "sha256",
#   "bytes", "mtime", "step": null, "snapshot": "ckpt/.ship.pt"}, a directory copied to ckpt/.ship.d/ and
#   printed with "dir": true, "files": [{"path", "bytes", "sha256"}], "sha256" (their tree hash,
#   tree_sha256 below), "snapshot": "ckpt/.ship.d"; what changes while it is copied is read again;
#   exit 1 with the reason on stderr when nothing matches) |
#   kill JOB_ID ATTEMPT (kill one attempt's group, identity-checked, without a cancel file: a stalled
#   attempt the patrol will run again as attempt n+1; prints "killed" or why not, exit 0 only if killed) |
#   stacks JOB_ID ATTEMPT (before a stall kill: where each process of the attempt's recorded group and
#   its leader's descendants waits, to attempts/<n>/stacks.txt (gpuq_stacks.py): py-spy dump when py-spy
#   is on PATH, else /proc's kernel stack, wait channel, state and cmdline; bounded, redacted; prints one
#   line saying what it saved, exit 0 only if it saved the file)
#   status --scan JOB_ID:ATTEMPT:LOG_OFFSET:METRICS_OFFSET ...: each named job's entry gains "scan"
#   (gpuq_scan.py): {"attempt", "log_from", "log_to", "log_skipped", "hits": [{"signature", "line"}],
#   "traceback": [<= 50 lines], "metrics_to", "nonfinite": [{"step", "epoch", "kind", "field", "value"}],
#   "from_scratch" (only when the wrapper's "gpuq: restarted from scratch: ..." line is among the new bytes)};
#   a running job whose spec has run.metrics also gets, in "nonfinite", each loss whose newest value in its
#   own metrics is NaN or infinite ("kind": the source, "run/<file>" or "log"; gpuq_nonfinite.py);
#   every launched job's entry carries "boot_id" (the boot its attempt started in)
#   an entry whose attempt is newer than the one its --scan names carries "host_retried": [{"attempt": k,
#   "exit": attempt k's exit.json, "class", "why", "time"}] for each attempt k (from the scanned one on) the
#   host's agent retried itself, oldest first (gpuq_retry.chain): the controller records them as its own |
#   decide-retry JOB_ID:ATTEMPT... (before the controller settles an ended attempt: under retry.lock, the
#   attempt's next.json as it stands, written {"by": "controller"} when absent; prints {job_id: {"by":
#   "host"|"controller", "attempt": n+1 or null, ...}}: "host" means the agent already started attempt n+1)
#
# MANIFEST.json (jobs/<job_id>/, schema "gpuq.manifest/1", rebuilt atomically on each `manifest`):
#   {"schema", "job_id", "queue_id", "attempt", "created_at", "total_files", "total_bytes",
#    "files": [{"path", "bytes", "sha256"}]}   paths relative to jobs/<job_id>/, POSIX, sorted:
#   result/** , ckpt/best.pt, attempts/<n>/job.log (when present), attempts/<n>/exit.json
#   For a spec with "run" (a project's own trainer): result/** when present (with the summary.json the
#   agent writes from run.metrics), "run/<rel>" for everything of the job's own under run/ an "outputs"
#   or "checkpoint" glob matches (`*`/`?` within a path component, `**` across them; every file of a
#   matched directory; a link to one of its own files as that file; never a link into the project or a
#   file under a symlinked dir; *.tmp left out), the run.metrics file, ckpt/best.pt only when present
#   (never required), and the attempt's job.log and exit.json.  A match that cannot travel (a name
#   name_problem refuses, a link out of run/, a FIFO) is an error entry naming it: no manifest.
#   `manifest` prints {job_id: {"manifest", "sha256" (of the manifest bytes), "attempt", "files",
#   "bytes"} | {"error"}}; exit 0 if any manifest was built, 1 if none, 64 for a malformed roster.
#
# trainer_exit.json (attempt dir, $GPUQ_EXIT_FILE): {"code", "rank", "pid"}, written O_EXCL by the first
#   payload process that exits with a deliberate non-zero code (3, 4, 143, 1 for divergence).
#   torchrun reports any worker failure as a bare 1; the wrapper uses this code instead, so a
#   configuration error (4) is never mistaken for a retryable crash.
#
# exit.json (attempt dir, written atomically last; written by the agent itself when a wrapper it
#   watched died without one): {"job_id", "attempt", "wrapper_code",
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
#              "ckpt", "cancel_requested", "progress", "run_ckpt_mtime", "run_metrics_mtime",
#              "gpu_util_pct"}],
#    "kernel": {"readable", "error", "cursor", "xids": [{"ts", "code", "pci", "line"}]}}
#   job "state": "queued" (in inbox) | "withdrawn" | "claimed" (claimed, not yet launched) |
#                "running" (group alive) | "exited" (exit.json present) | "dead" (launched, group
#                gone, no exit.json)
#   "progress" (running and dead jobs with a log; gpuq_observe.py): null | {"step", "total", "epoch",
#   "epochs", "loss", "pct" (0..100 when a total is known), "line" (the last non-empty log line,
#   escape sequences and control characters removed, <= 200 chars), "source": "regex" (spec
#   run.progress, named groups epoch/step/total/loss; a "total" without "step" counts epochs) |
#   "tqdm" ("12/100 [", or a Rich bar's "━━╸ 12/100") | "pattern" ("epoch 3", "Epoch 3/10", "step 1200",
#   "loss 0.3") | "metrics" (below) | null (only the line)}, from the last 64 KiB of the attempt's
#   job.log; gpuq's own lines there (the wrapper's "=== gpuq ... ===" header, "gpuq: " notes) are skipped.
#   "run_ckpt_mtime": the newest mtime among real files under run/ that spec run.checkpoint globs
#   match (running and dead jobs; null when none; the walk stops after 20,000 entries).
#   "run_metrics_mtime": the same for the files spec run.metrics names (a path or a glob; null for
#   "log", none, or no match).  When the log's tail shows no step or epoch, "progress" takes them (and
#   a loss) from the newest metrics file's last rows, with "source": "metrics".
#   "gpu_util_pct": the highest util_pct among a running job's GPU slots (GPU hosts), else null; shown,
#   never taken as liveness (a hung NCCL collective keeps a GPU at 100%).
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


# --- the file-name rule, shared with the agent (payload/agent/gpuq_records/gpuq_own.py) --------------
# A name travels unless it is unsafe: empty, "." or "..", a path separator, a control character,
# over 255 bytes, not UTF-8.  "=", "+", "@", ",", spaces and leading dots are ordinary
# (Lightning's epoch=19-step=40.ckpt, HF's checkpoint-500/, a DCP dir's .metadata).
MAX_NAME_BYTES = 255
MAX_PATH_PARTS = 32


def name_problem(name: str) -> str | None:
    """Why one path component cannot travel, or None (the agent's gpuq_own.name_problem)."""
    if name in ("", ".", ".."):
        return "an empty, '.' or '..' name"
    if "/" in name or "\\" in name:
        return "a path separator in the name"
    if any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in name):
        return "a control character in the name"
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        return "a name that is not UTF-8"
    if size > MAX_NAME_BYTES:
        return f"a name longer than {MAX_NAME_BYTES} bytes"
    return None


def path_problem(rel: str) -> str | None:
    """Why a relative POSIX path cannot travel, or None."""
    parts = rel.split("/")
    if len(parts) > MAX_PATH_PARTS:
        return f"more than {MAX_PATH_PARTS} levels deep"
    for part in parts:
        why = name_problem(part)
        if why is not None:
            return why
    return None


def end_record_path(attempt: int) -> str:
    """Attempt ``attempt``'s end record (``OUTPUTS_FILE``), relative to ``jobs/<job_id>/``."""
    return f"{ATTEMPTS_DIR}/{attempt}/{OUTPUTS_FILE}"


def tree_sha256(entries: list[tuple[str, int, str]]) -> str:
    """A checkpoint directory's hash from its (path, bytes, sha256) entries: the agent's
    gpuq_own.tree_sha256 (sha256 over "<sha256> <bytes> <path>\\n" lines sorted by path)."""
    import hashlib

    lines = "".join(f"{sha} {size} {path}\n" for path, size, sha in sorted(entries))
    return hashlib.sha256(lines.encode("utf-8")).hexdigest()
