"""gpuq: remote GPU job orchestrator and queue runner (the controller)."""
