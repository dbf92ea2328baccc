"""``[data]`` in gpuq.toml (orchestrator/queue/datasets.py): confined to the repository, symlinks refused, https
URLs only with a sha256, content-addressed trees, hashes cached (docs/your-project.md, "Data")."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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
    corpus, one = datasets.load_data(repo / "gpuq.toml", repo, home)
    assert corpus.kind == "dir" and [e.rel for e in corpus.entries] == ["a.txt", "sub/b.txt"]
    assert one.kind == "file" and one.file == "a.txt" and one.entries[0].sha256 == corpus.entries[0].sha256
    assert datasets.manifest(home, corpus.tree) == corpus  # saved with where its bytes are
    assert datasets.wire([corpus]) == {"corpus": {"tree": corpus.tree, "file": ""}}  # no local path
    # the same bytes elsewhere are the same tree; a changed byte is another tree
    copy = tmp_path / "repo2"
    (copy / ".git").mkdir(parents=True)
    os.rename(repo / "corpus", copy / "corpus")
    (copy / "gpuq.toml").write_text('[data]\ncorpus = "corpus"\n')
    (same,) = datasets.load_data(copy / "gpuq.toml", copy, home)
    assert same.tree == corpus.tree
    (copy / "corpus" / "a.txt").write_text("alphA")
    (changed,) = datasets.load_data(copy / "gpuq.toml", copy, home)
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
        datasets.load_data(repo / "gpuq.toml", repo, tmp_path / "home")


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
