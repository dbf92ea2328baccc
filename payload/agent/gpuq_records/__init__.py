"""A job's documents and run-dir files (inbox, own files, metrics, end record): imports gpuq_base."""
