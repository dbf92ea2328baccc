"""Ordered schema migrations, tracked in SQLite's ``PRAGMA user_version``.

Each migration is a function taking a DB-API connection inside one
transaction.  Never edit a released migration: append a new one.  A ledger
whose version is newer than the newest migration was written by a newer
gpuq and is refused rather than silently misread.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Callable

from orchestrator.core.errors import LedgerVersionError
from orchestrator.ledger.frozen_ddl import V1_DDL, V3_DDL, V23_DDL


def _v1_initial(conn: sqlite3.Connection) -> None:
    for statement in V1_DDL:
        conn.execute(statement)


def _v2_ssh_hosts(conn: sqlite3.Connection) -> None:
    """Remote SSH hosts: how to reach them and which host key was trusted."""
    for column in (
        "port INTEGER NOT NULL DEFAULT 22",
        "user VARCHAR NOT NULL DEFAULT ''",
        "key_path VARCHAR NOT NULL DEFAULT ''",
        "host_key VARCHAR NOT NULL DEFAULT ''",
        "train_device VARCHAR NOT NULL DEFAULT ''",
        "disk_free_bytes INTEGER",
        "min_free_gb FLOAT NOT NULL DEFAULT 0",
    ):
        conn.execute(f"ALTER TABLE host ADD COLUMN {column}")
    for column in (
        "hosts VARCHAR NOT NULL DEFAULT ''",
        "entry VARCHAR NOT NULL DEFAULT ''",
        "launcher VARCHAR NOT NULL DEFAULT 'torchrun'",
        "verify VARCHAR NOT NULL DEFAULT 'metrics,best_ckpt'",
    ):
        conn.execute(f"ALTER TABLE sweep ADD COLUMN {column}")


def _v3_pulls(conn: sqlite3.Connection) -> None:
    """`gpuq pull`: one row per pull outcome of a job; the newest says whether it is verified."""
    for statement in V3_DDL:
        conn.execute(statement)


def _v4_health(conn: sqlite3.Connection) -> None:
    """Health: preflight verdicts and holds on hosts, patrol scan offsets on attempts, findings on events."""
    for column in (
        "health VARCHAR NOT NULL DEFAULT ''",
        "health_at FLOAT",
        "health_detail VARCHAR NOT NULL DEFAULT ''",
        "hold_reason VARCHAR NOT NULL DEFAULT ''",
        "probe_failures INTEGER NOT NULL DEFAULT 0",
        "next_probe_at FLOAT",
        "kernel_cursor VARCHAR NOT NULL DEFAULT ''",
        "oom_kill INTEGER",
    ):
        conn.execute(f"ALTER TABLE host ADD COLUMN {column}")
    for column in ("log_scanned INTEGER NOT NULL DEFAULT 0", "metrics_scanned INTEGER NOT NULL DEFAULT 0"):
        conn.execute(f"ALTER TABLE attempt ADD COLUMN {column}")
    for column in ("severity VARCHAR NOT NULL DEFAULT ''", "rule VARCHAR NOT NULL DEFAULT ''",
                   "action VARCHAR NOT NULL DEFAULT ''"):
        conn.execute(f"ALTER TABLE event ADD COLUMN {column}")


def _v5_providers(conn: sqlite3.Connection) -> None:
    """Rented hosts (provider, instance, spot bid, lease state), attempt cost and preemption loss,
    checkpoints shipped to the controller."""
    for column in (
        "provider VARCHAR NOT NULL DEFAULT ''",
        "instance_id VARCHAR NOT NULL DEFAULT ''",
        "spot BOOLEAN NOT NULL DEFAULT 0",
        "bid_per_gpu FLOAT",
        "gpu_type VARCHAR NOT NULL DEFAULT ''",
        "gpu_count INTEGER NOT NULL DEFAULT 0",
        "region VARCHAR NOT NULL DEFAULT ''",
        "lease_state VARCHAR NOT NULL DEFAULT ''",
        "lease_reason VARCHAR NOT NULL DEFAULT ''",
        "lease_changed_at FLOAT",
    ):
        conn.execute(f"ALTER TABLE host ADD COLUMN {column}")
    for column in ("price_per_hour FLOAT", "gpu_share FLOAT NOT NULL DEFAULT 1.0", "resumed_step INTEGER",
                   "lost_step INTEGER"):
        conn.execute(f"ALTER TABLE attempt ADD COLUMN {column}")
    for column in ("durable_path VARCHAR NOT NULL DEFAULT ''", "host VARCHAR NOT NULL DEFAULT ''"):
        conn.execute(f"ALTER TABLE checkpoint ADD COLUMN {column}")


def _v6_run(conn: sqlite3.Connection) -> None:
    """Your own trainer: a job's trainer arguments and cell name, a sweep's [run] table (JSON)."""
    for column in ("args VARCHAR NOT NULL DEFAULT '[]'", "cell VARCHAR NOT NULL DEFAULT ''"):
        conn.execute(f"ALTER TABLE job ADD COLUMN {column}")
    conn.execute("ALTER TABLE sweep ADD COLUMN run VARCHAR NOT NULL DEFAULT ''")


def _v7_replacements(conn: sqlite3.Connection) -> None:
    """A replacement host names the rented host it replaced."""
    conn.execute("ALTER TABLE host ADD COLUMN replaces VARCHAR NOT NULL DEFAULT ''")


def _v8_slurm(conn: sqlite3.Connection) -> None:
    """v8: a Slurm host's settings (partition, account, qos, time limit, sbatch args, job cap, GRES)."""
    conn.execute("ALTER TABLE host ADD COLUMN slurm VARCHAR NOT NULL DEFAULT ''")


def _v9_nodes(conn: sqlite3.Connection) -> None:
    """v9: a multi-node attempt over SSH hosts names the host of each node rank (JSON list, rank order)."""
    conn.execute("ALTER TABLE attempt ADD COLUMN nodes VARCHAR NOT NULL DEFAULT ''")


def _v10_provenance(conn: sqlite3.Connection) -> None:
    """v10: what an attempt ran with (JSON of host_documents.Provenance), the project's git commit at submit."""
    conn.execute("ALTER TABLE attempt ADD COLUMN provenance VARCHAR NOT NULL DEFAULT ''")
    conn.execute("ALTER TABLE sweep ADD COLUMN git_commit VARCHAR NOT NULL DEFAULT ''")
    conn.execute("ALTER TABLE sweep ADD COLUMN git_dirty BOOLEAN")


def _v11_metric_scope(conn: sqlite3.Connection) -> None:
    """v11: an index on a metric's job and scope: `gpuq results` and `gpuq report` read each job's final
    and best rows without walking its learning curve's points."""
    conn.execute("CREATE INDEX ix_metric_job_id_scope ON metric (job_id, scope)")


def _v12_money(conn: sqlite3.Connection) -> None:
    """v12: a rented host's instance name (how gpuq finds an instance whose create call never answered,
    and tells its own instances from others), whether it ends itself when its work is done, and a
    sweep's budget cap."""
    conn.execute("ALTER TABLE host ADD COLUMN instance_name VARCHAR NOT NULL DEFAULT ''")
    conn.execute("ALTER TABLE host ADD COLUMN down_when_done BOOLEAN NOT NULL DEFAULT 0")
    conn.execute("ALTER TABLE sweep ADD COLUMN budget_usd FLOAT")


def _v13_withdrawing(conn: sqlite3.Connection) -> None:
    """v13: why the controller asked a host to withdraw an attempt not yet started ("steal", "budget"),
    written before it asks: a withdrawal it did not live to record puts the job back in the queue, where
    one without this mark (the user's cancel) ends it."""
    conn.execute("ALTER TABLE attempt ADD COLUMN withdrawing VARCHAR NOT NULL DEFAULT ''")


def _v14_gpu_needs(conn: sqlite3.Connection) -> None:
    """v14: hardware as a constraint: a job's `gpu=` models and `gpu_mem=` GB, a host's GPUs (JSON of
    [model, memory.total MiB] per GPU; "" until an audit or a probe lists them)."""
    conn.execute("ALTER TABLE job ADD COLUMN gpu VARCHAR NOT NULL DEFAULT ''")
    conn.execute("ALTER TABLE job ADD COLUMN gpu_mem FLOAT")
    conn.execute("ALTER TABLE host ADD COLUMN gpu_facts VARCHAR NOT NULL DEFAULT ''")


# v15's reading of older events' words, frozen with it: the classes of docs/health.md then, the settling
# decision's words ("transient: requeued ...", "config error: never retried ..."), an "ended badly"
# finding's note ("(class: oom)"), a job finding's "NAME a2: " and the ASSIGNED event's "attempt 2 on HOST"
_V15_CLASSES = ("stopped", "config", "checkpoint_mismatch", "shm_exhausted", "transient", "control_plane",
                "divergence", "gpu_oom", "disk_full", "host_oom", "killed", "vanished", "stalled",
                "deadlock_at_start", "unknown", "setup")
_V15_DECISION = re.compile(r"^([a-z_]+)(?: error)?: (?:[^;(]*\b)?(?:requeued|never retried|no retries|not retried)"
                           rf"|^({'|'.join(_V15_CLASSES)})(?: error)?:")
_V15_CLASS_NOTE = re.compile(r"\(class: ([a-z_]+)\)")
_V15_METRICS = ": succeeded, but "
_V15_ASSIGNED = re.compile(r"^attempt (\d+) on ")
_V15_NAMED = re.compile(r" a(\d+): ")


def _v15_event_fields(conn: sqlite3.Connection) -> None:
    """v15: an event's failure class, a finding's reason and the attempt it speaks of, in fields; older
    events get them from their words, best-effort ("unknown" where a finding's words do not say)."""
    for column in ("failure_class VARCHAR NOT NULL DEFAULT ''", "reason VARCHAR NOT NULL DEFAULT ''",
                   "attempt INTEGER"):
        conn.execute(f"ALTER TABLE event ADD COLUMN {column}")
    updates: list[tuple[str, str, int | None, int]] = []  # (failure_class, reason, attempt, id)
    for event_id, kind, new, rule, severity, message, name in conn.execute(
            "SELECT e.id, e.kind, e.new, e.rule, e.severity, e.message, j.name FROM event AS e "
            "LEFT JOIN job AS j ON e.subject = j.id "
            "WHERE e.rule IN ('failed', 'dead', 'rebooted', 'metrics_missing') OR (e.kind = 'job' AND e.new != '')"
            " OR (j.name IS NOT NULL AND substr(e.message, 1, length(j.name) + 2) = j.name || ' a')"):
        klass = reason = ""
        if rule in ("failed", "dead", "rebooted"):
            note = _V15_CLASS_NOTE.search(message)
            klass = note.group(1) if note else "unknown"
        elif rule == "" and kind == "job" and new:
            said = _V15_DECISION.match(message)
            klass = (said.group(1) or said.group(2)) if said else ""
        if rule == "metrics_missing" and severity != "info":
            reason = message.split(_V15_METRICS, 1)[1] if _V15_METRICS in message else "unknown"
        numbered = _V15_ASSIGNED.match(message) if kind == "job" and new else None
        if numbered is None and name is not None and message.startswith(f"{name} a"):
            numbered = _V15_NAMED.match(message, len(name))
        attempt = int(numbered.group(1)) if numbered else None
        if klass or reason or attempt is not None:
            updates.append((klass, reason, attempt, event_id))
    conn.executemany("UPDATE event SET failure_class = ?, reason = ?, attempt = ? WHERE id = ?", updates)


# v16: the holds gpuq wrote as "prefix: detail" text (v4-v15), as (kind, what the detail keeps); any
# other text is kept whole as the detail of an "other" hold
_V15_PREFIXES = (("unhealthy: ", "unhealthy"), ("disk: ", "disk"), ("not usable", "unusable"),
                 ("not registered when", "unusable"))


def _v16_hold_of(text: str) -> tuple[str, str]:
    if text == "terminated":
        return "terminated", ""
    if text.startswith("lease ") and text.endswith(": replaced"):
        return "replaced", text[:-len(": replaced")]
    for prefix, kind in _V15_PREFIXES:
        if text.startswith(prefix):
            return kind, text[len(prefix):] if prefix.endswith(": ") else text
    return "other", text


def _v16_holds(conn: sqlite3.Connection) -> None:
    """v16: a host's hold is a kind (``hold_kind``, states.HoldKind) and free detail text (``hold_detail``,
    the column that held the whole "prefix: detail" text as ``hold_reason``)."""
    conn.execute("ALTER TABLE host RENAME COLUMN hold_reason TO hold_detail")
    conn.execute("ALTER TABLE host ADD COLUMN hold_kind VARCHAR NOT NULL DEFAULT ''")
    held = conn.execute("SELECT name, hold_detail FROM host WHERE hold_detail != ''").fetchall()
    for name, text in held:
        kind, detail = _v16_hold_of(str(text))
        conn.execute("UPDATE host SET hold_kind = ?, hold_detail = ? WHERE name = ?", (kind, detail, name))


_V17_SIGNATURES = "signatures: "  # how a crash finding's action began, naming its signatures (v4-v16)


def _v17_signatures_of(action: str) -> str:
    """The JSON list of signature names a v4-v16 crash finding's action begins with; "unknown" otherwise."""
    if not action.startswith(_V17_SIGNATURES):
        return "unknown"
    names = [name.strip() for name in action[len(_V17_SIGNATURES):].split(";", 1)[0].split(",") if name.strip()]
    return json.dumps(names) if names else "unknown"


def _v17_crash_fields(conn: sqlite3.Connection) -> None:
    """v17: a crash finding's signature names in a field (``signatures``, a JSON list), and its first log line
    as its reason; older crash findings get them from their words ("unknown" signatures where the action
    does not name them; the whole message as the reason where it does not begin with the job's name)."""
    conn.execute("ALTER TABLE event ADD COLUMN signatures VARCHAR NOT NULL DEFAULT ''")
    updates: list[tuple[str, str, int]] = []
    for event_id, action, message, reason, name in conn.execute(
            "SELECT e.id, e.action, e.message, e.reason, j.name FROM event AS e LEFT JOIN job AS j ON e.subject = j.id "
            "WHERE e.rule = 'crash'"):
        if not reason:
            named = _V15_NAMED.match(message, len(name)) if name and message.startswith(f"{name} a") else None
            reason = message[named.end():] if named else message
        updates.append((_v17_signatures_of(action), reason, event_id))
    conn.executemany("UPDATE event SET signatures = ?, reason = ? WHERE id = ?", updates)


def _v18_stop_policy(conn: sqlite3.Connection) -> None:
    """v18: a sweep's early-stopping policy, JSON of ``stopping.policy.StopPolicy`` ("" = off)."""
    conn.execute("ALTER TABLE sweep ADD COLUMN stop VARCHAR NOT NULL DEFAULT ''")


def _v19_result_cache(conn: sqlite3.Connection) -> None:
    """v19: the result cache: a job's content key and the job whose verified results it reuses."""
    for column in ("content_key VARCHAR NOT NULL DEFAULT ''", "reused_from VARCHAR NOT NULL DEFAULT ''"):
        conn.execute(f"ALTER TABLE job ADD COLUMN {column}")


def _v20_attempt_clock(conn: sqlite3.Connection) -> None:
    """v20: what gpuq itself saw of each attempt, on its own clock (docs/cost.md, "The billed interval"): when it
    dispatched the spec (a host's own retry keeps the first dispatch), the first and the latest probe that saw
    it running, the first probe that saw it ended; and the times its host claimed, kept as claims (the billed
    ``started_at``/``ended_at`` are clamped to what gpuq saw)."""
    for column in ("dispatched_at", "seen_running_at", "seen_alive_at", "seen_ended_at", "host_started_at",
                   "host_ended_at"):
        conn.execute(f"ALTER TABLE attempt ADD COLUMN {column} FLOAT")


def _v21_auto_seeds(conn: sqlite3.Connection) -> None:
    """v21: ``seeds=auto:MIN..MAX`` (docs/stopping.md, "seeds=auto"): the most seeds a job's cell may have (0 = a
    fixed number of seeds); the tick adds a seed, as a job row named ``<cell>-seed<k>``, while the cell's verdict
    against the baseline is ambiguous."""
    conn.execute("ALTER TABLE job ADD COLUMN seeds_max INTEGER NOT NULL DEFAULT 0")


def _v22_sweep_parts(conn: sqlite3.Connection) -> None:
    """v22: a sweep grows by parts (``submit --into``): one row per submit that added jobs, each job's part.
    Every sweep so far is its part 1."""
    conn.execute("""CREATE TABLE sweep_part (
    id INTEGER NOT NULL,
    sweep_id VARCHAR NOT NULL,
    number INTEGER NOT NULL,
    queue_path VARCHAR NOT NULL,
    queue_text VARCHAR NOT NULL,
    bundle_sha VARCHAR NOT NULL,
    job_count INTEGER NOT NULL,
    created_at FLOAT NOT NULL,
    PRIMARY KEY (id),
    FOREIGN KEY(sweep_id) REFERENCES sweep (id)
)""")
    conn.execute("CREATE INDEX ix_sweep_part_sweep_id ON sweep_part (sweep_id)")
    conn.execute("CREATE UNIQUE INDEX ux_sweep_part_number ON sweep_part (sweep_id, number)")
    conn.execute("INSERT INTO sweep_part (sweep_id, number, queue_path, queue_text, bundle_sha, job_count, created_at) "
                 "SELECT id, 1, queue_path, queue_text, bundle_sha, job_count, created_at FROM sweep")
    conn.execute("ALTER TABLE job ADD COLUMN part INTEGER NOT NULL DEFAULT 1")


def _v23_stop_looks(conn: sqlite3.Connection) -> None:
    """v23: early stopping's looks (``stop_look``): one row per sweep, cell and rung, with the rule's numbers as
    fields, written before any job of a stopped cell is stopped (docs/stopping.md)."""
    for statement in V23_DDL:
        conn.execute(statement)


def _v24_dependencies(conn: sqlite3.Connection) -> None:
    """v24: ``after=`` edges between jobs (``tables.Dependency``): who waits for whom, and by which name the line
    asked for it (its checkpoint's placeholder)."""
    conn.execute("""CREATE TABLE dependency (
    id INTEGER NOT NULL,
    job_id VARCHAR NOT NULL,
    needs_id VARCHAR NOT NULL,
    via VARCHAR NOT NULL,
    created_at FLOAT NOT NULL,
    PRIMARY KEY (id),
    FOREIGN KEY(job_id) REFERENCES job (id),
    FOREIGN KEY(needs_id) REFERENCES job (id)
)""")
    conn.execute("CREATE INDEX ix_dependency_job_id ON dependency (job_id)")
    conn.execute("CREATE INDEX ix_dependency_needs_id ON dependency (needs_id)")


MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [_v1_initial, _v2_ssh_hosts, _v3_pulls, _v4_health,
                                                          _v5_providers, _v6_run, _v7_replacements, _v8_slurm,
                                                          _v9_nodes, _v10_provenance, _v11_metric_scope,
                                                          _v12_money, _v13_withdrawing, _v14_gpu_needs,
                                                          _v15_event_fields, _v16_holds, _v17_crash_fields,
                                                          _v18_stop_policy, _v19_result_cache, _v20_attempt_clock,
                                                          _v21_auto_seeds, _v22_sweep_parts, _v23_stop_looks,
                                                          _v24_dependencies]
SCHEMA_VERSION = len(MIGRATIONS)


def current_version(conn: sqlite3.Connection) -> int:
    row = conn.execute("PRAGMA user_version").fetchone()
    return int(row[0])


def migrate(conn: sqlite3.Connection, path: str) -> int:
    """Apply every pending migration, each in its own transaction; return the version."""
    version = current_version(conn)
    if version > SCHEMA_VERSION:
        raise LedgerVersionError(
            f"{path}: ledger schema v{version} is newer than this gpuq understands "
            f"(v{SCHEMA_VERSION}); upgrade gpuq or point GPUQ_HOME elsewhere"
        )
    for number in range(version + 1, SCHEMA_VERSION + 1):
        conn.execute("BEGIN IMMEDIATE")
        try:
            if current_version(conn) >= number:  # another process migrated meanwhile
                conn.execute("ROLLBACK")
                continue
            MIGRATIONS[number - 1](conn)
            conn.execute(f"PRAGMA user_version = {number}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    return SCHEMA_VERSION
