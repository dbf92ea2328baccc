"""``gpuq report``: which ablation cell won, by how much, and whether it is within the noise."""
