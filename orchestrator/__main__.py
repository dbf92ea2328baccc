"""``python -m orchestrator`` is ``gpuq``."""

from orchestrator.cli.entry import main

main()
