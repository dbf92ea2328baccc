"""The polling loops behind every adapter's ``wait_ready`` and ``wait_gone`` (docs/providers.md): how often
to ask (:class:`PollPolicy`), when an instance counts as ready, dead or stuck (:func:`base.classify`), and
that a termination's acknowledgement is not proof.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from orchestrator.core.errors import ProviderError, ProvisioningFailed
from orchestrator.providers.base import classify
from orchestrator.providers.models import Instance


@dataclass(frozen=True)
class PollPolicy:
    """How long and how often to poll: ``first_s`` growing by ``factor`` to ``max_s``."""

    timeout_s: float
    first_s: float
    max_s: float
    factor: float = 1.5

    def intervals(self) -> Callable[[], float]:
        current = [self.first_s]

        def nxt() -> float:
            value = current[0]
            current[0] = min(self.max_s, value * self.factor)
            return value

        return nxt


def poll_until_ready(
    provider: str,
    instance_id: str,
    fetch: Callable[[str], Instance | None],
    policy: PollPolicy,
    *,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Instance:
    """The polling loop behind every ``wait_ready``: stops at ready, raises ProvisioningFailed when the
    instance dies (exited, terminated, unhealthy, gone) or when ``policy.timeout_s`` passes."""
    deadline = clock() + policy.timeout_s
    interval = policy.intervals()
    while True:
        instance = fetch(instance_id)
        if instance is None:
            raise ProvisioningFailed(provider, f"{instance_id} is gone while waiting for it to become ready",
                                     code="host_failure")
        verdict = classify(instance)
        if verdict == "running":
            return instance
        if instance.state != "pending" and verdict != "pending":
            what = f"is {instance.raw_status}" + (" with 0 GPUs" if instance.gpu_count == 0 else "")
            reason = f" ({instance.reason})" if instance.reason else ""
            raise ProvisioningFailed(provider, f"{instance_id} {what}{reason} while waiting for it to become ready",
                                     code=verdict)
        if clock() >= deadline:
            raise ProvisioningFailed(
                provider,
                f"{instance_id} is still {instance.raw_status} without a public SSH endpoint after "
                f"{policy.timeout_s:.0f} s (stuck provisioning; it may still bill: terminate it or wait longer)",
                code="stuck_provisioning")
        sleep(interval())


def poll_until_gone(
    provider: str,
    instance_id: str,
    fetch: Callable[[str], Instance | None],
    policy: PollPolicy,
    *,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Poll until the instance is terminated or unknown (docs/providers.md: an acknowledgement is not proof)."""
    deadline = clock() + policy.timeout_s
    interval = policy.intervals()
    while True:
        instance = fetch(instance_id)
        if instance is None or instance.gone:
            return
        if clock() >= deadline:
            raise ProviderError(
                provider, f"{instance_id} is still {instance.raw_status} {policy.timeout_s:.0f} s after terminate; "
                "it may still bill: check the provider's console", code="not_gone")
        sleep(interval())
