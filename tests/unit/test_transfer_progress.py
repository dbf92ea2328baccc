"""Transfer progress: long pushes report their bytes to the installed reporter; nothing by default."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.agent.bundle import build_bundle
from orchestrator.agent.launcher import ensure_bundle
from orchestrator.hosts.local import LocalHost
from orchestrator.transfer import progress as transfer_progress


@pytest.fixture(autouse=True)
def _no_reporter() -> Iterator[None]:
    yield
    transfer_progress.install(None)


def test_a_bundle_push_reports_its_bytes_to_the_reporter(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "weights.bin").write_bytes(b"\1" * (transfer_progress.MIN_BYTES + 1024))
    bundle = build_bundle(project, tmp_path / "cache")
    seen: list[tuple[str, int, list[int]]] = []

    @contextlib.contextmanager
    def reporter(what: str, total: int) -> Iterator[transfer_progress.Callback]:
        done: list[int] = []
        seen.append((what, total, done))
        yield done.append

    transfer_progress.install(reporter)
    assert ensure_bundle(LocalHost(tmp_path / "host"), bundle)
    ((what, total, done),) = seen
    assert what == f"bundle {bundle.sha256[:12]} -> local" and total == bundle.path.stat().st_size
    assert done and done[-1] == total


def test_small_transfers_and_no_reporter_show_nothing() -> None:
    with transfer_progress.track("x", 10 << 30) as callback:
        callback(5)  # no reporter installed: a no-op
    transfer_progress.install(lambda what, total: contextlib.nullcontext(lambda done: None))
    with transfer_progress.track("tiny", 100) as callback:
        assert callback is transfer_progress._ignore


def test_bars_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.cli import progressbars

    monkeypatch.setattr("sys.stderr", io.StringIO())
    progressbars.install_if_terminal()
    assert transfer_progress._reporter is None
