"""A fake RunPod (docs/providers.md) for tests and demos: its REST API under ``/v1`` (runpod_rest.py; ``url``)
and its GraphQL API at ``/graphql`` (``graphql_url``), over the same pods.

GraphQL: ``POST /graphql`` with ``{"query": "<document>"}`` and literal values; auth by ``Authorization: Bearer``
or the older ``?api_key=`` query parameter (the real API accepts both; gpuq sends only the header); a
missing or wrong key gets HTTP 401.  Client errors come back as **HTTP 200 with an ``errors`` array**.
Every input field and every selected field is validated against the subset of the schema that
the adapter uses, so a typo in the adapter fails here the way it would against RunPod.

Behaviour (defaults in brackets; controls change them):

- create (``podFindAndDeployOnDemand`` / ``podRentInterruptable``) returns the id at once (``slow_create``:
  the pod exists at once, its answer comes late); the pod then
  shows ``CREATED`` for ``status_polls`` reads [0], ``RUNNING`` with ``runtime: null`` for ``port_polls``
  reads [1], then ``RUNNING`` with the backend's endpoint as a public tcp mapping of port 22 (once the
  backend's optional ``is_ready(pod_id)`` says its machine is up too: e.g. NetnsBackend while booting);
- ``podStop`` → EXITED, ``Exited by user: <date>``; ``podResume`` / ``podBidResume`` → RUNNING again
  with a new public port (backend.provision), optionally with zero GPUs;
- ``podTerminate`` → ``null``; the pod shows TERMINATED for ``terminate_polls`` reads [0], then
  ``pod(...)`` returns null and ``myself.pods`` omits it;
- capacity: each GPU type has a GPU stock; creating or resuming beyond it (or while ``no_capacity``
  is armed) fails with ``There are no longer any instances available with the requested
  specifications``; a type without stock shows null ``lowestPrice`` prices [unverified].

The REST routes (create, list, get, stop, start, delete) act on the same pods with the same rules; see
runpod_rest.py.  Not modelled yet: billing, hanging calls, host-key changes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.support.fakecloud import graphql as gql
from tests.support.fakecloud import runpod_rest
from tests.support.fakecloud.backend import HostBackend
from tests.support.fakecloud.server import FakeClock, FakeCloud, Reply, Request

CAPACITY_MESSAGE = ("There are no longer any instances available with the requested specifications. "
                    "Please refresh and try again.")
ID_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"

_ENV = gql.InputType("EnvironmentVariableInput", {"key": "String", "value": "String"}, frozenset({"key", "value"}))
_COMMON: dict[str, Any] = {
    "name": "String", "imageName": "String", "cloudType": "enum:CloudTypeEnum:ALL|COMMUNITY|SECURE",
    "gpuTypeId": "String", "gpuCount": "Int", "startSsh": "Boolean", "supportPublicIp": "Boolean",
    "ports": "String", "volumeInGb": "Int", "containerDiskInGb": "Int", "volumeMountPath": "String",
    "minVcpuCount": "Int", "minMemoryInGb": "Int", "dataCenterId": "String", "networkVolumeId": "String",
    "allowedCudaVersions": ["String"], "dockerArgs": "String", "env": [_ENV], "templateId": "String",
    "countryCode": "String",
}
# Required (`!`) inputs as in RunPod's API types (tests/fixtures/providers/README.md), except that the fake also
# requires gpuCount, gpuTypeId and a spot pod's bidPerGpu, which the API leaves optional: gpuq always sends them.
DEPLOY_INPUT = gql.InputType("PodFindAndDeployOnDemandInput", _COMMON, frozenset({"gpuCount", "gpuTypeId"}))
RENT_INPUT = gql.InputType("PodRentInterruptableInput",
                           {**_COMMON, "bidPerGpu": "Float", "terminateAfter": "String", "stopAfter": "String"},
                           frozenset({"bidPerGpu", "gpuCount", "gpuTypeId"}))
POD_ID_INPUT = gql.InputType("PodStopInput", {"podId": "String"}, frozenset({"podId"}))
TERMINATE_INPUT = gql.InputType("PodTerminateInput", {"podId": "String"}, frozenset({"podId"}))
RESUME_INPUT = gql.InputType("PodResumeInput", {"podId": "String", "gpuCount": "Int"}, frozenset({"podId"}))
BID_RESUME_INPUT = gql.InputType("PodBidResumeInput", {"podId": "String", "bidPerGpu": "Float", "gpuCount": "Int"},
                                 frozenset({"podId", "bidPerGpu", "gpuCount"}))
POD_FILTER = gql.InputType("PodFilter", {"podId": "String"}, frozenset({"podId"}))
GPU_FILTER = gql.InputType("GpuTypeFilter", {"id": "String"})
LOWEST_PRICE_INPUT = gql.InputType("GpuLowestPriceInput", {"gpuCount": "Int"}, frozenset({"gpuCount"}))
USER_SETTINGS_INPUT = gql.InputType("UpdateUserSettingsInput", {"pubKey": "String"}, frozenset({"pubKey"}))


@dataclass
class GpuType:
    id: str
    display_name: str
    memory_gb: int
    secure_price: float
    community_price: float
    min_bid: float
    stock: int = 16
    max_count: int = 8


DEFAULT_GPU_TYPES = (
    GpuType("NVIDIA GeForce RTX 4090", "RTX 4090", 24, 0.69, 0.44, 0.29),
    GpuType("NVIDIA RTX A6000", "RTX A6000", 48, 0.79, 0.49, 0.25),
    GpuType("NVIDIA H100 80GB HBM3", "H100 SXM", 80, 2.99, 2.69, 1.75),
)


@dataclass
class Pod:
    id: str
    name: str
    gpu_type: GpuType
    gpu_count: int
    image: str
    spot: bool
    bid: float | None
    env: list[str]
    ports: str
    volume_gb: int
    disk_gb: int
    mount: str
    status: str = "RUNNING"
    last_change: str = ""
    ip: str = ""
    port: int = 0
    started_at: float = 0.0
    status_polls: int = 0
    port_polls: int = 0
    terminate_polls: int = 0
    zero_gpus_next_resume: bool = False
    machine_id: str = ""
    host_id: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def js_date(epoch: float) -> str:
    """A date as RunPod writes it in ``lastStatusChange`` (JavaScript ``Date.toString()``), in UTC."""
    return time.strftime("%a %b %d %Y %H:%M:%S GMT+0000 (Coordinated Universal Time)", time.gmtime(epoch))


class FakeRunPod(FakeCloud):
    provider = "runpod"
    api_prefix = runpod_rest.PREFIX  # ``url``: the REST base an adapter is pointed at (GPUQ_RUNPOD_URL)
    graphql_prefix = "/graphql"
    controls = (*FakeCloud.controls, "preempt", "user_stop", "host_failure", "no_capacity", "set_stock",
                "graphql_error", "slow_ready", "fail_after_create", "zero_gpus_on_resume", "terminate_lag",
                "remove", "slow_create", "rest_error")

    def __init__(self, *, api_key: str = "fake-runpod-key", backend: HostBackend | None = None,
                 clock: FakeClock | None = None, port: int = 0, gpu_types: tuple[GpuType, ...] = DEFAULT_GPU_TYPES,
                 pub_key: str = "") -> None:
        super().__init__(api_key=api_key, backend=backend, clock=clock, port=port)
        self.gpu_types = {g.id: GpuType(**vars(g)) for g in gpu_types}
        self.pods: dict[str, Pod] = {}
        self.pub_key = pub_key
        self._no_capacity = 0
        self._errors: list[tuple[str, str | None]] = []
        self._rest_errors: list[tuple[str, str | None, int]] = []
        self._fail_after_create: list[tuple[int, float | None]] = []
        self._create_delays: list[float] = []
        self.status_polls = 0
        self.port_polls = 1
        self.terminate_polls = 0

    # -- auth -----------------------------------------------------------------------------------------

    @property
    def graphql_url(self) -> str:
        return self.root_url + self.graphql_prefix

    def authorize(self, req: Request) -> bool:
        auth = req.headers.get("authorization", "")
        if auth or req.path.startswith(runpod_rest.PREFIX):  # REST: Bearer only
            return auth == f"Bearer {self.api_key}"
        return req.query.get("api_key") == [self.api_key]

    def auth_failure(self, req: Request) -> Reply:
        # [obs] the body of RunPod's 401 is not documented; the status is what matters.
        if req.path.startswith(runpod_rest.PREFIX):
            return Reply(401, {"error": "Unauthorized", "status": 401})
        return Reply(401, {"errors": [{"message": "Unauthorized"}]})

    def describe(self, req: Request) -> str:
        if req.path.startswith(runpod_rest.PREFIX):
            return f"{req.method} {req.path[len(runpod_rest.PREFIX):]}"
        body = req.json()
        document = body.get("query", "") if isinstance(body, dict) else ""
        return ",".join(f.name for f in gql.parse(document).fields)

    # -- controls -----------------------------------------------------------------------------------------

    def _pod(self, pod_id: str) -> Pod:
        pod = self.pods.get(pod_id)
        if pod is None:
            raise KeyError(f"no pod {pod_id}")
        return pod

    def exit_pod(self, pod: Pod, label: str, grace_s: float) -> None:
        if pod.status == "RUNNING":
            self.backend.preempt(pod.id, grace_s)
            pod.gpu_type.stock += pod.gpu_count
        pod.status = "EXITED"
        pod.last_change = f"{label}: {js_date(self.clock.now())}"

    def preempt(self, pod_id: str, grace_s: float = 5.0) -> None:
        """Outbid: the backend gets SIGTERM-then-SIGKILL (``grace_s``), the pod turns EXITED with
        ``lastStatusChange: "Outbid: <date>"`` and ``runtime: null``."""
        with self.lock:
            self.exit_pod(self._pod(pod_id), "Outbid", grace_s)

    def user_stop(self, pod_id: str) -> None:
        """A human pressed stop in the console: EXITED, ``Exited by user: <date>``."""
        with self.lock:
            self.exit_pod(self._pod(pod_id), "Exited by user", 5.0)

    def host_failure(self, pod_id: str) -> None:
        """The platform stopped the pod (host problem, low balance): EXITED, ``Exited by Runpod: <date>``."""
        with self.lock:
            self.exit_pod(self._pod(pod_id), "Exited by Runpod", 0.0)

    def remove(self, pod_id: str) -> None:
        """The pod vanishes without a terminate from gpuq (RunPod deleted a long-stopped pod)."""
        with self.lock:
            self.backend.destroy(pod_id)
            self.pods.pop(pod_id, None)

    def no_capacity(self, count: int = 1) -> None:
        """The next ``count`` create/resume calls fail with the capacity message (nothing is created)."""
        with self.lock:
            self._no_capacity += count

    def set_stock(self, gpu_type: str, gpus: int) -> None:
        with self.lock:
            self.gpu_types[gpu_type].stock = gpus

    def graphql_error(self, message: str = "Something went wrong. Please try again later.", count: int = 1,
                      operation: str | None = None) -> None:
        """The next ``count`` calls (of ``operation`` only, if given) get HTTP 200 with ``errors``."""
        with self.lock:
            self._errors.extend([(message, operation)] * count)

    def rest_error(self, message: str = "Something went wrong. Please try again later.", count: int = 1,
                   operation: str | None = None, status: int = 400) -> None:
        """The next ``count`` REST calls (those whose ``METHOD /path`` starts with ``operation``, if given,
        e.g. ``"DELETE /pods"``) answer ``status`` with ``{"error": message}`` and do nothing."""
        with self.lock:
            self._rest_errors.extend([(message, operation, status)] * count)

    def slow_ready(self, port_polls: int = 1, status_polls: int = 0) -> None:
        """Pods created or resumed from now on show CREATED for ``status_polls`` reads, then RUNNING
        without a port mapping (``runtime: null``) for ``port_polls`` reads."""
        with self.lock:
            self.status_polls, self.port_polls = status_polls, port_polls

    def fail_after_create(self, count: int = 1, status: int = 429, retry_after: float | None = 1.0) -> None:
        """The next ``count`` creates succeed server-side but answer ``status`` (a leaked pod unless
        the client adopts it by name)."""
        with self.lock:
            self._fail_after_create.extend([(status, retry_after)] * count)

    def slow_create(self, seconds: float, count: int = 1) -> None:
        """The next ``count`` creates make their pod at once but answer ``seconds`` later (a client killed
        meanwhile never learns the pod's id; only its name finds it)."""
        with self.lock:
            self._create_delays.extend([seconds] * count)

    def zero_gpus_on_resume(self, pod_id: str) -> None:
        """The next resume of ``pod_id`` comes back RUNNING with zero GPUs."""
        with self.lock:
            self._pod(pod_id).zero_gpus_next_resume = True

    def terminate_lag(self, polls: int = 1) -> None:
        """Terminated pods stay listed as TERMINATED for ``polls`` reads (eventual consistency)."""
        with self.lock:
            self.terminate_polls = polls

    # -- GraphQL ------------------------------------------------------------------------------------------

    def handle(self, req: Request) -> Reply:
        if req.path.startswith(runpod_rest.PREFIX + "/"):
            op = self.describe(req)
            for index, (message, wanted, status) in enumerate(self._rest_errors):
                if wanted is None or op.startswith(wanted):
                    del self._rest_errors[index]
                    return Reply(status, {"error": message, "status": status})
            try:
                return runpod_rest.handle(self, req)
            except _AfterCreate as exc:
                headers = {} if exc.retry_after is None else {"Retry-After": format(exc.retry_after, "g")}
                return Reply(exc.status, {"error": "upstream failure after create", "status": exc.status}, headers)
        if req.path != self.graphql_prefix:
            return Reply(404, {"errors": [{"message": f"no route {req.path}"}]})
        if req.method != "POST":
            return Reply(405, "Method Not Allowed")
        try:
            body = req.json()
        except ValueError:
            return Reply(400, {"errors": [{"message": "POST body sent invalid JSON."}]})
        if not isinstance(body, dict) or not isinstance(body.get("query"), str):
            return Reply(400, {"errors": [{"message": "Must provide query string."}]})
        if body.get("variables"):
            # Whether RunPod honours variables is unverified (docs/providers.md); gpuq never sends them.
            return Reply(200, {"errors": [{"message": "The fake does not accept variables."}], "data": None})
        try:
            operation = gql.parse(body["query"])
            self._injected_error(operation)
            data = {f.key: self._root(operation.kind, f) for f in operation.fields}
            creates = {"podFindAndDeployOnDemand", "podRentInterruptable"} & {f.name for f in operation.fields}
            if creates and self._create_delays:
                return Reply(200, {"data": data}, delay_s=self.take_create_delay())
        except gql.GraphQLError as exc:
            error: dict[str, Any] = {"message": exc.message}
            if exc.path:
                error["path"] = exc.path
            return Reply(200, {"errors": [error], "data": None})
        except _AfterCreate as exc:
            headers = {} if exc.retry_after is None else {"Retry-After": format(exc.retry_after, "g")}
            return Reply(exc.status, {"errors": [{"message": "upstream failure after create"}]}, headers)
        return Reply(200, {"data": data})

    def _injected_error(self, operation: gql.Operation) -> None:
        names = {f.name for f in operation.fields}
        for index, (message, op) in enumerate(self._errors):
            if op is None or op in names:
                del self._errors[index]
                raise gql.GraphQLError(message)

    def _root(self, kind: str, fld: gql.Field) -> Any:
        resolvers: dict[str, Callable[[gql.Field], Any]] = (
            {"myself": self._q_myself, "pod": self._q_pod, "gpuTypes": self._q_gpu_types}
            if kind == "query" else
            {"podFindAndDeployOnDemand": self._m_deploy, "podRentInterruptable": self._m_rent,
             "podStop": self._m_stop, "podResume": self._m_resume, "podBidResume": self._m_bid_resume,
             "podTerminate": self._m_terminate, "updateUserSettings": self._m_user_settings})
        resolver = resolvers.get(fld.name)
        if resolver is None:
            type_name = "Query" if kind == "query" else "Mutation"
            raise gql.GraphQLError(f'Cannot query field "{fld.name}" on type "{type_name}".', [fld.key])
        result = resolver(fld)
        if fld.name == "podTerminate":
            if fld.selection is not None:
                raise gql.GraphQLError('Field "podTerminate" must not have a selection since type "Void" has no '
                                       "subfields.", [fld.key])
            return result
        return gql.project(result, gql.Field(fld.name, fld.alias, {}, fld.selection), [fld.key])

    # -- queries ------------------------------------------------------------------------------------------

    def take_create_delay(self) -> float:
        """How late the current create answers (``slow_create``), 0 when not armed."""
        return self._create_delays.pop(0) if self._create_delays else 0.0

    def visible(self) -> list[Pod]:
        """Pods a read can see; each read counts as one poll for readiness and deletion lags."""
        out = []
        for pod in list(self.pods.values()):
            if pod.status == "TERMINATED":
                if pod.terminate_polls <= 0:
                    del self.pods[pod.id]
                    continue
                pod.terminate_polls -= 1
            out.append(pod)
        return out

    def poll(self, pod: Pod, view_of: Callable[[FakeRunPod, Pod], dict[str, Any]] | None = None) -> dict[str, Any]:
        """``pod`` as one read shows it (``view_of``: REST's view; default GraphQL's); the read counts as a poll."""
        view = view_of(self, pod) if view_of is not None else self._pod_view(pod)
        if pod.status == "RUNNING":
            if pod.status_polls > 0:
                pod.status_polls -= 1
            elif pod.port_polls > 0:
                pod.port_polls -= 1
        return view

    def _q_myself(self, fld: gql.Field) -> Any:
        if fld.args:
            raise gql.GraphQLError(f'Unknown argument "{next(iter(fld.args))}" on field "myself".')

        def pods(sub: gql.Field) -> list[dict[str, Any]]:
            if sub.args:
                raise gql.GraphQLError(f'Unknown argument "{next(iter(sub.args))}" on field "pods".')
            return [self.poll(p) for p in self.visible()]

        return {"__typename": "User", "id": "user_fake", "pubKey": self.pub_key, "pods": pods}

    def _q_pod(self, fld: gql.Field) -> Any:
        pod_id = gql.input_arg(fld, POD_FILTER)["podId"]
        pod = next((p for p in self.visible() if p.id == pod_id), None)
        return self.poll(pod) if pod is not None else None

    def _q_gpu_types(self, fld: gql.Field) -> Any:
        wanted = gql.input_arg(fld, GPU_FILTER, required=False).get("id")
        return [self._gpu_view(g) for g in self.gpu_types.values() if wanted is None or g.id == wanted]

    def _gpu_view(self, gpu: GpuType) -> dict[str, Any]:
        def lowest(sub: gql.Field) -> dict[str, Any]:
            count = gql.input_arg(sub, LOWEST_PRICE_INPUT)["gpuCount"]
            available = 0 < count <= min(gpu.stock, gpu.max_count)
            return {"__typename": "LowestPrice",
                    "minimumBidPrice": gpu.min_bid if available else None,
                    "uninterruptablePrice": gpu.community_price if available else None,
                    "stockStatus": "High" if available else None}

        return {"__typename": "GpuType", "id": gpu.id, "displayName": gpu.display_name, "memoryInGb": gpu.memory_gb,
                "maxGpuCount": gpu.max_count, "securePrice": gpu.secure_price, "communityPrice": gpu.community_price,
                "secureSpotPrice": gpu.min_bid, "communitySpotPrice": gpu.min_bid,
                "oneWeekPrice": gpu.secure_price * 0.95, "oneMonthPrice": gpu.secure_price * 0.9,
                "lowestPrice": lowest}

    def _pod_view(self, pod: Pod) -> dict[str, Any]:
        running = pod.status == "RUNNING"
        shown_status = "CREATED" if running and pod.status_polls > 0 else pod.status
        runtime = None
        if running and pod.status_polls <= 0 and pod.port_polls <= 0 and self.machine_ready(pod):
            uptime = int(self.clock.now() - pod.started_at)
            runtime = {
                "__typename": "PodRuntime", "uptimeInSeconds": uptime,
                "ports": [
                    {"__typename": "PodRuntimePorts", "ip": pod.ip, "isIpPublic": True, "privatePort": 22,
                     "publicPort": pod.port, "type": "tcp"},
                    {"__typename": "PodRuntimePorts", "ip": "100.65.0.2", "isIpPublic": False, "privatePort": 22,
                     "publicPort": 22, "type": "tcp"},
                ],
                "gpus": [{"__typename": "PodRuntimeGpus", "id": f"GPU-{pod.id}-{i}", "gpuUtilPercent": 0,
                          "memoryUtilPercent": 0} for i in range(pod.gpu_count)],
                "container": {"__typename": "PodRuntimeContainer", "cpuPercent": 1, "memoryPercent": 2},
            }
        price = pod.bid if pod.spot and pod.bid is not None else pod.gpu_type.secure_price
        return {
            "__typename": "Pod", "id": pod.id, "name": pod.name, "desiredStatus": shown_status,
            "lastStatusChange": pod.last_change, "podType": "INTERRUPTABLE" if pod.spot else "RESERVED",
            "imageName": pod.image, "gpuCount": pod.gpu_count, "vcpuCount": 8 * max(pod.gpu_count, 1),
            "memoryInGb": 62 * max(pod.gpu_count, 1), "containerDiskInGb": pod.disk_gb, "volumeInGb": pod.volume_gb,
            "volumeMountPath": pod.mount, "costPerHr": round(price * max(pod.gpu_count, 1), 3),
            "uptimeSeconds": int(self.clock.now() - pod.started_at) if running else 0,
            "machineId": pod.machine_id, "env": list(pod.env), "ports": pod.ports, "port": None,
            "dockerArgs": "", "dockerId": None,
            "machine": {"__typename": "PodMachineInfo", "gpuDisplayName": pod.gpu_type.display_name,
                        "podHostId": pod.host_id},
            "runtime": runtime,
        }

    def machine_ready(self, pod: Pod) -> bool:
        """The backend's optional readiness hook (a backend without one is always ready)."""
        ready: Callable[[str], bool] | None = getattr(self.backend, "is_ready", None)
        return ready is None or ready(pod.id)

    # -- mutations ----------------------------------------------------------------------------------------

    def _take_capacity(self, gpu: GpuType, count: int) -> None:
        if self._no_capacity > 0:
            self._no_capacity -= 1
            raise gql.GraphQLError(CAPACITY_MESSAGE)
        if count > gpu.stock or count > gpu.max_count:
            raise gql.GraphQLError(CAPACITY_MESSAGE)
        gpu.stock -= count

    def _create(self, fld: gql.Field, spot: bool) -> dict[str, Any]:
        args = gql.input_arg(fld, RENT_INPUT if spot else DEPLOY_INPUT)
        gpu = self.gpu_types.get(args["gpuTypeId"])
        if gpu is None:
            # [unverified] RunPod's wording for an unknown GPU type.
            raise gql.GraphQLError(f"Invalid GPU type: {args['gpuTypeId']}")
        if spot and float(args["bidPerGpu"]) < gpu.min_bid:
            raise gql.GraphQLError(f"Your bid price is below the minimum bid of ${gpu.min_bid}/hr.")  # [unverified]
        env = [f"{e['key']}={e['value']}" for e in args.get("env") or []]
        pod = self.make_pod(name=args.get("name") or "", gpu=gpu, count=int(args["gpuCount"]),
                            image=args.get("imageName") or "runpod/base", spot=spot, bid=args.get("bidPerGpu"),
                            env=env, ports=args.get("ports") or "", volume_gb=args.get("volumeInGb") or 0,
                            disk_gb=args.get("containerDiskInGb") or 10,
                            mount=args.get("volumeMountPath") or "/runpod-volume")
        return self._pod_view(pod)

    def make_pod(self, *, name: str, gpu: GpuType, count: int, image: str, spot: bool, bid: float | None,
                 env: list[str], ports: str, volume_gb: int, disk_gb: int, mount: str) -> Pod:
        """Create a pod (either API): capacity taken, machine provisioned, then any armed ``fail_after_create``."""
        if count < 1:
            raise gql.GraphQLError("gpuCount must be at least 1")
        self._take_capacity(gpu, count)
        pod_id = self.new_id(14, ID_ALPHABET)
        pod = Pod(
            id=pod_id, name=name or pod_id, gpu_type=gpu, gpu_count=count, image=image, spot=spot, bid=bid,
            env=env, ports=ports, volume_gb=volume_gb, disk_gb=disk_gb, mount=mount,
            machine_id=self.new_id(12, ID_ALPHABET), host_id=f"{pod_id}-64410f2c",
            last_change=f"Rented by User: {js_date(self.clock.now())}",
        )
        self._start(pod, count)
        self.pods[pod_id] = pod
        if self._fail_after_create:
            status, retry_after = self._fail_after_create.pop(0)
            raise _AfterCreate(status, retry_after)
        return pod

    def _start(self, pod: Pod, gpus: int) -> None:
        pod.ip, pod.port = self.backend.provision(pod.id, gpus)
        pod.status = "RUNNING"
        pod.started_at = self.clock.now()
        pod.status_polls, pod.port_polls = self.status_polls, self.port_polls

    def _m_deploy(self, fld: gql.Field) -> Any:
        return self._create(fld, spot=False)

    def _m_rent(self, fld: gql.Field) -> Any:
        return self._create(fld, spot=True)

    def live_pod(self, pod_id: str) -> Pod:
        pod = self.pods.get(pod_id)
        if pod is None or pod.status == "TERMINATED":
            raise gql.GraphQLError("Pod not found.")  # [unverified] wording
        return pod

    def _m_stop(self, fld: gql.Field) -> Any:
        pod = self.live_pod(gql.input_arg(fld, POD_ID_INPUT)["podId"])
        self.exit_pod(pod, "Exited by user", 5.0)
        return {"__typename": "Pod", "id": pod.id, "desiredStatus": pod.status}

    def resume_pod(self, pod: Pod, gpu_count: int, *, spot: bool, bid: float | None) -> dict[str, Any]:
        if pod.status == "RUNNING":
            raise gql.GraphQLError("Pod is already running.")  # [unverified] wording
        if spot and bid is not None and bid < pod.gpu_type.min_bid:
            raise gql.GraphQLError(f"Your bid price is below the minimum bid of ${pod.gpu_type.min_bid}/hr.")
        self._take_capacity(pod.gpu_type, gpu_count)
        shown = 0 if pod.zero_gpus_next_resume else gpu_count
        pod.zero_gpus_next_resume = False
        pod.gpu_count = shown
        pod.spot, pod.bid = spot, bid if spot else pod.bid
        self._start(pod, shown)
        pod.last_change = f"Resumed by user: {js_date(self.clock.now())}"
        return self._pod_view(pod)

    def _m_resume(self, fld: gql.Field) -> Any:
        args = gql.input_arg(fld, RESUME_INPUT)
        pod = self.live_pod(args["podId"])
        return self.resume_pod(pod, int(args.get("gpuCount") or pod.gpu_count or 1), spot=False, bid=None)

    def _m_bid_resume(self, fld: gql.Field) -> Any:
        args = gql.input_arg(fld, BID_RESUME_INPUT)
        pod = self.live_pod(args["podId"])
        return self.resume_pod(pod, int(args.get("gpuCount") or pod.gpu_count or 1), spot=True,
                            bid=float(args["bidPerGpu"]))

    def _m_terminate(self, fld: gql.Field) -> Any:
        self.terminate_pod(self.live_pod(gql.input_arg(fld, TERMINATE_INPUT)["podId"]))

    def terminate_pod(self, pod: Pod) -> None:
        if pod.status == "RUNNING":
            pod.gpu_type.stock += pod.gpu_count
        self.backend.destroy(pod.id)
        pod.status = "TERMINATED"
        pod.terminate_polls = self.terminate_polls
        if pod.terminate_polls <= 0:
            del self.pods[pod.id]

    def _m_user_settings(self, fld: gql.Field) -> Any:
        args = gql.input_arg(fld, USER_SETTINGS_INPUT)
        if "pubKey" in args:
            self.pub_key = args["pubKey"] or ""
        return {"__typename": "UserSettings", "id": "user_fake", "pubKey": self.pub_key}

    def state(self) -> Any:
        return {"pods": {pid: self._pod_view(p) for pid, p in self.pods.items()},
                "stock": {g.id: g.stock for g in self.gpu_types.values()}, "pubKey": self.pub_key}


class _AfterCreate(Exception):
    def __init__(self, status: int, retry_after: float | None) -> None:
        super().__init__(status)
        self.status = status
        self.retry_after = retry_after
