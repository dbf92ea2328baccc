"""Where and when jobs run, as pure functions: the planner, its slot heaps, work stealing, estimates, gpu= matching.

Imports core alone: no ledger, no hosts, no I/O, so every rule is tested on plain values.
"""
