"""Stage 4, the metrics: msprobe's accuracy metrics, vectorised numpy, without torch."""
