"""Providers: things that hand out hosts (RunPod, Lambda Cloud, vast.ai).  Never imports hosts/, ledger/, api/ or cli/.

``base`` holds the Provider protocol, the plain values and the pure classification; ``registry`` lists the
providers (every provider list in gpuq derives from it); ``runpod`` (with ``runpod_wire``),
``lambda_cloud`` and ``vastai`` are the adapters, on the shared lifecycle of ``http_adapter``;
``transport`` and ``credentials`` are their shared HTTP and key handling.
"""
