"""Payload copy of the host contract (``orchestrator/core/protocol.py``).

The payload runs on rented hosts where only the bundle exists, so it carries
its own copy of the names it uses.  Values must equal those in
``orchestrator/core/protocol.py``; ``tests/unit/test_protocol_copies.py`` checks them.
"""

from __future__ import annotations

PROTOCOL_VERSION = "1.1"

# checkpoint directory
LATEST_POINTER = "LATEST"
LATEST_CKPT = "latest.pt"
BEST_CKPT = "best.pt"

# result directory
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"

# per attempt
HEARTBEAT_FILE = "heartbeat"

# exit codes (docs/host-protocol.md)
EXIT_OK = 0
EXIT_TRANSIENT = 3
EXIT_CONFIG = 4
EXIT_SIGNAL_BASE = 128

# environment a job receives (docs/host-protocol.md)
ENV_JOB_ID = "GPUQ_JOB_ID"
ENV_JOB_NAME = "GPUQ_JOB_NAME"
ENV_ATTEMPT = "GPUQ_ATTEMPT"
ENV_SEED = "GPUQ_SEED"
ENV_CKPT_DIR = "GPUQ_CKPT_DIR"
ENV_RESULT_DIR = "GPUQ_RESULT_DIR"
ENV_HEARTBEAT = "GPUQ_HEARTBEAT"
ENV_HEARTBEAT_S = "GPUQ_HEARTBEAT_S"
ENV_RESUME_FROM = "GPUQ_RESUME_FROM"
ENV_CKPT_INTERVAL_S = "GPUQ_CKPT_INTERVAL_S"
ENV_SPEC_HASH = "GPUQ_SPEC_HASH"
ENV_BUNDLE_SHA = "GPUQ_BUNDLE_SHA"
ENV_DEVICE = "GPUQ_DEVICE"
ENV_EXIT_FILE = "GPUQ_EXIT_FILE"
ENV_SIGTERM_GRACE_S = "GPUQ_SIGTERM_GRACE_S"  # seconds from SIGTERM to SIGKILL; "" or absent = unknown

DEFAULT_HEARTBEAT_S = 30
DEFAULT_CKPT_INTERVAL_S = 600

# markers
RESUMED_MARKER = "GPUQ_RESUMED"  # payload logs: GPUQ_RESUMED step=<s> epoch=<e> sha256=<h>

# payload-only knobs (not part of protocol.py)
ENV_CKPT_ON_SIGTERM = "GPUQ_CKPT_ON_SIGTERM"  # "0" disables the last save on SIGTERM/SIGINT
ENV_DIST_TIMEOUT_S = "GPUQ_DIST_TIMEOUT_S"  # collective timeout, seconds (default 600)
DEFAULT_DIST_TIMEOUT_S = 600
EXIT_SIGTERM = EXIT_SIGNAL_BASE + 15
# TEST HOOKS (tests only; never set them in a job): make saves and steps measurably slow and hold
# a save at one point so a test can SIGKILL it there.  "<point>:<seconds>[:<from_step>]" holds every
# rolling save at a step >= from_step, point one of
# write (mid-way through writing latest-<step>.pt.tmp), fsynced (tmp complete, not renamed),
# renamed (latest-<step>.pt in place, LATEST not yet moved), pointer (LATEST.tmp written, not renamed).
ENV_TEST_HOOK_SAVE_PAUSE = "GPUQ_TEST_HOOK_SAVE_PAUSE"
ENV_TEST_HOOK_STEP_SLEEP_S = "GPUQ_TEST_HOOK_STEP_SLEEP_S"  # sleep after each forward pass
TEST_HOOK_SAVE_POINTS = ("write", "fsynced", "renamed", "pointer")
EXIT_DIVERGED = 1
