"""The REST half of the fake RunPod (``/v1``, RunPod's published OpenAPI document:
tests/fixtures/providers/runpod/published/openapi.json), over the same pods as its GraphQL half.

Routes: ``POST /pods`` (201, the Pod), ``GET /pods``, ``GET /pods/{id}`` (404 once gone),
``POST /pods/{id}/stop`` and ``/start`` (200), ``DELETE /pods/{id}`` (204).  Auth: ``Authorization: Bearer``
only (the document's one security scheme); otherwise 401.  Errors: the status the document lists for the
operation (400, 404) with ``{"error": <text>}`` [unverified body shape]; a create or start beyond the
stock fails with RunPod's capacity message.  Create bodies are checked against the subset of
``PodCreateInput`` the fake models: an unknown field, a wrong type or a missing ``imageName`` /
``gpuTypeIds`` (the document leaves both optional; gpuq always sends them) is a 400.

An interruptible pod is rented at the GPU type's current minimum bid (REST takes no bid) and comes back
at it on ``/start``; GraphQL's ``podBidResume`` re-bids it at a price of the caller's.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from tests.support.fakecloud import graphql as gql
from tests.support.fakecloud.server import Reply, Request

if TYPE_CHECKING:
    from tests.support.fakecloud.runpod import FakeRunPod, Pod

PREFIX = "/v1"
# PodCreateInput fields the fake accepts, with their JSON types (the published document has more)
CREATE_FIELDS: dict[str, type | tuple[type, ...]] = {
    "name": str, "imageName": str, "cloudType": str, "computeType": str, "gpuTypeIds": list, "gpuCount": int,
    "interruptible": bool, "supportPublicIp": bool, "ports": list, "volumeInGb": int, "containerDiskInGb": int,
    "volumeMountPath": str, "minVCPUPerGPU": int, "minRAMPerGPU": int, "env": dict, "dataCenterIds": list,
    "networkVolumeId": str, "dockerStartCmd": list, "dockerEntrypoint": list, "locked": bool,
}
REQUIRED = ("imageName", "gpuTypeIds")
CLOUD_TYPES = ("SECURE", "COMMUNITY")


def _error(status: int, text: str) -> Reply:
    return Reply(status, {"error": text, "status": status})


def iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(epoch))


def pod_view(fake: FakeRunPod, pod: Pod) -> dict[str, Any]:
    """A pod as REST's ``Pod`` schema shows it."""
    running = pod.status == "RUNNING"
    ready = running and pod.status_polls <= 0 and pod.port_polls <= 0 and fake.machine_ready(pod)
    price = pod.bid if pod.spot and pod.bid is not None else pod.gpu_type.secure_price
    gpu = pod.gpu_type
    cost = round(price * max(pod.gpu_count, 1), 3)
    return {
        "id": pod.id, "name": pod.name, "desiredStatus": pod.status, "lastStatusChange": pod.last_change,
        "interruptible": pod.spot, "image": pod.image, "costPerHr": cost, "adjustedCostPerHr": cost,
        "gpu": {"id": gpu.id, "count": pod.gpu_count, "displayName": gpu.display_name, "securePrice": gpu.secure_price,
                "communityPrice": gpu.community_price, "secureSpotPrice": gpu.min_bid,
                "communitySpotPrice": gpu.min_bid},
        "machineId": pod.machine_id, "consumerUserId": "user_fake", "locked": False,
        "memoryInGb": 62 * max(pod.gpu_count, 1), "vcpuCount": 8 * max(pod.gpu_count, 1),
        "containerDiskInGb": pod.disk_gb, "volumeInGb": pod.volume_gb, "volumeMountPath": pod.mount,
        "env": dict(e.split("=", 1) for e in pod.env), "ports": [p for p in pod.ports.split(",") if p],
        "lastStartedAt": iso(pod.started_at),
        "publicIp": pod.ip if ready else None, "portMappings": {"22": pod.port} if ready else {},
    }


def handle(fake: FakeRunPod, req: Request) -> Reply:
    parts = [p for p in req.path[len(PREFIX):].split("/") if p]
    try:
        if parts == ["pods"]:
            if req.method == "GET":
                return Reply(200, [fake.poll(p, pod_view) for p in fake.visible()])
            if req.method == "POST":
                return _create(fake, req)
        elif len(parts) == 2 and parts[0] == "pods":
            if req.method == "GET":
                pod = next((p for p in fake.visible() if p.id == parts[1]), None)
                return Reply(200, fake.poll(pod, pod_view)) if pod else _error(404, "pod not found")
            if req.method == "DELETE":
                fake.terminate_pod(fake.live_pod(parts[1]))
                return Reply(204, "")
        elif len(parts) == 3 and parts[0] == "pods" and req.method == "POST" and parts[2] in ("stop", "start"):
            pod = fake.live_pod(parts[1])
            if parts[2] == "stop":
                fake.exit_pod(pod, "Exited by user", 5.0)
            else:
                bid = pod.gpu_type.min_bid if pod.spot else None
                fake.resume_pod(pod, pod.gpu_count or 1, spot=pod.spot, bid=bid)
            return Reply(200, pod_view(fake, pod))
        else:
            return _error(404, f"no route {req.method} {req.path}")
    except gql.GraphQLError as exc:
        return _error(404 if exc.message == "Pod not found." else 400, exc.message)
    return _error(405, f"{req.method} is not allowed on {req.path}")


def _create(fake: FakeRunPod, req: Request) -> Reply:
    try:
        body = req.json()
    except ValueError:
        return _error(400, "the body is not JSON")
    problem = _check_create(body)
    if problem:
        return _error(400, problem)
    spot = bool(body.get("interruptible"))
    gpu = fake.gpu_types.get(body["gpuTypeIds"][0])
    if gpu is None:
        return _error(400, f"create pod: invalid GPU type {body['gpuTypeIds'][0]!r}")  # [unverified] wording
    env = [f"{k}={v}" for k, v in (body.get("env") or {}).items()]
    try:
        pod = fake.make_pod(name=body.get("name") or "my pod", gpu=gpu, count=int(body.get("gpuCount", 1)),
                            image=body["imageName"], spot=spot, bid=gpu.min_bid if spot else None, env=env,
                            ports=",".join(body.get("ports") or ["8888/http", "22/tcp"]),
                            volume_gb=body.get("volumeInGb", 20), disk_gb=body.get("containerDiskInGb", 50),
                            mount=body.get("volumeMountPath") or "/workspace")
    except gql.GraphQLError as exc:
        return _error(400, f"create pod: {exc.message}")
    return Reply(201, pod_view(fake, pod), delay_s=fake.take_create_delay())


def _check_create(body: Any) -> str:
    if not isinstance(body, dict):
        return "the body must be a JSON object"
    for key, value in body.items():
        kind = CREATE_FIELDS.get(key)
        if kind is None:
            return f"unknown field {key!r}"
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            return f"{key}: wrong type {type(value).__name__}"
    missing = [k for k in REQUIRED if k not in body]
    if missing:
        return f"missing {', '.join(missing)}"
    if not body["gpuTypeIds"] or not all(isinstance(g, str) for g in body["gpuTypeIds"]):
        return "gpuTypeIds must name at least one GPU type"
    if body.get("cloudType", "SECURE") not in CLOUD_TYPES or body.get("computeType", "GPU") != "GPU":
        return "cloudType must be SECURE or COMMUNITY and computeType GPU"
    if int(body.get("gpuCount", 1)) < 1:
        return "gpuCount must be at least 1"
    if not all(isinstance(v, str) for v in body.get("env", {}).values()):
        return "env values must be strings"
    return ""
