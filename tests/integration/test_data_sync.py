"""``[data]`` (docs/your-project.md, "Data"): a dataset directory synced once to each of two namespace SSH
hosts, read-only to the jobs there; a sync killed halfway resumes with what it had moved; a second
sweep with the same data moves 0 bytes; `gpuq hosts show` lists what a host holds.  A repository named as
data goes through the bundle's filter (its .env and .git/config never reach the host), and data that is
your home directory is refused before anything is written (issue 43 #1).

The size is GPUQ_TEST_DATA_MB (default 200 MB, as issue 26 asks: about 3 s more than 48 MB on an idle
2-core box, 30 s for the whole test; scripts/bench_data_sync.py times the sync alone)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_gpuq, wait_for
from tests.support.gpuquser import User
from tests.support.testhosts import HostFarm

pytestmark = pytest.mark.integration

MB = int(os.environ.get("GPUQ_TEST_DATA_MB", "200"))

READER = """import hashlib, os, sys
root = os.environ["GPUQ_DATA_CORPUS"]
assert sys.argv[1] == root, (sys.argv[1], root)  # {data.corpus} and GPUQ_DATA_CORPUS agree
h, n = hashlib.sha256(), 0
for top, dirs, files in sorted(os.walk(root)):
    for name in sorted(files):
        with open(os.path.join(top, name), "rb") as f:
            data = f.read()
        h.update(name.encode() + data)
        n += len(data)
wrote = 0
for path in (os.path.join(root, "x"), os.path.join(root, sorted(os.listdir(root))[0])):
    try:
        open(path, "ab").close()
        wrote += 1
    except OSError:
        pass
open("seen.txt", "w").write("%d %s %d\\n" % (n, h.hexdigest(), wrote))
sys.exit(3 if wrote else 0)
"""


@pytest.fixture
def user(host_farm: Callable[..., HostFarm], tmp_path: Path) -> Iterator[User]:
    home = tmp_path / "gpuq-home"
    home.mkdir()
    u = User(host_farm(n=2, gpus=1), home, "/root/gpuq-data")
    u.env.update({"GPUQ_PREFLIGHT_SAMPLES": "1", "GPUQ_KILL_GRACE_S": "2"})
    yield u
    u.stop_everything()


def _project(tmp_path: Path) -> tuple[Path, int, str]:
    """A project whose [data] corpus is MB of incompressible bytes in a few files; (queue, bytes, digest)."""
    import hashlib

    work = tmp_path / "proj"
    corpus = work / "corpus"
    (corpus / "shards").mkdir(parents=True)
    h, total = hashlib.sha256(), 0
    sizes = [MB * (1 << 20) // 2, MB * (1 << 20) // 3, MB * (1 << 20) - MB * (1 << 20) // 2 - MB * (1 << 20) // 3]
    files = [corpus / "a.bin", corpus / "shards" / "b.bin", corpus / "shards" / "c.bin"]
    for path, size in zip(files, sizes, strict=True):
        path.write_bytes(os.urandom(size))
    for top, _dirs, names in sorted(os.walk(corpus)):
        for name in sorted(names):
            data = (Path(top) / name).read_bytes()
            h.update(name.encode() + data)
            total += len(data)
    (work / "read.py").write_text(READER)
    (work / "gpuq.toml").write_text('[run]\ncommand = "read.py {data.corpus}"\nlauncher = "python"\n'
                                    '[data]\ncorpus = "corpus"\n')
    (work / ".gpuqignore").write_text("corpus/\n")  # the data is not in the bundle
    return work / "queue.txt", total, h.hexdigest()


def _syncs(user: User) -> list[dict]:
    path = user.home / "data" / "syncs.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []


def test_data_is_synced_once_per_host_resumes_and_is_read_only(user: User, tmp_path: Path) -> None:
    user.add_hosts(2)
    queue, total, digest = _project(tmp_path)
    queue.write_text("name=a host=g0 gpus=1 --\nname=b host=g1 gpus=1 --\n")
    env = {**os.environ, **user.env}
    chunks = user.host_dir(0) / "bundles" / ".data" / "chunks"
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "submit", str(queue)], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        halfway = wait_for(lambda: proc.poll() is not None or len(list(chunks.glob("[0-9a-f]*"))) >= 1,
                           timeout=120, interval=0.02) and proc.poll() is None
    finally:
        proc.send_signal(signal.SIGKILL)  # the controller dies mid-sync: no warning
        proc.wait()
    assert halfway, proc.stdout.read().decode() if proc.stdout else ""
    assert not _syncs(user)  # no sync finished before the kill
    watched = user.gpuq("watch", "--interval", "1", timeout=600)  # re-delivers: the syncs resume
    assert watched.returncode == 0, watched.stdout + watched.stderr + user.logs_of_unfinished()
    first = {s["host"]: s for s in _syncs(user)}
    assert set(first) == {"g0", "g1"} and all(s["bytes"] == total for s in first.values()), first
    assert first["g0"]["moved"] < total, first  # resumed: the chunks it had were not sent again
    for i in (0, 1):
        (seen,) = user.host_dir(i).glob("jobs/*/run/seen.txt")
        assert seen.read_text().split() == [str(total), digest, "0"]  # every byte, verified, read-only
    # the same data again: nothing moves
    queue.write_text("name=c host=g0 gpus=1 --\nname=d host=g1 gpus=1 --\n")
    again = user.gpuq("submit", str(queue))
    assert again.returncode == 0, again.stdout + again.stderr
    second = _syncs(user)[len(first):]
    assert {s["host"] for s in second} == {"g0", "g1"} and all(s["moved"] == 0 for s in second), second
    shown = user.gpuq("hosts", "show", "g1")
    assert shown.returncode == 0 and "corpus: 3 file(s)" in shown.stdout, shown.stdout + shown.stderr


LISTER = """import os
root = os.environ["GPUQ_DATA_REPO"]
found = sorted(os.path.relpath(os.path.join(top, n), root) for top, _, names in os.walk(root) for n in names)
open("seen.txt", "w").write(" ".join(found) + "\\n")
"""
WANDB = "WANDB_API_KEY=" + "0a1b2c3d" * 5
GIT_TOKEN = "ghp_" + "Q7r8S9t0" * 5


def test_a_repository_as_data_leaves_its_secrets_here_and_your_home_is_refused(
        host_farm: Callable[..., HostFarm], tmp_path: Path) -> None:
    home = tmp_path / "gpuq-home"
    home.mkdir()
    user = User(host_farm(n=1, gpus=1), home, "/root/gpuq-data-repo")
    user.env.update({"GPUQ_PREFLIGHT_SAMPLES": "1", "GPUQ_KILL_GRACE_S": "2"})
    try:
        user.add_hosts(1)
        work = tmp_path / "proj"
        (work / ".git").mkdir(parents=True)
        (work / ".git" / "config").write_text(f'[remote "origin"]\n\turl = https://me:{GIT_TOKEN}@github.com/o/r\n')
        (work / ".env").write_text(WANDB + "\n")
        (work / "data.txt").write_text("corpus\n")
        (work / "list.py").write_text(LISTER)
        (work / "gpuq.toml").write_text('[run]\ncommand = "list.py"\nlauncher = "python"\n[data]\nrepo = "."\n')
        queue = work / "queue.txt"
        queue.write_text("name=a host=g0 gpus=1 --\n")
        done = user.gpuq("submit", str(queue))
        assert done.returncode == 0, done.stdout + done.stderr
        said = " ".join((done.stdout + done.stderr).split())
        assert f"sending these [data] trees to the hosts ([data] in {work / 'gpuq.toml'}): repo = {work}" in said
        assert "left out of [data] repo (credential-like paths" in said and ": .env" in said, said
        watched = user.gpuq("watch", "--interval", "1", timeout=300)
        assert watched.returncode == 0, watched.stdout + watched.stderr + user.logs_of_unfinished()
        (seen,) = user.host_dir(0).glob("jobs/*/run/seen.txt")
        assert seen.read_text().split() == ["data.txt", "gpuq.toml", "list.py", "queue.txt"]
        for path in user.host_dir(0).rglob("*"):  # not a byte of either secret anywhere on the host
            if path.is_file() and not path.is_symlink():
                data = path.read_bytes()
                assert WANDB.encode() not in data and GIT_TOKEN.encode() not in data, path
        # a project downloaded (no .git of its own) into a $HOME that is a dotfiles repository
        me = tmp_path / "me"
        for d in (".git", ".ssh", ".aws", "Downloads/proj"):
            (me / d).mkdir(parents=True)
        (me / ".ssh" / "id_ed25519").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
        (me / ".aws" / "credentials").write_text("[default]\naws_secret_access_key = x\n")
        proj = me / "Downloads" / "proj"
        (proj / "gpuq.toml").write_text('[run]\ncommand = "list.py"\nlauncher = "python"\n[data]\nh = "../.."\n')
        (proj / "queue.txt").write_text("name=b host=g0 gpus=1 --\n")
        syncs = (home / "data" / "syncs.jsonl").read_text()
        trees = sorted(p.name for p in (user.host_dir(0) / "bundles" / ".data" / "trees").iterdir())
        refused = run_gpuq("submit", str(proj / "queue.txt"), env={**user.env, "HOME": str(me)})
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stdout + refused.stderr
        assert f"{proj / 'gpuq.toml'}: [data] h: '../..' ({me}) is your home directory" in refused.stderr
        assert "Traceback" not in refused.stderr and len(user.status_doc()["jobs"]) == 1
        assert (home / "data" / "syncs.jsonl").read_text() == syncs
        assert sorted(p.name for p in (user.host_dir(0) / "bundles" / ".data" / "trees").iterdir()) == trees
    finally:
        user.stop_everything()
