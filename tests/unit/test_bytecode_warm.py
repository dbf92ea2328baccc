"""tests/support/bytecode.py: what says a library's bytecode is cached, and a warm-up with nothing to do."""

from __future__ import annotations

import py_compile
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import bytecode


@pytest.fixture
def package(tmp_path: Path) -> Iterator[Path]:
    """An importable package ``gpuq_warm_probe`` with one module besides its ``__init__``."""
    pkg = tmp_path / "gpuq_warm_probe"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "trainer.py").write_text("X = 1\n")
    sys.path.insert(0, str(tmp_path))
    try:
        yield pkg
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("gpuq_warm_probe", None)


def test_a_module_counts_as_cached_only_once_its_bytecode_is_written(package: Path) -> None:
    assert bytecode._cached("gpuq_warm_probe", "trainer.py") is False
    py_compile.compile(str(package / "trainer.py"), doraise=True)
    assert bytecode._cached("gpuq_warm_probe", "trainer.py") is True
    assert "gpuq_warm_probe" not in sys.modules  # looked up, never imported
    assert bytecode._cached("gpuq_no_such_package", "trainer.py") is None


def test_a_warmer_with_nothing_to_compile_starts_nothing_and_leaves_no_scratch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bytecode, "_cached", lambda package, relative: True)
    warmer = bytecode.Warmer().start()
    assert warmer.proc is None
    assert warmer.finish() == "" and not warmer.scratch.exists()
