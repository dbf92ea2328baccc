#!/usr/bin/env python3
"""Run the local fake RunPod (REST v2) and Lambda Cloud APIs (tests/support/fakecloud), or re-record the fixtures.

    python scripts/fakecloud.py serve [--runpod-port 8701] [--lambda-port 8702]
        prints the environment that points gpuq at the fakes, then serves until Ctrl-C; inject events with
        curl -X POST localhost:8701/_fake/host_failure -d '{"pod_id": "..."}'     (controls: GET /_fake/log)
    python scripts/fakecloud.py record
        re-records tests/fixtures/providers/<provider>/fake/*.json from the fakes (after an intended change
        to what an adapter sends), then replays them

By default the fakes hand out fake addresses (TEST-NET-3) that nothing answers.  With ``--farm N`` (root;
tests/support/testhosts/) both fakes rent real OpenSSH hosts of an N-host farm in network namespaces
instead (fakecloud.NetnsBackend): SSH as root with the farm's client key, or add yours with --authorize-key;
stops and failures SIGTERM/SIGKILL the host's processes, starts boot the same host.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.fakecloud import FakeLambda, FakeRunPod, HostBackend, NetnsBackend
from tests.support.testhosts import HostFarm, requirements_problem

ROOT = Path(__file__).resolve().parents[1]
# the contract (tests/unit/test_providers_contract.py) and vast.ai's subclass of it, which records its own fixtures
CONTRACTS = ("tests/unit/test_providers_contract.py", "tests/unit/test_provider_vastai.py")
FIXTURES = ROOT / "tests" / "fixtures" / "providers"


def serve(runpod_port: int, lambda_port: int, farm_hosts: int = 0, farm_gpus: int = 1, farm_dir: str = "",
          authorize: list[str] | None = None) -> int:
    farm: HostFarm | None = None
    backend: NetnsBackend | None = None
    if farm_hosts:
        problem = requirements_problem()
        if problem:
            print(f"--farm: {problem}", file=sys.stderr)
            return 2
        base = Path(farm_dir) if farm_dir else Path(tempfile.mkdtemp(prefix="gpuq-fakecloud-farm-"))
        farm = HostFarm(base, farm_hosts, farm_gpus).start()
        keys = [Path(k).expanduser().read_text().strip() for k in authorize or []]
        backend = NetnsBackend(farm, authorized_keys=keys)  # one pool for both fakes: their ids never collide
        print(f"# farm of {farm_hosts} hosts in {base}: ssh -i {farm.client_key} -o UserKnownHostsFile="
              f"{farm.known_hosts} root@<ip>  (a host rented again gets a new host key)", file=sys.stderr)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # `kill` tears the farm down too
    try:
        return _serve(runpod_port, lambda_port, backend)
    finally:
        if backend is not None:
            backend.close()
        if farm is not None:
            farm.teardown()


def _serve(runpod_port: int, lambda_port: int, backend: HostBackend | None) -> int:
    runpod = FakeRunPod(api_key="fake-runpod-key", port=runpod_port, backend=backend).start()
    lam = FakeLambda(api_key="fake-lambda-key", port=lambda_port, backend=backend).start()
    env = {"GPUQ_RUNPOD_URL": runpod.url, "RUNPOD_API_KEY": runpod.api_key,
           "GPUQ_LAMBDA_API_URL": lam.url, "LAMBDA_API_KEY": lam.api_key}
    for name, value in env.items():
        print(f"export {name}={shlex.quote(value)}")
    print(f"# RunPod controls: POST {runpod.root_url}/_fake/<{'|'.join(FakeRunPod.controls)}>", file=sys.stderr)
    print(f"# Lambda controls: POST {lam.root_url}/_fake/<{'|'.join(FakeLambda.controls)}>", file=sys.stderr)
    print("# GET /_fake/log and /_fake/state on either; Ctrl-C stops both", file=sys.stderr)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        runpod.stop()
        lam.stop()
    return 0


def record() -> int:
    for stale in FIXTURES.glob("*/fake"):  # recordings of renamed or removed tests go too
        shutil.rmtree(stale)
    env = dict(os.environ, GPUQ_RECORD_PROVIDER_FIXTURES="1")
    base = [sys.executable, "-m", "pytest", "-q", *CONTRACTS]
    recorded = subprocess.run([*base, "-k", "fake"], cwd=ROOT, env=env, check=False)
    if recorded.returncode != 0:
        return recorded.returncode
    env.pop("GPUQ_RECORD_PROVIDER_FIXTURES")
    return subprocess.run([*base, "-k", "replay"], cwd=ROOT, env=env, check=False).returncode


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("serve", help="run both fakes until Ctrl-C")
    run.add_argument("--runpod-port", type=int, default=8701)
    run.add_argument("--lambda-port", type=int, default=8702)
    run.add_argument("--farm", type=int, default=0, metavar="N",
                     help="back both fakes with N real SSH hosts in network namespaces (needs root)")
    run.add_argument("--farm-gpus", type=int, default=1, help="fake GPU nodes per farm host at start [1]")
    run.add_argument("--farm-dir", default="", help="the farm's directory [a new temporary one]")
    run.add_argument("--authorize-key", action="append", default=[], metavar="PUBFILE",
                     help="also install this public key on every rental (repeatable)")
    sub.add_parser("record", help="re-record the provider fixtures from the fakes, then replay them")
    args = ap.parse_args(argv)
    if args.cmd == "serve":
        return serve(args.runpod_port, args.lambda_port, args.farm, args.farm_gpus, args.farm_dir,
                     args.authorize_key)
    return record()


if __name__ == "__main__":
    sys.exit(main())
