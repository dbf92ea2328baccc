"""The tests' toy provider: an adapter and a registry entry that live outside gpuq, for the fake in
tests/support/fakecloud/toy.py, with its profile in tests/fixtures/providers/toy/toy.toml.

``GPUQ_PROVIDER_PLUGINS=tests.support.toycloud`` makes it a provider of every gpuq command
(orchestrator/providers/registry.py): ``gpuq up --provider toy``, ``down``, the JSON documents, the
credential variables (``TOY_API_KEY``, ``GPUQ_TOY_URL``).  Nothing in orchestrator/ names it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx

from orchestrator.core.errors import ProviderError, ProviderUnsupported
from orchestrator.providers.base import Capabilities
from orchestrator.providers.credentials import ProviderSpec
from orchestrator.providers.http_adapter import HttpProvider
from orchestrator.providers.models import Instance, Offer, OfferQuery, ProvisionRequest, parse_money
from orchestrator.providers.registry import Entry

TOY = ProviderSpec("toy", "Toy Cloud", ("GPUQ_TOY_API_KEY", "TOY_API_KEY"), ("GPUQ_TOY_URL",),
                   "https://toy.invalid/toy", "toy")
PROFILE = Path(__file__).resolve().parents[1] / "fixtures" / "providers" / "toy" / "toy.toml"


def _instance(machine: Mapping[str, Any]) -> Instance:
    state = {"starting": "pending", "up": "running", "gone": "terminated"}.get(str(machine.get("state")), "pending")
    up = state == "running" and machine.get("ip")
    return Instance("toy", str(machine["id"]), str(machine.get("name") or ""), state,  # type: ignore[arg-type]
                    str(machine.get("state")), ssh_host=str(machine["ip"]) if up else None,
                    ssh_port=int(machine["ssh_port"]) if up else None, ssh_user="root" if up else None,
                    price_per_hour=parse_money(machine.get("price")), gpu_count=machine.get("gpus"),
                    gpu_type=str(machine.get("shape")))


class ToyProvider(HttpProvider):
    name = "toy"
    spec = TOY
    capabilities = Capabilities(offers=True)
    default_min_interval_s = 0.0

    def _json(self, response: httpx.Response, what: str) -> Any:
        if not 200 <= response.status_code < 300:
            raise ProviderError(TOY.label, f"{what}: HTTP {response.status_code}", status=response.status_code)
        return response.json()

    def list_offers(self, query: OfferQuery) -> list[Offer]:
        if query.spot:
            raise ProviderUnsupported(TOY.label, "the toy cloud has no spot", code="no-spot")
        shapes = self._json(self.http.request("GET", "/shapes"), "GET /shapes")
        offers = [Offer("toy", s["shape"], s["shape"], s["gpus"], parse_money(s["price"])) for s in shapes]
        return [offer for offer in offers if query.admits(offer)]

    def list_instances(self) -> list[Instance]:
        return [_instance(m) for m in self._json(self.http.request("GET", "/machines"), "GET /machines")]

    def get(self, instance_id: str) -> Instance | None:
        response = self.http.request("GET", f"/machines/{instance_id}")
        return None if response.status_code == 404 else _instance(self._json(response, "GET /machines/{id}"))

    def provision(self, request: ProvisionRequest,
                  on_created: Callable[[str, str], None] | None = None) -> list[Instance]:
        if request.spot:
            raise ProviderUnsupported(TOY.label, "the toy cloud has no spot", code="no-spot")
        made = []
        for name in request.names():
            machine = self._json(self.http.request_once("POST", "/machines", json={"name": name,
                                                                                   "shape": request.gpu_type}),
                                 "POST /machines")
            if on_created is not None:
                on_created(name, str(machine["id"]))
            made.append(_instance(machine))
        return made

    def stop(self, instance_id: str) -> None:
        raise ProviderUnsupported(TOY.label, "the toy cloud has no stop", code="no-stop")

    def resume(self, instance_id: str, *, gpu_count: int = 1, bid_per_gpu: Decimal | None = None) -> None:
        raise ProviderUnsupported(TOY.label, "the toy cloud cannot resume", code="no-resume")

    def terminate(self, instance_id: str) -> None:
        response = self.http.request("DELETE", f"/machines/{instance_id}")
        if response.status_code != 404:
            self._json(response, "DELETE /machines/{id}")

    def ensure_ssh_key(self, public_key: str) -> str:
        return "toy-keys-are-the-farm's"  # the fake's hosts already trust the test farm's key


PROVIDER = Entry("toy", "tests.support.toycloud:ToyProvider", TOY, profile=PROFILE)
