"""A bundle already on a host is reused only while it matches its manifest (issue 23 item 5): a
rewritten, added or swapped file is found, the copy is moved aside (never deleted) and pushed again."""

from __future__ import annotations

import hashlib
import marshal
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.agent import bundle_check
from orchestrator.agent.bundle import Bundle, build_bundle
from orchestrator.agent.launcher import ensure_bundle
from orchestrator.core import protocol
from orchestrator.core.errors import BundleError
from orchestrator.hosts.local import LocalHost


@pytest.fixture
def placed(tmp_path: Path) -> tuple[LocalHost, Bundle, Path]:
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("print('honest')\n")
    bundle = build_bundle(project, tmp_path / "cache")
    host = LocalHost(tmp_path / "host")
    assert ensure_bundle(host, bundle) is True
    return host, bundle, tmp_path / "host" / protocol.BUNDLES_DIR / bundle.sha256


def _writable(path: Path) -> None:
    for p in (path, *path.rglob("*")):
        p.chmod(p.stat().st_mode | 0o200)


def _train(bundle_dir: Path) -> Path:
    return bundle_dir / protocol.BUNDLE_WORKDIR / "train.py"


def test_an_untouched_bundle_is_reused_and_verified_once_by_hash(placed: tuple[LocalHost, Bundle, Path]) -> None:
    host, bundle, where = placed
    assert ensure_bundle(host, bundle) is False
    marker = where.parent / f".{bundle.sha256}.verified"
    assert marker.is_file()  # the next check compares stats and rehashes nothing unchanged
    assert ensure_bundle(host, bundle) is False
    assert sorted(p.name for p in where.parent.iterdir()) == sorted([bundle.sha256, marker.name])


def _agent_pyc(bundle_dir: Path, module: str) -> Path:
    """The bytecode of ``module`` (``gpuq_agent``, or ``package/module``) of the bundle's agent."""
    folder, _, name = f"/{module}".rpartition("/")
    return bundle_dir / "payload" / "agent" / folder.lstrip("/") / "__pycache__" / \
        f"{name}.{sys.implementation.cache_tag}.pyc"


def test_the_agent_is_compiled_once_on_unpack_and_runs_from_its_bytecode(
        placed: tuple[LocalHost, Bundle, Path]) -> None:
    host, bundle, where = placed
    agent = where / "payload" / "agent"
    compiled = {p.relative_to(agent).as_posix() for p in agent.rglob("__pycache__/*")}
    sources = [p.relative_to(agent).with_suffix("").as_posix() for p in agent.rglob("*.py")]
    assert any("/" in s for s in sources)  # the packages are compiled too, and admitted below
    assert compiled == {_agent_pyc(where, s).relative_to(agent).as_posix() for s in sources}
    assert ensure_bundle(host, bundle) is False  # admitted by the check: each is its source's code
    assert ensure_bundle(host, bundle) is False  # and again on the cheap path
    run = subprocess.run([sys.executable, "-v", str(agent / "gpuq_agent.py"), "--root", str(host.root), "status"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stderr[-500:]
    assert f"code object from '{_agent_pyc(where, 'gpuq_base/gpuq_files')}'" in run.stderr
    assert not (where / protocol.BUNDLE_WORKDIR / "__pycache__").exists()  # the project's code is not touched


@pytest.mark.parametrize("tamper", ["rewrite", "same_size_same_mtime", "extra_pyc", "link", "manifest_too",
                                    "agent_pyc_rewritten", "agent_pyc_of_no_module"])
def test_a_tampered_bundle_is_moved_aside_and_pushed_again(placed: tuple[LocalHost, Bundle, Path],
                                                           tamper: str) -> None:
    host, bundle, where = placed
    assert ensure_bundle(host, bundle) is False  # verified once: a marker exists, the cheap path is armed
    _writable(where)
    train = _train(where)
    if tamper == "rewrite":
        train.write_text("import os; os.system('id')\n")
    elif tamper == "same_size_same_mtime":  # only the ctime tells, and the marker holds it
        st = train.stat()
        train.write_text("print('HONEST')\n")
        os.utime(train, ns=(st.st_atime_ns, st.st_mtime_ns))
    elif tamper == "extra_pyc":
        (train.parent / "__pycache__").mkdir()
        (train.parent / "__pycache__" / "train.cpython-38.pyc").write_bytes(b"\0" * 16)
    elif tamper == "agent_pyc_rewritten":  # a valid header and another program's code: python would run it
        pyc = _agent_pyc(where, "gpuq_base/gpuq_files")
        evil = marshal.dumps(compile("import os; os.system('id')\n", "gpuq_files.py", "exec"))
        pyc.write_bytes(pyc.read_bytes()[:16] + evil)
    elif tamper == "agent_pyc_of_no_module":
        planted = _agent_pyc(where, "gpuq_base/gpuq_files").read_bytes()
        _agent_pyc(where, "gpuq_base/gpuq_sitecustom").write_bytes(planted)
    elif tamper == "link":
        (train.parent / "lib.py").symlink_to("/etc/passwd")
    else:  # the manifest rewritten to match the new file: its own hash is the controller's
        train.write_text("import os\n")
        manifest = where / protocol.BUNDLE_MANIFEST
        manifest.write_text(manifest.read_text().replace('"bytes": 16', '"bytes": 10'))
    assert ensure_bundle(host, bundle) is True  # pushed again, never reused
    assert _train(where).read_text() == "print('honest')\n"
    aside = [p for p in where.parent.iterdir() if p.name.startswith(f".{bundle.sha256}.tampered.")]
    assert len(aside) == 1  # quarantined, not deleted
    assert ensure_bundle(host, bundle) is False


def test_the_manifest_digest_is_the_controllers_own(placed: tuple[LocalHost, Bundle, Path], tmp_path: Path) -> None:
    host, bundle, where = placed
    assert bundle_check.manifest_digest(bundle.path) == hashlib.sha256(
        (where / protocol.BUNDLE_MANIFEST).read_bytes()).hexdigest()
    assert bundle_check.verify_on_host(host, "0" * 64, "x").code == bundle_check.ABSENT
    empty = tmp_path / "empty.tar"
    empty.write_bytes(b"\0" * 1024)
    with pytest.raises(BundleError, match=r"holds no MANIFEST\.json"):
        bundle_check.manifest_digest(empty)
