"""``[data]`` in gpuq.toml (orchestrator/queue/datasets.py): confined to the repository, symlinks refused, https
URLs only with a sha256, content-addressed trees, hashes cached (docs/your-project.md, "Data")."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from orchestrator.agent.bundle import tree_rules
from orchestrator.core.errors import ConfigError
from orchestrator.queue import datasets
from tests.conftest import run_gpuq


def _repo(tmp_path: Path, table: str) -> Path:
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "corpus" / "sub").mkdir(parents=True)
    (repo / "corpus" / "a.txt").write_text("alpha")
    (repo / "corpus" / "sub" / "b.txt").write_text("beta" * 1000)
    (repo / "gpuq.toml").write_text("[data]\n" + table)
    return repo


def test_a_directory_becomes_a_content_addressed_tree_and_is_hashed_once(tmp_path: Path) -> None:
    repo = _repo(tmp_path, 'corpus = "corpus"\none = "corpus/a.txt"\n')
    home = tmp_path / "home"
    corpus, one = datasets.load_data(repo / "gpuq.toml", repo, home, tree_rules)
    assert corpus.kind == "dir" and [e.rel for e in corpus.entries] == ["a.txt", "sub/b.txt"]
    assert one.kind == "file" and one.file == "a.txt" and one.entries[0].sha256 == corpus.entries[0].sha256
    assert datasets.manifest(home, corpus.tree) == corpus  # saved with where its bytes are
    assert datasets.wire([corpus]) == {"corpus": {"tree": corpus.tree, "file": ""}}  # no local path
    # the same bytes elsewhere are the same tree; a changed byte is another tree
    copy = tmp_path / "repo2"
    (copy / ".git").mkdir(parents=True)
    os.rename(repo / "corpus", copy / "corpus")
    (copy / "gpuq.toml").write_text('[data]\ncorpus = "corpus"\n')
    (same,) = datasets.load_data(copy / "gpuq.toml", copy, home, tree_rules)
    assert same.tree == corpus.tree
    (copy / "corpus" / "a.txt").write_text("alphA")
    (changed,) = datasets.load_data(copy / "gpuq.toml", copy, home, tree_rules)
    assert changed.tree != corpus.tree and changed.entries[1] == corpus.entries[1]


@pytest.mark.parametrize(("table", "needle"), [
    ('x = "../outside"\n', "outside the repository"),
    ('x = "/etc"\n', "outside the repository"),
    ('x = "link"\n', "symlink"),
    ('x = "corpus"\n', "symlink inside"),
    ('x = { url = "https://example.org/w.bin" }\n', "needs sha256"),
    ('x = { url = "http://example.org/w.bin", sha256 = "' + "a" * 64 + '" }\n', "https://"),
    ('x = { url = "https://e.org/w", sha256 = "' + "a" * 64 + '", to = "/etc" }\n', "unknown key 'to'"),
    ('"bad-name" = "corpus"\n', "letters, digits"),
    ('x = "missing"\n', "does not exist"),
])
def test_a_data_entry_that_could_reach_elsewhere_is_one_clear_error(tmp_path: Path, table: str, needle: str) -> None:
    repo = _repo(tmp_path, table)
    (tmp_path / "outside").mkdir()
    (repo / "link").symlink_to(tmp_path / "outside")
    if "symlink inside" in needle:
        (repo / "corpus" / "sub" / "evil").symlink_to(Path.home())
    with pytest.raises(ConfigError, match=needle):
        datasets.load_data(repo / "gpuq.toml", repo, tmp_path / "home", tree_rules)


def test_submit_refuses_an_undeclared_data_placeholder(tmp_path: Path, gpuq_home: Path) -> None:
    repo = _repo(tmp_path, 'corpus = "corpus"\n')
    (repo / "gpuq.toml").write_text('[run]\ncommand = "t.py {data.other}"\nlauncher = "python"\n'
                                    '[data]\ncorpus = "corpus"\n')
    (repo / "t.py").write_text("")
    (repo / "queue.txt").write_text("name=a --\n")
    out = run_gpuq("submit", str(repo / "queue.txt"), "--dry-run")
    assert out.returncode == 2 and "{data.other}" in out.stderr and "corpus" in out.stderr, out.stderr
    (repo / "gpuq.toml").write_text('[run]\ncommand = "t.py {data.corpus}"\nlauncher = "python"\n'
                                    '[data]\ncorpus = "corpus"\n')
    out = run_gpuq("submit", str(repo / "queue.txt"), "--dry-run")
    assert out.returncode == 0 and "/bundles/.data/trees/" in out.stdout, out.stdout + out.stderr


WANDB = "WANDB_API_KEY=0123456789abcdef0123456789abcdef01234567"
GIT_TOKEN = "ghp_" + "Z9y8X7w6" * 5


def test_the_repository_as_data_goes_through_the_bundles_filter(tmp_path: Path) -> None:
    """issue 43 #1: `[data] repo = "."` sent the project's .env and .git/config (a token in the remote URL)."""
    repo = _repo(tmp_path, 'repo = "."\n')
    (repo / ".env").write_text(WANDB)
    (repo / ".git" / "config").write_text(f'[remote "origin"]\n\turl = https://me:{GIT_TOKEN}@github.com/o/r\n')
    (repo / "keys").mkdir()
    (repo / "keys" / "id_ed25519").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    (repo / "__pycache__").mkdir()
    (repo / "__pycache__" / "t.cpython-312.pyc").write_bytes(b"\0")
    (repo / ".gpuqignore").write_text("corpus/sub/\n")  # the tree's own .gpuqignore, as for the bundle
    home = tmp_path / "home"
    (tree,) = datasets.load_data(repo / "gpuq.toml", repo, home, tree_rules)
    assert sorted(e.rel for e in tree.entries) == [".gpuqignore", "corpus/a.txt", "gpuq.toml"]
    assert tree.left_out == (".env", "keys/id_ed25519")
    lines = datasets.leaving([tree], repo / "gpuq.toml")
    assert lines[0].startswith("sending these [data] trees to the hosts") and f"repo = {repo}" in lines[0]
    assert lines[1].startswith("left out of [data] repo (credential-like paths") and lines[1].endswith(
        ": .env, keys/id_ed25519")


@pytest.mark.parametrize(("value", "needle"), [
    ("../..", "is your home directory"),  # a project downloaded into a dotfiles repository that is $HOME
    ("../../.ssh", "credential-like (.ssh)"),
    ("../../.aws/credentials", "credential-like (.aws)"),
    ("../../work/gpuq-home", "holds gpuq's state directory"),
    ("../../work/gpuq-home/ledger.db", "is inside gpuq's state directory"),
    ("../../work", "holds gpuq's state directory"),
    ("../../.git", "is in .git/, which gpuq never sends"),
    ("../../.git/config", "is in .git/, which gpuq never sends"),
    ("../../work/.venv/lib", "is in work/.venv/, which gpuq never sends"),
    ("../../work/conf/.env", "credential-like (work/conf/.env)"),
])
def test_data_that_would_send_your_own_files_is_refused_and_nothing_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str, needle: str) -> None:
    home = tmp_path / "me"  # $HOME is a dotfiles repository; the project has no .git of its own
    for d in (".git", ".ssh", ".aws", "work/gpuq-home", "work/conf", "work/.venv/lib", "proj/sub"):
        (home / d).mkdir(parents=True)
    for f in (".ssh/id_ed25519", ".aws/credentials", "work/gpuq-home/ledger.db", ".git/config", "work/conf/.env"):
        (home / f).write_text("secret")
    monkeypatch.setenv("HOME", str(home))
    toml = home / "proj" / "sub" / "gpuq.toml"
    toml.write_text(f'[data]\nh = "{value}"\n')
    gpuq_home = home / "work" / "gpuq-home"
    with pytest.raises(ConfigError, match=re.escape(needle)) as info:
        datasets.load_data(toml, home, gpuq_home, tree_rules)
    assert str(info.value).startswith(f"{toml}: [data] h: ") and "\n" not in str(info.value)
    assert sorted(p.name for p in gpuq_home.iterdir()) == ["ledger.db"]  # nothing written


def test_a_gpuqignore_line_opts_a_credential_like_entry_in(tmp_path: Path) -> None:
    repo = _repo(tmp_path, 'cfg = "conf/.env"\n')
    (repo / "conf").mkdir()
    (repo / "conf" / ".env").write_text("A=1")
    with pytest.raises(ConfigError, match="credential-like"):
        datasets.load_data(repo / "gpuq.toml", repo, tmp_path / "home", tree_rules)
    (repo / ".gpuqignore").write_text("!conf/.env\n")
    (cfg,) = datasets.load_data(repo / "gpuq.toml", repo, tmp_path / "home", tree_rules)
    assert cfg.kind == "file" and cfg.file == ".env" and cfg.opted_in == ("conf/.env",)
    # inside a directory, its own .gpuqignore opts a path in; submit names what it sends
    (repo / "conf" / ".gpuqignore").write_text("!.env\n")
    (repo / "gpuq.toml").write_text('[data]\nconf = "conf"\n')
    (conf,) = datasets.load_data(repo / "gpuq.toml", repo, tmp_path / "home", tree_rules)
    assert [e.rel for e in conf.entries] == [".env", ".gpuqignore"] and conf.opted_in == (".env",)
    assert datasets.leaving([conf], repo / "gpuq.toml")[1] == (
        "sending credential-like paths in [data] conf, because a `!` line of .gpuqignore opts them in: .env")
    # a directory the repository's .gpuqignore leaves out of the bundle is still data: that is the point
    (repo / ".gpuqignore").write_text("corpus/\n")
    (repo / "gpuq.toml").write_text('[data]\ncorpus = "corpus"\n')
    (corpus,) = datasets.load_data(repo / "gpuq.toml", repo, tmp_path / "home", tree_rules)
    assert [e.rel for e in corpus.entries] == ["a.txt", "sub/b.txt"]


def test_a_dry_run_names_the_trees_that_leave_and_a_refusal_is_one_line(tmp_path: Path, gpuq_home: Path) -> None:
    repo = _repo(tmp_path, "")
    (repo / "corpus" / ".env").write_text(WANDB)
    (repo / "gpuq.toml").write_text('[run]\ncommand = "t.py {data.corpus}"\nlauncher = "python"\n'
                                    '[data]\ncorpus = "corpus"\n')
    (repo / "t.py").write_text("")
    (repo / "queue.txt").write_text("name=a --\n")
    out = run_gpuq("submit", str(repo / "queue.txt"), "--dry-run")
    said = " ".join(out.stderr.split())  # warnings go to stderr
    assert out.returncode == 0 and f"sending these [data] trees to the hosts ([data] in {repo / 'gpuq.toml'}): " \
        f"corpus = {repo / 'corpus'} (2 file(s), 0.0 MB)" in said, out.stdout + out.stderr
    assert "left out of [data] corpus (credential-like paths" in said and "ships one): .env" in said
    (repo / "gpuq.toml").write_text('[run]\ncommand = "t.py"\nlauncher = "python"\n[data]\ngit = ".git"\n')
    out = run_gpuq("submit", str(repo / "queue.txt"), "--dry-run")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr
    assert f"{repo / 'gpuq.toml'}: [data] git: '.git' is in .git/, which gpuq never sends" in out.stderr
