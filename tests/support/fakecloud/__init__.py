"""Local fakes of the RunPod (REST v2), Lambda Cloud v1 and vast.ai APIs (docs/providers.md), for tests and demos.

    with FakeRunPod() as cloud:                    # threaded stdlib HTTP server on 127.0.0.1
        provider = RunPodProvider(ApiKey(cloud.api_key, "RUNPOD_API_KEY"), url=cloud.url, ...)
        cloud.preempt(pod_id)                      # inject events (also POST /_fake/preempt)

``backend`` decides what stands behind a pod or instance (backend.HostBackend; ``netns_backend.NetnsBackend``
puts real SSH hosts of a tests/support/testhosts/ farm there); ``recording`` records
adapter exchanges into fixtures and replays them; ``runpod_wire`` holds the fake RunPod's records and
wire rules.  ``python scripts/fakecloud.py`` runs both fakes.
"""

from tests.support.fakecloud.backend import AddressBackend, HostBackend
from tests.support.fakecloud.lambda_cloud import FakeLambda
from tests.support.fakecloud.netns_backend import NetnsBackend, PoolExhausted
from tests.support.fakecloud.runpod import FakeRunPod
from tests.support.fakecloud.server import FakeClock, FakeCloud

__all__ = ["AddressBackend", "FakeClock", "FakeCloud", "FakeLambda", "FakeRunPod", "HostBackend", "NetnsBackend",
           "PoolExhausted"]
