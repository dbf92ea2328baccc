"""Successive halving (pure), the second, labelled option: at each rung the best ``keep`` share of
the compared cells goes on and the rest stop.  For a winner fast, not an ablation table: it bounds
no error rate, and it never stops the baseline."""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence

from orchestrator.report import stats
from orchestrator.stopping.policy import StopPolicy
from orchestrator.stopping.rules import AtRung, Look


def decide(
    policy: StopPolicy,
    baseline: str,
    seen: Sequence[AtRung],
    looked: Collection[tuple[str, int]],
    stopped: Collection[str],
) -> list[Look]:
    """The looks due now: at a rung, once every live compared cell has ``min_seeds`` there and none
    left to come (a synchronous rung), ranked by mean in the metric's direction."""
    out: list[Look] = []
    for rung in range(len(policy.rungs)):
        live = [a for a in seen if a.rung == rung and a.cell != baseline and a.cell not in stopped]
        live = [a for a in live if not any(o.cell == a.cell and o.stop for o in out)]
        if not live or any((a.cell, rung) in looked for a in live):
            continue
        if any(a.pending or len(a.values) < policy.min_seeds for a in live):
            continue
        out.extend(_rank(policy, rung, live, seen, baseline))
    return out


def _rank(policy: StopPolicy, rung: int, live: list[AtRung], seen: Sequence[AtRung], baseline: str) -> list[Look]:
    sign = 1.0 if policy.direction == "min" else -1.0
    ranked = sorted(live, key=lambda a: (sign * stats.mean(a.values), a.cell))
    kept = max(1, math.ceil(policy.keep * len(ranked)))
    cut = stats.mean(ranked[kept - 1].values)
    base = next((a for a in seen if a.cell == baseline and a.rung == rung and a.values), None)
    base_mean = stats.mean(base.values) if base else math.nan
    return [
        Look(
            rule="halving",
            cell=a.cell,
            rung=rung,
            fraction=policy.rungs[rung],
            cell_mean=stats.mean(a.values),
            baseline_mean=base_mean if math.isfinite(base_mean) else 0.0,
            n_cell=len(a.values),
            n_baseline=len(base.values) if base else 0,
            statistic=stats.mean(a.values),
            threshold=cut,
            stop=i >= kept,
        )
        for i, a in enumerate(ranked)
    ]
