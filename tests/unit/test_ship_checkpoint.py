"""Shipping a checkpoint off a host that saves faster than the controller copies (tick/checkpoints.py and the
agent's ``snapshot`` verb)."""

from __future__ import annotations

import hashlib
import json
import pickle
from pathlib import Path

import pytest

from orchestrator.hosts.local import LocalHost
from orchestrator.tick.checkpoints import _fetch_checkpoint
from tests.support.checkpointworld import archive
from tests.support.jobtree import SHA, install_agent
from tests.support.wire import status

JOB = "c0123456789ab"


@pytest.fixture
def host(tmp_path: Path) -> LocalHost:
    root = tmp_path / "host"
    install_agent(root)
    return LocalHost(root)


class _Boom:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        import os

        return (os.system, ("touch /tmp/gpuq-pwned-by-checkpoint",))


def _save(root: Path, step: int, data: bytes, job: str = JOB) -> dict[str, object]:
    ckpt = root / "jobs" / job / "ckpt"
    ckpt.mkdir(parents=True, exist_ok=True)
    name = f"latest-{step:09d}.pt"
    (ckpt / name).write_bytes(data)
    pointer = {"file": name, "step": step, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (ckpt / "LATEST").write_text(json.dumps(pointer))
    return pointer


def test_the_checkpoint_latest_names_now_is_pinned_copied_and_unpinned(host: LocalHost, tmp_path: Path) -> None:
    root = Path(host.root)
    _save(root, 4, b"four")
    (root / "jobs" / JOB / "ckpt" / "latest-000000004.pt").unlink()  # rotated away since the probe
    current = _save(root, 8, b"eight!")
    target = tmp_path / "home"
    target.mkdir()
    got = _fetch_checkpoint(host, SHA, JOB, target)
    assert not isinstance(got, str), got
    pointer, part = got
    assert pointer.model_dump(exclude_unset=True, exclude={"snapshot"}) == current and part.read_bytes() == b"eight!"
    assert not (root / "jobs" / JOB / "ckpt" / ".ship.pt").exists()  # the pin is gone after the copy
    assert (root / "jobs" / JOB / "ckpt" / "latest-000000008.pt").read_bytes() == b"eight!"  # untouched


def test_a_copy_that_does_not_match_its_pointer_is_never_kept(host: LocalHost, tmp_path: Path) -> None:
    root = Path(host.root)
    pointer = _save(root, 8, b"eight!")
    (root / "jobs" / JOB / "ckpt" / str(pointer["file"])).write_bytes(b"torn")  # same name, other bytes
    target = tmp_path / "home"
    target.mkdir()
    got = _fetch_checkpoint(host, SHA, JOB, target)
    assert isinstance(got, str) and "did not match" in got
    assert list(target.iterdir()) == []


def test_no_checkpoint_yet_is_said_plainly(host: LocalHost, tmp_path: Path) -> None:
    got = _fetch_checkpoint(host, SHA, JOB, tmp_path)
    assert isinstance(got, str) and "no checkpoint pointer" in got


# --- a host's status document is untrusted (docs/security.md) ------------------------------------

from orchestrator.context import open_context  # noqa: E402
from orchestrator.core.specs import JobSpec, job_id_for  # noqa: E402
from orchestrator.core.states import AttemptState, JobState  # noqa: E402
from orchestrator.tick.checkpoints import newest_durable, safe_checkpoint_file, ship_checkpoints  # noqa: E402


@pytest.mark.parametrize("name", ["latest-000000008.pt", "latest-000000008-1.pt", "run/snapshot.pt",
                                  "run/checkpoints/epoch=3-step=120.ckpt", "run/" + "d/" * 7 + "x",  # 8 deep
                                  # ordinary names of real trainers (Lightning, HF, DCP): only the unsafe is refused
                                  "run/lightning_logs/version_0/checkpoints/epoch=19-step=40.ckpt",
                                  "run/out/checkpoint-500", "run/ckpt/step+1@a,b c.pt", "run/dcp/.metadata"])
def test_plain_checkpoint_names_are_accepted(name: str) -> None:
    assert safe_checkpoint_file(name) == name


@pytest.mark.parametrize("name", ["../authorized_keys", "authorized_keys", "run/../../x", "run/./x",
                                  "run/", "run", "run/a\\b", "run/" + "x" * 256, "run/a\x85b", "/etc/passwd",
                                  "ckpt/best.pt", "run/a\nb", "run/" + "d/" * 8 + "x",
                                  None, 7, "latest-8.pt/../../x"])
def test_unsafe_checkpoint_names_are_refused(name: object) -> None:
    assert safe_checkpoint_file(name) is None


def test_a_status_document_cannot_make_the_controller_write_outside_its_job(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hostile host names a traversal job id, a job of another host and an unsafe file: nothing is
    written outside $GPUQ_HOME/checkpoints/<its own job>, and nothing the user owns is deleted."""
    home = tmp_path / "home"
    monkeypatch.setenv("GPUQ_HOME", str(home))
    decoy = tmp_path / "victim"
    decoy.mkdir()
    (decoy / "id_ed25519").write_text("private")
    ctx = open_context()
    try:
        local = ctx.fleet.local()
        install_agent(Path(local.root))
        ctx.ledger.update_host("local", agent_bundle=SHA)
        spec = JobSpec(name="a", config="c.yaml", task="t")
        ctx.ledger.add_sweep(sweep_id="qaaaaaa", queue_path="q.txt", workdir=str(tmp_path), queue_text="",
                             jobs=[spec], default_retries=0)
        mine = job_id_for("qaaaaaa", "a")
        ctx.ledger.start_attempt(mine, host="local", bundle_sha=SHA)
        ctx.ledger.transition(mine, AttemptState.RUNNING, attempt=1)
        ctx.ledger.transition(mine, JobState.RUNNING)
        pointer = _save(Path(local.root), 8, archive(), mine)
        # the host also lies: a LATEST that names a file outside ckpt/
        other = "c" + "0" * 12
        evil_dir = Path(local.root) / "jobs" / other / "ckpt"
        evil_dir.mkdir(parents=True)
        (evil_dir / "LATEST").write_text(json.dumps({"file": "../../../../victim/authorized_keys",
                                                      "sha256": "0" * 64, "bytes": 1, "step": 9}))
        doc = {"jobs": [
            {"job_id": "../../victim", "state": "running", "attempt": 1, "ckpt": pointer},
            {"job_id": other, "state": "running", "attempt": 1, "ckpt": {"sha256": "0" * 64, "step": 9}},
            {"job_id": mine, "state": "running", "attempt": 1, "ckpt": pointer},
        ]}  # an entry that is no object never passes the edge (test_host_documents)
        row = ctx.ledger.host("local")
        assert row is not None
        shipped = ship_checkpoints(ctx, row, status(doc))
    finally:
        ctx.close()
    assert shipped == [mine]
    assert sorted(p.name for p in decoy.iterdir()) == ["id_ed25519"]
    written = sorted(p.relative_to(home / "checkpoints").as_posix() for p in (home / "checkpoints").rglob("*")
                     if p.is_file())
    assert written == [f"{mine}/LATEST", f"{mine}/latest-000000008.pt"]


def test_a_checkpoint_that_needs_more_than_a_state_dict_is_refused_and_the_old_copy_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Host A ships a checkpoint whose pickle calls os.system: the controller reads its opcodes (never
    unpickles it), refuses it with an event naming the host and why, and keeps its previous copy, so a
    resume can never push it to another host."""
    home = tmp_path / "home"
    monkeypatch.setenv("GPUQ_HOME", str(home))
    ctx = open_context()
    try:
        local = ctx.fleet.local()
        install_agent(Path(local.root))
        ctx.ledger.update_host("local", agent_bundle=SHA)
        ctx.ledger.add_sweep(sweep_id="qbbbbbb", queue_path="q.txt", workdir=str(tmp_path), queue_text="",
                             jobs=[JobSpec(name="a", config="c.yaml", task="t")], default_retries=0)
        mine = job_id_for("qbbbbbb", "a")
        ctx.ledger.start_attempt(mine, host="local", bundle_sha=SHA)
        ctx.ledger.transition(mine, AttemptState.RUNNING, attempt=1)
        ctx.ledger.transition(mine, JobState.RUNNING)
        row = ctx.ledger.host("local")
        assert row is not None
        good = _save(Path(local.root), 8, archive(), mine)
        assert ship_checkpoints(ctx, row, status({"jobs": [{"job_id": mine, "state": "running", "attempt": 1,
                                                            "ckpt": good}]})) == [mine]
        evil = _save(Path(local.root), 16, archive(pickle.dumps({"w": _Boom()}, protocol=2)), mine)
        assert ship_checkpoints(ctx, row, status({"jobs": [{"job_id": mine, "state": "running", "attempt": 1,
                                                            "ckpt": evil}]})) == []
        kept = newest_durable(ctx, mine)
        events = [e.message for e in ctx.ledger.events(subject=mine)]
    finally:
        ctx.close()
    assert kept is not None and (kept.step, kept.sha256) == (8, good["sha256"])
    assert events[-1] == ("checkpoint latest-000000016.pt from local refused: it references posix.system, which "
                          "torch.load(weights_only=True) refuses; the controller keeps its previous copy")
    written = sorted(p.relative_to(home / "checkpoints").as_posix() for p in (home / "checkpoints").rglob("*")
                     if p.is_file())
    assert written == [f"{mine}/LATEST", f"{mine}/latest-000000008.pt"]
    assert not Path("/tmp/gpuq-pwned-by-checkpoint").exists()
