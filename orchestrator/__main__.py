"""``python -m orchestrator`` is ``gpuq``."""

from orchestrator.cli.main import main

main()
