"""A fake RunPod REST API v2 (docs/providers.md) for tests and demos, written from RunPod's published v2
OpenAPI document (tests/fixtures/providers/runpod/published/openapi-v2.json; every recorded exchange is
checked against it by tests/unit/test_providers_published_schema.py).

Routes (below ``/v2``): ``GET /catalog/gpus`` (``include=AVAILABILITY&product=POD``, ``count``, ``cloud``),
``GET|POST /pods``, ``GET|DELETE /pods/{id}``, ``POST /pods/{id}/action`` (``start``/``stop``/``restart``/
``terminate``), ``GET|PUT /account/ssh-keys``.  Auth: ``Authorization: Bearer`` only; otherwise 401.  Errors
are RFC 9457 problem objects (``title``, ``status``, ``detail``); a body the document does not allow is a 422
with ``errors``; no capacity is a 400 whose ``detail`` says so (v2 gives it no code [unverified wording]).

Behaviour (defaults in brackets; controls change them):

- create returns the pod at once (``slow_create``: the pod exists at once, its answer comes late); the pod
  shows ``PROVISIONING`` for ``status_polls`` reads [0], ``RUNNING`` without ``ssh.direct`` for
  ``port_polls`` reads [1], then ``RUNNING`` with the backend's endpoint as ``ssh.direct`` (once the
  backend's optional ``is_ready(pod_id)`` says its machine is up too: e.g. NetnsBackend while booting);
- ``stop`` → ``EXITED``; ``start`` → ``RUNNING`` again with a new public port (backend.provision), optionally
  with zero GPUs (``runtime.gpus`` empty); ``user_stop`` (the console) → ``EXITED``; ``host_failure`` →
  ``ERROR``; ``remove``: the pod vanishes;
- ``DELETE`` → 204; the pod shows ``TERMINATED`` for ``terminate_polls`` reads [0], then 404;
- capacity: each GPU type has a GPU stock; creating or starting beyond it (or while ``no_capacity`` is armed)
  fails; a type without stock shows availability ``NONE``.

There is no spot, interruptible or bid anywhere: v2 has none.  Not modelled: billing, hanging calls.
"""

from __future__ import annotations

import time
from typing import Any

from tests.support.fakecloud.backend import HostBackend
from tests.support.fakecloud.instance_tools import RUNPODCTL, furnish, runpod_may, scoped_call
from tests.support.fakecloud.runpod_wire import (
    CAPACITY_MESSAGE,
    DATA_CENTERS,
    DEFAULT_GPU_TYPES,
    ID_ALPHABET,
    KEY_PREFIXES,
    PREFIX,
    GpuType,
    Pod,
    _create_problems,
    _Failed,
    iso,
    problem,
)
from tests.support.fakecloud.server import FakeClock, FakeCloud, Reply, Request


class FakeRunPod(FakeCloud):
    provider = "runpod"
    api_prefix = PREFIX  # ``url``: the v2 base an adapter is pointed at (GPUQ_RUNPOD_URL)
    controls = (*FakeCloud.controls, "user_stop", "host_failure", "no_capacity", "set_stock", "slow_ready",
                "fail_after_create", "zero_gpus_on_resume", "terminate_lag", "remove", "slow_create", "rest_error")

    def __init__(self, *, api_key: str = "fake-runpod-key", backend: HostBackend | None = None,
                 clock: FakeClock | None = None, port: int = 0, gpu_types: tuple[GpuType, ...] = DEFAULT_GPU_TYPES,
                 ssh_keys: tuple[str, ...] = ()) -> None:
        super().__init__(api_key=api_key, backend=backend, clock=clock, port=port)
        self.gpu_types = {g.id: GpuType(**vars(g)) for g in gpu_types}
        self.pods: dict[str, Pod] = {}
        self.ssh_keys: list[str] = list(ssh_keys)
        self._no_capacity = 0
        self._rest_errors: list[tuple[str, str | None, int]] = []
        self._create_delays: list[float] = []
        self.status_polls = 0
        self.port_polls = 1
        self.terminate_polls = 0
        self.stop_grace_s = 5.0  # SIGTERM -> SIGKILL of a stopped pod's processes [unverified: RunPod's figure]

    # -- auth -----------------------------------------------------------------------------------------

    def authorize(self, req: Request) -> bool:
        """The account key; or a pod's own key (instance_tools.py), for reading and stopping that pod only."""
        return req.headers.get("authorization", "") == f"Bearer {self.api_key}" or scoped_call(
            self, req, {p.key: p.id for p in self.pods.values() if p.key}, runpod_may(PREFIX))

    def auth_failure(self, req: Request) -> Reply:
        return problem(401, "invalid bearer token")

    def rate_limited(self, retry_after: float | None) -> Reply:
        reply = problem(429, "rate limit exceeded")
        if retry_after is not None:
            reply.headers["Retry-After"] = format(retry_after, "g")
        return reply

    def describe(self, req: Request) -> str:
        return f"{req.method} {req.path[len(PREFIX):]}"

    # -- controls -----------------------------------------------------------------------------------------

    def _pod(self, pod_id: str) -> Pod:
        pod = self.pods.get(pod_id)
        if pod is None:
            raise KeyError(f"no pod {pod_id}")
        return pod

    def exit_pod(self, pod: Pod, status: str, grace_s: float) -> None:
        if pod.status == "RUNNING":
            self.backend.preempt(pod.id, grace_s)
            pod.gpu_type.stock += pod.running_gpus
        pod.status = status

    def user_stop(self, pod_id: str) -> None:
        """A human pressed stop in the console: EXITED (v2 says no more)."""
        with self.lock:
            self.exit_pod(self._pod(pod_id), "EXITED", self.stop_grace_s)

    def host_failure(self, pod_id: str) -> None:
        """The container fails beyond repair: ERROR."""
        with self.lock:
            self.exit_pod(self._pod(pod_id), "ERROR", 0.0)

    def remove(self, pod_id: str) -> None:
        """The pod vanishes without a terminate from gpuq (RunPod deleted a long-stopped pod)."""
        with self.lock:
            self.backend.destroy(pod_id)
            self.pods.pop(pod_id, None)

    def no_capacity(self, count: int = 1) -> None:
        """The next ``count`` create/start calls fail for capacity (nothing is created)."""
        with self.lock:
            self._no_capacity += count

    def set_stock(self, gpu_type: str, gpus: int) -> None:
        with self.lock:
            self.gpu_types[gpu_type].stock = gpus

    def rest_error(self, message: str = "Something went wrong. Please try again later.", count: int = 1,
                   operation: str | None = None, status: int = 400) -> None:
        """The next ``count`` calls (those whose ``METHOD /path`` starts with ``operation``, if given, e.g.
        ``"DELETE /pods"``) answer ``status`` with a problem object whose detail is ``message``, doing nothing."""
        with self.lock:
            self._rest_errors.extend([(message, operation, status)] * count)

    def slow_ready(self, port_polls: int = 1, status_polls: int = 0) -> None:
        """Pods created or started from now on show PROVISIONING for ``status_polls`` reads, then RUNNING
        without ``ssh.direct`` for ``port_polls`` reads."""
        with self.lock:
            self.status_polls, self.port_polls = status_polls, port_polls

    def slow_create(self, seconds: float, count: int = 1) -> None:
        """The next ``count`` creates make their pod at once but answer ``seconds`` later."""
        with self.lock:
            self._create_delays.extend([seconds] * count)

    def zero_gpus_on_resume(self, pod_id: str) -> None:
        """The next start of ``pod_id`` comes back RUNNING with zero GPUs."""
        with self.lock:
            self._pod(pod_id).zero_gpus_next_start = True

    def terminate_lag(self, polls: int = 1) -> None:
        """Terminated pods stay readable as TERMINATED for ``polls`` reads (eventual consistency)."""
        with self.lock:
            self.terminate_polls = polls

    # -- routes -------------------------------------------------------------------------------------------

    def handle(self, req: Request) -> Reply:
        if not req.path.startswith(PREFIX + "/"):
            return problem(404, f"no route {req.path}")
        op = self.describe(req)
        for index, (message, wanted, status) in enumerate(self._rest_errors):
            if wanted is None or op.startswith(wanted):
                del self._rest_errors[index]
                return problem(status, message)
        parts = [p for p in req.path[len(PREFIX):].split("/") if p]
        try:
            return self._route(req, parts)
        except _Failed as failed:
            return failed.reply

    def _route(self, req: Request, parts: list[str]) -> Reply:
        method = req.method
        if parts == ["catalog", "gpus"] and method == "GET":
            return Reply(200, {"gpus": self._catalog(req.query)})
        if parts == ["account", "ssh-keys"]:
            if method == "GET":
                return Reply(200, {"keys": list(self.ssh_keys)})
            if method == "PUT":
                return self._put_keys(req)
        if parts == ["pods"]:
            if method == "GET":
                return Reply(200, {"pods": [self.poll(p) for p in self.visible()]})
            if method == "POST":
                return self._create(req)
        if len(parts) == 2 and parts[0] == "pods":
            if method == "GET":
                pod = next((p for p in self.visible() if p.id == parts[1]), None)
                return Reply(200, self.poll(pod)) if pod else problem(404, "pod not found")
            if method == "DELETE":
                self.terminate_pod(self.live_pod(parts[1]))
                return Reply(204, "")
        if len(parts) == 3 and parts[0] == "pods" and parts[2] == "action" and method == "POST":
            return self._action(self.live_pod(parts[1]), req)
        return problem(404, f"no route {method} {req.path}")

    def _catalog(self, query: dict[str, list[str]]) -> list[dict[str, Any]]:
        known = {"include", "product", "count", "cloud", "countryCodes", "cudaVersions", "minCudaVersion"}
        unknown = sorted(set(query) - known)
        if unknown:
            raise _Failed(problem(400, f"unknown query parameter {unknown[0]}"))
        include = query.get("include", [""])[0]
        if include and (include != "AVAILABILITY" or query.get("product", [""])[0] != "POD"):
            raise _Failed(problem(400, "include=AVAILABILITY needs product (the fake models POD only)"))
        if not include and ({"product", "count", "cloud"} & set(query)):
            raise _Failed(problem(400, "product, count and cloud are valid only with include=AVAILABILITY"))
        count = int(query.get("count", ["1"])[0])
        cloud = query.get("cloud", ["SECURE"])[0]
        return [self._gpu_view(g, count, cloud if include else None) for g in self.gpu_types.values()]

    def _gpu_view(self, gpu: GpuType, count: int, cloud: str | None) -> dict[str, Any]:
        view: dict[str, Any] = {
            "id": gpu.id, "name": gpu.display_name, "pool": None, "manufacturer": "NVIDIA", "memory": gpu.memory_gb,
            "secure": True, "community": True, "price": {"secure": gpu.secure_price, "community": gpu.community_price},
            "maxCount": {"secure": gpu.max_count, "community": gpu.max_count}}
        if cloud is not None:
            level = "HIGH" if 0 < count <= min(gpu.stock, gpu.max_count) else "NONE"
            view["availability"] = level
            if level != "NONE":
                view["dataCenters"] = [{"id": dc, "name": dc, "availability": level} for dc in DATA_CENTERS]
        return view

    def _put_keys(self, req: Request) -> Reply:
        body = req.json()
        keys = body.get("keys") if isinstance(body, dict) and set(body) == {"keys"} else None
        if not isinstance(keys, list) or not all(isinstance(k, str) and k.startswith(KEY_PREFIXES)
                                                 and len(k.split()) >= 2 for k in keys):
            return problem(422, "invalid body", ["$.keys: each entry must be an authorized_keys line"])
        self.ssh_keys = list(keys)
        return Reply(200, {"keys": list(self.ssh_keys)})

    # -- reads ------------------------------------------------------------------------------------------------

    def take_create_delay(self) -> float:
        return self._create_delays.pop(0) if self._create_delays else 0.0

    def visible(self) -> list[Pod]:
        """Pods a read can see; each read counts as one poll for readiness and deletion lags."""
        out = []
        for pod in list(self.pods.values()):
            if pod.hidden_until > time.monotonic():
                continue
            if pod.status == "TERMINATED":
                if pod.terminate_polls <= 0:
                    del self.pods[pod.id]
                    continue
                pod.terminate_polls -= 1
            out.append(pod)
        return out

    def poll(self, pod: Pod) -> dict[str, Any]:
        """``pod`` as one read shows it; the read counts as a poll."""
        view = self.pod_view(pod)
        if pod.status == "RUNNING":
            if pod.status_polls > 0:
                pod.status_polls -= 1
            elif pod.port_polls > 0:
                pod.port_polls -= 1
        return view

    def machine_ready(self, pod: Pod) -> bool:
        """The backend's optional readiness hook (a backend without one is always ready)."""
        ready = getattr(self.backend, "is_ready", None)
        return ready is None or bool(ready(pod.id))

    def pod_view(self, pod: Pod) -> dict[str, Any]:
        """A pod as v2's ``Pod`` schema shows it."""
        running = pod.status == "RUNNING"
        shown = "PROVISIONING" if running and pod.status_polls > 0 else pod.status
        ready = running and pod.status_polls <= 0 and pod.port_polls <= 0 and self.machine_ready(pod)
        direct = ({"host": pod.ip, "port": pod.port, "username": "root", "command": f"ssh root@{pod.ip} -p {pod.port}"}
                  if ready and "22/tcp" in pod.ports and pod.start_ssh else None)
        proxy_user = f"{pod.id}-64411eb2"
        runtime = None
        if shown == "RUNNING":
            runtime = {"uptime": int(self.clock.now() - pod.started_at),
                       "gpus": [{"id": f"GPU-{pod.id}-{i}", "gpuUtilPercent": 0, "memoryUtilPercent": 0}
                                for i in range(pod.running_gpus)],
                       "ports": [{"private": 22, "public": pod.port, "type": "tcp", "ip": pod.ip}] if ready else []}
        actions = {"RUNNING": ["stop", "restart", "terminate"], "EXITED": ["start", "terminate"],
                   "ERROR": ["terminate"], "PROVISIONING": ["terminate"], "TERMINATED": []}[shown]
        price = pod.gpu_type.secure_price if pod.cloud == "SECURE" else pod.gpu_type.community_price
        return {
            "id": pod.id, "name": pod.name, "status": shown, "actions": actions, "image": pod.image, "args": "",
            "disk": pod.disk_gb, "mounts": {"persistent": {"size": pod.volume_gb, "path": "/workspace"}},
            "ports": list(pod.ports), "env": dict(pod.env), "registry": None,
            "gpu": {"id": pod.gpu_type.id, "count": pod.gpu_count}, "cloud": pod.cloud,
            "dataCenterId": pod.data_center, "cudaVersion": "12.8",
            "ssh": {"proxy": {"host": "ssh.runpod.io", "port": 22, "username": proxy_user,
                              "command": f"ssh {proxy_user}@ssh.runpod.io"}, "direct": direct},
            "template": None, "cost": round(price * pod.gpu_count, 3) if running else 0.0, "locked": False,
            "globalNetworking": {"enabled": False}, "runtime": runtime, "createdAt": iso(pod.created_at),
            "startedAt": iso(pod.started_at) if running else None,
        }

    # -- writes -----------------------------------------------------------------------------------------------

    def _take_capacity(self, gpu: GpuType, count: int) -> None:
        if self._no_capacity > 0:
            self._no_capacity -= 1
            raise _Failed(problem(400, CAPACITY_MESSAGE))
        if count > gpu.stock or count > gpu.max_count:
            raise _Failed(problem(400, CAPACITY_MESSAGE))
        gpu.stock -= count

    def _create(self, req: Request) -> Reply:
        body = req.json()
        problems = _create_problems(body)
        if problems:
            return problem(422, "the body does not match CreatePodRequest", problems)
        gpu = self.gpu_types.get(body["gpu"]["id"])
        if gpu is None:
            return problem(404, f"unknown GPU type {body['gpu']['id']}")  # [unverified] wording
        persistent = (body.get("mounts") or {}).get("persistent") or {}
        pod = self.make_pod(name=body["name"], gpu=gpu, count=int(body["gpu"].get("count", 1)), image=body["image"],
                            cloud=body.get("cloud", "SECURE"), env=dict(body.get("env") or {}),
                            ports=list(body.get("ports") or []), volume_gb=int(persistent.get("size", 0)),
                            disk_gb=int(body.get("disk", 50)), start_ssh=bool(body.get("startSsh")),
                            data_center=(body.get("dataCenterIds") or [DATA_CENTERS[0]])[0])
        return Reply(201, self.pod_view(pod), delay_s=self.take_create_delay())

    def make_pod(self, *, name: str, gpu: GpuType, count: int, image: str, cloud: str, env: dict[str, str],
                 ports: list[str], volume_gb: int, disk_gb: int, start_ssh: bool, data_center: str) -> Pod:
        """Create a pod: capacity taken, machine provisioned, then any armed ``fail_after_create``."""
        self._take_capacity(gpu, count)
        pod_id = self.new_id(14, ID_ALPHABET)
        pod = Pod(id=pod_id, name=name, gpu_type=gpu, gpu_count=count, image=image, cloud=cloud, env=env, ports=ports,
                  volume_gb=volume_gb, disk_gb=disk_gb, start_ssh=start_ssh, data_center=data_center,
                  created_at=self.clock.now(), key="rpa_pod_" + self.new_id(24, ID_ALPHABET))
        furnish(self, pod_id, {"RUNPOD_POD_ID": pod_id, "RUNPOD_API_KEY": pod.key}, "runpodctl", RUNPODCTL, PREFIX)
        self._start(pod, count)
        self.pods[pod_id] = pod
        failure = self.failure_after_create()
        if failure is not None:
            status, retry_after, pod.hidden_until = failure
            headers = {"Content-Type": "application/problem+json"}
            if retry_after is not None:
                headers["Retry-After"] = format(retry_after, "g")
            raise _Failed(Reply(status, {"title": "Error", "status": status, "detail": "upstream failure after create"},
                                headers))
        return pod

    def _start(self, pod: Pod, gpus: int) -> None:
        pod.ip, pod.port = self.backend.provision(pod.id, gpus)
        pod.running_gpus = gpus
        pod.status = "RUNNING"
        pod.started_at = self.clock.now()
        pod.status_polls, pod.port_polls = self.status_polls, self.port_polls

    def live_pod(self, pod_id: str) -> Pod:
        pod = self.pods.get(pod_id)
        if pod is None or pod.status == "TERMINATED":
            raise _Failed(problem(404, "pod not found"))
        return pod

    def _action(self, pod: Pod, req: Request) -> Reply:
        body = req.json()
        action = body.get("action") if isinstance(body, dict) and set(body) == {"action"} else None
        if action not in ("start", "stop", "restart", "terminate"):
            return problem(422, "invalid body", ["$.action: must be one of start, stop, restart, terminate"])
        if action == "terminate":
            self.terminate_pod(pod)
            return Reply(204, "")
        if action == "stop":
            if pod.status != "RUNNING":
                return problem(409, f"cannot stop a pod that is {pod.status}")
            self.exit_pod(pod, "EXITED", self.stop_grace_s)
        elif action == "start":
            if pod.status != "EXITED":
                return problem(409, f"cannot start a pod that is {pod.status}")
            self.start_pod(pod)
        return Reply(200, self.pod_view(pod))

    def start_pod(self, pod: Pod) -> None:
        """A stopped pod back on its host with its GPUs (none, when ``zero_gpus_on_resume`` was armed)."""
        gpus = 0 if pod.zero_gpus_next_start else pod.gpu_count
        self._take_capacity(pod.gpu_type, gpus)
        pod.zero_gpus_next_start = False
        self._start(pod, gpus)

    def terminate_pod(self, pod: Pod) -> None:
        if pod.status == "RUNNING":
            pod.gpu_type.stock += pod.running_gpus
        self.backend.destroy(pod.id)
        pod.status = "TERMINATED"
        pod.terminate_polls = self.terminate_polls
        if pod.terminate_polls <= 0:
            del self.pods[pod.id]

    def state(self) -> Any:
        return {"pods": {pid: self.pod_view(p) for pid, p in self.pods.items()},
                "stock": {g.id: g.stock for g in self.gpu_types.values()}, "sshKeys": list(self.ssh_keys)}
