"""A gpuq ``Context`` in this process whose Lambda Cloud is a :class:`FakeLambda` (unit tests of `gpuq up`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from orchestrator.context import Context, open_context
from tests.support.fakecloud.backend import HostBackend
from tests.support.fakecloud.lambda_cloud import FakeLambda


@contextmanager
def lambda_context(monkeypatch: pytest.MonkeyPatch, key: str,
                   backend: HostBackend) -> Iterator[tuple[Context, FakeLambda]]:
    """The fake (its machines from ``backend``) and a context that reaches it with ``key``, polling every 0.1 s."""
    with FakeLambda(api_key=key, backend=backend) as fake:
        monkeypatch.setenv("LAMBDA_API_KEY", key)
        monkeypatch.setenv("GPUQ_LAMBDA_API_URL", fake.url)
        monkeypatch.setenv("GPUQ_PROVIDER_POLL_S", "0.1")
        context = open_context()
        try:
            yield context, fake
        finally:
            context.close()
