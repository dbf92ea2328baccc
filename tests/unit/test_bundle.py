"""Bundles are deterministic, content-addressed, and never carry secrets or VCS data."""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path

import pytest

from orchestrator.bundle import build_bundle


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    work = tmp_path / "project"
    (work / "configs").mkdir(parents=True)
    (work / "configs" / "a.yaml").write_text("seed: 1\n")
    (work / "queue.txt").write_text("configs/a.yaml classify\n")
    return work


def _names(path: Path) -> set[str]:
    with tarfile.open(path) as tar:
        return set(tar.getnames())


def test_same_content_same_sha_regardless_of_mtime(workdir: Path, tmp_path: Path) -> None:
    first = build_bundle(workdir, tmp_path / "cache")
    os.utime(workdir / "configs" / "a.yaml", (1, 1))
    second = build_bundle(workdir, tmp_path / "cache2")
    assert first.sha256 == second.sha256
    assert first.path.read_bytes() == second.path.read_bytes()


def test_changed_content_changes_sha(workdir: Path, tmp_path: Path) -> None:
    first = build_bundle(workdir, tmp_path / "cache")
    (workdir / "configs" / "a.yaml").write_text("seed: 2\n")
    assert build_bundle(workdir, tmp_path / "cache").sha256 != first.sha256


def test_layout_and_manifest(workdir: Path, tmp_path: Path) -> None:
    bundle = build_bundle(workdir, tmp_path / "cache")
    names = _names(bundle.path)
    assert "workdir/configs/a.yaml" in names
    assert "payload/agent/gpuq_agent.py" in names
    assert "MANIFEST.json" in names
    with tarfile.open(bundle.path) as tar:
        member = tar.extractfile("MANIFEST.json")
        assert member is not None
        manifest = json.load(member)
    assert {f["path"] for f in manifest["files"]} == names - {"MANIFEST.json"}


def test_secrets_vcs_and_ignored_files_stay_out(workdir: Path, tmp_path: Path) -> None:
    (workdir / ".git").mkdir()
    (workdir / ".git" / "config").write_text("[core]\n")
    (workdir / ".env").write_text("WANDB_API_KEY=sekrit\n")
    (workdir / "id_ed25519").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    (workdir / "data").mkdir()
    (workdir / "data" / "big.bin").write_bytes(b"x" * 100)
    (workdir / "notes.log").write_text("log\n")
    (workdir / ".gpuqignore").write_text("# data is on the host\ndata/\n*.log\n")
    outside = tmp_path / "outside.txt"
    outside.write_text("not yours\n")
    (workdir / "link.txt").symlink_to(outside)
    bundle = build_bundle(workdir, tmp_path / "cache")
    names = _names(bundle.path)
    assert not any(".git/" in n or n.endswith((".env", "id_ed25519", "big.bin", "notes.log", "link.txt"))
                   for n in names)
    assert set(bundle.skipped_secrets) >= {"workdir/.env", "workdir/id_ed25519"}
    assert b"sekrit" not in bundle.path.read_bytes()


def test_gpuq_home_inside_workdir_is_excluded(workdir: Path, tmp_path: Path) -> None:
    home = workdir / "state"
    home.mkdir()
    (home / "ledger.db").write_bytes(b"sqlite")
    bundle = build_bundle(workdir, tmp_path / "cache", exclude=(home,))
    assert not any(n.startswith("workdir/state") for n in _names(bundle.path))
