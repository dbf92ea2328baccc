"""What a provider puts inside its instances, for the fakes' namespace hosts (docs/providers.md, "When no gpuq
command runs: the host stops itself").

A real RunPod pod has ``runpodctl`` preinstalled and ``RUNPOD_POD_ID`` plus a pod-scoped ``RUNPOD_API_KEY`` in
its container's environment; a vast.ai instance has ``CONTAINER_ID`` and an instance-scoped
``CONTAINER_API_KEY`` (its ``vastai`` CLI is pip-installed by the user's image; gpuq's docs say so).  The fakes
hand a backend that supports it (``NetnsBackend.in_instance``) the same: PID 1's environment and a small
stdlib stand-in for the CLI on the host's PATH that calls the fake's API from inside the host, over the
host's gateway, with the instance's own key (``FakeCloud.listen_on``).  The fake checks that key as the real
API would: it may stop its own instance and read it, nothing else.

Only the calls gpuq's agent makes are spoken: ``runpodctl pod stop ID`` (v2: ``POST /pods/{id}/action``
``{"action": "stop"}``) and ``vastai stop instance ID --api-key KEY`` (vast-cli: ``PUT /api/v0/instances/{id}/``
``{"state": "stopped"}``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from tests.support.fakecloud.backend import give_instance

if TYPE_CHECKING:
    from tests.support.fakecloud.server import FakeCloud, Request

# Each tool: a Python 3.8 stdlib script run by the host's python3; {api} is the API base as the host reaches it.
RUNPODCTL = '''\
import json, os, sys, urllib.request, urllib.error
API = {api!r}
args = sys.argv[1:]
if len(args) != 3 or args[:2] != ["pod", "stop"]:
    print("fake runpodctl: only `runpodctl pod stop POD_ID` is modelled", file=sys.stderr)
    sys.exit(2)
key = os.environ.get("RUNPOD_API_KEY", "")
req = urllib.request.Request(API + "/pods/" + args[2] + "/action", data=json.dumps({{"action": "stop"}}).encode(),
                             headers={{"Authorization": "Bearer " + key, "Content-Type": "application/json"}},
                             method="POST")
try:
    with urllib.request.urlopen(req, timeout=20) as r:
        print('pod "%s" stopped' % args[2], flush=True)
except urllib.error.HTTPError as e:
    print("Error: HTTP %d %s" % (e.code, e.read()[:200].decode("utf-8", "replace")), file=sys.stderr)
    sys.exit(1)
'''

VASTAI = '''\
import json, sys, urllib.request, urllib.error
API = {api!r}
args = sys.argv[1:]
key = ""
if "--api-key" in args:
    i = args.index("--api-key")
    key = args[i + 1] if i + 1 < len(args) else ""
    del args[i:i + 2]
if len(args) != 3 or args[:2] != ["stop", "instance"]:
    print("fake vastai: only `vastai stop instance ID --api-key KEY` is modelled", file=sys.stderr)
    sys.exit(2)
body = json.dumps({{"state": "stopped"}}).encode()
req = urllib.request.Request(API + "/api/v0/instances/" + args[2] + "/", data=body,
                             headers={{"Authorization": "Bearer " + key, "Content-Type": "application/json"}},
                             method="PUT")
try:
    with urllib.request.urlopen(req, timeout=20) as r:
        print("stopping instance %s." % args[2], flush=True)
except urllib.error.HTTPError as e:
    print("failed with error %d: %s" % (e.code, e.read()[:200].decode("utf-8", "replace")), file=sys.stderr)
    sys.exit(1)
'''


def render(template: str, api: str) -> str:
    return template.format(api=api)


def scoped_call(cloud: FakeCloud, req: Request, keys: Mapping[str, str],
                allowed: Callable[[str, Request], bool]) -> bool:
    """Whether ``req`` is an instance's own call that its key may make: the bearer token is the key of the
    instance ``keys[token]`` and ``allowed(instance_id, req)``.  Each such call is kept in
    ``cloud.instance_calls`` (instance, method, path, allowed, time); the key never is."""
    auth = req.headers.get("authorization", "")
    token = auth[len("Bearer "):] if auth.startswith("Bearer ") else ""
    instance_id = keys.get(token) if token else None
    if instance_id is None:
        return False
    ok = allowed(instance_id, req)
    cloud.instance_calls.append({"instance": instance_id, "method": req.method, "path": req.path, "allowed": ok,
                                 "at": time.time()})
    return ok


def body_is(req: Request, expected: dict[str, Any]) -> bool:
    try:
        return bool(req.json() == expected)
    except ValueError:
        return False


def runpod_may(prefix: str) -> Callable[[str, Request], bool]:
    """What a pod's own key may do at RunPod v2 (below ``prefix``): read its pod, stop it."""
    def may(pod_id: str, req: Request) -> bool:
        own = f"{prefix}/pods/{pod_id}"
        if req.method == "GET":
            return req.path == own
        return req.method == "POST" and req.path == own + "/action" and body_is(req, {"action": "stop"})
    return may


def vastai_may(instance_id: str, req: Request) -> bool:
    """What an instance's CONTAINER_API_KEY may do at vast.ai (as gpuq assumes: docs/providers.md): read and
    stop its own instance."""
    own = req.path == f"/api/v0/instances/{instance_id}/"
    return own and (req.method == "GET" or (req.method == "PUT" and body_is(req, {"state": "stopped"})))


def furnish(cloud: FakeCloud, instance_id: str, env: dict[str, str], tool: str, template: str, prefix: str) -> None:
    """Give the instance its environment and its CLI ``tool`` calling ``cloud``'s API (``prefix`` below the
    root) from inside, over its host's gateway (fakecloud/backend.py ``give_instance``)."""
    give_instance(cloud.backend, instance_id, env, {tool: lambda gateway: render(template,
                                                                                  cloud.listen_on(gateway) + prefix)})


def vastai_inside(cloud: FakeCloud, instance_id: str) -> str:
    """A new vast.ai instance's CONTAINER_ID and CONTAINER_API_KEY, and its ``vastai``; returns the key."""
    key = cloud.new_id(64, "0123456789abcdef")
    furnish(cloud, instance_id, {"CONTAINER_ID": instance_id, "CONTAINER_API_KEY": key}, "vastai", VASTAI, "")
    return key
