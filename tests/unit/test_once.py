"""tests/support/once.py: a costly fixture value is built by one of the workers that ask, once."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tests.support.once import once_in


def test_concurrent_askers_get_the_one_value_built_once(tmp_path: Path) -> None:
    builds: list[Path] = []

    def build(directory: Path) -> dict[str, str]:
        builds.append(directory)
        time.sleep(0.3)  # the others ask meanwhile and must wait, not build
        (directory / "weights").write_text("w")
        return {"weights": str(directory / "weights")}

    got: list[object] = []
    askers = [threading.Thread(target=lambda: got.append(once_in(tmp_path, "ref", build))) for _ in range(4)]
    for t in askers:
        t.start()
    for t in askers:
        t.join()
    assert builds == [tmp_path / "ref"]
    assert got == [{"weights": str(tmp_path / "ref" / "weights")}] * 4
    assert once_in(tmp_path, "ref", build) == got[0] and len(builds) == 1  # a later asker too


def test_a_failed_build_records_nothing_and_the_next_asker_builds_afresh(tmp_path: Path) -> None:
    def broken(directory: Path) -> str:
        (directory / "half").write_text("partial")
        raise AssertionError("reference run failed")

    with pytest.raises(AssertionError, match="reference run failed"):
        once_in(tmp_path, "ref", broken)

    def build(directory: Path) -> list[str]:
        return sorted(p.name for p in directory.iterdir())  # what the failed build left is gone

    assert once_in(tmp_path, "ref", build) == []
    assert once_in(tmp_path, "ref", broken) == []  # recorded: never built again
