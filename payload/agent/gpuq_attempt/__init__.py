"""One attempt (the wrapper, what it runs around the trainer): imports gpuq_watch and below, never gpuq_verbs."""
