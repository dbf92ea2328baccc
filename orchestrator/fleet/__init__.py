"""The registered hosts: one Host object per host per command, register, audit, forget; a Slurm login node as a host.

Imports core, host_documents, hosts, the ledger and scheduling's gpu= rule; nothing that runs jobs.
"""
