"""The fake RunPod's records and wire rules (see runpod.py): its constants, GPU types, the pod record,
RFC 9457 problem replies and what a create body may hold."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from tests.support.fakecloud.server import Reply

PREFIX = "/v2"
CAPACITY_MESSAGE = ("There are no longer any instances available with the requested specifications. "
                    "Please refresh and try again.")
ID_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"
DATA_CENTERS = ("US-KS-2", "EU-RO-1")
CREATE_FIELDS = frozenset({"name", "image", "cloud", "gpu", "disk", "mounts", "ports", "startSsh", "env",
                           "dataCenterIds", "args", "registry", "globalNetworking", "startJupyter", "templateId",
                           "cpu"})
KEY_PREFIXES = ("ssh-", "ecdsa-", "sk-")


@dataclass
class GpuType:
    id: str
    display_name: str
    memory_gb: int
    secure_price: float
    community_price: float
    stock: int = 16
    max_count: int = 8


DEFAULT_GPU_TYPES = (
    GpuType("NVIDIA GeForce RTX 4090", "RTX 4090", 24, 0.69, 0.44),
    GpuType("NVIDIA RTX A6000", "RTX A6000", 48, 0.79, 0.49),
    GpuType("NVIDIA H100 80GB HBM3", "H100 SXM", 80, 2.99, 2.69),
)


@dataclass
class Pod:
    id: str
    name: str
    gpu_type: GpuType
    gpu_count: int
    image: str
    cloud: str
    env: dict[str, str]
    ports: list[str]
    volume_gb: int
    disk_gb: int
    start_ssh: bool
    data_center: str
    status: str = "RUNNING"
    ip: str = ""
    port: int = 0
    created_at: float = 0.0
    hidden_until: float = 0.0  # time.monotonic() before which no read lists it (a lagging listing)
    started_at: float = 0.0
    status_polls: int = 0
    port_polls: int = 0
    terminate_polls: int = 0
    zero_gpus_next_start: bool = False
    running_gpus: int = 0
    key: str = ""  # the pod-scoped RUNPOD_API_KEY RunPod puts in the pod (it may stop and read this pod only)
    extra: dict[str, Any] = field(default_factory=dict)


def iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def problem(status: int, detail: str, errors: list[str] | None = None) -> Reply:
    titles = {400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 409: "Conflict",
              422: "Unprocessable Entity", 429: "Too Many Requests"}
    body: dict[str, Any] = {"title": titles.get(status, "Error"), "status": status, "detail": detail}
    if errors:
        body["errors"] = errors
    return Reply(status, body, {"Content-Type": "application/problem+json"})


class _Failed(Exception):
    def __init__(self, reply: Reply) -> None:
        super().__init__(reply.status)
        self.reply = reply


def _create_problems(body: Any) -> list[str]:
    """What in a create body the fake (the subset of CreatePodRequest gpuq uses) does not take."""
    if not isinstance(body, dict):
        return ["$: must be an object"]
    out = [f"$: additional properties '{k}' not allowed" for k in body if k not in CREATE_FIELDS]
    for key, kind in (("name", str), ("image", str), ("gpu", dict)):
        if not isinstance(body.get(key), kind):
            out.append(f"$.{key}: required {kind.__name__}")
    gpu: dict[str, Any] = body["gpu"] if isinstance(body.get("gpu"), dict) else {}
    if not isinstance(gpu.get("id"), str) or not isinstance(gpu.get("count", 1), int) or gpu.get("count", 1) < 1:
        out.append("$.gpu: needs an id and a count of at least 1")
    if body.get("cloud", "SECURE") not in ("SECURE", "COMMUNITY"):
        out.append("$.cloud: must be SECURE or COMMUNITY")
    if not all(isinstance(v, str) for v in (body.get("env") or {}).values()):
        out.append("$.env: values must be strings")
    return out
