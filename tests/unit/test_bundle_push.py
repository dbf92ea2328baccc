"""Placing a bundle on a host: concurrent pushes of the same bundle never share a temporary file."""

from __future__ import annotations

import threading
from pathlib import Path

from orchestrator.agent.bundle import build_bundle
from orchestrator.agent.launcher import ensure_bundle
from orchestrator.core import protocol
from orchestrator.hosts.local import LocalHost


class _RecordingHost(LocalHost):
    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.targets: list[str] = []
        self.both_uploaded = threading.Barrier(2, timeout=30)

    def put(self, local: Path, remote: str, **kw: object) -> None:  # type: ignore[override]
        super().put(local, remote)
        self.targets.append(remote)
        self.both_uploaded.wait()  # the two pushes overlap: both uploads land before either unpacks


def test_two_pushes_of_one_bundle_to_a_fresh_host_both_succeed(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("print('hi')\n")
    bundle = build_bundle(project, tmp_path / "cache")
    host = _RecordingHost(tmp_path / "host")
    errors: list[BaseException] = []

    def push() -> None:
        try:
            ensure_bundle(host, bundle)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=push) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert len(set(host.targets)) == 2
    bundles = tmp_path / "host" / protocol.BUNDLES_DIR
    assert (bundles / bundle.sha256 / protocol.BUNDLE_MANIFEST).is_file()
    assert [p.name for p in bundles.iterdir()] == [bundle.sha256]  # no temporary file or dir left behind
