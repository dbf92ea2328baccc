"""The host agent's `enqueue` in process (payload/agent/gpuq_records/gpuq_inbox.py): which launch orders it
writes, the verdict for each, and what it refuses, so that no job starts twice on one host.

tests/integration/test_agent.py drives the same command through a real agent process; these tests
pin each rule of the claim path on its own (scripts/mutation.py agent).
"""

from __future__ import annotations

import io
import json
import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.agentmodule import load_agent_module
from tests.support.jobspecs import spec_doc

inbox = load_agent_module("gpuq_records.gpuq_inbox", qualified=True)
P = load_agent_module("gpuq_base.gpuq_protocol")


def _enqueue(root: Path, payload: Any, capsys: pytest.CaptureFixture[str]) -> tuple[int, Any, str]:
    code = inbox.cmd_enqueue(str(root), io.StringIO(payload if isinstance(payload, str) else json.dumps(payload)))
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out else None), err


def _spec(job_id: str = "c000000000001", attempt: int = 1, **kw: Any) -> dict[str, Any]:
    return spec_doc(job_id=job_id, attempt=attempt, **kw)


def _attempt_dir(root: Path, job_id: str, n: int) -> Path:
    adir = root / P.JOBS_DIR / job_id / P.ATTEMPTS_DIR / str(n)
    adir.mkdir(parents=True)
    return adir


def test_a_new_spec_is_queued_once_and_written_whole(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, verdicts, err = _enqueue(tmp_path, [_spec(x=1), _spec("c2", 3)], capsys)
    assert (code, verdicts, err) == (0, {"c000000000001": "queued", "c2": "queued"}, "")
    written = json.loads((tmp_path / P.INBOX_DIR / "c000000000001.json").read_text())
    assert written == _spec(x=1)  # every key as it came, one this agent does not know included
    assert sorted(os.listdir(tmp_path / P.INBOX_DIR)) == ["c000000000001.json", "c2.json"]  # no temp file left
    # idempotent: the same order again is "exists", and the file is not rewritten
    before = (tmp_path / P.INBOX_DIR / "c2.json").stat().st_mtime_ns
    assert _enqueue(tmp_path, [_spec("c2", 3, x=2)], capsys)[1] == {"c2": "exists"}
    assert _enqueue(tmp_path, [_spec("c2", 2)], capsys)[1] == {"c2": "exists"}  # an older attempt too
    assert (tmp_path / P.INBOX_DIR / "c2.json").stat().st_mtime_ns == before
    assert _enqueue(tmp_path, [_spec("c2", 4)], capsys)[1] == {"c2": "queued"}  # the next attempt replaces it
    assert json.loads((tmp_path / P.INBOX_DIR / "c2.json").read_text())["attempt"] == 4


@pytest.mark.parametrize("where", ["claimed", "attempt"])
def test_a_spec_the_agent_already_took_exists(tmp_path: Path, where: str, capsys: pytest.CaptureFixture[str]) -> None:
    if where == "claimed":
        (tmp_path / P.CLAIMED_DIR).mkdir()
        (tmp_path / P.CLAIMED_DIR / "c1.json").write_text(json.dumps(_spec("c1", 2)))
    else:
        _attempt_dir(tmp_path, "c1", 2)
    assert _enqueue(tmp_path, [_spec("c1", 2)], capsys)[1] == {"c1": "exists"}
    assert not (tmp_path / P.INBOX_DIR / "c1.json").exists()
    if where == "claimed":
        assert _enqueue(tmp_path, [_spec("c1", 1)], capsys)[1] == {"c1": "exists"}
        assert _enqueue(tmp_path, [_spec("c1", 3)], capsys)[1] == {"c1": "queued"}


def test_a_withdrawn_spec_stays_withdrawn_for_its_attempt(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / P.WITHDRAWN_DIR).mkdir()
    (tmp_path / P.WITHDRAWN_DIR / "c1.json").write_text(json.dumps(_spec("c1", 2)))
    assert _enqueue(tmp_path, [_spec("c1", 1), _spec("c1", 2)], capsys)[1] == {"c1": "withdrawn"}
    assert _enqueue(tmp_path, [_spec("c1", 3)], capsys)[1] == {"c1": "queued"}


def test_another_live_attempt_of_the_job_makes_it_busy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Attempt 1 was launched moments ago (launch.json, no group recorded yet, no exit): attempt 2
    is refused until it has ended, and nothing is written."""
    live = _attempt_dir(tmp_path, "c1", 1)
    (live / P.LAUNCH_FILE).write_text("{}")
    assert _enqueue(tmp_path, [_spec("c1", 2)], capsys)[1] == {"c1": "busy"}
    assert not (tmp_path / P.INBOX_DIR / "c1.json").exists()
    (live / P.EXIT_FILE).write_text('{"code": 0}')
    assert _enqueue(tmp_path, [_spec("c1", 2)], capsys)[1] == {"c1": "queued"}


def test_a_launch_long_ago_whose_group_was_never_recorded_is_not_alive(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    old = _attempt_dir(tmp_path, "c1", 1)
    (old / P.LAUNCH_FILE).write_text("{}")
    past = time.time() - 3600
    os.utime(old / P.LAUNCH_FILE, (past, past))
    assert _enqueue(tmp_path, [_spec("c1", 2)], capsys)[1] == {"c1": "queued"}


def test_secrets_are_written_0600_in_a_0700_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    payload = {"specs": [_spec("c1")], "secrets": {"q1": {"HF_TOKEN": "hf_x", "N": 3}}}
    assert _enqueue(tmp_path, payload, capsys)[:2] == (0, {"c1": "queued"})
    sdir = tmp_path / P.SECRETS_DIR
    assert stat.S_IMODE(sdir.stat().st_mode) == 0o700
    assert stat.S_IMODE((sdir / "q1.json").stat().st_mode) == 0o600
    assert json.loads((sdir / "q1.json").read_text()) == {"HF_TOKEN": "hf_x", "N": "3"}
    assert os.listdir(sdir) == ["q1.json"]
    assert "hf_x" not in (tmp_path / P.INBOX_DIR / "c1.json").read_text()
    # without secrets the object form works too
    assert _enqueue(tmp_path, {"specs": [_spec("c2")]}, capsys)[:2] == (0, {"c2": "queued"})


@pytest.mark.parametrize(("payload", "message"), [
    ("not json", "gpuq enqueue: stdin is not JSON: "),
    ({"specs": {"job_id": "c1"}}, "gpuq enqueue: expected a JSON list of job specs"),
    ('{"job_id": "c1"}', "gpuq enqueue: expected a JSON list of job specs"),
    ({"specs": [], "secrets": ["x"]}, 'gpuq enqueue: "secrets" must map queue ids to {NAME: value} objects'),
    ({"specs": [], "secrets": {"../q": {}}}, 'gpuq enqueue: "secrets" must map queue ids to {NAME: value} objects'),
    ({"specs": [], "secrets": {"q1": "v"}}, 'gpuq enqueue: "secrets" must map queue ids to {NAME: value} objects'),
    ([_spec("../../etc")], "gpuq enqueue: malformed spec 0 ('../../etc'): job_id must be a job id"),
    ([_spec("c1", 0)], "gpuq enqueue: malformed spec 0 ('c1'): attempt must be an integer >= 1, not 0"),
    ([_spec("c1", "two")], "gpuq enqueue: malformed spec 0 ('c1'): attempt must be an integer >= 1, not 'two'"),
    ([_spec("c1"), "c2"], "gpuq enqueue: malformed spec 1: job spec is not a JSON object"),
    ([{k: v for k, v in _spec().items() if k != "job_id"}], "gpuq enqueue: malformed spec 0: job_id is missing"),
    ({"specs": [_spec("c1", -1)], "secrets": {"q1": {"A": "b"}}},
     "gpuq enqueue: malformed spec 0 ('c1'): attempt must be an integer >= 1, not -1"),
    ([_spec("c1", gpus="2")], "gpuq enqueue: malformed spec 0 ('c1'): gpus must be an integer >= 0 <= 4096, not '2'"),
    ([_spec("c1", schema="gpuq.job/2")], "gpuq enqueue: malformed spec 0 ('c1'): job spec schema gpuq.job/2 is newer"),
])
def test_a_malformed_order_writes_nothing(tmp_path: Path, payload: Any, message: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    code, verdicts, err = _enqueue(tmp_path, payload, capsys)
    assert (code, verdicts) == (P.AGENT_EXIT_USAGE, None)
    assert err.startswith(message), err
    assert list(tmp_path.iterdir()) == []  # not even a secrets file of a good queue id


def test_the_attempt_a_document_names_is_a_whole_number_else_zero() -> None:
    jobspec = load_agent_module("gpuq_base.gpuq_jobspec")
    assert jobspec.attempt_of({"attempt": 7}) == 7
    for bad in ({}, {"attempt": "7"}, {"attempt": None}, {"attempt": True}, {"attempt": 0}, "not a dict"):
        assert jobspec.attempt_of(bad) == 0, bad


def test_collect_refuses_a_bad_job_id_and_lists_only_real_result_files(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert inbox.cmd_collect(str(tmp_path), ["c1", "../x"]) == P.AGENT_EXIT_USAGE
    assert capsys.readouterr() == ("", "gpuq collect: bad job id '../x'\n")
    job = tmp_path / P.JOBS_DIR / "c1"
    (job / P.RESULT_DIR / "sub").mkdir(parents=True)
    (job / P.RESULT_DIR / "b.txt").write_text("bb")
    (job / P.RESULT_DIR / "sub" / "a.txt").write_text("a")
    (job / P.RESULT_DIR / "half.tmp").write_text("x")
    (job / P.RESULT_DIR / "link").symlink_to("/etc/passwd")
    (job / P.CKPT_DIR).mkdir()
    (job / P.CKPT_DIR / P.BEST_CKPT).write_bytes(b"ckpt")
    assert inbox.cmd_collect(str(tmp_path), ["c1"]) == 0
    got = json.loads(capsys.readouterr().out)["c1"]
    assert [(f["path"], f["bytes"]) for f in got["files"]] == [
        (f"{P.RESULT_DIR}/b.txt", 2), (f"{P.RESULT_DIR}/sub/a.txt", 1), (f"{P.CKPT_DIR}/{P.BEST_CKPT}", 4)]
    assert got["files"][0]["sha256"] == "3b64db95cb55c763391c707108489ae18b4112d783300de38e033b4c98c3deaf"
    assert (got["attempt"], got["summary"], got["ckpt"]) == (0, None, None)


def test_what_enqueue_writes_and_prints_is_sorted_and_beside_its_target(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """Temporary files go next to their target (never the agent's cwd: /proc takes no file), the
    secrets dir may exist already, and every document is written with sorted keys."""
    monkeypatch.chdir("/proc")
    root = tmp_path / "root"
    (root / P.SECRETS_DIR).mkdir(parents=True)
    order = {"specs": [_spec("c2", zeta=1, alpha=2), _spec("c1")], "secrets": {"q1": {"Z": "1", "A": "2"}}}
    code = inbox.cmd_enqueue(str(root), io.StringIO(json.dumps(order)))
    out = capsys.readouterr().out
    assert code == 0 and out == '{"c1": "queued", "c2": "queued"}\n'
    assert (root / P.INBOX_DIR / "c2.json").read_text() == json.dumps(_spec("c2", zeta=1, alpha=2), sort_keys=True)
    assert (root / P.SECRETS_DIR / "q1.json").read_text() == '{"A": "2", "Z": "1"}'
    assert sorted(os.listdir(root / P.INBOX_DIR)) == ["c1.json", "c2.json"]
