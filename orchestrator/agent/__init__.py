"""The controller's side of the host agent: the bundle it ships, its check before reuse, the job spec, its launcher.

Imports core, queue, transfer, hosts, host_documents and the ledger; the agent itself lives in payload/agent/.
"""
