"""What a run costs and may cost: attempt prices, a sweep's budget, which machines to rent for a queue.

Pure rules over the ledger's records and the providers' offers; renting, billing and teardown are carried out in tick/.
"""
