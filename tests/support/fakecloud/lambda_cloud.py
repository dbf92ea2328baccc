"""A fake Lambda Cloud v1 REST API (docs/providers.md) for tests and demos.

Base path ``/api/v1``; auth by ``Authorization: Bearer <key>`` or HTTP basic with the key as user name
and an empty password; anything else gets 401 ``global/invalid-api-key``.  Successes are
``{"data": ...}``, errors ``{"error": {code, message, suggestion}}`` with Lambda's documented codes
(HTTP statuses as assumed there).

Behaviour (defaults in brackets; controls change them):

- launch validates like Lambda's API: exactly one known SSH key, at most one file system and in the
  launch region, ``quantity`` > 1 rejected; a region without capacity for the type (or an armed
  ``no_capacity``) gives ``instance-operations/launch/insufficient-capacity``; launches closer than
  ``launch_interval_s`` [0: off] get 429;
- an instance is ``booting`` without ``ip`` for ``boot_polls`` reads [1], then ``active`` with the
  backend's address (once the backend's optional ``is_ready(instance_id)`` says its machine is up too:
  e.g. NetnsBackend while booting);
- terminate → ``terminating`` for ``terminate_polls`` reads [0] → ``terminated`` for ``linger_polls``
  reads [1] → ``global/object-does-not-exist``; ``short_terminate_response`` omits instances from the
  response;
- ``host_failure`` turns an instance ``unhealthy``; ``/ssh-keys`` refuses to delete a key in use.

Not modelled yet: billing, hanging calls, restart with a new address, per-second rate limiting of
ordinary calls.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.support.fakecloud.backend import HostBackend
from tests.support.fakecloud.server import FakeClock, FakeCloud, Reply, Request

HEX = "0123456789abcdef"


@dataclass
class InstanceType:
    name: str
    description: str
    price_cents: int
    gpus: int
    vcpus: int
    memory_gib: int
    storage_gib: int
    regions: list[str] = field(default_factory=list)  # with capacity now


DEFAULT_TYPES = (
    InstanceType("gpu_1x_a10", "1x A10 (24 GB PCIe)", 75, 1, 30, 200, 1400, ["us-east-1", "us-west-1"]),
    InstanceType("gpu_1x_a100", "1x A100 (40 GB SXM4)", 129, 1, 30, 200, 512, ["us-west-1"]),
    InstanceType("gpu_8x_h100_sxm5", "8x H100 (80 GB SXM5)", 2392, 8, 208, 1800, 24780, []),
)
REGIONS = {"us-east-1": "Virginia, USA", "us-west-1": "California, USA", "europe-central-1": "Frankfurt, Germany"}


@dataclass
class FakeInstance:
    id: str
    name: str | None
    itype: InstanceType
    region: str
    ssh_key: str
    file_systems: list[str]
    status: str = "booting"
    ip: str = ""
    boot_polls: int = 0
    terminate_polls: int = 0
    linger_polls: int = 0
    hidden_until: float = 0.0  # time.monotonic() before which no read lists it (a lagging listing)


def error(status: int, code: str, message: str, suggestion: str = "") -> Reply:
    body: dict[str, Any] = {"error": {"code": code, "message": message}}
    if suggestion:
        body["error"]["suggestion"] = suggestion
    return Reply(status, body)


def invalid(message: str) -> Reply:
    return error(400, "global/invalid-parameters", message, "Check the request body and try again.")


def not_found(what: str) -> Reply:
    return error(404, "global/object-does-not-exist", f"Specified {what} does not exist.")


class FakeLambda(FakeCloud):
    provider = "lambda"
    api_prefix = "/api/v1"
    controls = (*FakeCloud.controls, "host_failure", "terminate_externally", "no_capacity", "set_capacity",
                "slow_ready", "terminate_lag", "fail_after_create", "short_terminate_response", "account_inactive",
                "launch_interval", "add_file_system")

    def __init__(self, *, api_key: str = "fake-lambda-key", backend: HostBackend | None = None,
                 clock: FakeClock | None = None, port: int = 0,
                 instance_types: tuple[InstanceType, ...] = DEFAULT_TYPES) -> None:
        super().__init__(api_key=api_key, backend=backend, clock=clock, port=port)
        self.types = {t.name: InstanceType(**{**vars(t), "regions": list(t.regions)}) for t in instance_types}
        self.instances: dict[str, FakeInstance] = {}
        self.ssh_keys: dict[str, dict[str, str]] = {}  # id -> {id, name, public_key}
        self.file_systems: dict[str, str] = {}  # name -> region
        self._no_capacity = 0
        self._short_terminate = 0
        self._inactive = False
        self._launch_interval = 0.0
        self._last_launch: float | None = None
        self.boot_polls = 1
        self.terminate_polls = 0
        self.linger_polls = 1

    # -- auth -----------------------------------------------------------------------------------------

    def authorize(self, req: Request) -> bool:
        auth = req.headers.get("authorization", "")
        if auth.startswith("Bearer "):
            return auth[len("Bearer "):] == self.api_key
        if auth.startswith("Basic "):
            try:
                user, _, password = base64.b64decode(auth[len("Basic "):]).decode().partition(":")
            except ValueError:
                return False
            return user == self.api_key and password == ""
        return False

    def auth_failure(self, req: Request) -> Reply:
        return error(401, "global/invalid-api-key", "API key was invalid, expired, or deleted.",
                     "Check your API key or create a new one, then try again.")

    def rate_limited(self, retry_after: float | None) -> Reply:
        # [unverified] the body of Lambda's 429; clients go by the status.
        reply = error(429, "global/too-many-requests", "Too many requests.", "Slow down and try again.")
        if retry_after is not None:
            reply.headers["Retry-After"] = format(retry_after, "g")
        return reply

    # -- controls -----------------------------------------------------------------------------------------

    def _instance(self, instance_id: str) -> FakeInstance:
        inst = self.instances.get(instance_id)
        if inst is None:
            raise KeyError(f"no instance {instance_id}")
        return inst

    def host_failure(self, instance_id: str) -> None:
        """The instance turns ``unhealthy`` (the backend is left as it is: the host's fate is unknown)."""
        with self.lock:
            self._instance(instance_id).status = "unhealthy"

    def terminate_externally(self, instance_id: str) -> None:
        """An operator (or the console) terminated the instance."""
        with self.lock:
            self._terminate(self._instance(instance_id))

    def no_capacity(self, count: int = 1) -> None:
        """The next ``count`` launches fail with insufficient-capacity."""
        with self.lock:
            self._no_capacity += count

    def set_capacity(self, instance_type: str, regions: list[str]) -> None:
        with self.lock:
            self.types[instance_type].regions = list(regions)

    def slow_ready(self, polls: int = 1) -> None:
        """Instances launched from now on stay ``booting`` (no ip) for ``polls`` reads."""
        with self.lock:
            self.boot_polls = polls

    def terminate_lag(self, terminating_polls: int = 1, linger_polls: int = 1) -> None:
        with self.lock:
            self.terminate_polls, self.linger_polls = terminating_polls, linger_polls

    def short_terminate_response(self, count: int = 1) -> None:
        """The next ``count`` terminate responses list no instances (the terminate still happens)."""
        with self.lock:
            self._short_terminate += count

    def account_inactive(self, inactive: bool = True) -> None:
        with self.lock:
            self._inactive = inactive

    def launch_interval(self, seconds: float) -> None:
        """Launches closer together than ``seconds`` of fake-clock time get 429 (docs/providers.md)."""
        with self.lock:
            self._launch_interval = seconds

    def add_file_system(self, name: str, region: str) -> None:
        with self.lock:
            self.file_systems[name] = region

    # -- routes ---------------------------------------------------------------------------------------------

    def handle(self, req: Request) -> Reply:
        if self._inactive:
            return error(403, "global/account-inactive", "Your account is inactive.",
                         "Make sure you have verified your email address and have a valid payment method.")
        if not req.path.startswith(self.api_prefix + "/"):
            return not_found("resource")
        path = req.path[len(self.api_prefix):]
        parts = [p for p in path.split("/") if p]
        route = (req.method, *parts[:1])
        if route == ("GET", "instance-types") and len(parts) == 1:
            return Reply(200, {"data": {t.name: self._type_view(t) for t in self.types.values()}})
        if route == ("GET", "instances") and len(parts) == 1:
            return Reply(200, {"data": [self._poll(i) for i in self._visible()]})
        if route == ("GET", "instances") and len(parts) == 2:
            inst = next((i for i in self._visible() if i.id == parts[1]), None)
            return Reply(200, {"data": self._poll(inst)}) if inst else not_found("instance")
        if req.method == "POST" and parts[:1] == ["instance-operations"] and len(parts) == 2:
            body = self._body(req)
            if isinstance(body, Reply):
                return body
            if parts[1] == "launch":
                return self._launch(body)
            if parts[1] == "terminate":
                return self._terminate_op(body)
            if parts[1] == "restart":
                return self._restart_op(body)
        if route == ("GET", "ssh-keys") and len(parts) == 1:
            return Reply(200, {"data": list(self.ssh_keys.values())})
        if route == ("POST", "ssh-keys") and len(parts) == 1:
            body = self._body(req)
            return body if isinstance(body, Reply) else self._add_key(body)
        if route == ("DELETE", "ssh-keys") and len(parts) == 2:
            return self._delete_key(parts[1])
        if route == ("GET", "file-systems") and len(parts) == 1:
            return Reply(200, {"data": [
                {"id": f"fs-{name}", "name": name, "created": "2026-01-01T00:00:00Z", "created_by": {},
                 "mount_point": f"/home/ubuntu/{name}", "region": {"name": region, "description": REGIONS[region]},
                 "is_in_use": any(name in i.file_systems for i in self.instances.values())}
                for name, region in self.file_systems.items()]})
        return not_found("resource")

    @staticmethod
    def _body(req: Request) -> dict[str, Any] | Reply:
        try:
            body = req.json()
        except ValueError:
            return invalid("The request body is not valid JSON.")
        if not isinstance(body, dict):
            return invalid("The request body must be a JSON object.")
        return body

    # -- views ----------------------------------------------------------------------------------------------

    @staticmethod
    def _type_json(t: InstanceType) -> dict[str, Any]:
        return {"name": t.name, "description": t.description, "gpu_description": t.description.split(" ", 1)[-1],
                "price_cents_per_hour": t.price_cents,
                "specs": {"vcpus": t.vcpus, "memory_gib": t.memory_gib, "storage_gib": t.storage_gib, "gpus": t.gpus}}

    def _type_view(self, t: InstanceType) -> dict[str, Any]:
        return {"instance_type": self._type_json(t),
                "regions_with_capacity_available": [{"name": r, "description": REGIONS[r]} for r in t.regions]}

    def _visible(self) -> list[FakeInstance]:
        out = []
        for inst in list(self.instances.values()):
            if inst.hidden_until > time.monotonic():
                continue
            if inst.status == "terminated":
                if inst.linger_polls <= 0:
                    del self.instances[inst.id]
                    continue
                inst.linger_polls -= 1
            out.append(inst)
        return out

    def _poll(self, inst: FakeInstance) -> dict[str, Any]:
        """One read of ``inst``: ``booting`` and ``terminating`` each last their configured number of reads."""
        if inst.status == "booting":
            if inst.boot_polls > 0:
                inst.boot_polls -= 1
            elif self._machine_ready(inst):
                inst.status = "active"
        elif inst.status == "terminating":
            if inst.terminate_polls > 0:
                inst.terminate_polls -= 1
            else:
                inst.status = "terminated"
                inst.linger_polls -= 1  # this read is the first that shows it terminated
        return self._view(inst)

    def _machine_ready(self, inst: FakeInstance) -> bool:
        """The backend's optional readiness hook (a backend without one is always ready)."""
        ready: Callable[[str], bool] | None = getattr(self.backend, "is_ready", None)
        return ready is None or ready(inst.id)

    def _view(self, inst: FakeInstance) -> dict[str, Any]:
        up = inst.status in ("active", "unhealthy")
        out: dict[str, Any] = {
            "id": inst.id, "status": inst.status, "ssh_key_names": [inst.ssh_key],
            "file_system_names": list(inst.file_systems),
            "region": {"name": inst.region, "description": REGIONS.get(inst.region, inst.region)},
            "instance_type": self._type_json(inst.itype),
            "jupyter_token": "fakejupytertoken", "jupyter_url": f"https://jupyter-{inst.id[:8]}.example",
            "actions": self._actions(inst),
        }
        if up:  # the published API leaves the addresses out (never null) until the machine has them
            out.update(hostname=f"{inst.ip.replace('.', '-')}.cloud.lambdalabs.example", ip=inst.ip,
                       private_ip="10.19.0.2")
        if inst.name is not None:
            out["name"] = inst.name
        return out

    @staticmethod
    def _actions(inst: FakeInstance) -> dict[str, Any]:
        """The published ``actions`` block: which operations the instance's state allows now."""
        if inst.status == "booting":
            blocked = {"available": False, "reason_code": "vm-has-not-launched",
                       "reason_description": "the instance has not launched yet"}
        elif inst.status in ("terminating", "terminated"):
            blocked = {"available": False, "reason_code": "vm-is-terminating",
                       "reason_description": "the instance is terminating"}
        else:
            blocked = {}
        ok = blocked or {"available": True}
        return {"migrate": {"available": False, "reason_code": "vm-is-too-old",
                            "reason_description": "migration is not offered"},
                "rebuild": ok, "restart": ok, "cold_reboot": ok,
                "terminate": {"available": True} if inst.status in ("booting", "active", "unhealthy") else blocked}

    # -- operations -----------------------------------------------------------------------------------------

    def _launch(self, body: dict[str, Any]) -> Reply:
        allowed = {"region_name", "instance_type_name", "ssh_key_names", "file_system_names", "quantity", "name"}
        unknown = sorted(set(body) - allowed)
        if unknown:
            return invalid(f"Unknown field: {unknown[0]}")
        itype = self.types.get(str(body.get("instance_type_name")))
        region = body.get("region_name")
        if itype is None:
            return invalid("Invalid instance type name.")
        if region not in REGIONS:
            return invalid("Invalid region name.")
        keys = body.get("ssh_key_names")
        if not isinstance(keys, list) or len(keys) != 1:
            return invalid("Exactly one SSH key name must be provided.")
        if keys[0] not in {k["name"] for k in self.ssh_keys.values()}:
            return invalid(f"SSH key {keys[0]!r} does not exist.")
        fs = body.get("file_system_names") or []
        if not isinstance(fs, list) or len(fs) > 1:
            return invalid("At most one file system may be attached.")
        for name in fs:
            if name not in self.file_systems:
                return invalid(f"File system {name!r} does not exist.")
            if self.file_systems[name] != region:
                return error(400, "instance-operations/launch/file-system-in-wrong-region",
                             "File system is in a different region.", "Launch in the file system's region.")
        quantity = body.get("quantity", 1)
        if not isinstance(quantity, int) or quantity != 1:
            return invalid("Requested too many instances.")
        name = body.get("name")
        if name is not None and (not isinstance(name, str) or len(name) > 64):
            return invalid("Invalid instance name.")
        now = self.clock.now()
        if self._launch_interval and self._last_launch is not None and now - self._last_launch < self._launch_interval:
            return self.rate_limited(self._launch_interval - (now - self._last_launch))
        if self._no_capacity > 0 or region not in itype.regions:
            self._no_capacity = max(0, self._no_capacity - 1)
            return error(400, "instance-operations/launch/insufficient-capacity",
                         "Not enough capacity to fulfill launch request.",
                         "Choose an instance type with more availability, or try again later.")
        self._last_launch = now
        inst = FakeInstance(id=self.new_id(32, HEX), name=name, itype=itype, region=str(region), ssh_key=keys[0],
                            file_systems=list(fs), boot_polls=self.boot_polls)
        inst.ip, _port = self.backend.provision(inst.id, itype.gpus)
        self.instances[inst.id] = inst
        failure = self.failure_after_create()
        if failure is not None:
            status, retry_after, inst.hidden_until = failure
            if status == 429:
                return self.rate_limited(retry_after)
            return error(status, "global/unknown", "An unknown error occurred.")
        return Reply(200, {"data": {"instance_ids": [inst.id]}})

    def _ids(self, body: dict[str, Any]) -> list[FakeInstance] | Reply:
        ids = body.get("instance_ids")
        if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
            return invalid("instance_ids must be a non-empty list of instance ids.")
        found = [self.instances[i] for i in ids if i in self.instances and self.instances[i].status != "terminated"]
        if not found:
            return not_found("instance")
        return found

    def _terminate(self, inst: FakeInstance) -> None:
        if inst.status in ("terminating", "terminated"):
            return
        self.backend.destroy(inst.id)
        inst.status = "terminating"
        inst.terminate_polls = self.terminate_polls
        inst.linger_polls = self.linger_polls
        if inst.terminate_polls <= 0:
            inst.status = "terminated"

    def _terminate_op(self, body: dict[str, Any]) -> Reply:
        found = self._ids(body)
        if isinstance(found, Reply):
            return found
        for inst in found:
            self._terminate(inst)
        listed = [] if self._short_terminate > 0 else [self._view(i) for i in found]
        self._short_terminate = max(0, self._short_terminate - 1)
        return Reply(200, {"data": {"terminated_instances": listed}})

    def _restart_op(self, body: dict[str, Any]) -> Reply:
        found = self._ids(body)
        if isinstance(found, Reply):
            return found
        for inst in found:
            if inst.status in ("active", "unhealthy"):
                self.backend.preempt(inst.id, 0.0)
                inst.ip, _port = self.backend.provision(inst.id, inst.itype.gpus)
                inst.status, inst.boot_polls = "booting", self.boot_polls
        return Reply(200, {"data": {"restarted_instances": [self._view(i) for i in found]}})

    def _add_key(self, body: dict[str, Any]) -> Reply:
        name = body.get("name")
        if not isinstance(name, str) or not name:
            return invalid("name is required.")
        if any(k["name"] == name for k in self.ssh_keys.values()):
            return invalid(f"An SSH key named {name!r} already exists.")
        key_id = self.new_id(32, HEX)
        public = body.get("public_key")
        entry = {"id": key_id, "name": name}
        if public is None:
            entry["public_key"] = f"ssh-ed25519 AAAAFAKE{key_id} generated"
            self.ssh_keys[key_id] = dict(entry)
            return Reply(200, {"data": {**entry, "private_key": "-----BEGIN OPENSSH PRIVATE KEY-----\nfake\n"
                                                               "-----END OPENSSH PRIVATE KEY-----\n"}})
        if not isinstance(public, str) or len(public.split()) < 2:
            return invalid("public_key is not a valid SSH public key.")
        entry["public_key"] = public
        self.ssh_keys[key_id] = entry
        return Reply(200, {"data": dict(entry)})

    def _delete_key(self, key_id: str) -> Reply:
        key = self.ssh_keys.get(key_id)
        if key is None:
            return not_found("SSH key")
        if any(i.ssh_key == key["name"] and i.status != "terminated" for i in self.instances.values()):
            return error(400, "ssh-keys/key-in-use", "The SSH key is in use by an instance.",
                         "Terminate the instances that use it first.")
        del self.ssh_keys[key_id]
        return Reply(200, {"data": {}})

    def state(self) -> Any:
        return {"instances": {i: self._view(x) for i, x in self.instances.items()},
                "ssh_keys": list(self.ssh_keys.values()),
                "capacity": {t.name: list(t.regions) for t in self.types.values()}}
