"""A fake vast.ai REST API (docs/providers.md, "vast.ai") for tests and demos.

vast.ai publishes no schema file; this fake speaks the requests of its official client, vast-ai/vast-cli
(the commit is in tests/fixtures/providers/README.md), and refuses fields that client never sends.  Routes
(root ``/api/v0`` and ``/api/v1``; auth ``Authorization: Bearer <key>``, or ``?api_key=`` as older clients
sent it, logged as such, or an instance's own key on itself; anything else gets 401):

    POST   /api/v0/bundles/                   search offers (query body: field → {op: value}, order, type, ...)
    PUT    /api/v0/asks/<offer>/              rent an offer → {"success": true, "new_contract": <instance id>}
    GET    /api/v0/instances/<id>/?owner=me   {"instances": {...} | null}
    GET    /api/v1/instances/?select_filters=..&order_by=..&limit=..[&after_token=..]   pages, next_token
    PUT    /api/v0/instances/<id>/            {"state": "stopped" | "running"} or {"label": ...}
    PUT    /api/v0/instances/bid_price/<id>/  {"client_id": "me", "price": <per machine>}
    DELETE /api/v0/instances/<id>/            destroy
    GET|POST /api/v0/ssh/                     account keys;  POST /api/v0/instances/<id>/ssh/ attaches one

Errors are ``{"success": false, "error": <code>, "msg": <text>}`` with the codes vast.ai's OpenAPI document
gives (``auth_error``, ``invalid_args``, ``invalid_price``, ``no_such_ask``, ``not_found``,
``rate_limit_exceeded``).  Behaviour (controls in brackets):

- an instance is ``actual_status`` null, then ``loading`` for ``boot_polls`` reads [``slow_ready``, 1],
  then ``running`` once the backend's machine is up, with the direct endpoint (``public_ipaddr`` + the port
  mapped to ``22/tcp``) and the proxy one (``ssh<N>.vast.ai``); [``no_direct``] publishes the proxy only;
- [``preempt``] an interruptible instance is outbid: paused at once, with no warning and no signal (the
  backend's ``crash`` where it has one, else a preemption with no grace), ``actual_status`` stopped,
  ``intended_status`` still running, until its bid beats the higher one (``bid_price``) or
  [``outbid_ends``] (or, armed ``until_rebid``, the owner's next bid); it then boots again on the same host
  with a new port;
- ``stop`` keeps the machine (and its disk bill); a start comes back on the same host, or stays waiting
  for its GPU while [``gpu_taken``]; [``host_failure``] makes the host ``offline``;
- [``no_capacity``] the next N searches find nothing (capacity that appears after N polls); a rented
  offer leaves the market until its instance is destroyed; [``fail_after_create``] a create succeeds but
  answers an error (unlisted for ``listing_lag_s``); [``race``] a create finds its offer just taken
  (``no_such_ask``); [``terminate_lag``] a destroyed instance is still listed for N reads.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.support.fakecloud.backend import HostBackend
from tests.support.fakecloud.instance_tools import scoped_call, vastai_inside, vastai_may
from tests.support.fakecloud.server import FakeClock, FakeCloud, Reply, Request
from tests.support.fakecloud.vastai_market import CREATE_KEYS, DEFAULT_OFFERS, FakeOffer, check_query, search


@dataclass
class FakeInstance:
    id: int
    label: str | None
    offer: FakeOffer
    image: str
    disk: float
    bid: float | None  # per machine; None: on demand
    actual: str | None = None
    intended: str = "running"
    msg: str = ""
    ip: str = ""
    port: int = 0
    boot_polls: int = 0
    outbid_by: float | None = None  # the higher bid that paused it
    outbid_until_rebid: bool = False  # the higher bid is over by the time the owner bids again
    gpu_taken: bool = False
    destroyed_polls: int | None = None  # set once destroyed: reads it is still listed
    hidden_until: float = 0.0  # time.monotonic() before which no read shows it (a lagging listing)
    ssh_keys: list[str] = field(default_factory=list)
    key: str = ""  # its CONTAINER_API_KEY: it may stop and read itself only


def fail(status: int, code: str, msg: str) -> Reply:
    return Reply(status, {"success": False, "error": code, "msg": msg})


class FakeVastAI(FakeCloud):
    provider = "vastai"
    api_prefix = ""
    controls = (*FakeCloud.controls, "preempt", "outbid_ends", "host_failure", "terminate_externally", "no_capacity",
                "slow_ready", "terminate_lag", "fail_after_create", "gpu_taken", "no_direct", "race")

    def __init__(self, *, api_key: str = "fake-vast-key", backend: HostBackend | None = None,
                 clock: FakeClock | None = None, port: int = 0, offers: tuple[FakeOffer, ...] = DEFAULT_OFFERS) -> None:
        super().__init__(api_key=api_key, backend=backend, clock=clock, port=port)
        self.offers = {o.id: FakeOffer(**vars(o)) for o in offers}
        self.instances: dict[int, FakeInstance] = {}
        self.ssh_keys: list[dict[str, Any]] = []
        self._next_id = 9_000_001
        self._no_capacity = 0
        self._direct = True
        self._race = 0
        self.boot_polls = 1
        self.terminate_polls = 0

    # -- auth -----------------------------------------------------------------------------------------

    def authorize(self, req: Request) -> bool:
        auth = req.headers.get("authorization", "")
        if auth:  # the account's key, or an instance's own (instance_tools.py): reading and stopping itself only
            return auth == f"Bearer {self.api_key}" or scoped_call(
                self, req, {i.key: str(i.id) for i in self.instances.values() if i.key}, vastai_may)
        return req.query.get("api_key") == [self.api_key]

    def auth_failure(self, req: Request) -> Reply:
        return fail(401, "auth_error", "Invalid user key")

    def rate_limited(self, retry_after: float | None) -> Reply:
        reply = fail(429, "rate_limit_exceeded", "API requests too frequent endpoint threshold=3.0")
        if retry_after is not None:
            reply.headers["Retry-After"] = format(retry_after, "g")
        return reply

    def describe(self, req: Request) -> str:
        parts = ["{id}" if p.isdigit() else p for p in req.path.split("/") if p]
        return f"{req.method} /{'/'.join(parts)}/"

    # -- controls -----------------------------------------------------------------------------------------

    def _inst(self, instance_id: int | str) -> FakeInstance:
        inst = self.instances.get(int(instance_id))
        if inst is None or inst.destroyed_polls is not None:
            raise KeyError(f"no instance {instance_id}")
        return inst

    def preempt(self, instance_id: int | str, higher_bid: float | None = None, until_rebid: bool = False) -> None:
        """A higher bid takes an interruptible instance's GPU: paused at once, no warning, no grace.
        ``until_rebid``: that bid is over by the time the owner bids again (the next bid change starts it)."""
        with self.lock:
            inst = self._inst(instance_id)
            if inst.bid is None:
                raise ValueError("only an interruptible instance can be outbid")
            inst.outbid_by = higher_bid if higher_bid is not None else round(inst.bid + 0.01, 4)
            inst.outbid_until_rebid = until_rebid
            inst.actual, inst.msg = "stopped", "Instance paused: outbid by a higher bid"
            crash: Callable[[str], None] | None = getattr(self.backend, "crash", None)
            if crash is not None:
                crash(str(inst.id))  # no SIGTERM at all (NetnsBackend); the disk is kept
            else:
                self.backend.preempt(str(inst.id), 0.0)

    def outbid_ends(self, instance_id: int | str) -> None:
        """The higher bid finished: the paused instance starts again if it still wants to run."""
        with self.lock:
            inst = self._inst(instance_id)
            inst.outbid_by = None
            self._maybe_start(inst)

    def host_failure(self, instance_id: int | str) -> None:
        with self.lock:
            inst = self._inst(instance_id)
            inst.actual, inst.msg = "offline", "Host disconnected"

    def terminate_externally(self, instance_id: int | str) -> None:
        with self.lock:
            self._destroy(self._inst(instance_id), polls=0)

    def no_capacity(self, count: int = 1) -> None:
        """The next ``count`` searches find no offer (capacity appears after ``count`` polls)."""
        with self.lock:
            self._no_capacity += count

    def slow_ready(self, polls: int = 1) -> None:
        with self.lock:
            self.boot_polls = polls

    def terminate_lag(self, terminating_polls: int = 1) -> None:
        with self.lock:
            self.terminate_polls = terminating_polls

    def gpu_taken(self, instance_id: int | str, taken: bool = True) -> None:
        """Someone else rents the instance's GPU: a start waits for it (VAST3)."""
        with self.lock:
            inst = self._inst(instance_id)
            inst.gpu_taken = taken
            if not taken:
                self._maybe_start(inst)

    def race(self, count: int = 1) -> None:
        """The next ``count`` creates lose their offer to another renter just before they arrive."""
        with self.lock:
            self._race += count

    def no_direct(self, on: bool = True) -> None:
        """Instances publish only the proxy SSH endpoint (a host without open ports)."""
        with self.lock:
            self._direct = not on

    # -- routes ---------------------------------------------------------------------------------------------

    def handle(self, req: Request) -> Reply:
        parts = [p for p in req.path.split("/") if p]
        body = req.json() if req.body else None
        if parts[:2] == ["api", "v1"] and parts[2:] == ["instances"] and req.method == "GET":
            return self._list(req.query)
        if parts[:2] != ["api", "v0"]:
            return fail(404, "not_found", "No such endpoint.")
        route, ids = tuple("{id}" if p.isdigit() else p for p in parts[2:]), [int(p) for p in parts if p.isdigit()]
        if body is not None and not isinstance(body, dict):
            return fail(400, "invalid_args", "The body must be a JSON object.")
        body = body or {}
        handlers: dict[tuple[str, tuple[str, ...]], Callable[[], Reply]] = {
            ("POST", ("bundles",)): lambda: self._search(body),
            ("PUT", ("asks", "{id}")): lambda: self._create(ids[0], body),
            ("GET", ("instances", "{id}")): lambda: self._show(ids[0]),
            ("PUT", ("instances", "{id}")): lambda: self._update(ids[0], body),
            ("PUT", ("instances", "bid_price", "{id}")): lambda: self._change_bid(ids[0], body),
            ("DELETE", ("instances", "{id}")): lambda: self._delete(ids[0]),
            ("GET", ("ssh",)): lambda: Reply(200, [dict(k) for k in self.ssh_keys]),
            ("POST", ("ssh",)): lambda: self._add_key(body),
            ("POST", ("instances", "{id}", "ssh")): lambda: self._attach(ids[0], body),
        }
        handler = handlers.get((req.method, route))
        return handler() if handler else fail(404, "not_found", "No such endpoint.")

    # -- offers ---------------------------------------------------------------------------------------------

    def _search(self, q: dict[str, Any]) -> Reply:
        if self._no_capacity > 0 and not check_query(q):
            self._no_capacity -= 1
            return Reply(200, {"offers": []})
        rows, problem = search(list(self.offers.values()), q)
        return fail(400, "invalid_args", problem) if problem else Reply(200, {"offers": rows})

    # -- instances ------------------------------------------------------------------------------------------

    def _create(self, offer_id: int, body: dict[str, Any]) -> Reply:
        unknown = sorted(set(body) - CREATE_KEYS)
        if unknown:
            return fail(400, "invalid_args", f"Unknown field: {unknown[0]}")
        if body.get("client_id") != "me" or not isinstance(body.get("image"), str):
            return fail(400, "invalid_args", "client_id 'me' and an image are required.")
        disk, price = body.get("disk", 10), body.get("price")
        numbers = isinstance(disk, (int, float)) and (price is None or isinstance(price, (int, float)))
        if not numbers or disk < 1:
            return fail(400, "invalid_args", "disk and price must be numbers.")
        offer = self.offers.get(offer_id)
        if offer is not None and self._race > 0:
            self._race -= 1
            offer.rented = True
        if offer is None:
            return fail(404, "invalid_args",
                        f"error 404/3603: no_such_ask Instance type by id {offer_id} is not available.")
        if offer.rented:  # cancel_unavail: it cannot start now
            return fail(410, "no_such_ask",
                        f"error 410/3907: no_such_ask Instance type {offer_id} is no longer available.")
        if price is not None and (price < offer.min_bid or price > 128):
            return fail(400, "invalid_price", f"Bid {price} is outside [{offer.min_bid}, 128].")
        label = body.get("label")
        inst = FakeInstance(id=self._next_id, label=label if isinstance(label, str) else None, offer=offer,
                            image=body["image"], disk=float(disk), bid=float(price) if price is not None else None,
                            boot_polls=self.boot_polls, ssh_keys=[k["ssh_key"] for k in self.ssh_keys])
        inst.key = vastai_inside(self, str(inst.id))
        self._next_id += 1
        offer.rented = True
        inst.ip, inst.port = self.backend.provision(str(inst.id), offer.num_gpus)
        self.instances[inst.id] = inst
        failure = self.failure_after_create()
        if failure is not None:
            status, retry_after, inst.hidden_until = failure
            return self.rate_limited(retry_after) if status == 429 else fail(status, "server_error", "Internal error.")
        return Reply(200, {"success": True, "new_contract": inst.id})

    def _visible(self, inst: FakeInstance) -> bool:
        """One read of ``inst``: booting and destroyed-but-listed last their number of reads."""
        if inst.hidden_until > time.monotonic():
            return False
        if inst.destroyed_polls is not None:
            if inst.destroyed_polls <= 0:
                self.instances.pop(inst.id, None)
                return False
            inst.destroyed_polls -= 1
            return True
        if inst.actual in (None, "loading") and inst.intended == "running" and not inst.gpu_taken:
            if inst.boot_polls > 0:
                inst.boot_polls -= 1
                inst.actual = "loading"
            elif self._machine_ready(inst):
                inst.actual, inst.msg = "running", "success, running"
        return True

    def _machine_ready(self, inst: FakeInstance) -> bool:
        ready: Callable[[str], bool] | None = getattr(self.backend, "is_ready", None)
        return ready is None or ready(str(inst.id))

    def _view(self, inst: FakeInstance) -> dict[str, Any]:
        running = inst.actual == "running"
        ports = {"22/tcp": [{"HostIp": "0.0.0.0", "HostPort": str(inst.port)}]} if running and self._direct else {}
        cost = inst.bid if inst.bid is not None else inst.offer.dph_total
        return {"id": inst.id, "label": inst.label, "machine_id": inst.offer.id // 10, "actual_status": inst.actual,
                "intended_status": inst.intended, "cur_state": "running" if running else "stopped",
                "next_state": inst.intended, "status_msg": inst.msg, "num_gpus": inst.offer.num_gpus,
                "gpu_name": inst.offer.gpu_name, "gpu_ram": inst.offer.gpu_ram_mb,
                "dph_total": round(cost + inst.disk * 0.0001, 6), "is_bid": inst.bid is not None,
                "min_bid": inst.offer.min_bid, "public_ipaddr": inst.ip, "ports": ports,
                "ssh_host": f"ssh{inst.id % 9 + 1}.vast.ai", "ssh_port": 10000 + inst.id % 50000, "ssh_idx": "1",
                "image_uuid": inst.image, "image_runtype": "ssh_direc ssh_proxy", "disk_space": inst.disk,
                "start_date": self.clock.now(), "extra_env": [], "geolocation": inst.offer.geolocation,
                "reliability2": inst.offer.reliability, "direct_port_start": 40000, "direct_port_end": 40099}

    def _show(self, instance_id: int) -> Reply:
        inst = self.instances.get(instance_id)
        return Reply(200, {"instances": self._view(inst) if inst and self._visible(inst) else None})

    def _list(self, query: dict[str, list[str]]) -> Reply:
        limit = int((query.get("limit") or ["25"])[0])
        after = int((query.get("after_token") or ["0"])[0])
        rows = [i for i in sorted(self.instances.values(), key=lambda i: i.id) if self._visible(i) and i.id > after]
        page = rows[:limit]
        token = str(page[-1].id) if len(rows) > limit else None
        return Reply(200, {"instances": [self._view(i) for i in page], "next_token": token,
                           "total_instances": len(rows)})

    def _pause(self, inst: FakeInstance, actual: str, msg: str, grace_s: float) -> None:
        inst.actual, inst.msg = actual, msg
        self.backend.preempt(str(inst.id), grace_s)

    def _maybe_start(self, inst: FakeInstance) -> None:
        """Boot again on the same host when it wants to run and nothing holds its GPU."""
        if inst.intended != "running" or inst.actual not in ("stopped", "exited"):
            return
        if inst.gpu_taken:
            inst.msg = "Scheduling: waiting for the GPU to become available"
            return
        if inst.outbid_by is not None and (inst.bid or 0) <= inst.outbid_by:
            return
        inst.outbid_by = None
        inst.ip, inst.port = self.backend.provision(str(inst.id), inst.offer.num_gpus)
        inst.actual, inst.msg, inst.boot_polls = "loading", "", self.boot_polls

    def _update(self, instance_id: int, body: dict[str, Any]) -> Reply:
        inst = self.instances.get(instance_id)
        if inst is None or inst.destroyed_polls is not None:
            return fail(404, "not_found", "Instance not found")
        state = body.get("state")
        if set(body) == {"label"} and isinstance(body["label"], str):
            inst.label = body["label"]
        elif state == "stopped":
            inst.intended = "stopped"
            if inst.actual not in ("stopped", "exited"):
                self._pause(inst, "stopped", "Instance stopped by user", grace_s=10.0)
        elif state == "running":
            inst.intended = "running"
            self._maybe_start(inst)
        else:
            return fail(400, "invalid_args", "state must be running or stopped")
        return Reply(200, {"success": True})

    def _change_bid(self, instance_id: int, body: dict[str, Any]) -> Reply:
        inst = self.instances.get(instance_id)
        if inst is None or inst.destroyed_polls is not None:
            return fail(404, "not_found", "Instance not found")
        price = body.get("price")
        if body.get("client_id") != "me" or not isinstance(price, (int, float)) or inst.bid is None:
            return fail(400, "invalid_args", "an interruptible instance and a numeric price are required")
        inst.bid = float(price)
        if inst.outbid_until_rebid:
            inst.outbid_by, inst.outbid_until_rebid = None, False
        self._maybe_start(inst)
        return Reply(200, {"success": True})

    def _destroy(self, inst: FakeInstance, polls: int) -> None:
        self.backend.destroy(str(inst.id))
        inst.offer.rented = False
        inst.actual, inst.intended, inst.destroyed_polls = "exited", "stopped", polls

    def _delete(self, instance_id: int) -> Reply:
        inst = self.instances.get(instance_id)
        if inst is None or inst.destroyed_polls is not None:
            return fail(404, "not_found", "Instance not found")
        self._destroy(inst, self.terminate_polls)
        if inst.destroyed_polls == 0:
            del self.instances[instance_id]
        return Reply(200, {"success": True})

    # -- ssh keys -------------------------------------------------------------------------------------------

    def _add_key(self, body: dict[str, Any]) -> Reply:
        key = body.get("ssh_key")
        if set(body) != {"ssh_key"} or not isinstance(key, str) or len(key.split()) < 2:
            return fail(400, "invalid_args", "ssh_key must be an OpenSSH public key line.")
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.clock.now()))
        entry = {"id": 300 + len(self.ssh_keys), "ssh_key": key, "created_at": when}
        self.ssh_keys.append(entry)
        return Reply(200, {"success": True, "key": dict(entry)})

    def _attach(self, instance_id: int, body: dict[str, Any]) -> Reply:
        inst = self.instances.get(instance_id)
        key = body.get("ssh_key")
        if inst is None or inst.destroyed_polls is not None:
            return fail(404, "not_found", "Instance not found")
        if set(body) != {"ssh_key"} or not isinstance(key, str) or len(key.split()) < 2:
            return fail(400, "invalid_args", "ssh_key must be an OpenSSH public key line.")
        if key not in inst.ssh_keys:
            inst.ssh_keys.append(key)
        return Reply(200, {"success": True, "msg": "SSH key attached."})

    def state(self) -> Any:
        return {"instances": {str(i): self._view(x) for i, x in self.instances.items()},
                "offers": [o.row(5.0) for o in self.offers.values()], "ssh_keys": list(self.ssh_keys)}
