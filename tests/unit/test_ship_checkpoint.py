"""Shipping a checkpoint off a host that saves faster than the controller copies (api/cloud.py and the
agent's ``snapshot`` verb)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from orchestrator.api.cloud import _fetch_checkpoint
from orchestrator.hosts.local import LocalHost
from tests.support.jobtree import SHA, install_agent

JOB = "c0123456789ab"


@pytest.fixture
def host(tmp_path: Path) -> LocalHost:
    root = tmp_path / "host"
    install_agent(root)
    return LocalHost(root)


def _save(root: Path, step: int, data: bytes) -> dict[str, object]:
    ckpt = root / "jobs" / JOB / "ckpt"
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
    assert pointer == current and part.read_bytes() == b"eight!"
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
