"""The documents that cross the wire between the controller and a host's agent: how each is framed on
stdout, and what each JSON document holds, field by field (their schema names and versions are
``protocol.py``'s, with the rest of the host contract; docs/host-protocol.md says how they are used).
The agent's copy of the framing lines is ``payload/agent/gpuq_base/gpuq_protocol.py``."""

from __future__ import annotations

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
