#!/usr/bin/env python3
"""Start or stop a farm of real OpenSSH test "GPU hosts" (tests/support/testhosts/); needs root.

    python scripts/testhosts.py up --n 3 --gpus 2 --dir /tmp/farm    # prints the farm as JSON; hosts keep running
    ssh -F /dev/null -i /tmp/farm/client_ed25519 -o UserKnownHostsFile=/tmp/farm/known_hosts root@<address>
    python scripts/testhosts.py down --dir /tmp/farm                  # also cleans up after a crashed test run

``down`` kills each host's PID 1 by the pid (and start time) recorded in DIR/farm.json (which kills
everything in the host, e.g. a Slurm test cluster's daemons), deletes the recorded namespaces and
veths (a routed farm's forwarding setting is per veth and goes with them) and removes the attached
directories (a Slurm test cluster's shared dir under /var/tmp); it never matches processes by name.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.testhosts import HostFarm, requirements_problem


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start a farm and leave it running")
    up.add_argument("--n", type=int, default=3, help="hosts (default 3)")
    up.add_argument("--gpus", type=int, default=2, help="fake GPUs per host (0: no nvidia-smi; default 2)")
    up.add_argument("--dir", type=Path, required=True, help="farm directory (keys, per-host dirs, farm.json)")
    up.add_argument("--python", default=sys.executable, help="the hosts' python3 (default: this interpreter)")
    up.add_argument("--routed", action="store_true",
                    help="the hosts reach each other (per-veth forwarding; ip_forward is not touched)")
    down = sub.add_parser("down", help="tear down the farm recorded in DIR/farm.json")
    down.add_argument("--dir", type=Path, required=True)
    status = sub.add_parser("status", help="print the farm recorded in DIR/farm.json")
    status.add_argument("--dir", type=Path, required=True)
    args = ap.parse_args(argv)

    if args.cmd == "up":
        problem = requirements_problem()
        if problem:
            print(f"testhosts: {problem}", file=sys.stderr)
            return 2
        state = args.dir / "farm.json"
        if state.exists() and json.loads(state.read_text()).get("status") != "down":
            print(f"testhosts: {args.dir} holds a farm that is not down; run `down --dir {args.dir}` first",
                  file=sys.stderr)
            return 2
        farm = HostFarm(args.dir, args.n, args.gpus, args.python, routed=args.routed).start()
        farm.disown()
        print(json.dumps({**farm.describe(), "start_seconds": round(farm.start_seconds, 3)}, indent=1))
        return 0
    if not (args.dir / "farm.json").is_file():
        print(f"testhosts: no farm.json in {args.dir}", file=sys.stderr)
        return 2
    farm = HostFarm.from_state(args.dir)
    if args.cmd == "status":
        print(json.dumps({**farm.describe(), "alive": [h.init_alive() for h in farm.hosts]}, indent=1))
        return 0
    farm.teardown()
    print(f"testhosts: farm {farm.farm_id} in {args.dir} is down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
