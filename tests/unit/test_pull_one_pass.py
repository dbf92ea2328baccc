"""A pull hashes each file as it is written (one pass on this side), trusts that hash only while the file is
unchanged, and skips the tick for a sweep that is settled (docs/results.md, docs/performance.md)."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from orchestrator.api import pulling
from orchestrator.transfer import PULL_VERIFIED, job_copy
from orchestrator.transfer import verify as verify_module
from orchestrator.transfer.verify import Streamed
from tests.support.pullworld import World


def test_fresh_copies_are_verified_from_the_hash_taken_while_writing(world: World,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    reread: list[Path] = []
    real = verify_module.file_sha256
    monkeypatch.setattr(verify_module, "file_sha256", _counting(reread, real))
    outcomes = world.pull()
    assert [o.state for o in outcomes] == ["verified", "verified"]
    assert reread == []


def test_a_resumed_file_hashes_the_kept_part_and_verifies(world: World) -> None:
    world.host.breaks["best.pt"] = [100]  # the link drops after 100 bytes of the checkpoint, once per job
    outcomes = world.pull()
    assert [o.state for o in outcomes] == ["verified", "verified"]
    assert any(offset == 100 for remote, offset in world.host.gets if remote.endswith("best.pt"))


def test_a_copy_changed_after_it_was_written_is_read_again_and_caught(world: World,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    real = job_copy.verify_copy  # type: ignore[attr-defined]

    def change_then_verify(directory: Path, manifest: Any, streamed: Any = None) -> Any:
        target = directory / "result" / "plots" / "curve.csv"
        data = bytearray(target.read_bytes())
        data[0] ^= 0x01
        target.write_bytes(bytes(data))
        os.utime(target, ns=(1, 1))  # a new mtime, same size: the streamed hash no longer holds
        return real(directory, manifest, streamed)

    monkeypatch.setattr(job_copy, "verify_copy", change_then_verify)
    outcomes = world.pull()
    assert [o.state for o in outcomes] == ["quarantined", "quarantined"]
    assert all("result/plots/curve.csv has sha256" in o.reason for o in outcomes)


def test_a_streamed_hash_holds_only_for_the_same_file_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(b"abc")
    mark = Streamed.of(path, "x" * 64)
    assert mark.holds_for(path)
    path.write_bytes(b"abd")
    os.utime(path, ns=(5, 5))
    assert not mark.holds_for(path)


def test_a_settled_sweep_needs_no_tick(world: World) -> None:
    ctx: Any = SimpleNamespace(ledger=world.ledger)
    jobs = world.ledger.jobs(sweep_id=world.jobs[0].sweep_id)
    assert not pulling._settled(ctx, jobs)  # nothing verified yet: the host may have news
    world.pull()
    assert pulling._settled(ctx, jobs)
    (world.final(world.jobs[0]) / PULL_VERIFIED).unlink()  # the local copy lost its record: ask the host again
    assert not pulling._settled(ctx, jobs)


def _counting(seen: list[Path], real: Any) -> Any:
    def sha(path: Path) -> str:
        seen.append(path)
        return str(real(path))

    return sha
