"""Early stopping against the baseline: the pure rules (policy, rungs, tests, seeds=auto); no I/O.

Imports core and report's statistics only; the tick carries out what these decide (docs/stopping.md).
"""
