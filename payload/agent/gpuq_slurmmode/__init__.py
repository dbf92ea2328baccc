"""Slurm mode (config, sbatch and scancel, status's view, the compute node's side): imports gpuq_base."""
