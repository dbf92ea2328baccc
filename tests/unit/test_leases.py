"""The lease of a rented machine as a state machine, and a host's hold as a kind plus detail
(orchestrator/core/states.py, ledger/leases.py): the edge table walked on a real ledger, the one writer and its
event, the holds' rules, the migration of holds written as text, and the guard that no code writes or parses
either one another way."""

from __future__ import annotations

import ast
import sqlite3
from pathlib import Path

import pytest

from orchestrator.context import Context
from orchestrator.core.errors import IllegalTransition, LedgerError
from orchestrator.core.states import (
    ANY_HOLD,
    LEASE_ALLOWED,
    HoldChange,
    HoldKind,
    LeaseState,
    hold_text,
)
from orchestrator.health.patrol import Finding, Severity
from orchestrator.ledger import HostRow, Ledger
from orchestrator.ledger.migrate import MIGRATIONS
from orchestrator.tick import findings

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    found = Ledger(tmp_path / "ledger.db")
    found.add_host(HostRow(name="rp", kind="ssh", target="", root="", provider="runpod",
                           lease_state=LeaseState.PROVISIONING.value, lease_reason="recorded before its create call"))
    return found


def _put(ledger: Ledger, state: LeaseState) -> None:
    with ledger.session() as s:  # the row in ``state`` directly, bypassing the rules on purpose
        row = s.get(HostRow, "rp")
        assert row is not None
        row.lease_state = state.value


def _lease_events(ledger: Ledger) -> list[tuple[str, str, str]]:
    return [(e.old, e.new, e.message) for e in ledger.events("rp") if e.message.startswith("lease")]


@pytest.mark.parametrize("old", list(LeaseState))
@pytest.mark.parametrize("new", list(LeaseState))
def test_every_lease_transition_follows_the_table(ledger: Ledger, old: LeaseState, new: LeaseState) -> None:
    _put(ledger, old)
    before = ledger.host("rp")
    assert before is not None
    if old == new:  # no change of state: the reason is news all the same, with no event
        assert ledger.lease_transition("rp", new, "the provider's words", instance_id="pod1") is False
        assert _lease_events(ledger) == []
    elif new in LEASE_ALLOWED[old]:
        assert ledger.lease_transition("rp", new, "the provider's words", instance_id="pod1") is True
        assert _lease_events(ledger) == [(old.value, new.value, "lease: the provider's words")]
    else:
        with pytest.raises(IllegalTransition, match=f"lease rp: cannot go from {old.value} to {new.value}"):
            ledger.lease_transition("rp", new, "the provider's words", instance_id="pod1")
        assert ledger.host("rp") == before and _lease_events(ledger) == []  # nothing changed, fields neither
        return
    row = ledger.host("rp")
    assert row is not None and (row.lease, row.lease_reason, row.instance_id) == (new, "the provider's words", "pod1")
    assert row.lease_changed_at is not None and row.lease_changed_at >= (before.lease_changed_at or 0.0)


def test_the_table_has_one_way_in_and_no_way_out() -> None:
    """A lease is born PROVISIONING (`gpuq up` records it before its create call); TERMINATED is final; a
    machine comes back RUNNING only from where a re-bid or a resume brings it (preempted, stopped)."""
    assert LEASE_ALLOWED[LeaseState.NONE] == {LeaseState.PROVISIONING}
    assert LEASE_ALLOWED[LeaseState.TERMINATED] == frozenset()
    assert all(LeaseState.TERMINATED in LEASE_ALLOWED[s] for s in LeaseState if s not in
               (LeaseState.NONE, LeaseState.TERMINATED))  # gpuq ends a machine wherever its lease stands
    assert {s for s in LeaseState if LeaseState.RUNNING in LEASE_ALLOWED[s]} == {
        LeaseState.PROVISIONING, LeaseState.PREEMPTED, LeaseState.STOPPED}
    assert not any(LeaseState.PROVISIONING in LEASE_ALLOWED[s] for s in LeaseState if s is not LeaseState.NONE)
    assert not any(LeaseState.NONE in edges for edges in LEASE_ALLOWED.values())


def test_a_host_is_born_without_a_lease_or_provisioning(ledger: Ledger) -> None:
    ledger.add_host(HostRow(name="mine", kind="ssh", target="me@box", root="/r"))
    with pytest.raises(IllegalTransition, match="lease up: cannot go from  to running"):
        ledger.add_host(HostRow(name="up", kind="ssh", target="", root="", provider="runpod", lease_state="running"))
    assert ledger.host("up") is None and ledger.host("mine") is not None


def test_a_lease_change_and_what_comes_with_it_are_one_transaction(ledger: Ledger) -> None:
    ledger.lease_transition("rp", LeaseState.RUNNING, "", target="root@203.0.113.9", port=22)
    ledger.change_hold("rp", HoldChange(HoldKind.UNHEALTHY, "gpu: Xid 79"))
    ledger.lease_transition("rp", LeaseState.TERMINATED, "terminated by the user", at=1234.5,
                            hold=HoldChange(HoldKind.TERMINATED))
    row = ledger.host("rp")
    assert row is not None
    assert (row.lease, row.lease_changed_at, row.hold, row.hold_text) == (
        LeaseState.TERMINATED, 1234.5, HoldKind.TERMINATED, "terminated")
    assert _lease_events(ledger) == [("provisioning", "running", "lease"),
                                     ("running", "terminated", "lease: terminated by the user")]
    with pytest.raises(IllegalTransition):  # final: and the hold asked for with it is not written either
        ledger.lease_transition("rp", LeaseState.RUNNING, "", hold=HoldChange(HoldKind.NONE))
    row = ledger.host("rp")
    assert row is not None and (row.lease, row.hold) == (LeaseState.TERMINATED, HoldKind.TERMINATED)


def test_a_lease_or_hold_of_a_host_the_ledger_does_not_have_is_refused_by_name(ledger: Ledger) -> None:
    with pytest.raises(LedgerError, match="unknown host 'gone'"):
        ledger.lease_transition("gone", LeaseState.RUNNING, "")
    with pytest.raises(LedgerError, match="unknown host 'gone'"):
        ledger.change_hold("gone", HoldChange(HoldKind.UNHEALTHY, "gpu: Xid 79"))
    assert ledger.host("gone") is None


def test_update_host_writes_neither_a_lease_nor_a_hold(ledger: Ledger) -> None:
    for key, value in (("lease_state", "running"), ("lease_reason", "x"), ("lease_changed_at", 1.0),
                       ("hold_kind", "disk"), ("hold_detail", "x"), ("hold_reason", "disk: x")):
        with pytest.raises(LedgerError, match="update_host cannot write"):
            ledger.update_host("rp", **{key: value})  # type: ignore[misc]
    row = ledger.host("rp")
    assert row is not None and (row.name, row.lease, row.hold) == ("rp", LeaseState.PROVISIONING, HoldKind.NONE)
    ledger.update_host("rp", slots_total=10**9, price_per_hour=0.79)
    row = ledger.host("rp")
    assert row is not None and row.slots_total < 10**9 and row.price_per_hour == 0.79  # clamped, as before


def test_a_hold_changes_only_over_the_holds_it_names(ledger: Ledger) -> None:
    def hold() -> tuple[HoldKind, str]:
        row = ledger.host("rp")
        assert row is not None
        return row.hold, row.hold_detail

    but_unhealthy = ANY_HOLD - {HoldKind.UNHEALTHY}
    assert ledger.change_hold("rp", HoldChange.lift(HoldKind.DISK)) is False  # not held: nothing to lift
    assert ledger.change_hold("rp", HoldChange(HoldKind.DISK, "97% used", over=but_unhealthy)) is True
    assert ledger.change_hold("rp", HoldChange(HoldKind.DISK, "97% used", over=but_unhealthy)) is False  # the same
    assert ledger.change_hold("rp", HoldChange(HoldKind.UNHEALTHY, "gpu: Xid 79"), health="fail") is True
    assert ledger.change_hold("rp", HoldChange(HoldKind.DISK, "98% used", over=but_unhealthy)) is False
    assert ledger.change_hold("rp", HoldChange.lift(HoldKind.DISK)) is False  # a disk that clears lifts no Xid
    assert hold() == (HoldKind.UNHEALTHY, "gpu: Xid 79")
    assert ledger.change_hold("rp", HoldChange.lift(HoldKind.UNHEALTHY), health="pass") is True
    assert hold() == (HoldKind.NONE, "")
    row = ledger.host("rp")
    assert row is not None and row.health == "pass" and not row.held


def test_a_hold_reads_as_one_line() -> None:
    assert hold_text(HoldKind.NONE, "") == ""
    assert hold_text(HoldKind.DISK, "97% used") == "disk: 97% used"
    assert hold_text(HoldKind.TERMINATED, "") == "terminated"
    assert hold_text(HoldKind.OTHER, "held by an older gpuq") == "held by an older gpuq"


def test_holds_written_as_text_become_kinds_and_details(tmp_path: Path) -> None:
    """A v14 ledger's holds ("prefix: detail" text, as gpuq wrote them) migrate to a kind and the detail;
    text gpuq never wrote stays whole as the detail of an "other" hold."""
    path = tmp_path / "ledger.db"
    conn = sqlite3.connect(path, isolation_level=None)
    for number, step in enumerate(MIGRATIONS[:14], start=1):
        step(conn)
        conn.execute(f"PRAGMA user_version = {number}")
    held = {"ok": "", "xid": "unhealthy: gpu: Xid 79", "full": "disk: /data 97% used", "gone": "terminated",
            "old": "lease preempted: replaced", "kept": "not usable (no SSH endpoint)",
            "cut": "not registered when interrupted", "odd": "held: by hand", "lease": "lease what"}
    for name, text in held.items():
        conn.execute("INSERT INTO host (name, kind, target, root, python, profile, agent_bundle, slots_kind, "
                     "slots_total, created_at, hold_reason, lease_state) VALUES (?, 'ssh', '', '/r', '', '', '', "
                     "'', 0, 0, ?, '')", (name, text))
    conn.close()
    ledger = Ledger(path)
    rows = {r.name: (r.hold, r.hold_detail) for r in ledger.hosts()}
    assert rows == {"ok": (HoldKind.NONE, ""), "xid": (HoldKind.UNHEALTHY, "gpu: Xid 79"),
                    "full": (HoldKind.DISK, "/data 97% used"), "gone": (HoldKind.TERMINATED, ""),
                    "old": (HoldKind.REPLACED, "lease preempted"),
                    "kept": (HoldKind.UNUSABLE, "not usable (no SSH endpoint)"),
                    "cut": (HoldKind.UNUSABLE, "not registered when interrupted"),
                    "odd": (HoldKind.OTHER, "held: by hand"), "lease": (HoldKind.OTHER, "lease what")}
    assert {r.name: r.hold_text for r in ledger.hosts()}["odd"] == "held: by hand"  # people read what they read


# --- the guard: no other writer, no parsing, no literal comparison ---------------------------------------------

LEASE_COLUMNS = {"lease_state", "lease_reason", "lease_changed_at", "hold_kind", "hold_detail", "hold_reason"}
HOLD_TEXT = {"hold_detail", "hold_reason", "hold_text", "hold_kind", "lease_state"}


def offences(source: str) -> list[str]:
    """What in ``source`` writes a lease or a hold around their writers, parses a hold's text, or compares a
    lease or hold column with a literal (the enums' members are the way: ``row.lease is LeaseState.RUNNING``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "update_host":
                found += [f"update_host({k.arg}=)" for k in node.keywords if k.arg in LEASE_COLUMNS]
            inner = node.func.value
            if node.func.attr in ("startswith", "split", "endswith", "partition", "removeprefix") and \
                    isinstance(inner, ast.Attribute) and inner.attr in HOLD_TEXT:
                found.append(f"{inner.attr}.{node.func.attr}(")
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(s, ast.Attribute) and s.attr in HOLD_TEXT for s in sides) and any(
                    isinstance(s, ast.Constant) or (isinstance(s, ast.Tuple) and s.elts
                                                    and all(isinstance(e, ast.Constant) for e in s.elts))
                    for s in sides):
                found.append(f"{ast.unparse(node)}")
    return found


def test_the_guard_finds_what_it_forbids() -> None:
    assert offences('ledger.update_host(n, lease_state="running", slots_total=1)') == ["update_host(lease_state=)"]
    assert offences('ledger.update_host(n, hold_reason="disk: x")') == ["update_host(hold_reason=)"]
    assert offences('row.hold_reason.startswith(("lease ", "terminated"))') == ["hold_reason.startswith("]
    assert offences('row.hold_detail.split(":", 1)') == ["hold_detail.split("]
    assert offences('row.lease_state in ("terminated", "provisioning")') == [
        "row.lease_state in ('terminated', 'provisioning')"]
    assert offences('row.lease_state != "terminated"') == ["row.lease_state != 'terminated'"]
    assert offences("row.lease is LeaseState.RUNNING and row.hold in (HoldKind.DISK,)") == []
    assert offences('ledger.update_host(n, slots_total=1, health="fail")') == []


def test_no_code_writes_parses_or_compares_a_lease_or_a_hold_by_text() -> None:
    """The migration parses the old text once, at the edge; nothing else may (issue 44, item 5)."""
    allowed = {REPO / "orchestrator" / "ledger" / "migrate.py"}
    files = [p for d in ("orchestrator", "scripts", "payload") for p in (REPO / d).rglob("*.py") if p not in allowed]
    assert len(files) > 100
    found = {str(p.relative_to(REPO)): o for p in files if (o := offences(p.read_text()))}
    assert found == {}


def test_a_full_disk_never_replaces_another_hold(ctx: Context) -> None:
    """A machine `gpuq up` gave up on (held unusable, still probed) whose disk fills and then clears keeps its
    hold: the disk hold takes only a host not held or held for its disk, so clearing it never frees the host
    for work (it replaced every hold but unhealthy, and lifting it then released an unusable machine)."""
    ctx.ledger.add_host(HostRow(name="box", kind="ssh", target="me@box", root="/r"))
    ctx.ledger.change_hold("box", HoldChange(HoldKind.UNUSABLE, "not usable (no SSH endpoint)"))
    full = Finding("disk", Severity.ESCALATE, "box", "disk: /data 97% used")
    findings.holds(ctx, ctx.ledger.host("box"), [full])
    assert ctx.ledger.host("box").hold is HoldKind.UNUSABLE
    findings.holds(ctx, ctx.ledger.host("box"), [])
    assert (ctx.ledger.host("box").hold, ctx.ledger.host("box").hold_detail) == (
        HoldKind.UNUSABLE, "not usable (no SSH endpoint)")
    ctx.ledger.change_hold("box", HoldChange.lift(HoldKind.UNUSABLE))
    findings.holds(ctx, ctx.ledger.host("box"), [full])  # a host not held is held for its disk, and freed after
    assert ctx.ledger.host("box").hold is HoldKind.DISK
    findings.holds(ctx, ctx.ledger.host("box"), [])
    assert ctx.ledger.host("box").hold is HoldKind.NONE
