"""Bundles are deterministic, content-addressed, and never carry secrets or VCS data."""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path

import pytest

from orchestrator.agent.bundle import build_bundle


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


CREDENTIALS = [".git-credentials", ".docker/config.json", "sub/.kube/config", ".cache/huggingface/token",
               "application_default_credentials.json", "service-account-prod.json", ".npmrc", ".pgpass", ".envrc",
               ".ssh/id_work", ".bash_history", "tools/.zsh_history", ".python_history", ".aws/credentials",
               "deploy/server.pem"]


def test_credentials_are_denied_by_path_at_any_depth(workdir: Path, tmp_path: Path) -> None:
    for rel in CREDENTIALS:
        (workdir / rel).parent.mkdir(parents=True, exist_ok=True)
        (workdir / rel).write_text("TOKEN-s3cr3t\n")
    (workdir / "src").mkdir()
    (workdir / "src" / "docker_config.py").write_text("ok = 1\n")  # a look-alike name is code, not a credential
    bundle = build_bundle(workdir, tmp_path / "cache")
    names = _names(bundle.path)
    assert b"TOKEN-s3cr3t" not in bundle.path.read_bytes()
    assert "workdir/src/docker_config.py" in names
    skipped = {s.rstrip("/") for s in bundle.skipped_secrets}
    for rel in CREDENTIALS:
        top = rel.split("/")[0] if rel.startswith((".ssh/", ".aws/")) else rel
        assert f"workdir/{top}" in skipped, rel


def test_gpuqignore_has_gitignore_semantics(workdir: Path, tmp_path: Path) -> None:
    """Anchored patterns, directory-only patterns, negation, and opting a denied path back in."""
    for rel in ("data/train.bin", "sub/data/keep.txt", "big.bin", "sub/big.bin", "logs/a.log", "logs/keep.log",
                "ckpt/x.ckpt", "deep/er/y.ckpt", ".npmrc"):
        (workdir / rel).parent.mkdir(parents=True, exist_ok=True)
        (workdir / rel).write_text(rel)
    (workdir / ".gpuqignore").write_text("/data/\n/big.bin\n*.log\n!logs/keep.log\n**/*.ckpt\n!.npmrc\n")
    names = _names(build_bundle(workdir, tmp_path / "cache").path)
    assert {"workdir/sub/data/keep.txt", "workdir/sub/big.bin", "workdir/logs/keep.log", "workdir/.npmrc"} <= names
    assert not names & {"workdir/data/train.bin", "workdir/big.bin", "workdir/logs/a.log", "workdir/ckpt/x.ckpt",
                        "workdir/deep/er/y.ckpt"}


def test_a_large_project_is_named_and_an_oversized_one_refused(workdir: Path, tmp_path: Path) -> None:
    from orchestrator.core.errors import BundleError

    (workdir / "data").mkdir()
    (workdir / "data" / "train.bin").write_bytes(b"\0" * 300_000)
    (workdir / "data" / "val.bin").write_bytes(b"\0" * 100_000)
    warned = build_bundle(workdir, tmp_path / "cache", warn_bytes=200_000)
    assert warned.biggest[:2] == (("data/train.bin", 300_000), ("data/val.bin", 100_000))
    assert build_bundle(workdir, tmp_path / "cache").biggest == ()
    with pytest.raises(BundleError, match=r"over the bundle limit of 0\.3 MB.*data/train\.bin \(0\.3 MB\)"):
        build_bundle(workdir, tmp_path / "cache2", max_bytes=300_000)
    assert not (tmp_path / "cache2").exists() or not list((tmp_path / "cache2").iterdir())


def test_the_tarball_matches_its_manifest(workdir: Path, tmp_path: Path) -> None:
    import hashlib

    (workdir / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (workdir / "run.sh").chmod(0o755)
    bundle = build_bundle(workdir, tmp_path / "cache")
    assert hashlib.sha256(bundle.path.read_bytes()).hexdigest() == bundle.sha256
    with tarfile.open(bundle.path) as tar:
        manifest = json.load(tar.extractfile("MANIFEST.json"))  # type: ignore[arg-type]
        for item in manifest["files"]:
            member = tar.getmember(item["path"])
            data = tar.extractfile(member).read()  # type: ignore[union-attr]
            assert (len(data), hashlib.sha256(data).hexdigest()) == (item["bytes"], item["sha256"])
        assert tar.getmember("workdir/run.sh").mode == 0o755


@pytest.mark.honest
def test_framework_output_dirs_stay_out_unless_gpuqignore_asks_for_them(workdir: Path, tmp_path: Path) -> None:
    """An old local run (Lightning's lightning_logs/, wandb/, Hydra's outputs/, an HF checkpoint-N/) is never
    the job's: it stays out of the bundle, said by name; a `!name/` line of .gpuqignore ships one."""
    for rel in ("lightning_logs/version_0/checkpoints/last.ckpt", "wandb/run-1/files/x", "outputs/2026-11-26/a.log",
                "mlruns/0/meta.yaml", "runs/Nov26/events.out", "multirun/0/x", "out/checkpoint-500/model.safetensors",
                "src/outputs/keep.py", "src/runs.py"):
        (workdir / rel).parent.mkdir(parents=True, exist_ok=True)
        (workdir / rel).write_text("x\n")
    bundle = build_bundle(workdir, tmp_path / "cache")
    names = _names(bundle.path)
    assert not any(n.startswith(("workdir/lightning_logs", "workdir/wandb", "workdir/outputs", "workdir/mlruns",
                                 "workdir/runs/", "workdir/multirun", "workdir/out/checkpoint-500")) for n in names)
    assert {"workdir/src/outputs/keep.py", "workdir/src/runs.py"} <= names  # only top-level names (and checkpoint-N)
    assert bundle.skipped_outputs == ("lightning_logs/", "mlruns/", "multirun/", "outputs/", "runs/", "wandb/",
                                      "out/checkpoint-500/")
    (workdir / ".gpuqignore").write_text("!runs/\n")
    again = build_bundle(workdir, tmp_path / "cache")
    assert "workdir/runs/Nov26/events.out" in _names(again.path) and "runs/" not in again.skipped_outputs


def test_a_projects_bundle_carries_none_of_gpuqs_demo_files(workdir: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """gpuq's payload/ travels as its agent, trainer and package only: the example's configs, queue.txt
    and a scratch file there are no part of another project's bundle, nor of its hash (issue 39 item 14)."""
    import shutil

    from orchestrator.agent import bundle as bundle_mod

    own = tmp_path / "gpuq_payload_copy"
    shutil.copytree(bundle_mod.payload_dir(), own, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(bundle_mod, "payload_dir", lambda: own)
    first = build_bundle(workdir, tmp_path / "cache")
    names = _names(first.path)
    assert "payload/train.py" in names and "payload/gpuq_payload/trainer.py" in names
    assert "payload/agent/gpuq_agent.py" in names
    assert not any(n.startswith(("payload/configs/", "payload/queue.txt")) for n in names), sorted(names)
    (own / "queue.txt").write_text("configs/baseline.yaml classify 1 gpus=1\n")
    (own / "notes.txt").write_text("scratch\n")
    assert build_bundle(workdir, tmp_path / "cache2").sha256 == first.sha256
