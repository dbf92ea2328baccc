"""``gpuq -v`` makes provider retries and rate-limit waits visible; without it nothing new prints."""

from __future__ import annotations

import logging
import subprocess
import sys

import httpx
import pytest

from orchestrator.cli.verbose import configure
from orchestrator.providers.models import OfferQuery
from tests.unit.test_providers_units import Clock, lambda_with


def test_a_429_wait_and_a_backoff_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    replies = [httpx.Response(429, headers={"Retry-After": "3"}, json={"error": {"code": "global/quota-exceeded"}}),
               httpx.Response(502, json={"error": {"code": "global/unknown"}}),
               httpx.Response(200, json={"data": {}})]
    clock = Clock()
    with caplog.at_level(logging.INFO, logger="orchestrator"):
        assert lambda_with(lambda request: replies.pop(0), clock).list_offers(OfferQuery()) == []
    text = caplog.text
    assert "rate limited" in text and "3.0 s" in text
    assert "backing off" in text


def test_configure_installs_a_stderr_handler_only_when_asked() -> None:
    log = logging.getLogger("orchestrator")
    before = list(log.handlers)
    configure(0)
    assert log.handlers == before
    try:
        configure(1)
        assert len(log.handlers) == len(before) + 1 and log.level == logging.INFO
    finally:
        for handler in log.handlers[len(before):]:
            log.removeHandler(handler)
        log.setLevel(logging.NOTSET)


def test_the_flag_is_on_the_top_level_command() -> None:
    out = subprocess.run([sys.executable, "-m", "orchestrator", "--help"], capture_output=True, text=True, check=True)
    assert "-v, --verbose" in out.stdout
