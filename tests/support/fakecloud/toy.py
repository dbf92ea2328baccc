"""The fake cloud behind the tests' toy provider (tests/support/toycloud.py): the smallest REST API that
rents machines, so that a provider gpuq has never heard of can be plugged in from the test side.

    GET    /toy/shapes            [{"shape", "gpus", "price"}]
    GET    /toy/machines          [machine, ...]          machine: {"id", "name", "shape", "gpus", "price",
    POST   /toy/machines          201 machine                       "state": "starting" | "up" | "gone",
    GET    /toy/machines/{id}     machine, or 404                   "ip", "ssh_port"}
    DELETE /toy/machines/{id}     202 (404 once gone)

Auth: ``Authorization: Bearer <key>``, else 401.  A machine is ``starting`` until the backend says its host
is up (``is_ready``), then ``up`` with the backend's endpoint; a deleted one is gone at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.support.fakecloud.backend import HostBackend
from tests.support.fakecloud.server import FakeClock, FakeCloud, Reply, Request

SHAPES = {"toy-1": (1, 0.11), "toy-2": (2, 0.22)}


@dataclass
class Machine:
    id: str
    name: str
    shape: str
    ip: str
    port: int


class FakeToy(FakeCloud):
    provider = "toy"
    api_prefix = "/toy"

    def __init__(self, *, api_key: str = "fake-toy-key", backend: HostBackend | None = None,
                 clock: FakeClock | None = None, port: int = 0) -> None:
        super().__init__(api_key=api_key, backend=backend, clock=clock, port=port)
        self.machines: dict[str, Machine] = {}

    def authorize(self, req: Request) -> bool:
        return req.headers.get("authorization", "") == f"Bearer {self.api_key}"

    def auth_failure(self, req: Request) -> Reply:
        return Reply(401, {"error": "bad key"})

    def _view(self, machine: Machine) -> dict[str, Any]:
        ready: Callable[[str], bool] | None = getattr(self.backend, "is_ready", None)
        up = ready is None or ready(machine.id)
        gpus, price = SHAPES[machine.shape]
        return {"id": machine.id, "name": machine.name, "shape": machine.shape, "gpus": gpus, "price": price,
                "state": "up" if up else "starting", "ip": machine.ip if up else "",
                "ssh_port": machine.port if up else 0}

    def handle(self, req: Request) -> Reply:
        parts = [p for p in req.path[len(self.api_prefix):].split("/") if p]
        if parts == ["shapes"] and req.method == "GET":
            return Reply(200, [{"shape": s, "gpus": g, "price": p} for s, (g, p) in SHAPES.items()])
        if parts == ["machines"] and req.method == "GET":
            return Reply(200, [self._view(m) for m in self.machines.values()])
        if parts == ["machines"] and req.method == "POST":
            body = req.json() or {}
            if body.get("shape") not in SHAPES or not isinstance(body.get("name"), str):
                return Reply(400, {"error": f"unknown shape {body.get('shape')!r} or no name"})
            machine_id = "toy-" + self.new_id(8, "abcdefghijklmnopqrstuvwxyz0123456789")
            ip, port = self.backend.provision(machine_id, SHAPES[body["shape"]][0])
            self.machines[machine_id] = Machine(machine_id, body["name"], body["shape"], ip, port)
            return Reply(201, self._view(self.machines[machine_id]))
        if len(parts) == 2 and parts[0] == "machines" and req.method in ("GET", "DELETE"):
            machine = self.machines.get(parts[1])
            if machine is None:
                return Reply(404, {"error": "no such machine"})
            if req.method == "GET":
                return Reply(200, self._view(machine))
            self.backend.destroy(machine.id)
            del self.machines[machine.id]
            return Reply(202, {"id": machine.id, "state": "gone"})
        return Reply(404, {"error": f"no route {req.method} {req.path}"})

    def state(self) -> Any:
        return {"machines": {m.id: self._view(m) for m in self.machines.values()}}
