"""Stage 2, the inputs: arguments rebuilt from the dump (saved tensors, or random from statistics) and
the per-item seeds."""
