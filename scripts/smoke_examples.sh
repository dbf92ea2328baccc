#!/bin/sh
# `gpuq submit --smoke` on the three example projects (issue 26): the payload's queue, examples/ddp_snapshot
# and examples/hydra_csv, every cell of their own queue files, as a user would run them from a checkout.
# hydra_csv's setup hook pip-installs Hydra into the local interpreter when it lacks it: run this in a
# virtualenv you may change, or set GPUQ_LOCAL_PYTHON to one.  The suite smokes one cell of each
# (tests/integration/test_smoke.py, with pyproject's `examples` extra installed).  Exit 1 when any cell fails.
set -eu
cd "$(dirname "$0")/.."
status=0
for queue in payload/queue.txt examples/ddp_snapshot/queue.txt examples/hydra_csv/queue.txt; do
    echo "== $queue"
    python -m orchestrator submit --smoke "$queue" || status=1
done
exit $status
