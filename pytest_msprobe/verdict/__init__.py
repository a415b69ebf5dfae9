"""Stage 5, the verdict: msprobe's Layer-1 rule and its Layer-2 algorithms, the new-standard decisions, the
strict standard (on the device dtype's grid), MindSpore's rule, an earlier run's reference values, and which
standard applies."""
