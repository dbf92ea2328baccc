"""Providers: things that hand out hosts (RunPod, Lambda Cloud).  Never imports hosts/, ledger/, api/ or cli/.

``base`` holds the Provider protocol, the plain values and the pure classification; ``runpod`` and
``lambda_cloud`` are the adapters; ``transport`` and ``credentials`` are their shared HTTP and key handling.
"""
