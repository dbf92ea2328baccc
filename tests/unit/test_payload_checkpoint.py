"""Unit tests of the payload's atomic checkpoint writer and verified loader."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "payload"))

from gpuq_payload import checkpoint, contract  # noqa: E402


def _state(step: int) -> dict:
    return {"model": {"w": torch.arange(64, dtype=torch.float32) * step}, "step": step}


def test_save_writes_complete_file_and_matching_pointer(tmp_path: Path) -> None:
    doc = checkpoint.save_checkpoint(_state(3), str(tmp_path), step=3, epoch=1)
    pointer = json.loads((tmp_path / contract.LATEST_POINTER).read_text())
    assert pointer == doc
    assert set(pointer) == {"file", "step", "epoch", "sha256", "bytes", "written_at"}
    path = tmp_path / pointer["file"]
    assert pointer["file"] == checkpoint.rolling_name(3) == "latest-000000003.pt"
    assert pointer["sha256"] == checkpoint.sha256_file(str(path))
    assert pointer["bytes"] == path.stat().st_size
    assert not list(tmp_path.glob("*.tmp"))
    loaded = checkpoint.load_checkpoint(str(path), pointer["sha256"])
    assert torch.equal(loaded["model"]["w"], _state(3)["model"]["w"])


def test_leftover_tmp_is_deleted_and_never_selected(tmp_path: Path) -> None:
    checkpoint.save_checkpoint(_state(5), str(tmp_path), step=5, epoch=0)
    name = checkpoint.rolling_name(5)
    good = (tmp_path / name).read_bytes()
    # a torn write of the next checkpoint: truncated latest-*.pt.tmp and a half-written LATEST.tmp
    torn = checkpoint.rolling_name(6) + ".tmp"
    (tmp_path / torn).write_bytes(good[: len(good) // 3])
    (tmp_path / (contract.LATEST_POINTER + ".tmp")).write_text('{"file": "latest-6.pt.tmp", "st')
    path, sha = checkpoint.resolve_resume(str(tmp_path), None)
    assert os.path.basename(path) == name
    assert checkpoint.load_checkpoint(path, sha)["step"] == 5
    removed = checkpoint.cleanup_tmp(str(tmp_path))
    assert sorted(removed) == sorted([torn, contract.LATEST_POINTER + ".tmp"])
    assert not list(tmp_path.glob("*.tmp"))
    assert (tmp_path / name).read_bytes() == good


def test_the_file_the_pointer_names_is_never_rewritten(tmp_path: Path) -> None:
    """A kill at any point of a save leaves LATEST naming a complete file with its sha256: the next
    checkpoint goes to a new name, the pointer moves, and only then the old file goes."""
    first = checkpoint.save_checkpoint(_state(1), str(tmp_path), step=1, epoch=0)
    before = (tmp_path / first["file"]).read_bytes()
    second = checkpoint.save_checkpoint(_state(2), str(tmp_path), step=2, epoch=0)
    assert second["file"] != first["file"] and not (tmp_path / first["file"]).exists()
    assert sorted(p.name for p in tmp_path.glob("latest*.pt")) == [second["file"]]
    # the window between the new file and the pointer: the old pointer still verifies its own file
    (tmp_path / first["file"]).write_bytes(before)
    checkpoint.write_pointer(str(tmp_path), first)
    path, sha = checkpoint.resolve_resume(str(tmp_path), None)
    assert checkpoint.load_checkpoint(path, sha)["step"] == 1


def test_pointer_to_tmp_file_is_rejected(tmp_path: Path) -> None:
    checkpoint.save_checkpoint(_state(1), str(tmp_path), step=1, epoch=0)
    doc = json.loads((tmp_path / contract.LATEST_POINTER).read_text())
    doc["file"] = doc["file"] + ".tmp"
    (tmp_path / contract.LATEST_POINTER).write_text(json.dumps(doc))
    with pytest.raises(checkpoint.CheckpointError):
        checkpoint.resolve_resume(str(tmp_path), None)


def test_load_rejects_sha_mismatch(tmp_path: Path) -> None:
    checkpoint.save_checkpoint(_state(2), str(tmp_path), step=2, epoch=0)
    path, sha = checkpoint.resolve_resume(str(tmp_path), None)
    with pytest.raises(checkpoint.CheckpointError, match="sha256 mismatch"):
        checkpoint.load_checkpoint(path, "0" * 64)
    with open(path, "r+b") as fh:  # flip one byte of the real file
        fh.seek(10)
        byte = fh.read(1)
        fh.seek(10)
        fh.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(checkpoint.CheckpointError, match="sha256 mismatch"):
        checkpoint.load_checkpoint(path, sha)


def test_no_pointer_means_fresh_start_and_explicit_resume(tmp_path: Path) -> None:
    assert checkpoint.resolve_resume(str(tmp_path), None) is None
    with pytest.raises(checkpoint.CheckpointError):
        checkpoint.resolve_resume(str(tmp_path), str(tmp_path / "missing.pt"))
    checkpoint.save_checkpoint(_state(4), str(tmp_path), step=4, epoch=0)
    for target in (tmp_path, tmp_path / contract.LATEST_POINTER, tmp_path / checkpoint.rolling_name(4)):
        path, sha = checkpoint.resolve_resume(str(tmp_path / "elsewhere"), str(target))
        assert checkpoint.load_checkpoint(path, sha)["step"] == 4


def test_best_loads_with_weights_only_and_weights_hash_is_stable(tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 2)
    sd = checkpoint.unwrap_state_dict(model)
    checkpoint.save_best({"model": sd, "metrics": {"val_acc": 0.5, "kind": "eval"}, "step": 1}, str(tmp_path))
    best = torch.load(tmp_path / contract.BEST_CKPT, weights_only=True)
    assert best["metrics"]["val_acc"] == 0.5
    assert checkpoint.weights_sha256(best["model"]) == checkpoint.weights_sha256(sd)
    sd2 = {k: v.clone() for k, v in sd.items()}
    sd2["bias"][0] += 1.0
    assert checkpoint.weights_sha256(sd2) != checkpoint.weights_sha256(sd)
