"""The controller's one-shot verbs (status, health, cancel, ...): imports gpuq_watch and below, not gpuq_attempt."""
