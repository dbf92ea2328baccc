"""The serving loop (serve, detach, its inbox view, its stall heal): imports any package; none imports it."""
