"""CLI conventions on a ledger built directly (no host is contacted): job references, cancel of
several jobs, exit codes, --version, completion, status --no-probe / --state."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from orchestrator import __version__
from orchestrator.core import exitcodes
from orchestrator.core.config import tomllib
from orchestrator.core.specs import JobSpec
from orchestrator.ledger import Ledger
from tests.conftest import ROOT, run_gpuq


def _sweep(ledger: Ledger, sweep_id: str, names: list[str]) -> list[str]:
    specs = [JobSpec(name=n, config=f"{n}.yaml", task="classify", config_sha256=sweep_id[-1] * 64, line=i + 1)
             for i, n in enumerate(names)]
    rows = ledger.add_sweep(sweep_id=sweep_id, queue_path="q.txt", workdir="/w", queue_text="", jobs=specs,
                            default_retries=1)
    return [r.id for r in rows]


@pytest.fixture
def home(gpuq_home: Path) -> Path:
    ledger = Ledger(gpuq_home / "ledger.db")
    _sweep(ledger, "qold0001", ["baseline", "wide"])
    _sweep(ledger, "qnew0002", ["baseline", "deep", "tiny"])
    conn = sqlite3.connect(gpuq_home / "ledger.db")
    conn.execute("UPDATE sweep SET created_at = 1000 WHERE id = 'qold0001'")
    conn.execute("UPDATE sweep SET created_at = 2000 WHERE id = 'qnew0002'")
    conn.execute("UPDATE job SET state = 'FAILED' WHERE sweep_id = 'qnew0002' AND name = 'tiny'")
    conn.commit()
    conn.close()
    ledger.close()
    return gpuq_home


def _states(home: Path) -> dict[str, str]:
    conn = sqlite3.connect(home / "ledger.db")
    try:
        return {f"{s}:{n}": st for s, n, st in conn.execute("SELECT sweep_id, name, state FROM job")}
    finally:
        conn.close()


def _job_id(home: Path, sweep: str, name: str) -> str:
    conn = sqlite3.connect(home / "ledger.db")
    try:
        return str(conn.execute("SELECT id FROM job WHERE sweep_id = ? AND name = ?", (sweep, name)).fetchone()[0])
    finally:
        conn.close()


def test_bare_name_means_the_newest_sweeps_job_and_says_so(home: Path) -> None:
    result = run_gpuq("cancel", "baseline")
    assert result.returncode == 0, result.stderr
    assert "qnew0002:baseline" in result.stdout and "cancelled before placement" in result.stdout
    assert "newest sweep qnew0002" in result.stderr and "qold0001" in result.stderr
    states = _states(home)
    assert states["qnew0002:baseline"] == "CANCELLED" and states["qold0001:baseline"] == "QUEUED"
    # a name only one sweep has: no note; SWEEP:NAME picks the older one
    only = run_gpuq("cancel", "wide")
    assert only.returncode == 0 and "qold0001:wide" in only.stdout and only.stderr == ""
    assert run_gpuq("cancel", "qold0001:baseline").returncode == 0
    assert _states(home)["qold0001:baseline"] == "CANCELLED"
    logs = run_gpuq("logs", "deep")  # a name only the newest sweep has, not started: no note, a clear reason
    assert logs.returncode == exitcodes.USAGE and "has not started yet" in logs.stderr and "newest" not in logs.stderr
    prefix = run_gpuq("logs", _job_id(home, "qnew0002", "tiny")[:6])
    assert prefix.returncode == exitcodes.USAGE and "(tiny) has not started yet" in prefix.stderr
    missing = run_gpuq("logs", "nosuchjob")
    assert missing.returncode == exitcodes.USAGE and "no job matches 'nosuchjob'" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_cancel_several_needs_confirmation_without_a_terminal(home: Path) -> None:
    refused = run_gpuq("cancel", "wide", "deep")
    assert refused.returncode == exitcodes.USAGE and "cancels 2 jobs" in refused.stderr and "-y" in refused.stderr
    assert set(_states(home).values()) == {"QUEUED", "FAILED"}  # nothing was cancelled
    typo = run_gpuq("cancel", "-y", "wide", "nosuch")
    assert typo.returncode == exitcodes.USAGE and "nosuch" in typo.stderr
    assert set(_states(home).values()) == {"QUEUED", "FAILED"}  # every reference resolves first
    done = run_gpuq("cancel", "-y", "wide", "deep", "tiny")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 3 and "already FAILED" in lines[2]
    assert _states(home)["qold0001:wide"] == "CANCELLED" and _states(home)["qnew0002:deep"] == "CANCELLED"


def test_cancel_sweeps_and_all(home: Path) -> None:
    one = run_gpuq("cancel", "-y", "--sweep", "qold")
    assert one.returncode == 0 and len(one.stdout.splitlines()) == 2
    assert _states(home)["qnew0002:deep"] == "QUEUED"
    both = run_gpuq("cancel", "--all", "--yes")
    assert both.returncode == 0 and len(both.stdout.splitlines()) == 2  # the unfinished ones: baseline, deep
    assert set(_states(home).values()) == {"CANCELLED", "FAILED"}
    again = run_gpuq("cancel", "--all")
    assert again.returncode == 0 and "nothing to cancel" in again.stdout
    usage = run_gpuq("cancel", "--all", "deep")
    assert usage.returncode == exitcodes.USAGE and "--all" in usage.stderr


def test_status_no_probe_and_state_filter(home: Path) -> None:
    import json

    doc = json.loads(run_gpuq("status", "--json", "--no-probe", "--all", "--state", "failed,QUEUED").stdout)
    assert sorted(j["name"] for j in doc["jobs"]) == ["baseline", "baseline", "deep", "tiny", "wide"]
    failed = json.loads(run_gpuq("status", "--json", "--no-probe", "--all", "--state", "FAILED").stdout)
    assert [j["name"] for j in failed["jobs"]] == ["tiny"]
    assert all(h["last_probe_at"] is None for h in failed["hosts"])  # nothing was probed
    table = run_gpuq("status", "--once", "--no-probe", "--state", "FAILED")
    assert table.returncode == 0 and "tiny" in table.stdout and "deep" not in table.stdout
    bad = run_gpuq("status", "--once", "--state", "RUNING")
    assert bad.returncode == exitcodes.USAGE and "unknown state RUNING" in bad.stderr


def test_version_from_a_checkout() -> None:
    result = run_gpuq("--version")
    expected = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert result.returncode == 0 and result.stdout.strip() == f"gpuq {expected}", result.stderr
    assert __version__ == expected


def test_help_lists_the_exit_codes() -> None:
    result = run_gpuq("--help")
    assert result.returncode == 0
    for code, text in exitcodes.TABLE.items():
        assert f"{code}  {text}" in result.stdout


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_script(shell: str) -> None:
    result = run_gpuq("completion", shell)
    assert result.returncode == 0 and "_GPUQ_COMPLETE" in result.stdout


def _complete(words: str, home: Path) -> list[str]:
    env = dict(os.environ, _GPUQ_COMPLETE="bash_complete", COMP_WORDS=words, COMP_CWORD=str(len(words.split()) - 1
                                                                                          + words.endswith(" ")),
               GPUQ_HOME=str(home))
    out = subprocess.run([sys.executable, "-m", "orchestrator"], capture_output=True, text=True, env=env, cwd=ROOT,
                         check=False, timeout=30)
    lines = out.stdout.splitlines()
    return [line.split(",", 1)[1] for line in lines if "," in line]


def test_completion_of_jobs_sweeps_and_hosts(home: Path) -> None:
    assert _complete("gpuq logs ba", home) == ["baseline"]
    assert sorted(_complete("gpuq cancel d", home)) == ["deep"]
    assert _complete("gpuq logs qold0001:w", home) == ["qold0001:wide"]
    assert sorted(_complete("gpuq status --sweep q", home)) == ["qnew0002", "qold0001"]
    assert _complete("gpuq logs ba", home / "nowhere") == []  # no ledger: nothing, no error


def test_wait_timeout_exits_4(home: Path) -> None:
    conn = sqlite3.connect(home / "ledger.db")
    conn.execute("UPDATE sweep SET hosts = 'gone'")  # a host that is not registered: nothing can start
    conn.commit()
    conn.close()
    result = run_gpuq("wait", "--timeout", "0")
    assert result.returncode == exitcodes.TIMEOUT, (result.returncode, result.stdout, result.stderr)
    assert "still running after 0 s" in result.stderr and "Traceback" not in result.stderr
    assert result.stdout == ""  # without --json: the one line on stderr alone
    # a script asking for JSON gets it on timeout too: the jobs as they stood, timed_out, then exit 4
    as_json = run_gpuq("wait", "--timeout", "0", "--json")
    assert as_json.returncode == exitcodes.TIMEOUT and "still running after 0 s" in as_json.stderr, as_json.stderr
    doc = json.loads(as_json.stdout)
    schema = json.loads((ROOT / "docs" / "schemas" / "wait.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(doc)
    assert doc["timed_out"] is True and doc["ok"] is False and doc["jobs"], doc
    assert sum(doc["states"].values()) == len(doc["jobs"]) and "SUCCEEDED" not in doc["states"], doc


def test_committed_schemas_are_the_generated_ones() -> None:
    from orchestrator.cli import documents

    folder = ROOT / "docs" / "schemas"
    committed = {p.name for p in folder.glob("*.schema.json")}
    assert committed == {f"{name}.schema.json" for name in documents.DOCUMENTS}
    for name in documents.DOCUMENTS:
        assert (folder / f"{name}.schema.json").read_text() == documents.render_schema(name), (
            f"docs/schemas/{name}.schema.json is stale: run `python -m orchestrator.cli.documents`")


def _validate(name: str, doc: object) -> None:
    import jsonschema

    from orchestrator.cli import documents

    jsonschema.Draft202012Validator(documents.json_schema(name)).validate(doc)


def test_json_of_results_hosts_and_wait(home: Path) -> None:
    import json

    conn = sqlite3.connect(home / "ledger.db")
    conn.execute("UPDATE job SET state = 'FAILED' WHERE sweep_id = 'qnew0002'")
    conn.commit()
    conn.close()
    results = run_gpuq("results", "--json")
    assert results.returncode == 0, results.stderr
    doc = json.loads(results.stdout)
    _validate("results", doc)
    assert doc["sweep"] == "qnew0002" and [j["name"] for j in doc["jobs"]] == ["baseline", "deep", "tiny"]
    assert run_gpuq("results", "--json", "--csv").returncode == exitcodes.USAGE

    waited = run_gpuq("wait", "--json", "--sweep", "qnew")
    assert waited.returncode == exitcodes.FAILED, waited.stderr  # every job FAILED
    doc = json.loads(waited.stdout)
    _validate("wait", doc)
    assert doc["ok"] is False and doc["states"] == {"FAILED": 3}

    from orchestrator.ledger import HostRow

    ledger = Ledger(home / "ledger.db")
    ledger.add_host(HostRow(name="g1", kind="ssh", target="me@192.0.2.1", root="/srv/gpuq", profile="ssh"))
    ledger.close()
    listed = run_gpuq("hosts", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    doc = json.loads(listed.stdout)
    _validate("hosts", doc)
    assert [h["target"] for h in doc["hosts"] if h["name"] == "g1"] == ["me@192.0.2.1"]
    shown = run_gpuq("hosts", "show", "g1", "--json")
    assert shown.returncode == 0, shown.stderr
    doc = json.loads(shown.stdout)
    _validate("host", doc)
    assert doc["host"]["root"] == "/srv/gpuq" and doc["active_jobs"] == []
    assert _complete("gpuq hosts show g", home) == ["g1"]
    unknown = run_gpuq("hosts", "show", "nope", "--json")
    assert unknown.returncode == exitcodes.USAGE and "unknown host" in unknown.stderr


@pytest.mark.parametrize(("answer", "code", "state"), [("y", 0, "CANCELLED"), ("n", exitcodes.INTERRUPTED, "QUEUED")])
def test_cancel_of_several_asks_in_a_terminal(home: Path, answer: str, code: int, state: str) -> None:
    import pty

    controller, terminal = pty.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "cancel", "wide", "deep"], stdin=terminal,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        os.write(controller, f"{answer}\n".encode())
        out, err = proc.communicate(timeout=60)
    finally:
        os.close(controller)
        os.close(terminal)
    assert proc.returncode == code, (out, err)
    assert "cancel 2 jobs of sweep(s) qnew0002, qold0001?" in out
    states = _states(home)
    assert states["qold0001:wide"] == state and states["qnew0002:deep"] == state


def test_an_eof_error_inside_gpuq_is_its_own_traceback_not_aborted(monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """click turns every EOFError into Abort; gpuq says "aborted" only for a prompt the user left
    unanswered, and lets any other EOFError (a dropped connection nobody caught) show what it is."""
    import io

    import click

    from orchestrator.cli.main import cli, main

    @click.command("eof-inside")
    def eof_inside() -> None:
        raise EOFError("connection closed under gpuq")

    @click.command("eof-at-prompt")
    def eof_at_prompt() -> None:
        click.confirm("go on?", abort=True)

    monkeypatch.setitem(cli.commands, "eof-inside", eof_inside)
    monkeypatch.setitem(cli.commands, "eof-at-prompt", eof_at_prompt)
    with pytest.raises(EOFError, match="connection closed under gpuq"):
        main(["eof-inside"])
    assert "aborted" not in capsys.readouterr().err

    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    with pytest.raises(SystemExit) as ended:
        main(["eof-at-prompt"])
    assert ended.value.code == exitcodes.INTERRUPTED
    assert capsys.readouterr().err.rstrip().endswith("aborted")


def test_no_cli_module_is_over_400_lines() -> None:
    """cli/ holds tables and emitters only (the view models are orchestrator/views/): one purpose per module."""
    long = {p.name: n for p in (ROOT / "orchestrator" / "cli").glob("*.py")
            if (n := len(p.read_text().splitlines())) > 400}
    assert not long, long


def test_the_api_package_is_plain_re_exports() -> None:
    """``api.status``, ``api.wait``, ``api.pull`` and ``api.submit`` are the verbs, whatever was imported
    before (no module of the package shadows one; no module-class trick)."""
    code = ("import importlib, pkgutil, types, orchestrator.api as api\n"
            "for m in pkgutil.iter_modules(api.__path__): importlib.import_module(f'orchestrator.api.{m.name}')\n"
            "assert type(api) is types.ModuleType, type(api)\n"
            "bad = [n for n in api.__all__ if isinstance(getattr(api, n), types.ModuleType)]\n"
            "assert not bad, bad\n"
            "assert all(callable(getattr(api, n)) for n in ('status', 'wait', 'pull', 'submit'))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
