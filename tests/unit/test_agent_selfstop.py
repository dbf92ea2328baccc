"""The host stops its own billing when the controller is gone (payload/agent/gpuq_serving/gpuq_selfstop.py):
the pure decision on every case, and the act: selfstop.json written before the provider's in-instance stop
(a fake ``runpodctl``/``vastai`` on PATH records its argv) or the notify POST (a loopback receiver)."""

from __future__ import annotations

import http.server
import json
import os
import stat
import threading
import time
from pathlib import Path

import pytest

from tests.support.agentmodule import load_agent_module

ss = load_agent_module("gpuq_serving.gpuq_selfstop")

RUNPOD = {"RUNPOD_POD_ID": "pod-1", "RUNPOD_API_KEY": "pod-scoped"}
VAST = {"CONTAINER_ID": "42", "CONTAINER_API_KEY": "instance-key"}


def test_the_mechanism_is_what_the_provider_put_in_the_instance() -> None:
    assert ss.mechanism(RUNPOD) == "runpod"
    assert ss.mechanism(VAST) == "vastai"
    assert ss.mechanism({"CONTAINER_ID": "42"}) == ""  # no instance key: vast.ai cannot stop itself
    assert ss.mechanism({}) == ""
    assert ss.stop_argv("runpod", RUNPOD) == ["runpodctl", "pod", "stop", "pod-1"]
    assert ss.stop_argv("vastai", VAST) == ["vastai", "stop", "instance", "42", "--api-key", "instance-key"]


@pytest.mark.parametrize(
    ("timeout", "silent", "busy", "already", "mech", "notify", "action"),
    [
        (None, 10_000, 0, False, "runpod", True, ss.OFF),  # no lease.json: not rented, or the user said off
        (0, 10_000, 0, False, "runpod", True, ss.OFF),
        (60, 10_000, 0, True, "runpod", True, ss.DONE),  # it acts once
        (60, 10_000, 1, False, "runpod", True, ss.WAIT),  # a running attempt or a spec: never stops
        (60, 10_000, 3, False, "", True, ss.WAIT),
        (60, 59, 0, False, "runpod", True, ss.WAIT),  # the controller was heard within the lease
        (60, 60, 0, False, "runpod", False, ss.STOP),
        (60, 61, 0, False, "vastai", False, ss.STOP),
        (60, 61, 0, False, "", True, ss.NOTIFY),  # Lambda: no in-instance stop, the user hears
        (60, 61, 0, False, "", False, ss.WAIT),  # nothing it can do: it says so, billing goes on
    ],
)
def test_decide(
    timeout: float | None, silent: float, busy: int, already: bool, mech: str, notify: bool, action: str
) -> None:
    now = 1_000_000.0
    v = ss.decide(now, now - silent, timeout, busy, already, mech, notify)
    assert v.action == action
    assert v.mechanism == (mech if action == ss.STOP else "")
    if action == ss.WAIT and busy == 0 and silent > (timeout or 0) and not notify:
        assert "billing goes on" in v.reason


def test_a_bad_lease_file_is_no_lease(tmp_path: Path) -> None:
    for doc in ('{"timeout_s": true}', '{"timeout_s": -5}', "[1]", "not json", '{"timeout_s": "60"}'):
        (tmp_path / ss.LEASE_FILE).write_text(doc)
        assert ss.read_lease(str(tmp_path)) == (None, "")
    (tmp_path / ss.LEASE_FILE).write_text('{"timeout_s": 90, "notify_url": "file:///etc/passwd"}')
    assert ss.read_lease(str(tmp_path)) == (90.0, "")


def _fake_cli(tmp_path: Path, name: str) -> Path:
    """A fake provider CLI on PATH that appends its argv, one JSON line, to calls.jsonl."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    calls = tmp_path / "calls.jsonl"
    exe = bindir / name
    exe.write_text(
        f"#!/usr/bin/env python3\nimport json, os, sys\nopen({str(calls)!r}, 'a').write("
        "json.dumps(sys.argv[1:] + [os.environ.get('RUNPOD_API_KEY')]) + '\\n')\nprint('pod stopped')\n"
    )
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return calls


def _silent_root(tmp_path: Path, timeout_s: float, url: str | None = None, silent_s: float = 3600) -> Path:
    root = tmp_path / "root"
    root.mkdir()
    (root / ss.LEASE_FILE).write_text(json.dumps({"timeout_s": timeout_s, "notify_url": url}))
    ss.touch_contact(str(root))
    then = time.time() - silent_s
    os.utime(root / ss.CONTACT_FILE, (then, then))
    return root


def test_a_host_without_a_lease_is_never_written_by_a_verb(tmp_path: Path) -> None:
    """A host the user brought has no lease.json: ``status`` (any verb) leaves its root as it was."""
    ss.touch_contact(str(tmp_path))
    assert list(tmp_path.iterdir()) == []
    (tmp_path / ss.LEASE_FILE).write_text(json.dumps({"timeout_s": 60, "notify_url": None}))
    ss.touch_contact(str(tmp_path))
    assert (tmp_path / ss.CONTACT_FILE).is_file()


def _agent(root: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> object:
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    logs: list[str] = []
    watch = ss.SelfStop(str(root), logs.append, env=env)
    watch.started = time.time() - 7200  # as though the agent had run since before the silence
    return watch


def test_a_silent_idle_runpod_host_writes_what_it_does_then_stops_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _fake_cli(tmp_path, "runpodctl")
    root = _silent_root(tmp_path, timeout_s=60)
    watch = _agent(root, RUNPOD, monkeypatch, tmp_path)
    assert watch.check(busy=1).action == ss.WAIT  # a running attempt: never
    assert not calls.exists() and not (root / ss.SELFSTOP_FILE).exists()
    watch.next_check = 0.0
    assert watch.lease_on()  # the agent stays while the lease is on
    assert watch.check(busy=0).action == ss.STOP
    assert [json.loads(line) for line in calls.read_text().splitlines()] == [["pod", "stop", "pod-1", "pod-scoped"]]
    doc = json.loads((root / ss.SELFSTOP_FILE).read_text())
    assert (doc["schema"], doc["action"], doc["mechanism"]) == (ss.SELFSTOP_SCHEMA, "stop", "runpod")
    assert doc["outcome"].startswith("exit 0")
    assert watch.check(busy=0) is None  # between checks: nothing read
    watch.next_check = 0.0
    assert watch.check(busy=0).action == ss.DONE and not watch.lease_on()
    assert len(calls.read_text().splitlines()) == 1
    # a restarted agent finds selfstop.json and does not act again
    assert ss.SelfStop(str(root), print, env=RUNPOD).acted
    # the machine started again and a gpuq command came: the lease holds anew, the old record kept
    later = time.time() + 5
    os.utime(root / ss.CONTACT_FILE, (later, later))
    watch.next_check = 0.0
    assert watch.check(busy=0).action == ss.WAIT and watch.lease_on()
    assert json.loads((root / ss.PREV_FILE).read_text())["action"] == "stop"
    assert not (root / ss.SELFSTOP_FILE).exists()


def test_a_vast_host_uses_the_instance_key_and_never_writes_it_down(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _fake_cli(tmp_path, "vastai")
    root = _silent_root(tmp_path, timeout_s=60)
    assert _agent(root, VAST, monkeypatch, tmp_path).check(busy=0).action == ss.STOP
    assert json.loads(calls.read_text()) == ["stop", "instance", "42", "--api-key", "instance-key", None]
    assert "instance-key" not in (root / ss.SELFSTOP_FILE).read_text()


def test_a_recent_contact_or_agent_start_keeps_the_host_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _fake_cli(tmp_path, "runpodctl")
    root = _silent_root(tmp_path, timeout_s=60, silent_s=0)
    assert _agent(root, RUNPOD, monkeypatch, tmp_path).check(busy=0).action == ss.WAIT
    (root / ss.CONTACT_FILE).unlink()
    watch = ss.SelfStop(str(root), print, env=RUNPOD)  # started now: the silence before it is not counted
    assert watch.check(busy=0).action == ss.WAIT
    assert not calls.exists()
    nothing = ss.SelfStop(str(root), print, env={})  # no in-instance stop, no notify_url: it exits idle as before
    assert nothing.check(busy=0).action == ss.WAIT and not nothing.lease_on()


def test_a_lambda_host_notifies_the_user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    got: list[dict[str, object]] = []

    class Receiver(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.handle_request, daemon=True).start()
    root = _silent_root(tmp_path, timeout_s=60, url=f"http://127.0.0.1:{server.server_port}/hook")
    try:
        assert _agent(root, {}, monkeypatch, tmp_path).check(busy=0).action == ss.NOTIFY
    finally:
        server.server_close()
    assert len(got) == 1 and "cannot stop itself" in str(got[0]["text"])
    doc = json.loads((root / ss.SELFSTOP_FILE).read_text())
    assert (doc["action"], doc["outcome"]) == ("notify", "notified: HTTP 204")


def test_the_controller_sets_the_lease_and_keeps_the_notify_url(tmp_path: Path) -> None:
    ss.write_lease(str(tmp_path), 1800)
    assert ss.read_lease(str(tmp_path)) == (1800.0, "")
    assert (tmp_path / ss.CONTACT_FILE).exists()  # the serve/enqueue that set it reached the host: a contact
    (tmp_path / ss.LEASE_FILE).write_text('{"timeout_s": 60, "notify_url": "https://hooks.example.com/x"}')
    ss.write_lease(str(tmp_path), 0)  # the user turned it off
    assert ss.read_lease(str(tmp_path)) == (None, "https://hooks.example.com/x")
    ss.write_lease(str(tmp_path / "absent"), 60)  # no root yet: nothing written, no error
    assert not (tmp_path / "absent").exists()


def test_only_a_rented_host_gets_a_lease() -> None:
    from orchestrator.core.config import Settings
    from orchestrator.fleet.registry import agent_flags
    from orchestrator.ledger.tables import HostRow

    settings = Settings(home=Path("/nonexistent"), lease_timeout_min=0.5)
    fields = {"name": "h", "kind": "ssh", "root": "/r", "created_at": 0.0}
    rented = HostRow.model_validate({**fields, "provider": "runpod", "instance_id": "pod-1"})
    assert agent_flags(rented, settings)[-2:] == ("--lease-timeout-s", "30")
    assert "--lease-timeout-s" not in agent_flags(HostRow.model_validate(fields), settings)


AGENT = Path(__file__).resolve().parents[2] / "payload" / "agent" / "gpuq_agent.py"


def test_the_serving_agent_outlives_its_idle_exit_while_the_lease_is_on_then_stops_the_pod(
    tmp_path: Path,
) -> None:
    """The real serve loop: idle exit after 1 s, a 2 s lease.  It stays past the idle exit, stops the pod
    once (its first look after the lease ran out), then exits idle."""
    import subprocess
    import sys

    calls = _fake_cli(tmp_path, "runpodctl")
    root = tmp_path / "root"
    env = {**os.environ, **RUNPOD, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    argv = [sys.executable, str(AGENT), "--root", str(root), "serve", "--idle-exit-s", "1", "--cpu-slots", "1"]
    done = subprocess.run([*argv, "--lease-timeout-s", "2"], env=env, timeout=60, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert [json.loads(line) for line in calls.read_text().splitlines()] == [["pod", "stop", "pod-1", "pod-scoped"]]
    doc = json.loads((root / ss.SELFSTOP_FILE).read_text())
    assert (doc["action"], doc["mechanism"]) == ("stop", "runpod")
    log = (root / "agent.log").read_text()
    assert log.index("SELFSTOP stop") < log.index("idle for")
    # without a lease the same agent exits idle and never stops anything
    (root / ss.SELFSTOP_FILE).unlink()
    again = subprocess.run([*argv, "--lease-timeout-s", "0"], env=env, timeout=60, capture_output=True, text=True)
    assert again.returncode == 0 and len(calls.read_text().splitlines()) == 1
    assert not (root / ss.SELFSTOP_FILE).exists()


def test_the_lease_keeps_the_notice_form_and_is_the_users_alone(tmp_path: Path) -> None:
    lease = {"timeout_s": 60, "notify_url": "https://hooks.example.com/x", "notify_format": "discord"}
    (tmp_path / ss.LEASE_FILE).write_text(json.dumps(lease))
    ss.write_lease(str(tmp_path), 120)  # a later serve/enqueue changes the timeout only
    assert json.loads((tmp_path / ss.LEASE_FILE).read_text()) == {**lease, "timeout_s": 120.0}
    assert (tmp_path / ss.LEASE_FILE).stat().st_mode & 0o077 == 0  # the URL is the user's webhook: 0600
    assert ss.notify_format(str(tmp_path)) == "discord"
    (tmp_path / ss.LEASE_FILE).write_text('{"timeout_s": 60, "notify_format": "<script>"}')
    assert ss.notify_format(str(tmp_path)) == "json"


@pytest.mark.parametrize(("fmt", "ctype", "key"), [("json", "application/json", "text"),
                                                    ("slack", "application/json", "text"),
                                                    ("discord", "application/json", "content"),
                                                    ("ntfy", "text/plain; charset=utf-8", None)])
def test_the_notice_comes_in_the_form_the_users_webhook_reads(fmt: str, ctype: str, key: str | None) -> None:
    record = {"action": "notify", "last_contact": "2026-12-02T10:00:00.000Z"}
    body, got_type = ss.notice_body(record, fmt)
    assert got_type == ctype
    text = json.loads(body)[key] if key else body.decode()
    assert "cannot stop itself" in text and "2026-12-02T10:00:00.000Z" in text and "gpuq down" in text
    if fmt == "json":
        assert json.loads(body)["selfstop"] == record and json.loads(body)["event"] == "self_stop_notice"


def test_only_a_host_that_cannot_stop_itself_gets_the_users_webhook() -> None:
    from orchestrator.core.config import Settings
    from orchestrator.fleet.hostlease import HostLease, lease_for

    hook = "https://hooks.example.com/secret-path"
    settings = Settings(home=Path("/nonexistent"), lease_timeout_min=0.5, webhook_url=hook, webhook_format="slack")
    assert lease_for("lambda", settings) == HostLease(30.0, hook, "slack")
    assert lease_for("runpod", settings) is None and lease_for("vastai", settings) is None  # they stop themselves
    assert lease_for("lambda", settings.model_copy(update={"lease_timeout_min": 0.0})) is None  # the lease is off
    assert lease_for("lambda", settings.model_copy(update={"webhook_url": ""})) is None  # nobody to tell
