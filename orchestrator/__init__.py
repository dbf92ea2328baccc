"""gpuq: remote GPU job orchestrator and queue runner (the controller)."""

__version__ = "0.1.0"  # what `gpuq --version` says when pyproject.toml cannot be read
