"""Forwarded secret values never reach the ledger or the webhook from host text (docs/security.md)."""

from __future__ import annotations

import http.server
import json
import sqlite3
import threading
from pathlib import Path

import pytest

from orchestrator.core import protocol, redact
from orchestrator.core.config import load_settings
from orchestrator.core.specs import JobSpec
from orchestrator.core.states import AttemptState, HoldChange, HoldKind, JobState
from orchestrator.ledger import Ledger
from orchestrator.tick import notify

TOKEN = "tok-4f1c9a7e2b8d6053"


def test_values_names_and_token_shapes_are_replaced() -> None:
    r = redact.Redactor.of({"HF_TOKEN": TOKEN, "SHORT": "abc"})
    assert r.text(f"login with {TOKEN} failed") == "login with [redacted:HF_TOKEN] failed"
    assert r.text("abc def") == "abc def"  # values shorter than MIN_LENGTH are left
    assert "ghp_" not in r.text("push ghp_" + "a" * 36)
    assert r.text("Authorization: Bearer abcdefghijklmnopqrstuvwxyz") == "Authorization: Bearer [redacted]"
    assert "AKIAABCDEFGHIJKLMNOP" not in r.text("key AKIAABCDEFGHIJKLMNOP")
    # a tail cut the value: the part that shows is still replaced
    assert TOKEN[5:] not in r.text(TOKEN[5:] + " then failed")
    assert TOKEN[:-4] not in r.text("echo " + TOKEN[:-4])
    assert r.value({"a": [TOKEN, 3]}) == {"a": ["[redacted:HF_TOKEN]", 3]}
    assert redact.Redactor().text("job q1234 step 7 loss 0.5") == "job q1234 step 7 loss 0.5"


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Ledger:
    monkeypatch.setenv("MY_HF_TOKEN", TOKEN)
    led = Ledger(tmp_path / "home" / "ledger.db")
    led.add_sweep(sweep_id="qsecret", queue_path="q.txt", workdir="/w", queue_text="...",
                  jobs=[JobSpec(name="a", config="c.yaml", task="classify", config_sha256="0" * 64, line=1)],
                  default_retries=1, run=json.dumps({"forward_env": ["MY_HF_TOKEN"]}))
    return led


def _every_text(path: Path) -> str:
    with sqlite3.connect(path) as db:
        rows = [*db.execute("SELECT message, action FROM event"), *db.execute("SELECT message FROM attempt"),
                *db.execute("SELECT health_detail, hold_detail FROM host")]
    return json.dumps(rows)


def test_host_text_is_redacted_as_the_ledger_writes_it(ledger: Ledger) -> None:
    job = ledger.jobs()[0]
    ledger.ensure_host("local", kind="local", root="/r")
    ledger.start_attempt(job.id, host="local", bundle_sha="b")
    setup_tail = f"setup failed on local: + echo {TOKEN}\n{TOKEN}\nexit 3"
    ledger.update_attempt(job.id, 1, message=setup_tail)
    ledger.transition(job.id, AttemptState.RUNNING, attempt=1, message=setup_tail)
    ledger.transition(job.id, JobState.RUNNING, message=setup_tail)
    ledger.record_event("job", job.id, f"scan: {TOKEN}")
    ledger.record_finding("host", "local", severity="warn", rule="r", message=TOKEN, action=f"unset {TOKEN}")
    ledger.change_hold("local", HoldChange(HoldKind.DISK, TOKEN), health_detail=f"x {TOKEN}")
    stored = _every_text(ledger.path)
    assert TOKEN not in stored and "[redacted:MY_HF_TOKEN]" in stored
    assert ledger.attempt(job.id, 1).message.count("[redacted:MY_HF_TOKEN]") == 2


def test_webhook_body_is_redacted(ledger: Ledger, tmp_path: Path) -> None:
    bodies: list[str] = []

    class Hook(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            bodies.append(self.rfile.read(int(self.headers["Content-Length"])).decode())
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/hook"
        settings = load_settings(env={"GPUQ_HOME": str(tmp_path), "GPUQ_WEBHOOK_URL": url})
        assert notify.send(settings, ledger, {"event": "escalation", "message": f"setup echoed {TOKEN}",
                                              "detail": {"lines": [TOKEN]}})
    finally:
        server.shutdown()
    assert bodies and TOKEN not in bodies[0] and "[redacted:MY_HF_TOKEN]" in bodies[0]


def test_a_streamed_text_is_redacted_even_where_a_chunk_splits_a_value() -> None:
    r = redact.Redactor.of({"HF_TOKEN": TOKEN})
    text = f"step 1\nlogin {TOKEN} ok\r50%\rdone {TOKEN}"
    for at in range(1, len(text)):  # every place a read of the growing log can end
        shown = "".join(redact.stream([text[:at], text[at:]], r.text))
        assert TOKEN[:7] not in shown and shown.count("[redacted:HF_TOKEN]") == 2, (at, shown)
    long_line = "x" * (redact.HELD_CHARS + 10)  # a line without an end is not held for ever
    assert list(redact.stream([long_line, "y\n"], r.text)) == [long_line, "y\n"]


def test_gpuq_logs_redacts_what_the_trainer_printed(gpuq_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A trainer that prints its forwarded token: it is in job.log on the host (docs/security.md says so), never
    in what `gpuq logs` shows, with or without --raw, nor for one attempt."""
    from tests.conftest import run_gpuq

    monkeypatch.setenv("MY_HF_TOKEN", TOKEN)
    led = Ledger(gpuq_home / "ledger.db")
    try:
        (job,) = led.add_sweep(sweep_id="qsecret", queue_path="q.txt", workdir="/w", queue_text="...",
                               jobs=[JobSpec(name="a", config="c.yaml", task="classify", config_sha256="0" * 64,
                                             line=1)],
                               default_retries=1, run=json.dumps({"forward_env": ["MY_HF_TOKEN"]}))
        led.ensure_host("local", kind="local", root=str(gpuq_home / "local"))
        led.start_attempt(job.id, host="local", bundle_sha="b" * 64)
    finally:
        led.close()
    log = gpuq_home / "local" / protocol.JOBS_DIR / job.id / protocol.ATTEMPTS_DIR / "1" / protocol.JOB_LOG
    log.parent.mkdir(parents=True)
    log.write_text(f"step 1\nwandb login {TOKEN}\nstep 2 ghp_{'a' * 36}\n")
    for args in (["logs", job.id], ["logs", "--raw", job.id], ["logs", "--attempt", "1", job.id]):
        done = run_gpuq(*args)
        assert done.returncode == 0, done.stderr
        assert TOKEN not in done.stdout and "ghp_" not in done.stdout, (args, done.stdout)
        assert done.stdout == "step 1\nwandb login [redacted:MY_HF_TOKEN]\nstep 2 [redacted]\n", args
    assert TOKEN in log.read_text()  # the host's own file is as the trainer wrote it
