"""An attempt's signs and what follows (Xids, scans, host retries): imports gpuq_records, gpuq_slurmmode, gpuq_base."""
