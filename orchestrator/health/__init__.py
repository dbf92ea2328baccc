"""What the health patrol judges: rules, failure classes, stops, hints, observed numbers, setup holds, checkpoint trust.

Imports core, host_documents and the ledger; the tick carries out what these decide.
"""
