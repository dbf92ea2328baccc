#!/usr/bin/env python3
"""Early stopping against the baseline, simulated (orchestrator/stopping/): seeded, no processes.

The curve model: seed ``s`` of cell ``c`` reports, at a fraction ``t`` of its run, the loss
``2.0 + 1.5 * exp(-t / 0.3) + effect_c + u_s + e_st`` with ``u_s ~ N(0, sd_seed)`` the seed's own
offset (the same at every rung, so the looks at one cell are correlated) and ``e_st ~ N(0, sd_step)``
fresh at each rung.  Lower is better.  Every cell has ``--seeds`` seeds that reach each rung together.

- null sweeps: ``--cells`` cells, all with effect 0 (as good as the baseline): a wrong stop is any
  stop; the rate of sweeps with at least one is printed with its 95 % Wilson interval, against alpha.
- worse sweeps: 3 of the cells have effect ``--delta`` (worse), the rest effect 0 or ``-delta/2``
  (better): the share of GPU-hours saved against running every cell to its end (a stopped seed has
  used its rung's fraction of a run), how often a worse cell was stopped, and how often a better or
  equal one was.
- the baseline is never stopped in any run (checked, exit 1 otherwise, or when the null rate
  exceeds alpha).

    python scripts/bench_stopping.py [--sweeps 10000] [--cells 12] [--seeds 4] [--alpha 0.05]
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from orchestrator.stopping import halving, rules
from orchestrator.stopping.policy import StopPolicy
from orchestrator.stopping.rules import AtRung

BASE = "c00"


def _curve(t: float) -> float:
    return 2.0 + 1.5 * math.exp(-t / 0.3)


def sweep(policy: StopPolicy, effects: list[float], args: argparse.Namespace, rnd: random.Random) -> dict[str, int]:
    """One simulated sweep: the rung at which each cell stopped (absent: ran to its end)."""
    names = [f"c{i:02d}" for i in range(len(effects))]
    offsets = {c: [rnd.gauss(0.0, args.sd_seed) for _ in range(args.seeds)] for c in names}
    stopped: dict[str, int] = {}
    looked: set[tuple[str, int]] = set()
    for rung, t in enumerate(policy.rungs):
        seen = [
            AtRung(
                cell=c,
                rung=rung,
                values=tuple(_curve(t) + eff + u + rnd.gauss(0.0, args.sd_step) for u in offsets[c]),
            )
            for c, eff in zip(names, effects, strict=True)
            if c not in stopped
        ]
        if policy.rule == "halving":
            looks = halving.decide(policy, BASE, seen, looked, set(stopped))
        else:
            looks = rules.decide(policy, BASE, len(names) - 1, seen, looked, set(stopped))
        looked |= {(v.cell, v.rung) for v in looks}
        stopped |= {v.cell: rung for v in looks if v.stop}
    return stopped


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def null_sweeps(policy: StopPolicy, args: argparse.Namespace, rnd: random.Random) -> tuple[int, int]:
    wrong = base_stops = 0
    for _ in range(args.sweeps):
        stopped = sweep(policy, [0.0] * args.cells, args, rnd)
        wrong += bool(stopped)
        base_stops += BASE in stopped
    return wrong, base_stops


def worse_sweeps(policy: StopPolicy, args: argparse.Namespace, rnd: random.Random) -> dict[str, float]:
    effects = [0.0] + [args.delta] * 3 + [0.0, -args.delta / 2] * ((args.cells - 4) // 2)
    effects += [0.0] * (args.cells - len(effects))
    worse = {f"c{i:02d}" for i, e in enumerate(effects) if e > 0}
    saved = hit = good_stopped = base_stops = 0.0
    for _ in range(args.worse_sweeps):
        stopped = sweep(policy, effects, args, rnd)
        saved += sum(1.0 - policy.rungs[r] for r in stopped.values()) / len(effects)
        hit += len(worse & stopped.keys()) / len(worse)
        good_stopped += bool(stopped.keys() - worse)
        base_stops += BASE in stopped
    n = args.worse_sweeps
    return {"saved": saved / n, "hit": hit / n, "good_stopped": good_stopped / n, "base_stops": base_stops}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweeps", type=int, default=10_000)
    ap.add_argument("--worse-sweeps", type=int, default=2_000)
    ap.add_argument("--cells", type=int, default=12, help="cells per sweep, the baseline included")
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--delta", type=float, default=0.15, help="how much worse the 3 worse cells are")
    ap.add_argument("--sd-seed", type=float, default=0.04)
    ap.add_argument("--sd-step", type=float, default=0.02)
    ap.add_argument("--seed", type=int, default=40)
    args = ap.parse_args()
    rnd = random.Random(args.seed)
    policy = StopPolicy(rule="baseline", alpha=args.alpha, min_seeds=min(3, args.seeds))
    began = time.monotonic()
    print(
        f"model: loss 2+1.5exp(-t/0.3)+effect+N(0,{args.sd_seed}) per seed+N(0,{args.sd_step}) per rung; "
        f"{args.cells} cells x {args.seeds} seeds, rungs {[round(r, 3) for r in policy.rungs]}, seed {args.seed}"
    )
    wrong, base_null = null_sweeps(policy, args, rnd)
    low, high = wilson(wrong, args.sweeps)
    print(
        f"null sweeps: {args.sweeps}; any wrong stop in {wrong} = {wrong / args.sweeps:.4f} "
        f"(95% Wilson CI {low:.4f}..{high:.4f}) vs alpha {args.alpha}"
    )
    out = worse_sweeps(policy, args, rnd)
    print(
        f"worse sweeps (3 of {args.cells} cells worse by {args.delta}): {args.worse_sweeps}; GPU-hours saved "
        f"{out['saved']:.1%} of running every cell to its end; worse cells stopped {out['hit']:.1%}; "
        f"sweeps with a better or equal cell stopped {out['good_stopped']:.2%}"
    )
    sh = worse_sweeps(StopPolicy(rule="halving", min_seeds=min(3, args.seeds)), args, rnd)
    print(
        f"successive halving (keep 1/3, no error bound), same worse sweeps: saved {sh['saved']:.1%}; "
        f"sweeps with a better or equal cell stopped {sh['good_stopped']:.2%}"
    )
    base = base_null + out["base_stops"] + sh["base_stops"]
    print(f"baseline stopped: {int(base)} times; {time.monotonic() - began:.1f} s")
    return 0 if base == 0 and wrong / args.sweeps <= args.alpha else 1


if __name__ == "__main__":
    sys.exit(main())
