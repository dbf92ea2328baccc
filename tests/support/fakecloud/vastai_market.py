"""The fake vast.ai's market (tests/support/fakecloud/vastai.py): its offers, and the offer search as
vast.ai's official client (vast-ai/vast-cli) asks for it: a JSON object of ``field: {operator: value}``
conditions on the client's search fields, plus ``order``, ``type``, ``limit`` and ``allocated_storage``.
A field or operator that client never sends is refused.  The lists equal
tests/fixtures/providers/vastai/client_requests.json (a test checks it)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any


@dataclass
class FakeOffer:
    id: int
    gpu_name: str
    num_gpus: int
    gpu_ram_mb: int
    dph_total: float
    min_bid: float
    reliability: float = 0.99
    direct_port_count: int = 8
    geolocation: str = "US"
    verified: bool = True
    rented: bool = False

    def row(self, storage_gb: float) -> dict[str, Any]:
        return {"id": self.id, "ask_contract_id": self.id, "machine_id": self.id // 10, "host_id": 7,
                "num_gpus": self.num_gpus, "gpu_name": self.gpu_name, "gpu_ram": self.gpu_ram_mb,
                "gpu_total_ram": self.gpu_ram_mb * self.num_gpus, "dph_base": self.dph_total,
                "dph_total": round(self.dph_total + storage_gb * 0.0001, 6), "min_bid": self.min_bid,
                "reliability": self.reliability, "reliability2": self.reliability, "rentable": not self.rented,
                "rented": self.rented, "verified": self.verified, "external": False, "is_bid": False,
                "direct_port_count": self.direct_port_count, "geolocation": self.geolocation,
                "inet_up_cost": 0.0, "inet_down_cost": 0.0, "storage_cost": 0.1, "score": 100.0}


DEFAULT_OFFERS = (
    FakeOffer(5001, "RTX 4090", 1, 24564, 0.35, 0.20),
    FakeOffer(5002, "RTX 4090", 1, 24564, 0.42, 0.24, reliability=0.97, geolocation="SE"),
    FakeOffer(5003, "RTX 4090", 1, 24564, 0.30, 0.15, direct_port_count=0),  # proxy SSH only: filtered out
    FakeOffer(5004, "RTX 3090", 1, 24576, 0.18, 0.09, reliability=0.80),  # unreliable: filtered out
    FakeOffer(5005, "RTX A6000", 1, 49140, 0.49, 0.28),
    FakeOffer(5006, "A100 PCIE", 1, 40960, 0.85, 0.50),
    FakeOffer(5007, "A100 SXM4", 1, 81920, 1.20, 0.70, geolocation="DE"),
    FakeOffer(5008, "H100 SXM", 2, 81559, 4.40, 2.60),
    FakeOffer(5009, "RTX 4090", 2, 24564, 0.75, 0.40),
)
OFFER_FIELDS = frozenset({  # vast-cli's offers_fields (vastai/api/query.py), which its search may send
    "bw_nvlink", "compute_cap", "cpu_arch", "cpu_cores", "cpu_cores_effective", "cpu_ghz", "cpu_ram", "cuda_max_good",
    "datacenter", "direct_port_count", "driver_version", "disk_bw", "disk_space", "dlperf", "dlperf_per_dphtotal",
    "dph_total", "duration", "external", "flops_per_dphtotal", "gpu_arch", "gpu_display_active", "gpu_frac",
    "gpu_max_power", "gpu_max_temp", "gpu_mem_bw", "gpu_name", "gpu_ram", "gpu_total_ram", "has_avx", "host_id",
    "id", "inet_down", "inet_down_cost", "inet_up", "inet_up_cost", "machine_id", "min_bid", "mobo_name",
    "num_gpus", "pci_gen", "pcie_bw", "reliability", "rentable", "rented", "storage_cost", "static_ip",
    "total_flops", "ubuntu_version", "verification", "verified", "vms_enabled", "geolocation", "cluster_id"})
SEARCH_KEYS = frozenset({"order", "type", "limit", "allocated_storage", "disable_bundling"})
CREATE_KEYS = frozenset({"client_id", "image", "env", "price", "disk", "label", "extra", "onstart", "image_login",
                         "python_utf8", "lang_utf8", "use_jupyter_lab", "jupyter_dir", "force", "cancel_unavail",
                         "template_hash_id", "user", "runtype", "args", "volume_info"})
OPS: dict[str, Callable[[Any, Any], bool]] = {
    "eq": lambda a, b: bool(a == b), "neq": lambda a, b: bool(a != b), "gt": lambda a, b: bool(a > b),
    "gte": lambda a, b: bool(a >= b), "lt": lambda a, b: bool(a < b), "lte": lambda a, b: bool(a <= b),
    "in": lambda a, b: a in b, "notin": lambda a, b: a not in b}


def _sort_key(col: str, row: dict[str, Any]) -> Any:
    return row.get(col) or 0


def check_query(q: dict[str, Any]) -> str:
    """What in a search body the client would never send ("" when nothing)."""
    unknown = sorted(set(q) - OFFER_FIELDS - SEARCH_KEYS)
    if unknown:
        return f"Unknown search field: {unknown[0]}"
    if q.get("type") not in ("on-demand", "bid", "reserved"):
        return "type must be on-demand, bid or reserved"
    for name, cond in q.items():
        if name not in SEARCH_KEYS and (not isinstance(cond, dict) or not set(cond) <= set(OPS)):
            return f"bad condition for {name}"
    return ""


def search(offers: list[FakeOffer], q: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    """The rows of ``offers`` that meet every condition of ``q``, in its order, up to its limit; or the
    problem with ``q``."""
    problem = check_query(q)
    if problem:
        return [], problem
    rows = [o.row(float(q.get("allocated_storage", 5.0))) for o in offers]
    for name, cond in q.items():
        if name not in SEARCH_KEYS:
            rows = [r for r in rows if name not in r or all(OPS[op](r[name], v) for op, v in cond.items())]
    for col, direction in reversed(q.get("order") or []):
        rows.sort(key=partial(_sort_key, col), reverse=direction == "desc")
    return rows[: int(q.get("limit") or 64)], ""
