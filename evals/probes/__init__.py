"""pytest plugins that measure a run from inside (`-p evals.probes.run_probe`, `-p evals.probes.controller_probe`)
and the readers of what they write."""
