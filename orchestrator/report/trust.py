"""What a cell's seeds can support (docs/report.md, "Flags"): seeds whose curves are identical (the
trainer ignored its seed, so they are one run counted n times and give no interval or p-value), and
seeds, or a baseline, that ran on different GPU models or software (the difference may be the
machine's).  Pure: the caller brings the ledger's rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from orchestrator.host_documents import Provenance
from orchestrator.host_documents.provenance import SOFTWARE

IDENTICAL = "seeds identical: does the trainer use its seed? (they count as one run: no interval, no p-value)"
BASELINE_IDENTICAL = "baseline seeds identical: no interval or p-value against it"
Signature = tuple[object, ...] | None


def identical(signatures: Sequence[Signature]) -> bool:
    """True when two or more seeds produced the very same curves, and their final values (a seed
    without curves is no evidence: equal final numbers alone may be a metric that saturates)."""
    first = signatures[0] if signatures else None
    return len(signatures) >= 2 and first is not None and all(s == first for s in signatures[1:])


def signature(curve: Iterable[tuple[str, int | None, float]], final: float) -> Signature:
    """What one seed produced: its curve points (name, step, value) in order and its final value; None
    without curves."""
    points = sorted(curve, key=lambda p: (p[0], -1 if p[1] is None else p[1], p[2]))
    return (final, *points) if points else None


def _values(runs: Iterable[Provenance]) -> dict[str, set[str]]:
    """Each field's distinct known values over ``runs`` (unknown ones say nothing)."""
    found: dict[str, set[str]] = {"GPUs": set()}
    for ran in runs:
        if ran.gpu_model is not None or ran.slot_kind == "cpu":
            found["GPUs"].add(ran.gpus().split(" x ", 1)[-1])  # the model: a count is the job's own choice
        for key in SOFTWARE:
            value = getattr(ran, key)
            if value is not None:
                found.setdefault(key, set()).add(value)
    return found


def _say(values: Mapping[str, set[str]]) -> str:
    return "; ".join(f"{k} {' vs '.join(sorted(v))}" for k, v in values.items())


def mixed(seeds: Mapping[str, Sequence[Provenance]]) -> str:
    """A flag when the seeds of a cell ran on more than one GPU model or version of a piece of software
    ("" when they agree, or nothing is known).  ``seeds``: job name -> what its attempts ran with."""
    every = [ran for runs in seeds.values() for ran in runs]
    differ = {k: v for k, v in _values(every).items() if len(v) > 1}
    return f"mixed machines across seeds: {_say(differ)}" if differ else ""


def unlike_baseline(cell: Sequence[Provenance], baseline: Sequence[Provenance]) -> str:
    """A flag when the cell ran on GPU models or software the baseline did not (and the reverse)."""
    mine, theirs = _values(cell), _values(baseline)
    differ = {k: mine[k] | theirs.get(k, set()) for k in mine
              if mine[k] and theirs.get(k) and mine[k] != theirs[k]}
    if not differ:
        return ""
    return "ran on other machines than the baseline: " + "; ".join(
        f"{k} {' / '.join(sorted(mine[k]))} vs baseline {' / '.join(sorted(theirs[k]))}" for k in differ)


def lines(runs: Iterable[Provenance]) -> list[str]:
    """The distinct one-line descriptions of what ``runs`` ran with, in order of first appearance."""
    return list(dict.fromkeys(ran.line() for ran in runs))
