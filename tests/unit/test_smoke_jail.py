"""The jail of `gpuq submit --smoke` (orchestrator/hosts/jail.py, docs/security.md): a real command in a real
namespace, as root and as an unprivileged user, cannot read $GPUQ_HOME, ~/.ssh, ~/.aws or ~/.netrc, writes
its own root, and the files it could not see are unchanged; without unshare only HOME is set and it says so.
(The whole smoke through the wrapper: tests/integration/test_smoke.py.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.hosts import jail

ROOT = Path(__file__).resolve().parents[2]
SNOOP = 'cat "$1/gh/keys.toml" "$1/home/.ssh/id_rsa" "$1/home/.aws/credentials" "$1/home/.netrc" ../../keys.toml; ' \
        'echo "HOME=$HOME"; touch mine; id -u'

RUN = """import json, subprocess, sys
from pathlib import Path
import gpuqjail as jail  # orchestrator/hosts/jail.py: the standard library only
top = sys.argv[1]
j = jail.prefix(sys.executable, top + "/gh/smoke/r1", Path(top + "/gh"), {"PATH": "/usr/bin:/bin",
                                                                          "HOME": top + "/home"})
out = subprocess.run([*j.prefix, "sh", "-c", sys.argv[2], "sh", top], env=j.env, capture_output=True, text=True,
                     cwd=top + "/gh/smoke/r1")
print(json.dumps({"why_not": j.why_not, "out": out.stdout, "err": out.stderr}))
"""


@pytest.fixture
def top() -> Iterator[Path]:
    """A gpuq home with a smoke root and keys.toml, and a user's home with credentials, in a directory
    an unprivileged user can reach (pytest's own tmp is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="gpuq-jail-"))
    for rel in ("gh/keys.toml", "home/.ssh/id_rsa", "home/.aws/credentials", "home/.netrc"):
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_text(f"SECRET {rel}\n")
    (path / "gh/smoke/r1").mkdir(parents=True)
    (path / "pkg").mkdir()
    shutil.copy(ROOT / "orchestrator/hosts/jail.py", path / "pkg/gpuqjail.py")
    yield path
    shutil.rmtree(path)


def _run(top: Path, as_user: list[str]) -> dict[str, str]:
    import json

    got = subprocess.run([*as_user, sys.executable if not as_user else "/usr/bin/python3", "-I", "-c",
                          f"import sys; sys.path.insert(0, {str(top / 'pkg')!r}); exec({RUN!r})", str(top), SNOOP],
                         capture_output=True, text=True, timeout=60, cwd=top, check=False)
    assert got.returncode == 0, got.stderr
    return dict(json.loads(got.stdout))


def _hidden(top: Path, seen: dict[str, str], uid: int) -> None:
    assert seen["why_not"] == "", seen
    assert "SECRET" not in seen["out"] + seen["err"], seen
    assert f"HOME={top}/gh/smoke/r1" in seen["out"] and seen["out"].split()[-1] == str(uid), seen
    assert (top / "gh/smoke/r1/mine").exists()  # its own root is its own, at its own path
    assert (top / "gh/keys.toml").read_text() == "SECRET gh/keys.toml\n"  # your files are untouched
    assert (top / "home/.netrc").read_text() == "SECRET home/.netrc\n"


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="as root, with unshare")
def test_a_root_smoke_sees_neither_gpuq_home_nor_credentials(top: Path) -> None:
    _hidden(top, _run(top, []), 0)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv") or not os.path.exists("/usr/bin/python3"),
                    reason="root to become an unprivileged user; setpriv; a system python3 that user can run")
def test_an_unprivileged_smoke_sees_neither_and_stays_its_own_user(top: Path) -> None:
    for path in [top, *top.rglob("*")]:
        os.chown(path, 65534, 65534, follow_symlinks=False)
    seen = _run(top, ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"])
    if "user" in seen["why_not"]:
        pytest.skip(f"unprivileged user namespaces are disabled here: {seen['why_not']}")
    _hidden(top, seen, 65534)


def test_without_unshare_only_home_is_set_and_it_says_why(tmp_path: Path) -> None:
    got = jail.prefix(sys.executable, str(tmp_path / "r"), tmp_path, {"PATH": str(tmp_path), "HOME": "/home/u"})
    assert got.prefix == [] and got.env["HOME"] == str(tmp_path / "r") and got.why_not == "unshare not found"


def test_the_hidden_paths_are_gpuq_home_and_the_bundle_deny_lists_credentials(tmp_path: Path) -> None:
    dirs, files = jail.hidden_paths(tmp_path, "/home/u")
    assert dirs[0] == str(tmp_path.resolve())
    assert {"/home/u/.ssh", "/home/u/.aws", "/home/u/.config/gcloud"} <= set(dirs)
    assert "/home/u/.netrc" in files and "/home/u/.git-credentials" in files
    assert jail.hidden_paths(tmp_path, "") == ([str(tmp_path.resolve())], [])
