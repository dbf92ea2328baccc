"""A project's ``[run] setup`` that failed on a host (docs/your-project.md): the host is held for that
bundle, the job goes back to the queue without spending a retry, and nothing is lost.

The hold is an open escalation finding on the host (rule ``setup:<bundle sha, 12 hex>``), so it shows in
the alerts with the host, the log tail and what to do, and needs no schema of its own.  Jobs of that
bundle are not placed on the host while it is open; other bundles still are.  ``release`` closes the
holds of a host (``gpuq hosts release``), e.g. after a transient network failure during ``pip install``;
a changed requirements file makes a new bundle (and setup key), which is never held.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from orchestrator.health.verdicts import Decision
from orchestrator.host_documents import ExitRecord
from orchestrator.ledger import Ledger
from orchestrator.ledger.attempt_records import SETUP_PHASE

RULE_PREFIX = "setup:"
PHASE = SETUP_PHASE  # the attempt's phase: a setup failure never counts against retries=
SHA_CHARS = 12


def is_setup_failure(exit_doc: ExitRecord) -> bool:
    """The wrapper ended the attempt because the project's setup command failed."""
    return exit_doc.setup_failed


def held_bundles(ledger: Ledger, hosts: Iterable[str]) -> dict[str, set[str]]:
    """{host: {bundle sha prefix, ...}} of the setup holds still open."""
    out: dict[str, set[str]] = {}
    for (subject, rule), _event in ledger.open_findings(hosts).items():
        if rule.startswith(RULE_PREFIX):
            out.setdefault(subject, set()).add(rule[len(RULE_PREFIX):])
    return out


def is_held(holds: Mapping[str, set[str]], host: str, bundle_sha: str) -> bool:
    return bundle_sha[:SHA_CHARS] in holds.get(host, set())


def settle_setup_failure(ledger: Ledger, job_id: str, host: str, bundle_sha: str,
                         exit_doc: ExitRecord, message: str) -> Decision:
    """Hold ``host`` for the bundle (once) and put the job back in the queue: it goes to another host, or
    waits.  The attempt (already EXITED) is marked so it does not count against ``retries=``."""
    sha = bundle_sha[:SHA_CHARS]
    tail = (exit_doc.setup_tail or exit_doc.message or "")[-1500:]
    if not is_held(held_bundles(ledger, [host]), host, bundle_sha):
        ledger.record_finding(
            "host", host, severity="escalate", rule=RULE_PREFIX + sha,
            message=f"setup failed on {host} for bundle {sha}: {message}" + (f"\n{tail}" if tail else ""),
            action=f"fix the project's setup and submit again (jobs of bundle {sha} wait or run elsewhere); "
                   f"for a transient failure: gpuq hosts release {host}")
    reason = f"setup failed on {host}: waits for another host (no retry spent)"
    ledger.requeue(job_id, message=reason, attempt_fields={"phase": PHASE}, failure_class="setup")
    return Decision("requeue", reason)


def release(ledger: Ledger, host: str) -> list[str]:
    """Close every setup hold of ``host``; returns the bundle prefixes released."""
    released = sorted(held_bundles(ledger, [host]).get(host, set()))
    for sha in released:
        ledger.record_finding("host", host, severity="info", rule=RULE_PREFIX + sha,
                              message=f"cleared: setup hold for bundle {sha} released")
    return released
