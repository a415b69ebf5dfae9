"""Stage 5, the verdict: msprobe's Layer-1 rule, the new-standard decisions, the strict standard,
MindSpore's rule, an earlier run's reference values, and which standard applies."""
