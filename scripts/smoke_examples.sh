#!/bin/sh
# `gpuq submit --smoke` on the three example projects (issue 26): the payload's queue, examples/ddp_snapshot
# and examples/hydra_csv (whose setup hook pip-installs Hydra into the local interpreter: run it in a
# virtualenv you may change, or set GPUQ_LOCAL_PYTHON to one).  The suite smokes the first two
# (tests/integration/test_smoke.py); this covers all three.  Exit 1 when any cell fails.
set -eu
cd "$(dirname "$0")/.."
status=0
for queue in payload/queue.txt examples/ddp_snapshot/queue.txt examples/hydra_csv/queue.txt; do
    echo "== $queue"
    python -m orchestrator submit --smoke "$queue" || status=1
done
exit $status
