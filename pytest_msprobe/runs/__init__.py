"""Stage 3, the device and bench runs: device backends and the device-call boundary, API resolution,
msprobe's precision plan, the two sides and backward, --msprobe-kernels, the third (reference) run,
the MindSpore re-run, what the check captures for triage. No pytest here."""
