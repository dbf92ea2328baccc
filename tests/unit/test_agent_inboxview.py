"""The serving loop's inbox view (payload/agent/gpuq_serving/gpuq_inboxview.py): every spec the controller renames in
or out is seen at the next look, oldest first, and an unchanged inbox is neither listed nor read again."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from tests.support.agentmodule import load_agent_module
from tests.support.jobspecs import spec_doc

view_mod = load_agent_module("gpuq_serving.gpuq_inboxview")


def _enqueue(inbox: Path, job_id: str, created: float) -> None:
    """As the agent's enqueue writes a spec: a dot-tmp file renamed in."""
    tmp = inbox / f".{job_id}.tmp"
    tmp.write_text(json.dumps(spec_doc(job_id=job_id, attempt=1, gpus=1, nodes=1, created_at=created)))
    os.replace(tmp, inbox / f"{job_id}.json")


def _age(path: Path, seconds: float) -> None:
    """Set a file's or directory's mtime into the past (out of the view's racy window)."""
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_renames_in_and_out_are_seen_at_once_oldest_first(tmp_path: Path) -> None:
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    view = view_mod.InboxView(str(inbox))
    assert view.specs() == []
    _enqueue(inbox, "cb", 2.0)
    _enqueue(inbox, "ca", 2.0)
    _enqueue(inbox, "cz", 1.0)
    (inbox / "notes.txt").write_text("not a spec")
    assert [job for _c, job, _s in view.specs()] == ["cz", "ca", "cb"]  # by created_at, then job id
    os.rename(inbox / "ca.json", tmp_path / "ca.json")  # claimed
    assert [job for _c, job, _s in view.specs()] == ["cz", "cb"]
    _age(inbox, 60)  # even with a directory mtime that says "long unchanged", a later rename is seen
    _enqueue(inbox, "cc", 0.5)
    assert [job for _c, job, _s in view.specs()] == ["cc", "cz", "cb"]


def test_an_unchanged_inbox_is_not_read_again_and_its_generation_stays(tmp_path: Path) -> None:
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    for i in range(50):
        _enqueue(inbox, f"c{i:03d}", float(i))
    view = view_mod.InboxView(str(inbox))
    first = view.specs()
    generation = view.generation
    # rewrite one spec in place keeping its size, mtime and inode, and age the directory: a view that
    # re-read the inbox would see the change; this one keeps what it read (nothing in gpuq writes so)
    spec = inbox / "c007.json"
    st = spec.stat()
    spec.write_text(spec.read_text().replace('"c007"', '"x007"'))
    os.utime(spec, ns=(st.st_atime_ns, st.st_mtime_ns))
    _age(inbox, 60)
    view.specs()  # the directory's key changed (aged): listed again, but the file's key did not
    assert view.specs() is view.specs() and view.generation == generation
    assert [s.job_id for _c, _j, s in view.specs()] == [s.job_id for _c, _j, s in first]
    assert view.specs()[7][2].job_id == "c007"
    # a spec renamed in (a new inode) is read, and the generation moves on
    _enqueue(inbox, "c007", 7.0)
    assert view.specs()[7][2].job_id == "c007" and view.generation == generation + 1


def test_a_spec_renamed_in_while_a_round_claims_is_taken_by_the_next_round(tmp_path: Path) -> None:
    """The serving loop skips a round whose inbox, slots and jobs are as the last round left them.  A
    spec that arrives while a round is claiming (the controller enqueues at any moment) was not decided
    on by that round: the next round must take it, on an otherwise idle host too."""
    serve_mod = load_agent_module("gpuq_serving.gpuq_serve")
    files_mod = load_agent_module("gpuq_base.gpuq_files")
    root = tmp_path / "root"
    for d in ("inbox", "claimed", "jobs"):
        (root / d).mkdir(parents=True)
    args = argparse.Namespace(idle_exit_s=600.0, poll_s=0.1, cpu_slots=2, train_device="cpu")
    agent = serve_mod.Agent(files_mod.Layout(str(root)), args)
    agent.slots = {"kind": "cpu", "ids": [0, 1, 2]}
    launched: list[str] = []

    def launch(job_id: str, spec: dict[str, object], slots: tuple[int, ...]) -> None:
        launched.append(job_id)
        for s in slots:
            agent.busy[s] = job_id

    agent.launch = launch
    claim = agent._claim

    def claim_racing_an_enqueue(job_id: str) -> bool:
        took = claim(job_id)
        if job_id == "ca":
            _enqueue(root / "inbox", "cb", 2.0)  # the controller enqueues while this round claims
        return took

    agent._claim = claim_racing_an_enqueue
    _enqueue(root / "inbox", "ca", 1.0)
    assert agent.claim_and_launch() == 0 and launched == ["ca"]
    _age(root / "inbox", 60)  # past the racy window: only the listing's own bookkeeping can tell
    for _ in range(3):
        agent.claim_and_launch()
    assert launched == ["ca", "cb"]
    assert sorted(os.listdir(root / "claimed")) == ["ca.json", "cb.json"]
