"""The queue banners of agent.log: "=== gpuq queue Q on HOST: N jobs ===" when a queue's first job
starts here, and "=== gpuq queue Q done on HOST: ... ===" once none of its jobs is queued or running;
and each start's place in its queue (launch.json's ``index`` and ``count``).

stdlib only, Python >= 3.8.
"""

# ruff: noqa: UP031  (%-formatting on purpose: one style for every Python >= 3.8 the agent meets)
from __future__ import annotations

from typing import Iterable

from gpuq_base import gpuq_protocol as P
from gpuq_base.gpuq_files import Layout, list_specs, read_json
from gpuq_base.gpuq_jobspec import JobSpec, read_spec


class QueueBanners:
    def __init__(self, lay: Layout, host: str) -> None:
        self.lay = lay
        self.host = host
        self.queue_of: dict[str, str] = {}  # job id -> queue id, of every job claimed here
        self.queues_open: dict[str, bool] = {}

    def started(self, job_id: str, qid: str) -> tuple[int, int]:
        """A job of queue ``qid`` starts: (its index, the queue's count); the queue's banner when it
        is the first here."""
        idx, count = self.position(job_id, qid)
        if qid and not self.queues_open.get(qid):
            self.queues_open[qid] = True
            self.lay.log("=== gpuq queue %s on %s: %d jobs ===" % (qid, self.host, count))
        return idx, count

    def position(self, job_id: str, qid: str) -> tuple[int, int]:
        claimed = list_specs(self.lay.p(P.CLAIMED_DIR))
        mine = 0
        for j in claimed:
            if j not in self.queue_of:
                s = read_spec(self.lay.p(P.CLAIMED_DIR, j + ".json"))
                self.queue_of[j] = s.queue_id if s is not None else ""
            if self.queue_of[j] == qid:
                mine += 1
        waiting = 0
        for j in list_specs(self.lay.p(P.INBOX_DIR)):
            s = read_spec(self.lay.p(P.INBOX_DIR, j + ".json"))
            if s is not None and s.queue_id == qid:
                waiting += 1
        return mine, mine + waiting

    def done_check(self, qid: str, running: Iterable[JobSpec]) -> None:
        """A job of ``qid`` ended (``running``: the specs still running here): the queue's closing
        banner once none of its jobs is queued or running."""
        if not qid or not self.queues_open.get(qid):
            return
        if any(spec.queue_id == qid for spec in running):
            return
        for j in list_specs(self.lay.p(P.INBOX_DIR)):
            s = read_spec(self.lay.p(P.INBOX_DIR, j + ".json"))
            if s is not None and s.queue_id == qid:
                return
        failed, n = [], 0
        for j in list_specs(self.lay.p(P.CLAIMED_DIR)):
            if self.queue_of.get(j) != qid:
                continue
            s = read_spec(self.lay.p(P.CLAIMED_DIR, j + ".json"))
            n += 1
            ex = read_json(self.lay.attempt(j, s.attempt if s is not None else 1, P.EXIT_FILE))
            if not isinstance(ex, dict) or ex.get("wrapper_code") != 0:
                failed.append(s.name if s is not None else j)
        self.queues_open[qid] = False
        if failed:
            self.lay.log("=== gpuq queue %s done on %s: %d jobs FAILED: %s ===" % (
                qid, self.host, len(failed), " ".join(failed)))
        else:
            self.lay.log("=== gpuq queue %s done on %s: all %d jobs exited 0 ===" % (qid, self.host, n))
