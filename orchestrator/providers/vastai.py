"""vast.ai over its REST API, as its official client (vast-ai/vast-cli) speaks it (docs/providers.md, "vast.ai").

vast.ai is a marketplace: an *offer* is one host's GPUs at the host's price, found by ``POST
/api/v0/bundles/`` and rented by ``PUT /api/v0/asks/<offer id>/``, which answers the new instance's id
(``new_contract``).  gpuq rents the cheapest offer that matches the request's GPU model and count, from a
verified host of at least ``min_reliability`` with an open port for direct SSH; interruptible rentals
(``spot``) search the bid market and send the bid (``price``, per machine).  Creation is idempotent by
``label`` (gpuq's instance name), and ``cancel_unavail`` is always sent: an offer taken meanwhile fails
the create (then the next offer is tried) instead of leaving a stopped instance that bills its disk.

Readiness (API half): ``actual_status`` running with the *direct* endpoint (the host's ``public_ipaddr``
and the port mapped to the container's 22/tcp); vast.ai's SSH proxy (``ssh<N>.vast.ai``) is accepted only
after ``proxy_after_s`` of waiting without a direct one.  SSH as ``root``.

Billing: ``terminate`` (DELETE, vast.ai's "destroy") is the only call that stops the meter.  A stopped
instance, and an interruptible one paused by a higher bid, keep billing their disk, and bandwidth bills in
every state (``Capabilities.stop_bills_storage``).  An outbid instance is paused with no warning and
no signal; gpuq sees it as ``spot_preemption``.  Auth: ``Authorization: Bearer <key>`` (never the URL).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from functools import partial
from typing import Any, ClassVar
from urllib.parse import quote_plus

import httpx

from orchestrator.core.errors import NoCapacity, ProviderError
from orchestrator.providers import vastai_wire as wire
from orchestrator.providers.base import Capabilities, Provider
from orchestrator.providers.credentials import VASTAI, ApiKey
from orchestrator.providers.http_adapter import HttpProvider, key_name
from orchestrator.providers.models import (
    Instance,
    Offer,
    OfferQuery,
    ProviderOptions,
    ProvisionRequest,
    check_price_cap,
)
from orchestrator.providers.polling import PollPolicy, poll_until_ready
from orchestrator.providers.transport import TERMINATE_TIMEOUT_S, RetryPolicy
from orchestrator.scheduling.gpumatch import MIB_PER_GB

log = logging.getLogger("orchestrator.providers.vastai")

RETRY = RetryPolicy(tries=6, first_delay_s=2.0, max_delay_s=60.0)
MIN_INTERVAL_S = 1.0
READY = PollPolicy(timeout_s=1200.0, first_s=10.0, max_s=20.0)  # image pulls take 1-5 min, fat ones longer
GONE = PollPolicy(timeout_s=600.0, first_s=10.0, max_s=10.0)
PROXY_AFTER_S = 120.0
MIN_RELIABILITY = 0.95
OFFERS_TRIED = 3  # offers tried per machine when the cheapest was rented meanwhile
SEARCH_LIMIT = 64
PAGE_LIMIT = 25
MAX_PAGES = 40
MIN_DISK_GB = 10
DEFAULT_IMAGE = "pytorch/pytorch:2.4.0-cuda12.4-cudnn9-runtime"
RUNTYPE = "ssh_direc ssh_proxy"  # the client's --ssh --direct
CAPACITY_CODES = frozenset({"no_such_ask"})
NOT_FOUND_CODES = frozenset({"no_such_instance", "not_found"})


@dataclass(frozen=True)
class VastOptions(ProviderOptions):
    """vast.ai's extras of a ProvisionRequest.  ``image``: the Docker image, which is the whole environment
    (its CUDA must not be newer than the host driver allows).  ``disk_gb``: the one local disk, fixed at
    create and never resizable, billed while the instance exists (stopped too).  ``min_reliability``: the
    host reliability score an offer needs.  ``bid_margin_per_gpu``: added to an offer's minimum bid when the
    request names no ``bid_per_gpu``."""

    provider: ClassVar[str] = "vastai"
    image: str = DEFAULT_IMAGE
    disk_gb: int = 50
    min_reliability: float = MIN_RELIABILITY
    bid_margin_per_gpu: Decimal = Decimal("0.01")


class VastAIProvider(HttpProvider):
    """:class:`orchestrator.providers.base.Provider` for vast.ai (REST, api/v0 and api/v1)."""

    name = "vastai"
    spec = VASTAI
    # stopped or outbid, the disk bills on (stop_bills_storage); only terminate stops the meter
    capabilities = Capabilities(spot=True, stop=True, rebid=True, regions=True, offers=True, market_search=True,
                                stop_bills_storage=True)
    ssh_names: ClassVar[tuple[str, ...]] = (wire.PROXY_SUFFIX,)  # its proxy gateways, ssh<N>.vast.ai
    default_retry = RETRY
    default_min_interval_s = MIN_INTERVAL_S
    default_ready = READY
    default_gone = GONE

    def __init__(self, key: ApiKey, *, proxy_after_s: float = PROXY_AFTER_S, **options: Any) -> None:
        super().__init__(key, **options)
        self.proxy_after_s = proxy_after_s
        self._destroyed: set[str] = set()

    @classmethod
    def quick_options(cls, poll_s: float, ready_timeout_s: float) -> dict[str, Any]:
        return {**super().quick_options(poll_s, ready_timeout_s), "proxy_after_s": min(PROXY_AFTER_S, 20 * poll_s)}

    # -- REST ------------------------------------------------------------------------------------

    def _check(self, response: httpx.Response, what: str) -> Any:
        """The JSON body of a 2xx answer that does not say ``"success": false``; a gpuq error otherwise."""
        body = self.http.json_body(response)
        status = response.status_code
        if 200 <= status < 300 and not (isinstance(body, dict) and body.get("success") is False):
            return body
        err = wire.parse_error(body)
        code = err.error or ""
        detail = self.http.scrub(err.msg or err.error or response.text[:200] or "no message")
        if status == 401 or (status == 403 and code not in ("invalid_args",)):
            raise self.http.auth_error(status, detail, code=code)
        if code in CAPACITY_CODES or "no_such_ask" in detail:  # 410 no_such_ask; 404 invalid_args "no_such_ask ..."
            raise NoCapacity(wire.LABEL, f"{what}: no capacity: {detail}", code=code, status=status)
        if status == 404 or code in NOT_FOUND_CODES:
            raise ProviderError(wire.LABEL, f"{what}: not found: {detail}", code="not_found", status=status)
        raise ProviderError(wire.LABEL, f"{what}: {code or 'HTTP ' + str(status)}: {detail}",
                            code=code or str(status), status=status)

    @staticmethod
    def _path(path: str, query: Mapping[str, Any] | None = None) -> str:
        """The client's query encoding: strings as they are, anything else as JSON, both quote_plus'd."""
        if not query:
            return path
        return path + "?" + "&".join(f"{k}={quote_plus(v if isinstance(v, str) else json.dumps(v))}"
                                     for k, v in query.items())

    def _call(self, method: str, path: str, *, json_body: Any = None, query: Mapping[str, Any] | None = None,
              timeout_s: float | None = None) -> Any:
        what = f"{method} {path}"
        response = self.http.request(method, self._path(path, query), json=json_body, timeout_s=timeout_s, what=what)
        return self._check(response, what)

    def _once(self, method: str, path: str, *, json_body: Any = None) -> Any:
        what = f"{method} {path}"
        return self._check(self.http.request_once(method, path, json=json_body, what=what), what)

    # -- offers ----------------------------------------------------------------------------------

    @staticmethod
    def _query(*, gpu_name: str | None, gpu_count: int, spot: bool, disk_gb: float, min_reliability: float,
               min_gpu_ram_mib: float | None = None, region: str | None = None) -> dict[str, Any]:
        q: dict[str, Any] = {"verified": {"eq": True}, "external": {"eq": False}, "rentable": {"eq": True},
                             "rented": {"eq": False}, "num_gpus": {"eq": gpu_count},
                             "reliability": {"gte": min_reliability}, "direct_port_count": {"gte": 1}}
        if gpu_name:
            q["gpu_name"] = {"eq": gpu_name}
        if min_gpu_ram_mib:
            q["gpu_ram"] = {"gte": float(min_gpu_ram_mib)}  # the offers' gpu_ram: MiB per GPU
        if region:
            q["geolocation"] = {"eq": region}
        q["order"] = [["min_bid" if spot else "dph_total", "asc"]]
        q["type"] = "bid" if spot else "on-demand"
        q["limit"] = SEARCH_LIMIT
        q["allocated_storage"] = disk_gb
        return q

    def _search(self, query: dict[str, Any]) -> list[wire.WireOffer]:
        body = self._call("POST", "/api/v0/bundles/", json_body=query)
        rows = body.get("offers") if isinstance(body, dict) else None
        if not isinstance(rows, list):
            raise ProviderError(wire.LABEL, "POST /api/v0/bundles/: the response has no offers", code="bad-response")
        offers = []
        for row in rows[:1000]:
            try:
                offers.append(wire.WireOffer.model_validate(row))
            except ValueError:
                log.warning("skipping a vast.ai offer that does not fit the expected shape")
        spot = query.get("type") == "bid"
        return sorted(offers, key=lambda o: (o.min_bid if spot and o.min_bid is not None else o.dph_total, o.id))

    def list_offers(self, query: OfferQuery) -> list[Offer]:
        """Rentable offers of ``query.gpu_count`` GPUs (default 1), cheapest first, each with its on-demand price
        and the machine's minimum interruptible bid.  The search takes the count, GPU name, memory floor
        (``gpu_ram`` in MiB: ``min_gpu_memory_gb`` GB of 10^9 bytes, a MiB of slack for the rounding), region
        (``geolocation``) and ``spot`` (the bid market instead); the price cap is filtered here."""
        floor = (max(0.0, query.min_gpu_memory_gb * MIB_PER_GB - 1)
                 if query.min_gpu_memory_gb is not None else None)
        search = self._query(gpu_name=query.gpu_name, gpu_count=query.gpu_count or 1, spot=query.spot,
                             disk_gb=MIN_DISK_GB, min_reliability=MIN_RELIABILITY, min_gpu_ram_mib=floor,
                             region=query.region)
        offers = [wire.offer_of(row) for row in self._search(search)]
        return [offer for offer in offers if query.admits(offer)]

    # -- instances ----------------------------------------------------------------------------------

    def list_instances(self) -> list[Instance]:
        out: list[Instance] = []
        query: dict[str, Any] = {"select_filters": {}, "order_by": [{"col": "id", "dir": "asc"}], "limit": PAGE_LIMIT}
        for _ in range(MAX_PAGES):
            page = wire.parse(wire.WireInstancePage, self._call("GET", "/api/v1/instances/", query=query),
                              "GET /api/v1/instances/")
            out.extend(self._instance(item) for item in page.instances)
            if not page.next_token:
                break
            query["after_token"] = page.next_token
        else:
            log.warning("vast.ai listed more than %d pages of instances; the rest are not shown", MAX_PAGES)
        return out

    def _instance(self, item: wire.WireInstance, allow_proxy: bool = True) -> Instance:
        return wire.instance_of(item, destroyed=str(item.id) in self._destroyed, allow_proxy=allow_proxy)

    def get(self, instance_id: str) -> Instance | None:
        return self._get(instance_id, allow_proxy=True)

    def _get(self, instance_id: str, *, allow_proxy: bool) -> Instance | None:
        if not _is_id(instance_id):
            return None  # vast.ai's ids are numbers: it knows no such instance
        try:
            body = self._call("GET", f"/api/v0/instances/{instance_id}/", query={"owner": "me"})
        except ProviderError as exc:
            if exc.code == "not_found":
                self._destroyed.discard(instance_id)
                return None
            raise
        item = wire.parse(wire.WireOneInstance, body, "GET /api/v0/instances/{id}/").instances
        if item is None:
            self._destroyed.discard(instance_id)
            return None
        return self._instance(item, allow_proxy)

    def _find_by_label(self, name: str) -> str | None:
        matches = [i for i in self.list_instances() if i.name == name and i.state not in ("terminating", "terminated")]
        if len(matches) > 1:
            log.warning("%d vast.ai instances are labelled %s; adopting %s", len(matches), name, matches[0].id)
        return matches[0].id if matches else None

    def provision(self, request: ProvisionRequest,
                  on_created: Callable[[str, str], None] | None = None) -> list[Instance]:
        if not request.ssh_public_key:
            raise ProviderError(wire.LABEL, "a vast.ai rental needs an SSH key: pass ssh_public_key", code="no-ssh-key")
        extras = request.options_for(VastOptions)
        self.ensure_ssh_key(request.ssh_public_key)
        existing = {i.name: i.id for i in self.list_instances() if i.state not in ("terminating", "terminated")}
        ids: list[str] = []
        for name in request.names():
            if name in existing:
                log.info("adopting vast.ai instance %s already labelled %s", existing[name], name)
                instance_id = existing[name]
            else:
                instance_id = self._rent(name, request, extras)
                self._attach(instance_id, request.ssh_public_key)
            ids.append(instance_id)
            if on_created is not None:
                on_created(name, instance_id)
        return [self.get(i) or Instance(wire.PROVIDER, i, n, "pending", "booting", gpu_type=request.gpu_type,
                                        spot=request.spot) for i, n in zip(ids, request.names(), strict=True)]

    def _rent(self, name: str, request: ProvisionRequest, extras: VastOptions) -> str:
        """Rent one machine for ``name`` on the cheapest matching offer; the next offers when one is taken."""
        disk = max(MIN_DISK_GB, extras.disk_gb)
        query = self._query(gpu_name=request.gpu_type, gpu_count=request.gpu_count, spot=request.spot,
                            disk_gb=disk, min_reliability=extras.min_reliability, region=request.region)
        offers = self._search(query)
        if request.spot and request.bid_per_gpu is not None:
            bid = wire.machine_bid(request.bid_per_gpu, request.gpu_count)
            offers = [o for o in offers if o.min_bid is None or o.min_bid <= bid]
        cap = request.max_price_per_hour
        if cap is not None and offers:  # on demand: the offer's dph_total; interruptible: its minimum bid
            fitting = [o for o in offers if self._price(o, request.spot) <= cap]
            if not fitting:
                check_price_cap(wire.LABEL, request, self._price(offers[0], request.spot))
            offers = fitting
        if not offers:
            kind = "interruptible" if request.spot else "on-demand"
            raise NoCapacity(wire.LABEL, f"no {kind} vast.ai offer has capacity for {request.gpu_count}x "
                             f"{request.gpu_type} now (verified, reliability >= {extras.min_reliability}, direct SSH)",
                             code="no-offer")
        last: NoCapacity | None = None
        for offer in offers[:OFFERS_TRIED]:
            body: dict[str, Any] = {"client_id": "me", "image": extras.image, "disk": disk, "label": name,
                                    "runtype": RUNTYPE, "cancel_unavail": True}
            if request.env:
                body["env"] = dict(request.env)  # the client's form: a JSON object of name → value
            if request.spot:
                bid = self._bid(request, extras, offer)
                body["price"] = bid if cap is None else min(bid, float(cap))  # never above the cap
            try:
                return self.http.retrying(partial(self._create_once, f"/api/v0/asks/{offer.id}/", body),
                                          adopt=partial(self._find_by_label, name), repeat_applied=False)
            except NoCapacity as exc:
                log.info("vast.ai offer %d was taken meanwhile; trying the next", offer.id)
                last = exc
        assert last is not None
        raise last

    @staticmethod
    def _price(offer: wire.WireOffer, spot: bool) -> Decimal:
        """What one machine of the offer costs per hour: its minimum bid (interruptible) or dph_total."""
        return Decimal(str(offer.min_bid if spot and offer.min_bid is not None else offer.dph_total))

    @staticmethod
    def _bid(request: ProvisionRequest, extras: VastOptions, offer: wire.WireOffer) -> float:
        """The interruptible bid for the whole machine: the request's ceiling, else the offer's minimum plus
        the margin."""
        if request.bid_per_gpu is not None:
            return wire.machine_bid(request.bid_per_gpu, request.gpu_count)
        floor = Decimal(str(offer.min_bid if offer.min_bid is not None else offer.dph_total))
        return wire.machine_bid(floor / max(offer.num_gpus, 1) + extras.bid_margin_per_gpu, offer.num_gpus)

    def _create_once(self, path: str, body: Mapping[str, Any]) -> str:
        made = wire.parse(wire.WireCreated, self._once("PUT", path, json_body=dict(body)), "PUT /api/v0/asks/{id}/")
        return str(made.new_contract)

    def _attach(self, instance_id: str, public_key: str) -> None:
        """Put the key on the instance itself too (an account key reaches only instances created after it)."""
        self._call("POST", f"/api/v0/instances/{_checked(instance_id)}/ssh/", json_body={"ssh_key": public_key.strip()})

    def wait_ready(self, instance_id: str, *, timeout_s: float | None = None) -> Instance:
        """Poll until running with the direct SSH endpoint, or the proxy one after ``proxy_after_s``."""
        policy = self.ready_policy if timeout_s is None else PollPolicy(timeout_s, self.ready_policy.first_s,
                                                                        self.ready_policy.max_s)
        started = self.http.clock()

        def fetch(i: str) -> Instance | None:
            return self._get(i, allow_proxy=self.http.clock() - started >= self.proxy_after_s)

        ready = poll_until_ready(wire.LABEL, instance_id, fetch, policy, sleep=self.http.sleep, clock=self.http.clock)
        if wire.via_proxy(ready):
            log.warning("vast.ai instance %s published no direct SSH port; using the slower SSH proxy", instance_id)
        return ready

    # -- lifecycle -----------------------------------------------------------------------------------

    def stop(self, instance_id: str) -> None:
        """Stop the container, keeping its disk: the disk keeps billing (only terminate stops the meter)."""
        self._call("PUT", f"/api/v0/instances/{_checked(instance_id)}/", json_body={"state": "stopped"})

    def resume(self, instance_id: str, *, gpu_count: int = 1, bid_per_gpu: Decimal | None = None) -> None:
        """Start a stopped or outbid instance again on the same GPU; with ``bid_per_gpu`` the interruptible
        bid is changed first.  It stays pending while its GPU is rented by someone else (VAST3)."""
        checked = _checked(instance_id)
        if bid_per_gpu is not None:
            self._call("PUT", f"/api/v0/instances/bid_price/{checked}/",
                       json_body={"client_id": "me", "price": wire.machine_bid(bid_per_gpu, gpu_count)})
        self._call("PUT", f"/api/v0/instances/{checked}/", json_body={"state": "running"})

    def terminate(self, instance_id: str) -> None:
        """Destroy the instance and its disk (the only meter stop).  Idempotent; :meth:`wait_gone` proves it."""
        if not _is_id(instance_id):
            return
        try:
            self._call("DELETE", f"/api/v0/instances/{instance_id}/", timeout_s=TERMINATE_TIMEOUT_S)
        except ProviderError as exc:
            if exc.code != "not_found":
                raise
        self._destroyed.add(instance_id)

    # -- ssh keys ------------------------------------------------------------------------------------

    def list_ssh_keys(self) -> list[wire.WireSshKey]:
        body = self._call("GET", "/api/v0/ssh/")
        return wire.parse(wire.WireSshKeys, body if isinstance(body, dict) else {"ssh_keys": body},
                          "GET /api/v0/ssh/").ssh_keys

    def ensure_ssh_key(self, public_key: str) -> str:
        """Add ``public_key`` to the account unless it is there; vast.ai keys have no names, so the answer is
        gpuq's name for it (``gpuq-<sha12>``)."""
        body = " ".join(public_key.split()[:2])
        if len(body.split()) != 2:
            raise ProviderError(wire.LABEL, "not an OpenSSH public key line", code="bad-key")

        def present() -> str | None:
            known = any(" ".join(k.ssh_key.split()[:2]) == body for k in self.list_ssh_keys())
            return key_name(public_key) if known else None

        if present() is not None:
            return key_name(public_key)

        def add() -> str:
            self._once("POST", "/api/v0/ssh/", json_body={"ssh_key": public_key.strip()})
            return key_name(public_key)

        return self.http.retrying(add, adopt=present)


def _is_id(value: str) -> bool:
    return value.isascii() and value.isdigit() and len(value) <= 18


def _checked(value: str) -> str:
    """An id as one URL path segment: vast.ai's ids are decimal numbers."""
    if not _is_id(value):
        raise ProviderError(wire.LABEL, f"not a vast.ai instance id: {value[:40]!r}", code="bad-id")
    return value


def _conforms(provider: VastAIProvider) -> Provider:
    """Checked by mypy: VastAIProvider satisfies the Provider protocol."""
    return provider
