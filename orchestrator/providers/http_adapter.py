"""The lifecycle every HTTP provider adapter shares, held once (docs/providers.md, "Adding a provider").

An adapter subclasses :class:`HttpProvider`, sets ``name``, ``spec`` (its credentials and URLs,
credentials.ProviderSpec), ``capabilities`` (base.Capabilities) and its pacing defaults, and writes the
vendor calls: ``list_offers``, ``list_instances``, ``get``, ``provision``, ``stop``, ``resume``, ``terminate``,
``ensure_ssh_key``.  The base gives it the key and URL from the environment (:meth:`HttpProvider.from_env`),
one :class:`~orchestrator.providers.transport.ApiTransport` (``self.http``), a repr that never shows the
key, ``close``, and the polling ``wait_ready`` / ``wait_gone`` (polling.poll_until_ready / poll_until_gone).
``supports_stop`` / ``supports_spot`` (the Provider protocol's) are derived from ``capabilities``.
"""

from __future__ import annotations

import hashlib
import random
import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar

import httpx

from orchestrator.providers.base import Capabilities
from orchestrator.providers.credentials import ApiKey, ProviderSpec, load_key, load_url
from orchestrator.providers.models import Instance
from orchestrator.providers.polling import PollPolicy, poll_until_gone, poll_until_ready
from orchestrator.providers.transport import ApiTransport, RetryPolicy

_P = TypeVar("_P", bound="HttpProvider")  # typing.Self needs Python 3.11; the controller runs on 3.10


def key_name(public_key: str) -> str:
    """The name gpuq registers its SSH key under where a provider names keys (Lambda, vast.ai):
    ``gpuq-<first 12 hex of sha256(type base64)>``."""
    body = " ".join(public_key.split()[:2])
    return "gpuq-" + hashlib.sha256(body.encode()).hexdigest()[:12]


class HttpProvider:
    """Base class of the adapters (see the module docstring).  Subclasses override the class attributes."""

    name: str = ""
    spec: ClassVar[ProviderSpec]
    capabilities: ClassVar[Capabilities] = Capabilities()
    supports_stop: bool = False
    supports_spot: bool = False
    # pacing and polling defaults (docs/providers.md gives each provider's)
    default_retry: ClassVar[RetryPolicy] = RetryPolicy()
    default_min_interval_s: ClassVar[float] = 1.0
    default_ready: ClassVar[PollPolicy] = PollPolicy(timeout_s=900.0, first_s=10.0, max_s=10.0)
    default_gone: ClassVar[PollPolicy] = PollPolicy(timeout_s=600.0, first_s=10.0, max_s=10.0)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.supports_stop = cls.capabilities.stop
        cls.supports_spot = cls.capabilities.spot

    def __init__(
        self,
        key: ApiKey,
        *,
        url: str | None = None,
        transport: httpx.BaseTransport | None = None,
        policy: RetryPolicy | None = None,
        min_interval_s: float | None = None,
        ready: PollPolicy | None = None,
        gone: PollPolicy | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.http = ApiTransport(self.spec, url or self.spec.default_url, key, policy=policy or self.default_retry,
                                 min_interval_s=self.default_min_interval_s if min_interval_s is None
                                 else min_interval_s,
                                 transport=transport, sleep=sleep, clock=clock, rng=rng)
        self.ready_policy = ready or self.default_ready
        self.gone_policy = gone or self.default_gone

    @classmethod
    def from_env(cls: type[_P], env: Mapping[str, str] | None = None, **options: Any) -> _P:
        """Key and URL(s) from the environment or the keys file (credentials.py).  Other APIs of the spec
        (:attr:`ProviderSpec.more_urls`) are passed as ``<name>_url`` keyword arguments."""
        more: dict[str, Any] = {f"{e.name}_url": load_url(cls.spec, env, e.name) for e in cls.spec.more_urls}
        return cls(load_key(cls.spec, env), url=load_url(cls.spec, env), **more, **options)

    @classmethod
    def quick_options(cls, poll_s: float, ready_timeout_s: float) -> dict[str, Any]:
        """Constructor options for a short poll interval (the ``provider_poll_s`` setting: tests, demos):
        poll every ``poll_s``, no client-side pacing.  Adapters with more pacing add theirs."""
        return {"ready": PollPolicy(ready_timeout_s, poll_s, poll_s),
                "gone": PollPolicy(max(60.0, 100 * poll_s), poll_s, poll_s), "min_interval_s": 0.0}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.http.base_url}, key {self.http.key!r})"

    def close(self) -> None:
        self.http.close()

    def get(self, instance_id: str) -> Instance | None:
        raise NotImplementedError

    def wait_ready(self, instance_id: str, *, timeout_s: float | None = None) -> Instance:
        policy = self.ready_policy if timeout_s is None else PollPolicy(timeout_s, self.ready_policy.first_s,
                                                                        self.ready_policy.max_s)
        return poll_until_ready(self.spec.label, instance_id, self.get, policy, sleep=self.http.sleep,
                                clock=self.http.clock)

    def wait_gone(self, instance_id: str, *, timeout_s: float | None = None) -> None:
        policy = self.gone_policy if timeout_s is None else PollPolicy(timeout_s, self.gone_policy.first_s,
                                                                      self.gone_policy.max_s)
        poll_until_gone(self.spec.label, instance_id, self.get, policy, sleep=self.http.sleep, clock=self.http.clock)
